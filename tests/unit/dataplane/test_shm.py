"""The shared-memory area's rules: who may open it, the files' modes and owners, sizes, room and names."""

from __future__ import annotations

import logging
import os
import stat
from types import SimpleNamespace

import pytest

from stagevisor.supervisor.dataplane import shm
from tests.descriptors import descriptors_on
from tests.fakes import FakeClock

OTHER_UID = 54321
root_only = pytest.mark.skipif(os.getuid() != 0, reason="only root can give a file to another user")


@pytest.fixture
def area(tmp_path):
    area = shm.SharedArea.create(tmp_path / "area")
    yield area
    area.remove()


def write_of(name: str) -> str:
    """A token naming a write into the file `name`, as a SegmentPool hands them out."""
    return f"{name}.1"


@pytest.fixture
def pool(area):
    """A pool of up to 4 free files on a clock that stands still until a test moves it; closed after the test."""
    pool = shm.SegmentPool(area, max_free=4, clock=FakeClock())
    yield pool
    pool.close()


@pytest.mark.parametrize("mode", [0o750, 0o710, 0o720, 0o740, 0o770, 0o701, 0o702, 0o704])
def test_an_area_any_group_or_other_permission_makes_shared_is_refused_naming_the_mode(tmp_path, mode):
    path = tmp_path / "area"
    path.mkdir()
    path.chmod(mode)
    with pytest.raises(shm.SharedMemoryError, match=f"not private to this user .*mode {mode:o}"):
        shm.SharedArea.open(path)


def test_an_area_of_this_user_with_mode_0700_opens(tmp_path):
    path = tmp_path / "area"
    path.mkdir()
    path.chmod(0o700)
    shm.SharedArea.open(path).close()


@root_only
def test_an_area_of_another_user_is_refused_naming_its_owner(tmp_path):
    path = tmp_path / "area"
    path.mkdir(mode=0o700)
    os.chown(path, OTHER_UID, OTHER_UID)
    with pytest.raises(shm.SharedMemoryError, match=f"owner uid {OTHER_UID}"):
        shm.SharedArea.open(path)


def test_an_area_is_created_private_and_never_over_something_already_there(tmp_path):
    area = shm.SharedArea.create(tmp_path / "area")
    try:
        assert stat.S_IMODE(os.stat(area.path).st_mode) == 0o700
    finally:
        area.remove()
    (tmp_path / "taken").mkdir()
    with pytest.raises(FileExistsError):
        shm.SharedArea.create(tmp_path / "taken")


def test_a_missing_area_cannot_be_opened_and_says_why(tmp_path):
    with pytest.raises(shm.SharedMemoryError, match="cannot open the shared-memory directory"):
        shm.SharedArea.open(tmp_path / "nowhere")


def test_a_buffer_file_is_readable_and_writable_by_its_owner_only_whatever_the_umask(area):
    previous = os.umask(0)
    try:
        name, mapped = area.allocate(64)
    finally:
        os.umask(previous)
    mapped.close()
    assert stat.S_IMODE(os.stat(area.path / name).st_mode) == 0o600


def test_a_buffer_file_is_named_by_its_writers_pid_and_has_its_size_reserved(area):
    name, mapped = area.allocate(4096)
    mapped.close()
    pid, _, token = name.partition("-")
    assert int(pid) == os.getpid() and len(token) == 16 and int(token, 16) >= 0
    assert os.stat(area.path / name).st_size == 4096


def test_an_empty_buffer_has_a_file_and_no_mapping(area):
    name, mapped = area.allocate(0)
    assert mapped is None and name in area.files()


@root_only
def test_a_buffer_file_of_another_user_is_refused(area):
    name, mapped = area.allocate(16)
    mapped.close()
    os.chown(area.path / name, OTHER_UID, OTHER_UID)
    with pytest.raises(shm.SharedMemoryError, match="not a regular file of this user"):
        area.map(write_of(name), 16)


def test_a_buffer_holding_exactly_the_size_announced_maps_and_a_smaller_one_is_refused(area):
    name, mapped = area.allocate(16)
    mapped[:16] = b"0123456789abcdef"
    mapped.close()
    view = area.map(write_of(name), 16)
    assert view[:] == b"0123456789abcdef"
    view.close()
    with pytest.raises(shm.SharedMemoryError, match="holds 16 bytes, not 17"):
        area.map(write_of(name), 17)


