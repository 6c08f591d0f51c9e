"""Runtime files at their edges: missing paths, other users' files, links and devices, races, errors named."""

from __future__ import annotations

import logging
import os
import socket
import stat
from pathlib import Path

import pytest

from stagevisor.supervisor.daemon import runtime_files
from stagevisor.supervisor.daemon.runtime_files import (
    SocketClaim,
    make_private_dir,
    remove_private_tree,
    remove_stale_run_dirs,
)
from stagevisor.supervisor.errors import DaemonError, DaemonErrorCode
from tests.descriptors import descriptors_on

DEAD_PID = 2**22 + 1  # above the kernel's pid_max ceiling: never a live process
OTHER_UID = 54321


def bind_unix(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    return sock


# -- making the directory --------------------------------------------------------


def test_a_runtime_dir_is_made_with_every_missing_parent(tmp_path):
    make_private_dir(tmp_path / "a" / "b" / "rt")
    assert stat.S_IMODE((tmp_path / "a" / "b" / "rt").stat().st_mode) == 0o700


# -- removing trees -----------------------------------------------------------


def test_a_tree_that_is_already_gone_counts_as_removed(tmp_path):
    assert remove_private_tree(tmp_path / "never-there") is True


@pytest.mark.skipif(os.getuid() != 0, reason="only root can give a directory to another user")
def test_another_users_directory_is_left_alone(tmp_path):
    theirs = tmp_path / "theirs"
    (theirs / "inside").mkdir(parents=True)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    assert remove_private_tree(theirs) is False
    assert (theirs / "inside").is_dir()


def test_a_regular_file_is_not_removed_as_a_tree(tmp_path):
    (tmp_path / "file").write_text("keep")
    assert remove_private_tree(tmp_path / "file") is False
    assert (tmp_path / "file").read_text() == "keep"


def refuse_to_unlink_stuck(monkeypatch) -> None:
    """os.unlink fails with EACCES for any file named `stuck`, as for a file the user may not remove."""
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if os.fspath(path).endswith("stuck"):
            raise PermissionError(13, "Permission denied (planted)")
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)


def test_an_entry_that_cannot_be_removed_is_logged_with_its_error_and_the_tree_reported_not_gone(
    tmp_path, monkeypatch, caplog
):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "stuck").write_text("")
    refuse_to_unlink_stuck(monkeypatch)
    with caplog.at_level(logging.WARNING, logger=runtime_files.log.name):
        assert remove_private_tree(tree) is False
    messages = [r.getMessage() for r in caplog.records]
    assert f"could not remove {tree / 'stuck'}: [Errno 13] Permission denied (planted)" in messages


# -- sweeping run directories -----------------------------------------------------


def in_name_order(monkeypatch, parent: Path) -> None:
    """The sweep sees `parent`'s entries sorted by name (so one that must be skipped comes first)."""
    real_scandir = os.scandir

    def scandir(path="."):
        if isinstance(path, (str, os.PathLike)) and Path(path) == parent:
            return sorted(real_scandir(path), key=lambda entry: entry.name)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)


def test_sweeping_a_parent_that_does_not_exist_removes_nothing(tmp_path):
    assert remove_stale_run_dirs(tmp_path / "missing") == []


