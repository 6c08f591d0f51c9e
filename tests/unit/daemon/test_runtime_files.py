"""Runtime directories and socket claims refuse links, non-sockets and live holders; they remove only their own."""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

import pytest

from stagevisor.supervisor.errors import DaemonError, DaemonErrorCode
from stagevisor.supervisor.daemon import runtime_files
from stagevisor.supervisor.daemon.runtime_files import (
    SocketClaim,
    claim_holder,
    make_private_dir,
    remove_private_tree,
    remove_stale_run_dirs,
)

DEAD_PID = 2**22 + 1  # above the kernel's pid_max ceiling: never a live process


def victim_dir(tmp_path: Path) -> Path:
    """A directory of ours with a `d<dead pid>` inside, the kind a planted link points at."""
    target = tmp_path / "precious"
    (target / f"d{DEAD_PID}").mkdir(parents=True)
    (target / f"d{DEAD_PID}" / "data").write_text("keep me")
    target.chmod(0o755)
    return target


def bind_unix(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    return sock


# -- runtime directories -----------------------------------------------------


def test_a_runtime_dir_that_is_a_symlink_is_refused_and_its_target_untouched(tmp_path):
    target = victim_dir(tmp_path)
    link = tmp_path / "stagevisor-1000"
    link.symlink_to(target)
    with pytest.raises(DaemonError, match="symbolic link") as raised:
        make_private_dir(link)
    assert raised.value.code is DaemonErrorCode.UNSAFE_PATH
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert (target / f"d{DEAD_PID}" / "data").read_text() == "keep me"


def test_a_runtime_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "rt").write_text("")
    with pytest.raises(DaemonError, match="not a directory"):
        make_private_dir(tmp_path / "rt")


def test_a_runtime_dir_is_created_private_and_an_existing_one_tightened(tmp_path):
    make_private_dir(tmp_path / "new" / "rt")
    assert stat.S_IMODE((tmp_path / "new" / "rt").stat().st_mode) == 0o700
    (tmp_path / "loose").mkdir(mode=0o777)
    make_private_dir(tmp_path / "loose")
    assert stat.S_IMODE((tmp_path / "loose").stat().st_mode) == 0o700


def test_stale_run_dir_sweep_never_follows_a_link_named_like_a_run_dir(tmp_path):
    target = victim_dir(tmp_path)
    parent = tmp_path / "rt"
    parent.mkdir()
    (parent / f"d{DEAD_PID + 1}").symlink_to(target / f"d{DEAD_PID}")
    (parent / f"d{DEAD_PID + 2}").mkdir()  # a real leftover of a dead daemon
    (parent / f"d{os.getpid()}").mkdir()  # a live daemon's (ours)
    removed = remove_stale_run_dirs(parent)
    assert removed == [parent / f"d{DEAD_PID + 2}"]
    assert (target / f"d{DEAD_PID}" / "data").read_text() == "keep me"
    assert (parent / f"d{DEAD_PID + 1}").is_symlink() and (parent / f"d{os.getpid()}").is_dir()


def test_stale_run_dir_sweep_skips_names_that_are_not_ascii_digits(tmp_path):
    parent = tmp_path / "rt"
    for name in ("d²", "d١٢", "d+1", "dx"):
        (parent / name).mkdir(parents=True)
    assert remove_stale_run_dirs(parent) == []
    assert sorted(p.name for p in parent.iterdir()) == sorted(["d²", "d١٢", "d+1", "dx"])


def test_removing_a_private_tree_refuses_a_symlink(tmp_path):
    target = victim_dir(tmp_path)
    (tmp_path / "run").symlink_to(target)
    assert remove_private_tree(tmp_path / "run") is False
    assert (target / f"d{DEAD_PID}" / "data").exists()


# -- socket claims -----------------------------------------------------------


def test_a_second_claim_on_a_held_socket_path_is_refused_naming_the_holder(tmp_path):
    first = SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    try:
        with pytest.raises(DaemonError, match=f"pid {os.getpid()}") as raised:
            SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
        assert raised.value.code is DaemonErrorCode.DAEMON_RUNNING
    finally:
        first.release()
    SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address").release()  # free again
    assert not (tmp_path / "admin.sock.lock").exists()


def test_the_directories_a_claim_made_are_removed_on_release_as_far_as_they_are_empty(tmp_path):
    """Before: `--admin-address unix:/new/dir/a.sock` made /new/dir and left it behind after `stop`."""
    made = tmp_path / "new" / "dir"
    claim = SocketClaim.acquire(made / "admin.sock", "--admin-address")
    assert made.is_dir() and made.stat().st_mode & 0o777 == 0o700
    claim.release()
    assert list(tmp_path.iterdir()) == []
    claim = SocketClaim.acquire(made / "admin.sock", "--admin-address")
    (tmp_path / "new" / "kept.txt").write_text("another program's")
    claim.release()
    assert not made.exists() and (tmp_path / "new" / "kept.txt").exists()  # only what is empty goes
    (tmp_path / "new" / "dir").mkdir()  # a directory the daemon did not make stays
    SocketClaim.acquire(made / "admin.sock", "--admin-address").release()
    assert made.is_dir()