def test_a_receivers_writes_to_a_mapped_buffer_stay_its_own(area):
    name, mapped = area.allocate(4)
    mapped[:4] = b"abcd"
    view = area.map(write_of(name), 4)
    view[:4] = b"wxyz"
    assert mapped[:4] == b"abcd"
    view.close()
    mapped.close()


def test_unlinking_a_buffer_that_is_gone_is_no_error(area):
    area.unlink("1-0000000000000000")


def test_the_area_sweeps_no_file_of_its_own_process(area, monkeypatch):
    monkeypatch.setattr(shm, "pid_alive", lambda pid: False)
    name, mapped = area.allocate(8)
    mapped.close()
    (area.path / "999999-00000000000000f0").write_bytes(b"x")
    assert area.sweep_dead_writers() == 1
    assert area.files() == [name]


def test_closing_an_area_twice_is_harmless(tmp_path):
    area = shm.SharedArea.create(tmp_path / "area")
    area.close()
    area.close()
    area.remove()
    assert not (tmp_path / "area").exists()


def test_removing_an_area_that_is_gone_is_no_error(tmp_path):
    area = shm.SharedArea.create(tmp_path / "area")
    area.remove()
    area.remove()


# ---- orphan areas and the start-up check --------------------------------------------


def test_a_new_area_path_names_its_user_and_daemon_and_is_unguessable(tmp_path):
    first, second = shm.new_area_path(tmp_path), shm.new_area_path(tmp_path)
    assert first.parent == tmp_path and first != second
    prefix = f"stagevisor-{os.getuid()}-{os.getpid()}-"
    assert first.name.startswith(prefix) and len(first.name) == len(prefix) + 16


def test_the_area_root_is_dev_shm_unless_the_environment_names_another(monkeypatch, tmp_path):
    monkeypatch.delenv(shm.SHM_DIR_ENV, raising=False)
    assert shm.shm_root() == shm.SHM_ROOT
    monkeypatch.setenv(shm.SHM_DIR_ENV, str(tmp_path))
    assert shm.shm_root() == tmp_path
    assert shm.new_area_path().parent == tmp_path


@pytest.mark.parametrize(
    "raw, expected", [("", 16 * 1024 * 1024), ("1048576", 1048576), ("1e6", 16 * 1024 * 1024), ("²", 16 * 1024 * 1024)]
)
def test_the_bytes_per_request_come_from_the_environment_when_a_whole_number(monkeypatch, raw, expected):
    monkeypatch.setenv(shm.SHM_BYTES_PER_REQUEST_ENV, raw)
    assert shm.bytes_per_request() == expected


def test_the_areas_of_this_daemon_and_of_other_users_are_never_swept(tmp_path, monkeypatch):
    monkeypatch.setattr(shm, "pid_alive", lambda pid: False)
    uid = os.getuid()
    own = tmp_path / f"stagevisor-{uid}-{os.getpid()}-{'a' * 16}"
    other_user = tmp_path / f"stagevisor-{uid + 1}-999999-{'b' * 16}"
    plain_file = tmp_path / f"stagevisor-{uid}-999998-{'c' * 16}"
    for path in (own, other_user):
        path.mkdir()
    plain_file.write_bytes(b"x")
    assert shm.remove_orphan_areas(tmp_path) == 0
    assert own.exists() and other_user.exists() and plain_file.exists()


def test_a_sweep_for_one_daemon_removes_its_area_only(tmp_path, monkeypatch):
    """What `stagevisor bench` runs once the daemon it started has ended: that daemon's area goes (a SIGKILL left
    it), any other dead daemon's stays for its own user's next daemon start to judge."""
    monkeypatch.setattr(shm, "pid_alive", lambda pid: False)
    uid = os.getuid()
    ours = tmp_path / f"stagevisor-{uid}-999997-{'a' * 16}"
    other = tmp_path / f"stagevisor-{uid}-999996-{'b' * 16}"
    for path in (ours, other):
        path.mkdir()
        (path / f"999995-{'c' * 16}").write_bytes(b"x")  # a worker's pooled file inside
    assert shm.remove_orphan_areas(tmp_path, daemon=999997) == 1
    assert not ours.exists() and other.exists()


def test_sweeping_orphans_under_a_missing_root_removes_nothing(tmp_path):
    assert shm.remove_orphan_areas(tmp_path / "nowhere") == 0