def test_entries_not_named_like_a_run_dir_are_skipped_and_the_sweep_goes_on(tmp_path, monkeypatch):
    for name in ("a-first", "cache", "d", "dx1"):
        (tmp_path / name).mkdir()
    stale = tmp_path / f"d{DEAD_PID}"
    stale.mkdir()
    in_name_order(monkeypatch, tmp_path)
    assert remove_stale_run_dirs(tmp_path) == [stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-first", "cache", "d", "dx1"]


@pytest.mark.skipif(os.getuid() != 0, reason="only root can give a directory to another user")
def test_another_users_run_dir_is_not_swept_and_the_sweep_goes_on(tmp_path, monkeypatch):
    theirs, ours = tmp_path / "d1", tmp_path / f"d{DEAD_PID}"
    theirs.mkdir()
    ours.mkdir()
    os.chown(theirs, OTHER_UID, OTHER_UID)
    in_name_order(monkeypatch, tmp_path)
    monkeypatch.setattr(runtime_files, "pid_alive", lambda pid: False)
    assert remove_stale_run_dirs(tmp_path) == [ours]
    assert theirs.is_dir()


# -- lock files ---------------------------------------------------------------


def test_the_lock_file_is_created_readable_and_writable_by_this_user_only(tmp_path):
    old = os.umask(0)
    try:
        claim = SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(os.lstat(claim.lock_path).st_mode) == 0o600
    finally:
        claim.release()


def test_a_lock_file_that_cannot_be_opened_is_named_with_the_systems_reason(tmp_path):
    (tmp_path / "admin.sock.lock").mkdir()
    with pytest.raises(DaemonError) as raised:
        SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    assert raised.value.code is DaemonErrorCode.UNSAFE_PATH
    assert f"cannot open lock file {tmp_path / 'admin.sock.lock'}" in str(raised.value)
    assert "Is a directory" in str(raised.value) and "symbolic link" not in str(raised.value)


def test_a_lock_file_that_is_a_symlink_is_named_as_one(tmp_path):
    (tmp_path / "admin.sock.lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(DaemonError, match="it is a symbolic link; remove it"):
        SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    assert not (tmp_path / "elsewhere").exists()


# -- what sits at the socket path -------------------------------------------------------


def test_nothing_at_the_path_is_none():
    assert SocketClaim(Path("/nonexistent/dir/admin.sock"), "--admin-address").existing() is None


@pytest.mark.skipif(not Path("/dev/null").is_char_device(), reason="no /dev/null character device")
def test_a_character_device_at_the_path_is_named_a_device_file():
    claim = SocketClaim(Path("/dev/null"), "--admin-address")  # only looked at, never locked or touched
    assert claim.existing() == "a device file"
    with pytest.raises(DaemonError, match="exists and is a device file, not a socket"):
        claim.refuse_non_socket()


# -- binding and releasing -----------------------------------------------------------------


def test_a_socket_that_cannot_be_moved_into_place_is_unsafe_path_naming_the_reason(tmp_path):
    claim = SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    (tmp_path / "admin.sock").mkdir()
    (tmp_path / "admin.sock" / "occupied").write_text("")
    sock = bind_unix(claim.staging_path)
    try:
        with pytest.raises(DaemonError) as raised:
            claim.bound()
        assert raised.value.code is DaemonErrorCode.UNSAFE_PATH
        assert f"cannot put the socket in place at {tmp_path / 'admin.sock'} (--admin-address): " in str(raised.value)
    finally:
        sock.close()
        claim.release()
    assert not claim.staging_path.exists() and (tmp_path / "admin.sock" / "occupied").exists()


def test_release_removes_a_socket_bound_but_not_yet_moved_into_place(tmp_path):
    claim = SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    sock = bind_unix(claim.staging_path)
    sock.close()
    claim.release()
    assert not os.path.lexists(claim.staging_path) and not os.path.lexists(claim.lock_path)


def test_release_leaves_a_file_that_is_not_a_socket_at_the_staging_path(tmp_path):
    claim = SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    claim.staging_path.write_text("not ours")
    claim.release()
    assert claim.staging_path.read_text() == "not ours"


def test_release_after_our_socket_was_removed_by_someone_else_is_quiet(tmp_path):
    claim = SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    sock = bind_unix(claim.staging_path)
    claim.bound()
    sock.close()
    (tmp_path / "admin.sock").unlink()
    claim.release()
    claim.release()  # idempotent
    assert not os.path.lexists(claim.lock_path)


def test_a_regular_file_given_as_a_tree_is_refused_before_any_removal_is_tried(tmp_path, caplog):
    (tmp_path / "file").write_text("keep")
    with caplog.at_level(logging.WARNING, logger=runtime_files.log.name):
        assert remove_private_tree(tmp_path / "file") is False
    assert [r.getMessage() for r in caplog.records] == [
        f"not removing {tmp_path / 'file'}: it is a symbolic link, not a directory, or not this user's"
    ]


class VanishingEntry:
    """A directory entry that is gone by the time the sweep looks at it."""

    def __init__(self, parent: Path, name: str) -> None:
        self.name, self.path = name, str(parent / name)

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        raise FileNotFoundError(2, "No such file or directory", self.path)

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        raise FileNotFoundError(2, "No such file or directory", self.path)


def test_a_run_dir_that_vanishes_during_the_sweep_is_skipped_and_the_sweep_goes_on(tmp_path, monkeypatch):
    stale = tmp_path / f"d{DEAD_PID}"
    stale.mkdir()
    real_scandir = os.scandir

    def scandir(path="."):
        if isinstance(path, (str, os.PathLike)) and Path(path) == tmp_path:
            return [VanishingEntry(tmp_path, "d1"), *real_scandir(path)]
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert remove_stale_run_dirs(tmp_path) == [stale]


def lock_fd_flags(lock_path: Path) -> int:
    """The open flags of this process's descriptor on `lock_path` (from /proc/self/fdinfo)."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(lock_path):
                with open(f"/proc/self/fdinfo/{fd}") as info:
                    return int(next(line for line in info if line.startswith("flags:")).split()[1], 8)
        except OSError:
            continue
    raise AssertionError(f"no descriptor open on {lock_path}")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fdinfo"), reason="needs /proc/self/fdinfo")
def test_the_lock_is_held_on_a_descriptor_closed_on_exec_and_never_blocking(tmp_path):
    claim = SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    try:
        flags = lock_fd_flags(claim.lock_path)
        assert flags & os.O_CLOEXEC and flags & os.O_NONBLOCK and flags & os.O_RDWR
    finally:
        claim.release()


def test_a_lock_path_that_is_a_fifo_of_ours_is_refused_as_not_a_regular_file(tmp_path):
    os.mkfifo(tmp_path / "admin.sock.lock", 0o600)
    with pytest.raises(DaemonError, match="is not a regular file of this user") as raised:
        SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    assert raised.value.code is DaemonErrorCode.UNSAFE_PATH


@pytest.mark.skipif(os.getuid() != 0, reason="only root can give a file to another user")
def test_a_lock_file_of_another_user_is_refused(tmp_path):
    lock = tmp_path / "admin.sock.lock"
    lock.write_text("")
    os.chown(lock, OTHER_UID, OTHER_UID)
    with pytest.raises(DaemonError, match="is not a regular file of this user"):
        SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")


def test_the_holder_named_in_the_refusal_is_the_lock_files_first_32_characters(tmp_path):
    first = SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    try:
        first.lock_path.write_text("1234567890" * 4)  # a holder's record longer than any pid
        with pytest.raises(DaemonError) as raised:
            SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
        assert f"(pid {('1234567890' * 4)[:32]}) holds" in str(raised.value)
    finally:
        first.release()


def test_the_lock_file_holds_exactly_this_process_id(tmp_path):
    (tmp_path / "admin.sock.lock").write_text("a much longer record left by an earlier daemon\n")
    claim = SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    try:
        assert claim.lock_path.read_text() == f"{os.getpid()}\n"
    finally:
        claim.release()


@pytest.mark.parametrize("swap", ["removed", "replaced"])
def test_a_lock_file_removed_or_replaced_while_locking_is_locked_again_on_the_fresh_file(tmp_path, monkeypatch, swap):
    """The holder releases (and unlinks, or a new holder recreates) the file between our open and our flock."""
    lock_path = tmp_path / "admin.sock.lock"
    real_flock = runtime_files.fcntl.flock
    calls = []

    def flock(fd, operation):
        calls.append(fd)
        real_flock(fd, operation)
        if len(calls) == 1:
            lock_path.unlink()
            if swap == "replaced":
                lock_path.write_text("")

    monkeypatch.setattr(runtime_files.fcntl, "flock", flock)
    claim = SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    try:
        assert len(calls) == 2
        assert lock_path.read_text() == f"{os.getpid()}\n"
    finally:
        claim.release()
    assert not lock_path.exists()


def test_a_stale_socket_gone_before_it_is_removed_is_no_error(tmp_path, monkeypatch):
    claim = SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    try:
        monkeypatch.setattr(claim, "existing", lambda: "socket")  # seen a moment ago, gone now
        claim.remove_stale_socket()
    finally:
        claim.release()


def test_release_after_the_lock_file_was_removed_is_quiet(tmp_path):
    claim = SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    claim.lock_path.unlink()
    claim.release()
    assert not claim.lock_path.exists()


# -- what the tests above leave open ----------------------------------------------


needs_proc_fd = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")


def test_a_new_runtime_dir_is_private_from_the_moment_it_is_made_not_only_once_tightened(tmp_path, monkeypatch):
    modes = []
    real_fchmod = os.fchmod

    def fchmod(fd, mode):
        modes.append(stat.S_IMODE(os.fstat(fd).st_mode))  # as os.mkdir left it
        real_fchmod(fd, mode)

    monkeypatch.setattr(runtime_files.os, "fchmod", fchmod)
    old_umask = os.umask(0)
    try:
        make_private_dir(tmp_path / "rt")
    finally:
        os.umask(old_umask)
    assert modes == [0o700]


def test_a_runtime_dir_of_another_user_is_refused_and_left_as_it_was(tmp_path, monkeypatch):
    loose = tmp_path / "rt"
    loose.mkdir()
    loose.chmod(0o777)
    owner = loose.stat().st_uid
    monkeypatch.setattr(runtime_files.os, "getuid", lambda: OTHER_UID)  # the directory is now another user's
    with pytest.raises(DaemonError) as raised:
        make_private_dir(loose)
    assert raised.value.code is DaemonErrorCode.UNSAFE_PATH
    assert f"belongs to uid {owner}, not to this user (uid {OTHER_UID})" in str(raised.value)
    assert stat.S_IMODE(loose.stat().st_mode) == 0o777


@needs_proc_fd
def test_making_a_runtime_dir_leaves_no_descriptor_open_whether_or_not_it_is_refused(tmp_path, monkeypatch):
    make_private_dir(tmp_path / "rt")
    monkeypatch.setattr(runtime_files.os, "getuid", lambda: OTHER_UID)
    with pytest.raises(DaemonError):
        make_private_dir(tmp_path / "rt")
    monkeypatch.undo()
    assert descriptors_on(tmp_path) == {}


def test_a_numbered_entry_without_the_d_prefix_is_not_swept(tmp_path):
    for name in (f"x{DEAD_PID}", f"{DEAD_PID}", f"p{DEAD_PID}"):
        (tmp_path / name).mkdir()
    assert remove_stale_run_dirs(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"x{DEAD_PID}", f"{DEAD_PID}", f"p{DEAD_PID}"])


def test_a_stale_run_dir_that_could_not_be_removed_is_not_reported_removed(tmp_path, monkeypatch):
    stale = tmp_path / f"d{DEAD_PID}"
    stale.mkdir()
    (stale / "stuck").write_text("")
    refuse_to_unlink_stuck(monkeypatch)
    assert remove_stale_run_dirs(tmp_path) == []
    assert stale.is_dir()


def test_a_holder_that_left_no_pid_is_named_unknown(tmp_path):
    first = SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    try:
        first.lock_path.write_text("")
        with pytest.raises(DaemonError) as raised:
            SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
        assert "another stagevisor daemon (pid unknown) holds" in str(raised.value)
    finally:
        first.release()


@needs_proc_fd
def test_a_refused_claim_and_a_released_one_leave_no_descriptor_open(tmp_path):
    first = SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    assert descriptors_on(tmp_path)  # the held lock, which the check sees
    with pytest.raises(DaemonError):
        SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    first.release()
    assert descriptors_on(tmp_path) == {}


def test_a_file_at_the_staging_path_that_is_not_a_socket_is_never_moved_into_place(tmp_path):
    claim = SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    try:
        claim.staging_path.write_text("planted")
        with pytest.raises(DaemonError) as raised:
            claim.bound()
        assert raised.value.code is DaemonErrorCode.UNSAFE_PATH
        assert "is not the socket this daemon bound" in str(raised.value)
        assert not claim.path.exists() and claim.staging_path.read_text() == "planted"
    finally:
        claim.release()
        claim.staging_path.unlink()


def test_release_leaves_a_lock_file_that_another_daemon_made_since(tmp_path):
    claim = SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    fresh = tmp_path / "fresh"
    fresh.write_text("999\n")
    os.replace(fresh, claim.lock_path)  # our file unlinked and a new one put in its place
    claim.release()
    assert claim.lock_path.read_text() == "999\n"
    claim.lock_path.unlink()


def test_each_daemon_binds_first_at_a_staging_path_of_its_own_beside_the_socket(tmp_path):
    claim = SocketClaim(tmp_path / "admin.sock", "--admin-address")
    assert claim.staging_path == tmp_path / f".admin.sock.{os.getpid()}"
    assert claim.lock_path == tmp_path / "admin.sock.lock"


def test_a_directory_at_the_socket_path_is_refused_by_name_and_kept(tmp_path):
    (tmp_path / "admin.sock").mkdir()
    claim = SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    try:
        assert claim.existing() == "a directory"
        with pytest.raises(DaemonError, match="exists and is a directory, not a socket") as raised:
            claim.remove_stale_socket()
        assert raised.value.code is DaemonErrorCode.UNSAFE_PATH
    finally:
        claim.release()
    assert (tmp_path / "admin.sock").is_dir()


def test_a_symbolic_link_at_the_socket_path_is_refused_by_name_and_neither_it_nor_its_target_touched(tmp_path):
    target = tmp_path / "target"
    target.write_text("keep")
    (tmp_path / "admin.sock").symlink_to(target)
    claim = SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    try:
        assert claim.existing() == "a symbolic link"
        with pytest.raises(DaemonError, match="exists and is a symbolic link, not a socket"):
            claim.refuse_non_socket()
    finally:
        claim.release()
    assert (tmp_path / "admin.sock").is_symlink() and target.read_text() == "keep"


def test_a_lock_file_that_cannot_be_opened_says_to_remove_it_or_choose_another_address(tmp_path):
    (tmp_path / "admin.sock.lock").mkdir()
    with pytest.raises(DaemonError) as raised:
        SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    assert str(raised.value).endswith("; remove it or choose another --admin-address")


def test_the_run_dir_of_another_live_process_is_not_swept(tmp_path):
    parent = os.getppid()  # alive as long as this test runs
    (tmp_path / f"d{parent}").mkdir()
    assert remove_stale_run_dirs(tmp_path) == []
    assert (tmp_path / f"d{parent}").is_dir()


def test_a_runtime_dir_that_cannot_be_opened_is_an_unsafe_path_saying_why(tmp_path, monkeypatch):
    real_open = os.open

    def refusing(path, flags, *args, **kwargs):
        if os.fspath(path) == str(tmp_path / "rt"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(runtime_files.os, "open", refusing)
    with pytest.raises(DaemonError) as raised:
        make_private_dir(tmp_path / "rt")
    assert raised.value.code is DaemonErrorCode.UNSAFE_PATH
    assert f"runtime directory {tmp_path / 'rt'} cannot be opened: Permission denied" in str(raised.value)


# Another user's files, for any user running the tests: this process pretends to be OTHER_UID.


def test_another_users_tree_is_left_alone_whoever_runs_the_tests(tmp_path, monkeypatch):
    (tmp_path / "theirs" / "inside").mkdir(parents=True)
    monkeypatch.setattr(runtime_files.os, "getuid", lambda: OTHER_UID)
    assert remove_private_tree(tmp_path / "theirs") is False
    assert (tmp_path / "theirs" / "inside").is_dir()


def test_another_users_run_dir_is_not_swept_whoever_runs_the_tests(tmp_path, monkeypatch):
    (tmp_path / f"d{DEAD_PID}").mkdir()
    monkeypatch.setattr(runtime_files.os, "getuid", lambda: OTHER_UID)
    assert remove_stale_run_dirs(tmp_path) == []
    assert (tmp_path / f"d{DEAD_PID}").is_dir()


def test_a_lock_file_of_another_user_is_refused_whoever_runs_the_tests(tmp_path, monkeypatch):
    (tmp_path / "admin.sock.lock").write_text("")
    monkeypatch.setattr(runtime_files.os, "getuid", lambda: OTHER_UID)
    with pytest.raises(DaemonError, match="is not a regular file of this user") as raised:
        SocketClaim.acquire(tmp_path / "admin.sock", "--admin-address")
    assert raised.value.code is DaemonErrorCode.UNSAFE_PATH