@pytest.mark.parametrize("failing, verb", [("ftruncate", "write"), ("pwrite", "write"), ("open", "create")])
def test_a_lock_file_that_cannot_be_written_is_named_with_the_systems_reason_and_removed(
    tmp_path, monkeypatch, failing, verb
):
    """Before: on a full file system `serve --admin-address unix:...` ended in a traceback (OSError ENOSPC from
    os.pwrite) and left an empty lock file behind; one it could not create at all read UNSAFE_PATH, "remove it or
    choose another", for a file that was never there."""

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(runtime_files.os, failing, full)
    made = tmp_path / "new"
    with pytest.raises(DaemonError) as raised:
        SocketClaim.acquire(made / "adm.sock", "--admin-address")
    assert raised.value.code is DaemonErrorCode.DAEMON_ERROR
    assert str(raised.value) == (
        f"cannot {verb} lock file {made / 'adm.sock.lock'} for --admin-address {made / 'adm.sock'}: "
        "No space left on device; free space on its file system or choose another --admin-address"
    )
    assert list(tmp_path.iterdir()) == []  # the lock file and the directory made for it are gone


def test_a_directory_that_cannot_be_made_for_the_socket_is_named_with_the_systems_reason(tmp_path, monkeypatch):
    """Only the deepest fails: the directory made above it is removed too."""
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kwargs):
        if Path(path).name == "inner":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(runtime_files.os, "mkdir", mkdir)
    target = tmp_path / "outer" / "inner" / "adm.sock"
    with pytest.raises(DaemonError, match=f"cannot make directory {target.parent} for --admin-address {target}: "):
        SocketClaim.acquire(target, "--admin-address")
    assert list(tmp_path.iterdir()) == []


def test_a_regular_file_at_the_socket_path_is_never_removed(tmp_path):
    path = tmp_path / "important.txt"
    path.write_text("data")
    claim = SocketClaim.acquire(path, "--admin-address")
    try:
        with pytest.raises(DaemonError, match="regular file, not a socket") as raised:
            claim.remove_stale_socket()
        assert raised.value.code is DaemonErrorCode.UNSAFE_PATH
    finally:
        claim.release()
    assert path.read_text() == "data"


def test_a_fifo_at_the_socket_path_is_named_once(tmp_path):
    path = tmp_path / "admin.sock"
    os.mkfifo(path)
    claim = SocketClaim.acquire(path, "--admin-address")
    try:
        with pytest.raises(DaemonError) as raised:
            claim.refuse_non_socket()
        assert "exists and is a FIFO, not a socket;" in raised.value.message
        assert "not a socket, not a socket" not in raised.value.message
    finally:
        claim.release()


def test_a_stale_socket_is_removed_under_the_lock(tmp_path):
    path = tmp_path / "admin.sock"
    bind_unix(path).close()  # a socket file whose daemon is gone
    claim = SocketClaim.acquire(path, "--admin-address")
    claim.remove_stale_socket()
    claim.release()
    assert not path.exists()


def test_release_removes_only_the_socket_this_claim_bound(tmp_path):
    path = tmp_path / "admin.sock"
    claim = SocketClaim.acquire(path, "--admin-address")
    ours = bind_unix(claim.staging_path)
    claim.bound()
    path.unlink()
    theirs = bind_unix(path)  # another daemon's socket now lives at the path
    their_inode = os.lstat(path).st_ino
    try:
        claim.release()
        assert stat.S_ISSOCK(os.lstat(path).st_mode) and os.lstat(path).st_ino == their_inode
    finally:
        ours.close()
        theirs.close()


def test_release_removes_our_own_socket(tmp_path):
    path = tmp_path / "admin.sock"
    claim = SocketClaim.acquire(path, "--admin-address")
    with bind_unix(claim.staging_path):
        claim.bound()
        assert stat.S_ISSOCK(os.lstat(path).st_mode) and not claim.staging_path.exists()
        claim.release()
    assert not path.exists() and not (tmp_path / "admin.sock.lock").exists()


def test_a_lock_file_that_is_a_symlink_is_refused_and_not_followed(tmp_path):
    target = tmp_path / "target"
    target.write_text("keep")
    (tmp_path / "admin.sock.lock").symlink_to(target)
    with pytest.raises(DaemonError, match="symbolic link") as raised:
        SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    assert raised.value.code is DaemonErrorCode.UNSAFE_PATH
    assert target.read_text() == "keep"


# -- who holds a socket -------------------------------------------------------


def test_the_holder_of_a_socket_is_the_live_pid_in_its_lock_file(tmp_path):
    path = tmp_path / "admin.sock"
    assert claim_holder(path) is None  # no lock file
    claim = SocketClaim.acquire(path, "--admin-address")
    try:
        assert claim_holder(path) == os.getpid()
    finally:
        claim.release()
    assert claim_holder(path) is None


def test_a_lock_file_left_by_a_dead_daemon_or_not_a_pid_names_no_holder(tmp_path):
    path = tmp_path / "admin.sock"
    lock = tmp_path / "admin.sock.lock"
    for content in (f"{DEAD_PID}\n", "0\n", "-1\n", "", "12ab\n"):
        lock.write_text(content)
        assert claim_holder(path) is None, content
    lock.unlink()
    (tmp_path / "elsewhere").write_text(f"{os.getpid()}\n")
    lock.symlink_to(tmp_path / "elsewhere")
    assert claim_holder(path) is None  # never followed