def test_a_root_with_room_enough_is_ok_and_reports_its_figures(tmp_path):
    room = shm.check_room(tmp_path, 1)
    assert room.ok and room.root == tmp_path and room.needed == 1 and room.free >= 1 and room.reason == ""


def test_a_root_with_less_room_than_needed_says_how_much_in_mib(tmp_path, monkeypatch):
    monkeypatch.setattr(shm, "free_bytes", lambda root: 3 * 1024 * 1024)
    room = shm.check_room(tmp_path, 3 * 1024 * 1024 + 1)
    assert not room.ok and room.free == 3 * 1024 * 1024
    assert room.reason == f"{tmp_path} has 3.0 MiB free, the pool needs 3.0 MiB"
    assert shm.check_room(tmp_path, 3 * 1024 * 1024).ok


def test_a_root_that_is_missing_or_not_a_directory_is_not_ok(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    for root in (tmp_path / "nowhere", tmp_path / "file"):
        room = shm.check_room(root, 1)
        assert not room.ok and room.reason == f"{root} is not a writable directory"
        assert (room.free, room.needed) == (0, 1)


def test_a_root_that_cannot_be_inspected_says_why(tmp_path, monkeypatch):
    def fail(root):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(shm, "free_bytes", fail)
    room = shm.check_room(tmp_path, 1)
    assert not room.ok and room.reason == f"{tmp_path} cannot be inspected: Permission denied"
    assert (room.free, room.needed) == (0, 1)


def test_free_bytes_are_the_blocks_an_unprivileged_writer_may_still_allocate(tmp_path, monkeypatch):
    figures = SimpleNamespace(f_bavail=10, f_bfree=12, f_frsize=4096, f_bsize=8192)
    monkeypatch.setattr(shm.os, "statvfs", lambda root: figures if root == tmp_path else None)
    assert shm.free_bytes(tmp_path) == 10 * 4096


def test_sizes_are_shown_in_mib_with_one_decimal():
    assert shm.mib(1536 * 1024) == "1.5 MiB"
    assert shm.mib(1000 * 1024 * 1024) == "1000.0 MiB"


def test_a_regular_file_given_as_the_area_is_refused_as_not_a_directory(tmp_path):
    path = tmp_path / "area"
    path.write_bytes(b"")
    path.chmod(0o600)
    with pytest.raises(shm.SharedMemoryError, match="cannot open the shared-memory directory: Not a directory"):
        shm.SharedArea.open(path)


# ---- the sender's pool ---------------------------------------------------------------


def test_a_pool_keeping_one_free_file_reuses_it_even_without_a_peak_window(area):
    pool = shm.SegmentPool(area, max_free=1, peak_seconds=0)
    first = pool.write(memoryview(b"x" * 64))
    pool.release(first)
    assert shm.file_of(pool.write(memoryview(b"y" * 64))) == shm.file_of(first)
    assert pool.created == 1
    pool.close()


def test_a_pool_keeping_no_free_file_removes_each_file_once_released(area):
    pool = shm.SegmentPool(area, max_free=0, peak_seconds=0)
    first = pool.write(memoryview(b"x" * 64))
    assert shm.file_of(first) in area.files()
    pool.release(first)
    assert area.files() == [] and pool.files() == 0 and pool.held_bytes() == 0
    pool.close()


def test_a_burst_is_remembered_for_exactly_the_peak_window_and_forgotten_after_it(area):
    clock = FakeClock(1000.0)
    pool = shm.SegmentPool(area, max_free=1, peak_seconds=30.0, clock=clock)
    try:
        for name in [pool.write(memoryview(b"b" * 64)) for _ in range(3)]:  # three in flight at once
            pool.release(name)
        assert pool.files() == 3
        clock.now = 1030.0  # the window's last instant: the three stay, written or released
        again = pool.write(memoryview(b"c" * 64))
        assert pool.files() == 3
        pool.release(again)
        assert pool.files() == 3
        clock.now = 1030.5  # past it: trimmed back to max_free
        pool.release(pool.write(memoryview(b"d" * 64)))
        assert pool.files() == 1
    finally:
        pool.close()
    assert pool.files() == 0 and pool.held_bytes() == 0


def test_a_new_buffer_file_is_never_opened_over_something_already_at_its_name(area, monkeypatch):
    monkeypatch.setattr(shm.secrets, "token_hex", lambda n: "0" * (2 * n))
    target = area.path.parent / "target"
    target.write_bytes(b"keep")
    (area.path / f"{os.getpid()}-{'0' * 16}").symlink_to(target)
    with pytest.raises(FileExistsError):
        area.allocate(4096)
    assert target.read_bytes() == b"keep"


def test_an_area_opened_on_descriptor_0_is_closed_like_any_other(tmp_path):
    path = tmp_path / "area"
    path.mkdir(mode=0o700)
    saved = os.dup(0)
    try:
        os.close(0)
        area = shm.SharedArea.open(path)  # the lowest free descriptor: 0
        opened = os.fstat(0)
        assert stat.S_ISDIR(opened.st_mode)
        area.close()
        try:
            now = os.fstat(0)
        except OSError:
            return  # closed, and not taken again yet
        # Another thread of the test process may take the free descriptor 0 at once: not the area's directory.
        assert (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino)
    finally:
        os.dup2(saved, 0)
        os.close(saved)


@root_only
def test_removing_an_area_that_now_belongs_to_another_user_leaves_it(tmp_path):
    area = shm.SharedArea.create(tmp_path / "area")
    (area.path / "1-0000000000000001").write_bytes(b"x")
    os.chown(area.path, OTHER_UID, OTHER_UID)
    area.remove()
    assert (tmp_path / "area" / "1-0000000000000001").exists()
    os.chown(tmp_path / "area", os.getuid(), os.getgid())  # the fixture's own clean-up


def test_an_area_that_cannot_be_swept_is_logged_with_its_error_and_the_sweep_goes_on(tmp_path, monkeypatch, caplog):
    def unknowable(pid):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(shm, "pid_alive", unknowable)
    (tmp_path / f"stagevisor-{os.getuid()}-999999-{'a' * 16}").mkdir()
    with caplog.at_level(logging.DEBUG, logger=shm.__name__):
        assert shm.remove_orphan_areas(tmp_path) == 0
    [record] = [r for r in caplog.records if r.getMessage().startswith("cannot sweep")]
    assert record.exc_info is not None and isinstance(record.exc_info[1], PermissionError)


def test_a_pool_file_that_cannot_be_unlinked_is_logged_with_its_error(area, monkeypatch, caplog):
    pool = shm.SegmentPool(area, max_free=0, peak_seconds=0)
    name = shm.file_of(written := pool.write(memoryview(b"x" * 64)))

    def refuse(name):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(area, "unlink", refuse)
    with caplog.at_level(logging.DEBUG, logger=shm.__name__):
        pool.drop(written)
    [record] = [r for r in caplog.records if r.getMessage() == f"cannot unlink shared buffer {name}"]
    assert record.exc_info is not None and isinstance(record.exc_info[1], PermissionError)
    monkeypatch.undo()
    area.unlink(name)


def test_a_link_to_a_private_directory_is_not_opened_as_an_area(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(shm.SharedMemoryError, match="cannot open the shared-memory directory"):
        shm.SharedArea.open(tmp_path / "link")


def test_a_refused_buffer_name_is_quoted_at_most_80_characters_long(area):
    name = "n" * 100
    with pytest.raises(shm.SharedMemoryError) as caught:
        area.map(name, 4)
    assert caught.value.strerror == f"refusing shared buffer name {'n' * 80!r}"


def test_the_sweep_goes_on_past_names_it_skips(area, monkeypatch):
    monkeypatch.setattr(shm, "pid_alive", lambda pid: False)
    own = f"{os.getpid()}-{'1' * 16}"
    dead = f"999999-{'2' * 16}"
    for name in (own, dead, "notes"):
        (area.path / name).write_bytes(b"x")
    monkeypatch.setattr(area, "files", lambda: ["notes", own, dead])
    assert area.sweep_dead_writers() == 1
    assert not (area.path / dead).exists() and (area.path / own).exists()


def test_the_orphan_sweep_goes_on_past_entries_it_skips(tmp_path, monkeypatch):
    monkeypatch.setattr(shm, "pid_alive", lambda pid: False)
    scandir = os.scandir

    def in_name_order(root):  # the sweep's own listing sorted; rmtree's (by descriptor) untouched
        return sorted(scandir(root), key=lambda e: e.name) if root == tmp_path else scandir(root)

    monkeypatch.setattr(shm.os, "scandir", in_name_order)
    (tmp_path / "aaa-not-an-area").mkdir()
    (tmp_path / f"stagevisor-{os.getuid()}-999990-{'a' * 16}").write_bytes(b"")  # named like one, not a directory
    dead = tmp_path / f"stagevisor-{os.getuid()}-999999-{'d' * 16}"
    dead.mkdir()
    assert shm.remove_orphan_areas(tmp_path) == 1
    assert not dead.exists()


def test_a_free_file_more_than_twice_the_size_needed_is_not_reused(pool):
    pool.release(pool.write(memoryview(b"x" * 64)))
    pool.write(memoryview(b"y" * 31))  # 64 > 2 x 31: a file of its own
    assert pool.created == 2
    pool.write(memoryview(b"z" * 32))  # 64 = 2 x 32: the free file fits
    assert pool.created == 2


def test_an_empty_buffer_without_a_mapping_is_dropped_like_any_other(area):
    pool = shm.SegmentPool(area, max_free=4)
    name = pool.write(memoryview(b""))
    assert shm.file_of(name) in area.files()
    pool.drop(name)
    assert area.files() == [] and pool.files() == 0
    pool.close()


def test_a_dropped_buffer_s_mapping_is_closed(area):
    pool = shm.SegmentPool(area, max_free=4)
    name = pool.write(memoryview(b"x" * 64))
    mapped = area.map(name, 64)
    mapped.close()
    pool.drop(name)
    assert area.files() == []
    pool.close()


def test_a_file_the_area_cannot_remove_is_logged_by_its_path_with_its_error(tmp_path, monkeypatch, caplog):
    area = shm.SharedArea.create(tmp_path / "area")
    (area.path / "stuck").write_bytes(b"x")
    unlink = os.unlink

    def refuse_stuck(name, *args, **kwargs):
        if str(name).endswith("stuck"):
            raise PermissionError(1, "Operation not permitted")
        return unlink(name, *args, **kwargs)

    monkeypatch.setattr(shm.os, "unlink", refuse_stuck)
    with caplog.at_level(logging.DEBUG, logger=shm.__name__):
        area.remove()
    monkeypatch.undo()
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [f"cannot remove {area.path / 'stuck'}", f"cannot remove {area.path}"]  # then its directory
    record = caplog.records[0]
    assert record.exc_info is not None and isinstance(record.exc_info[1], PermissionError)
    area.remove()


def test_the_start_up_check_s_findings_are_immutable_values(tmp_path):
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        shm.check_room(tmp_path, 1).ok = False  # type: ignore[misc]


def test_a_root_this_user_may_not_write_to_is_not_ok(tmp_path, monkeypatch):
    access = os.access
    monkeypatch.setattr(shm.os, "access", lambda path, mode: not mode & os.W_OK and access(path, mode))
    room = shm.check_room(tmp_path, 1)  # as root every directory is writable: the denial is simulated
    assert not room.ok and room.reason == f"{tmp_path} is not a writable directory"


def test_an_executable_file_is_not_a_root_either(tmp_path):
    path = tmp_path / "tool"
    path.write_bytes(b"")
    path.chmod(0o755)
    room = shm.check_room(path, 1)
    assert not room.ok and room.reason == f"{path} is not a writable directory"


def test_a_buffer_whose_pages_cannot_be_reserved_leaves_no_file_behind(area, monkeypatch):
    def full(fd, offset, size):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shm.os, "posix_fallocate", full)
    with pytest.raises(OSError, match="No space left on device"):
        area.allocate(4096)
    assert area.files() == []


def test_a_burst_as_large_as_the_last_one_starts_the_window_again(area):
    clock = FakeClock(1000.0)
    pool = shm.SegmentPool(area, max_free=1, peak_seconds=30.0, clock=clock)
    try:
        for _ in range(2):  # the same three in flight at once, twice, 20 s apart
            for name in [pool.write(memoryview(b"b" * 64)) for _ in range(3)]:
                pool.release(name)
            clock.advance(20.0)
        clock.advance(-5.0)  # 35 s after the first burst, 15 s after the second: its files stay
        pool.release(pool.write(memoryview(b"c" * 64)))
        assert pool.files() == 3
    finally:
        pool.close()


def test_an_idle_pool_gives_a_burst_s_files_back_only_once_its_window_is_past(area):
    clock = FakeClock(1000.0)
    pool = shm.SegmentPool(area, max_free=1, peak_seconds=30.0, clock=clock)
    try:
        for name in [pool.write(memoryview(b"b" * 64)) for _ in range(3)]:
            pool.release(name)
        clock.now = 1030.0
        pool.expire()  # the window's last instant
        assert pool.files() == 3
        clock.now = 1030.5
        pool.expire()
        assert pool.files() == 1
    finally:
        pool.close()


def test_of_free_files_of_one_size_the_least_recently_released_is_reused_first(pool):
    first, second = pool.write(memoryview(b"a" * 64)), pool.write(memoryview(b"b" * 64))
    pool.release(first)
    pool.release(second)
    assert shm.file_of(pool.write(memoryview(b"c" * 64))) == shm.file_of(first)


# ---- what the tests above leave open ------------------------------------------------


def mapped_paths() -> str:
    with open("/proc/self/maps") as maps:
        return maps.read()


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self")


@needs_proc
def test_an_area_refused_as_not_private_leaves_no_descriptor_open(tmp_path):
    path = tmp_path / "area"
    path.mkdir()
    path.chmod(0o755)
    with pytest.raises(shm.SharedMemoryError):
        shm.SharedArea.open(path)
    assert descriptors_on(path) == {}


@needs_proc
def test_mapping_a_buffer_or_refusing_it_leaves_no_descriptor_open(area):
    name, written = area.allocate(64)
    assert descriptors_on(area.path / name)  # a mapping holds a descriptor of its own, which the check sees
    written.close()
    area.map(write_of(name), 64).close()
    with pytest.raises(shm.SharedMemoryError):
        area.map(write_of(name), 65)
    assert descriptors_on(area.path / name) == {}


@needs_proc
def test_a_dropped_or_closed_pool_file_is_unmapped_from_the_sender(area):
    pool = shm.SegmentPool(area, max_free=4)
    dropped, kept = pool.write(memoryview(b"x" * 4096)), pool.write(memoryview(b"y" * 4096))
    dropped_file, kept_file = shm.file_of(dropped), shm.file_of(kept)
    assert dropped_file in mapped_paths() and kept_file in mapped_paths()
    pool.drop(dropped)
    assert dropped_file not in mapped_paths() and kept_file in mapped_paths()
    pool.close()
    assert kept_file not in mapped_paths()


def test_a_reused_file_is_held_at_its_whole_capacity_and_a_dropped_one_not_at_all(pool):
    first = pool.write(memoryview(b"a" * 100))
    pool.release(first)
    second = pool.write(memoryview(b"b" * 60))  # fits in the 100-byte file: reused
    assert shm.file_of(second) == shm.file_of(first) and pool.held_bytes() == 100
    pool.release(second)
    assert pool.held_bytes() == 100
    third = pool.write(memoryview(b"c" * 80))
    pool.drop(third)
    assert pool.held_bytes() == 0 and pool.files() == 0


def test_of_free_files_that_fit_the_smallest_is_reused(pool):
    larger, smaller = pool.write(memoryview(b"a" * 150)), pool.write(memoryview(b"b" * 110))
    pool.release(larger)
    pool.release(smaller)
    assert shm.file_of(pool.write(memoryview(b"c" * 100))) == shm.file_of(smaller)


@pytest.mark.parametrize("suffix", [".evil", "0", "\n"])
def test_a_name_that_only_starts_like_a_buffer_name_is_refused(area, suffix):
    name = f"{os.getpid()}-0123456789abcdef{suffix}"
    fd = os.open(area.path / name, os.O_CREAT | os.O_WRONLY, 0o600)
    os.ftruncate(fd, 64)
    os.close(fd)
    with pytest.raises(shm.SharedMemoryError, match="refusing shared buffer name") as caught:
        area.map(name, 64)
    assert caught.value.errno == shm.errno.EINVAL


def test_releasing_a_burst_s_files_after_its_window_keeps_only_max_free(area):
    clock = FakeClock(1000.0)
    pool = shm.SegmentPool(area, max_free=1, peak_seconds=10.0, clock=clock)
    try:
        first, second = pool.write(memoryview(b"a" * 64)), pool.write(memoryview(b"b" * 64))
        clock.now = 1020.0  # the burst is past its window when its files come back
        pool.release(first)
        pool.release(second)
        assert pool.files() == 1
    finally:
        pool.close()


def test_an_area_name_followed_by_a_newline_is_not_swept_as_an_orphan(tmp_path, monkeypatch):
    monkeypatch.setattr(shm, "pid_alive", lambda pid: False)
    odd = tmp_path / f"stagevisor-{os.getuid()}-1-0123456789abcdef\n"
    odd.mkdir()
    assert shm.remove_orphan_areas(tmp_path) == 0 and odd.is_dir()


@needs_proc
def test_removing_an_area_closes_its_directory_descriptor(tmp_path):
    area = shm.SharedArea.create(tmp_path / "area")
    assert descriptors_on(tmp_path / "area")
    area.remove()
    assert descriptors_on(tmp_path / "area") == {} and not (tmp_path / "area").exists()


def test_a_room_too_small_names_the_free_and_the_needed_figures_each_in_its_place(tmp_path, monkeypatch):
    monkeypatch.setattr(shm, "free_bytes", lambda root: 1024 * 1024)
    room = shm.check_room(tmp_path, 5 * 1024 * 1024)
    assert room.reason == f"{tmp_path} has 1.0 MiB free, the pool needs 5.0 MiB"


def test_a_buffer_file_larger_than_announced_maps_the_part_announced(area, pool):
    first = pool.write(memoryview(b"a" * 100))
    pool.release(first)
    reused = pool.write(memoryview(b"b" * 60))  # the 100-byte file, reused for 60 bytes
    assert shm.file_of(reused) == shm.file_of(first)
    mapped = area.map(reused, 60)
    try:
        assert len(mapped) == 60 and mapped[:] == b"b" * 60
    finally:
        mapped.close()


def test_a_closed_pool_holds_nothing_busy_or_free(area):
    pool = shm.SegmentPool(area, max_free=4, clock=FakeClock())
    busy = pool.write(memoryview(b"a" * 64))
    pool.release(pool.write(memoryview(b"b" * 64)))
    pool.close()
    assert (pool.busy(), pool.files(), pool.held_bytes()) == (0, 0, 0)
    assert shm.file_of(busy) not in area.files() and area.files() == []


def test_a_full_area_with_no_free_file_to_give_back_fails_the_write_after_one_attempt(area, monkeypatch):
    pool = shm.SegmentPool(area, max_free=4, clock=FakeClock())
    attempts = []

    def full(size):
        attempts.append(size)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(area, "allocate", full)
    with pytest.raises(OSError, match="No space left"):
        pool.write(memoryview(b"x" * 64))
    assert attempts == [64]


def test_each_refusal_carries_the_errno_of_its_kind(tmp_path, area):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o750)
    with pytest.raises(shm.SharedMemoryError) as not_private:
        shm.SharedArea.open(shared)
    os.mkfifo(area.path / f"{os.getpid()}-0123456789abcdef")
    with pytest.raises(shm.SharedMemoryError) as not_regular:
        area.map(write_of(f"{os.getpid()}-0123456789abcdef"), 1)
    pool = shm.SegmentPool(area, max_free=4)
    name = pool.write(memoryview(b"x" * 8))
    with pytest.raises(shm.SharedMemoryError) as too_small:
        area.map(name, 9)
    pool.close()
    assert (not_private.value.errno, not_regular.value.errno, too_small.value.errno) == (
        shm.errno.EPERM,
        shm.errno.EPERM,
        shm.errno.EINVAL,
    )


def test_a_pool_keeps_8_free_files_and_a_burst_s_for_30_seconds_by_default(area):
    pool = shm.SegmentPool(area)
    assert (pool.max_free, pool.peak_seconds, shm.POOL_PEAK_SECONDS) == (8, 30.0, 30.0)


def test_released_files_are_no_longer_busy(pool):
    names = [pool.write(memoryview(b"x" * 64)) for _ in range(3)]
    pool.release(names[0])
    assert (pool.busy(), pool.files()) == (2, 3)


# Another user's files, for any user running the tests: this process pretends to be OTHER_UID.


def test_a_buffer_file_of_another_user_is_refused_whoever_runs_the_tests(area, monkeypatch):
    name, mapped = area.allocate(16)
    mapped.close()
    monkeypatch.setattr(shm.os, "getuid", lambda: OTHER_UID)
    with pytest.raises(shm.SharedMemoryError, match="not a regular file of this user"):
        area.map(write_of(name), 16)


def test_an_area_of_another_user_is_neither_opened_nor_removed_whoever_runs_the_tests(tmp_path, monkeypatch):
    area = shm.SharedArea.create(tmp_path / "area")
    area.close()
    owner = os.stat(tmp_path / "area").st_uid
    monkeypatch.setattr(shm.os, "getuid", lambda: OTHER_UID)
    with pytest.raises(shm.SharedMemoryError, match=f"owner uid {owner}"):
        shm.SharedArea.open(tmp_path / "area")
    area.remove()
    assert (tmp_path / "area").is_dir()


def test_without_an_admission_limit_the_room_check_assumes_8_requests_of_16_mib():
    # as docs/design/data-plane.md says: "8 unless the daemon is given an admission limit"
    assert shm.DEFAULT_CONCURRENT_REQUESTS * shm.DEFAULT_BYTES_PER_REQUEST == 128 * 1024 * 1024
    assert shm.DEFAULT_CONCURRENT_REQUESTS == 8


def test_a_root_that_cannot_be_written_or_inspected_is_marked_unwritable_and_a_full_one_is_not(tmp_path, monkeypatch):
    assert not shm.check_room(tmp_path / "nowhere", 1).writable
    monkeypatch.setattr(shm, "free_bytes", lambda root: 0)
    full = shm.check_room(tmp_path, 1)
    assert not full.ok and full.writable


# ---- a Release names one write, not a file ----------------------------------------------


def test_a_release_repeated_after_its_file_went_out_again_leaves_the_new_write_alone(area, pool):
    """The stale Release of a write whose file was handed to another request since:

    1. write A; its receiver releases A: the file is free.
    2. write B (another request): the same file, busy again; B's receiver maps it.
    3. A's Release comes again (a receiver released it twice): ignored, counted.
    4. write C: it needs a file of its own; B's receiver still reads B's bytes.
    """
    first = pool.write(memoryview(b"a" * 64))
    pool.release(first)
    second = pool.write(memoryview(b"b" * 64))
    assert shm.file_of(second) == shm.file_of(first)
    reader = area.map(second, 64)
    try:
        pool.release(first)
        assert (pool.busy(), pool.ignored) == (1, 1)
        third = pool.write(memoryview(b"c" * 64))
        assert shm.file_of(third) != shm.file_of(second) and pool.created == 2
        assert reader[:] == b"b" * 64
    finally:
        reader.close()


def test_a_drop_of_a_write_whose_file_went_out_again_leaves_the_file(area, pool):
    first = pool.write(memoryview(b"a" * 64))
    pool.release(first)
    second = pool.write(memoryview(b"b" * 64))
    pool.drop(first)
    assert (pool.busy(), pool.ignored) == (1, 1) and area.files() == [shm.file_of(second)]
    pool.release(second)
    assert (pool.busy(), pool.files(), pool.ignored) == (0, 1, 1)


def test_an_ignored_release_is_logged_at_debug_naming_the_write(pool, caplog):
    written = pool.write(memoryview(b"a" * 64))
    pool.release(written)
    with caplog.at_level(logging.DEBUG, logger=shm.__name__):
        pool.release(written)
    [record] = caplog.records
    assert record.levelno == logging.DEBUG and written in record.getMessage()


def test_each_write_gets_a_token_of_its_own_that_names_its_file(area, pool):
    tokens = []
    for _ in range(3):
        tokens.append(pool.write(memoryview(b"x" * 64)))
        pool.release(tokens[-1])
    assert len(set(tokens)) == 3 and {shm.file_of(token) for token in tokens} == set(area.files())
    pid, _, rest = tokens[0].partition("-")
    random, _, number = rest.partition(".")
    assert int(pid) == os.getpid() and len(random) == 16 and number.isdigit()


@pytest.mark.parametrize("suffix", ["", ".", ".1\n", ".1.2", ".x1", ".\u0661", "." + "1" * 20, ".1/"])
def test_a_token_that_names_the_file_but_no_write_of_the_exact_form_is_refused(area, suffix):
    name, mapped = area.allocate(64)
    mapped.close()
    with pytest.raises(shm.SharedMemoryError, match="refusing shared buffer name") as caught:
        area.map(f"{name}{suffix}", 64)
    assert caught.value.errno == shm.errno.EINVAL
