"""The data-tree codec: what crosses a process boundary comes back equal, with dtype and shape."""

import asyncio
import errno
import os
import sys

import numpy as np
import pytest

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane import shm
from stagevisor.supervisor.dataplane.codec import Codec
from stagevisor.supervisor.dataplane.codec_errors import CodecError
from stagevisor.supervisor.dataplane.out_of_line import discard_shared, piece_frames
from stagevisor.supervisor.dataplane.link.pieces import PieceAssembler
from stagevisor.supervisor.dataplane.link.frames import frame_bytes
from tests.fakes import FakeClock


def roundtrip(obj, codec=None):
    codec = codec or Codec()
    wire = codec.encode(obj).SerializeToString()
    return codec.decode(pb.Value.FromString(wire))


def test_scalars_strings_and_bytes_round_trip_with_their_types():
    tree = {"none": None, "yes": True, "n": -7, "x": 0.25, "s": "héllo", "b": b"\x00\xff", "big": 2**80}
    back = roundtrip(tree)
    assert back == tree
    assert [type(v) for v in back.values()] == [type(v) for v in tree.values()]


def test_nested_lists_and_maps_keep_order_and_structure():
    tree = {"z": [1, [2, {"a": []}], {}], "a": {"k": [None, "v"]}}
    back = roundtrip(tree)
    assert back == tree
    assert list(back) == ["z", "a"]


def test_tuples_arrive_as_lists():
    assert roundtrip({"t": (1, 2)}) == {"t": [1, 2]}


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "uint8", "bool", "complex64", ">i4"])
def test_numpy_arrays_keep_dtype_and_shape(dtype):
    array = (np.arange(24) % 3).astype(dtype).reshape(2, 3, 4)
    back = roundtrip({"a": array})["a"]
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)


def test_non_contiguous_and_zero_size_arrays_round_trip():
    strided = np.arange(20, dtype=np.float64).reshape(4, 5)[:, ::2]
    empty = np.zeros((0, 3), dtype=np.int16)
    back = roundtrip([strided, empty])
    np.testing.assert_array_equal(back[0], strided)
    assert back[1].shape == (0, 3) and back[1].dtype == np.int16


def test_numpy_scalars_come_back_as_numpy_scalars():
    back = roundtrip({"s": np.float16(1.5)})["s"]
    assert isinstance(back, np.float16) and back == np.float16(1.5)


def test_decoded_arrays_are_writable():
    back = roundtrip(np.ones(4, np.float32))
    back[0] = 3.0
    assert back[0] == 3.0


def test_unsupported_values_are_rejected_naming_their_path():
    with pytest.raises(CodecError, match=r"data\['outer'\]\[1\].*object"):
        Codec().encode({"outer": [1, object()]})


def test_non_string_keys_are_rejected():
    with pytest.raises(CodecError, match="only str keys"):
        Codec().encode({1: "one"})


class Source:
    """A BufferSource standing in for an InboundLink: records releases, holds inline pieces."""

    def __init__(self):
        self.released = []
        self.pieces = PieceAssembler()

    def release(self, name):
        self.released.append(name)

    def take_inline(self, buffer_id, size):
        return self.pieces.take(buffer_id, size)

    def discard_inline(self, buffer_id):
        self.pieces.discard(buffer_id)

    def receive(self, codec, request_id="r"):
        """Deliver what `codec` put out of line, as a link would."""
        out = codec.take_out_of_line()
        for frame in piece_frames(request_id, out.pieces, piece_bytes=1000):
            assert self.pieces.add(request_id, frame.piece) is None
        return out


@pytest.fixture
def area(tmp_path):
    area = shm.SharedArea.create(tmp_path / "area")
    yield area
    area.remove()


def test_large_tensor_goes_through_a_pooled_shared_file_and_is_released_when_gone(area):
    import gc

    codec, source = Codec(area=area, shm_threshold=1024), Source()
    array = np.arange(4096, dtype=np.float32).reshape(64, 64)
    value = codec.encode({"t": array})
    name = value.map.values[0].tensor.shared.name
    assert value.map.values[0].tensor.shared.pooled and value.map.values[0].tensor.data == b""
    assert source.receive(codec).segments == [name] and area.files() == [shm.file_of(name)]
    back = codec.decode(pb.Value.FromString(value.SerializeToString()), source)["t"]
    np.testing.assert_array_equal(back, array)
    del back
    gc.collect()
    assert source.released == [name] and area.files() == [shm.file_of(name)]  # the receiver never unlinks
    codec.close()
    assert area.files() == []


def test_large_bytes_go_inline_in_pieces_without_a_shared_area():
    codec, source = Codec(shm_threshold=1024, pieces=True), Source()
    blob = os.urandom(5000)
    value = codec.encode(blob)
    assert value.WhichOneof("kind") == "shared_raw" and value.shared_raw.inline
    out = source.receive(codec)
    assert len(out.pieces) == 1 and not out.segments
    assert codec.decode(value, source) == blob
    assert len(source.pieces) == 0


def test_a_full_shared_area_falls_back_to_inline_pieces(area, monkeypatch):
    def full(size):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(area, "allocate", full)
    codec, source = Codec(area=area, shm_threshold=16, pieces=True), Source()
    array = np.arange(64, dtype=np.int64)
    value = codec.encode(array)
    assert value.tensor.shared.inline
    source.receive(codec)
    np.testing.assert_array_equal(codec.decode(value, source), array)


def test_discarding_a_value_releases_pooled_and_forgets_inline_buffers(area):
    codec, source = Codec(area=area, shm_threshold=16), Source()
    value = codec.encode({"a": [np.zeros(64, np.uint8)], "b": b"x" * 64})
    source.receive(codec)
    discard_shared(value, source)
    assert sorted(shm.file_of(name) for name in source.released) == sorted(area.files())
    inline, source = Codec(shm_threshold=16, pieces=True), Source()
    value = inline.encode(b"y" * 64)
    source.receive(inline)
    discard_shared(value, source)
    assert len(source.pieces) == 0
    codec.close()


def test_receiver_refuses_names_links_fifos_and_directories(area):
    source = Source()
    codec = Codec(area=area)
    for name in ("../etc-passwd", "a/b", "..", "stagevisor-x", "123-zz", "1-0000000000000001", "1-0000000000000001.1/"):
        value = pb.Value(shared_raw=pb.SharedBuffer(name=name, size=4, pooled=True))
        with pytest.raises(CodecError, match="refusing shared buffer name"):
            codec.decode(value, source)
    planted = {"101-00000000000000a1": "symlink", "102-00000000000000a2": "fifo", "103-00000000000000a3": "dir"}
    target = area.path.parent / "target"
    target.write_bytes(b"x" * 64)
    os.symlink(target, area.path / "101-00000000000000a1")
    os.mkfifo(area.path / "102-00000000000000a2")
    os.mkdir(area.path / "103-00000000000000a3")
    for name in planted:
        value = pb.Value(shared_raw=pb.SharedBuffer(name=f"{name}.1", size=4, pooled=True))
        with pytest.raises(CodecError, match="shared buffer refused"):
            codec.decode(value, source)
    assert (area.path / "102-00000000000000a2").exists() and target.exists()  # refused, never removed


def test_unpooled_shared_buffers_are_refused_and_nothing_is_unlinked(area):
    """A crafted frame cannot make a receiver unlink files: receivers never unlink."""
    name, mapped = area.allocate(16)
    mapped.close()
    value = pb.Value(shared_raw=pb.SharedBuffer(name=name, size=16))
    with pytest.raises(CodecError, match="unpooled"):
        Codec(area=area).decode(value, Source())
    discard_shared(value, Source())
    assert name in area.files()


def test_mismatched_tensor_shapes_and_dtypes_are_codec_errors():
    codec = Codec()
    bad = [
        pb.Tensor(dtype="<f4", shape=[1 << 40], data=b"", framework="numpy"),
        pb.Tensor(dtype="<f4", shape=[3], data=b"\0" * 8, framework="numpy"),
        pb.Tensor(dtype="O", shape=[1], data=b"\0" * 8, framework="numpy"),
        pb.Tensor(dtype="nonsense", shape=[1], data=b"\0", framework="numpy"),
        pb.Tensor(dtype="torch.save", shape=[1], data=b"\0", framework="torch"),
        pb.Tensor(dtype="<f4", shape=[-1], data=b"", framework="numpy"),
        pb.Tensor(dtype="<f4", shape=[1], data=b"\0" * 4, framework="pickle"),
    ]
    for tensor in bad:
        with pytest.raises(CodecError):
            codec.decode(pb.Value(tensor=tensor))


def test_dead_writers_files_are_swept_and_live_ones_kept(area, monkeypatch):
    monkeypatch.setattr(shm, "pid_alive", lambda pid: pid == 4242)
    for name in ("999999-00000000000000f0", "4242-00000000000000f1", "notes"):
        (area.path / name).write_bytes(b"x")
    assert area.sweep_dead_writers() == 1
    assert sorted(area.files()) == ["4242-00000000000000f1", "notes"]


def test_orphan_areas_of_dead_daemons_are_removed_but_not_links_or_live_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(shm, "pid_alive", lambda pid: pid == 4242)
    uid = os.getuid()
    dead = tmp_path / f"stagevisor-{uid}-999999-{'a' * 16}"
    live = tmp_path / f"stagevisor-{uid}-4242-{'b' * 16}"
    elsewhere = tmp_path / "elsewhere"
    for path in (dead, live, elsewhere):
        path.mkdir()
        (path / "1-0000000000000001").write_bytes(b"x")
    link = tmp_path / f"stagevisor-{uid}-999998-{'c' * 16}"
    link.symlink_to(elsewhere)
    assert shm.remove_orphan_areas(tmp_path) == 1
    assert not dead.exists() and live.exists() and link.is_symlink() and (elsewhere / "1-0000000000000001").exists()


def test_an_area_another_user_could_open_is_refused(tmp_path):
    path = tmp_path / "open-area"
    path.mkdir(mode=0o755)
    path.chmod(0o755)
    with pytest.raises(shm.SharedMemoryError, match="not private"):
        shm.SharedArea.open(path)
    (tmp_path / "link").symlink_to(path)
    with pytest.raises(shm.SharedMemoryError):
        shm.SharedArea.open(tmp_path / "link")


def test_batched_frames_parse_as_one_frame_batch():
    frames = [pb.Frame(request_id=str(i), cancel=pb.Cancel(reason="r" * i)) for i in range(300)]
    batch = pb.FrameBatch.FromString(b"".join(frame_bytes(f) for f in frames))
    assert [f.request_id for f in batch.frames] == [str(i) for i in range(300)]


@pytest.mark.torch
def test_torch_tensors_round_trip_as_torch_tensors():
    torch = pytest.importorskip("torch")
    tensor = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    back = roundtrip({"t": tensor})["t"]
    assert isinstance(back, torch.Tensor) and back.dtype == torch.bfloat16 and back.shape == (2, 3)
    assert torch.equal(back, tensor)


def test_pooled_buffer_is_reused_once_released(area):
    import gc

    codec, source = Codec(area=area, shm_threshold=1024), Source()
    try:
        array = np.arange(2048, dtype=np.float32)
        value = codec.encode(array)
        name = value.tensor.shared.name
        source.receive(codec)
        back = codec.decode(pb.Value.FromString(value.SerializeToString()), source)
        np.testing.assert_array_equal(back, array)
        assert source.released == []  # still in use
        del back
        gc.collect()
        assert source.released == [name]
        codec.release(source.released)
        again = codec.encode(array + 1)
        assert shm.file_of(again.tensor.shared.name) == shm.file_of(name)  # the released file is overwritten
        source.receive(codec)
        np.testing.assert_array_equal(codec.decode(again, source), array + 1)
    finally:
        codec.close()
    assert area.files() == []


def test_a_dropped_buffer_is_removed_not_reused(area):
    codec = Codec(area=area, shm_threshold=16)
    value = codec.encode(b"z" * 64)
    assert area.files() == [shm.file_of(value.shared_raw.name)]
    codec.drop(codec.take_out_of_line().segments)
    assert area.files() == [] and codec.pool.files() == 0


def test_a_full_free_pool_gives_up_its_least_recently_released_file_not_the_one_just_released(area):
    pool = shm.SegmentPool(area, max_free=2)
    try:
        small = [pool.write(memoryview(b"s" * 64)) for _ in range(2)]
        for name in small:
            pool.release(name)
        big = pool.write(memoryview(b"b" * 4096))  # never busy beside the small ones
        pool.release(big)  # the free list is full of small files: the oldest of them goes
        assert sorted(area.files()) == sorted(shm.file_of(name) for name in (small[1], big))
        assert shm.file_of(pool.write(memoryview(b"c" * 4096))) == shm.file_of(big)  # the next large one reuses it
        assert pool.created == 3
    finally:
        pool.close()
    assert area.files() == []


def test_a_pool_keeps_the_files_of_its_busiest_moment_and_shrinks_once_it_is_past(area):
    clock = FakeClock(0.0)
    pool = shm.SegmentPool(area, max_free=2, peak_seconds=30.0, clock=clock)
    try:
        names = [pool.write(memoryview(bytes([i]) * 4096)) for i in range(6)]  # 6 in flight at once
        for name in names:
            pool.release(name)
        assert pool.files() == 6 and pool.held_bytes() == 6 * 4096  # all kept: they were needed at once
        again = [pool.write(memoryview(b"x" * 4096)) for _ in range(6)]
        assert sorted(map(shm.file_of, again)) == sorted(map(shm.file_of, names))  # the next burst reuses them
        assert pool.created == 6
        for name in again:
            pool.release(name)
        clock.now = 31.0  # the burst is past: the next use trims back to max_free
        pool.release(pool.write(memoryview(b"y" * 4096)))
        assert pool.files() == 2 and len(area.files()) == 2
    finally:
        pool.close()
    assert area.files() == []


def test_a_pool_never_holds_more_than_its_recent_peak_beyond_max_free(area):
    pool = shm.SegmentPool(area, max_free=1, clock=FakeClock(0.0))
    try:
        for size in (1024, 2048, 8192, 65536):  # one at a time: the peak is one file
            pool.release(pool.write(memoryview(b"z" * size)))
            # The file of the size no longer sent goes: it was never busy beside this one.
            assert pool.files() == 1 and pool.held_bytes() == size
    finally:
        pool.close()


def test_a_full_tmpfs_gives_up_free_files_of_other_sizes_before_going_inline(area, monkeypatch):
    pool = shm.SegmentPool(area, max_free=4, clock=FakeClock(0.0))
    try:
        pool.release(pool.write(memoryview(b"s" * 64)))
        allocate, calls = area.allocate, []

        def full_once(size):
            calls.append(size)
            if len(calls) == 1:
                raise OSError(errno.ENOSPC, "No space left on device")
            return allocate(size)

        monkeypatch.setattr(area, "allocate", full_once)
        name = pool.write(memoryview(b"b" * 8192))
        assert calls == [8192, 8192] and area.files() == [shm.file_of(name)]  # the small free file made room
    finally:
        pool.close()


@pytest.mark.parametrize("dtype", ["torch.float32", "float32"])
def test_a_torch_frame_where_torch_is_missing_is_a_codec_error_naming_the_extra(monkeypatch, dtype):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError, as without torch
    frame = pb.Tensor(dtype=dtype, shape=[2], data=b"\0" * 8, framework="torch")
    with pytest.raises(CodecError, match=r"torch is not installed in this process: pip install .*\[torch\]"):
        Codec().decode(pb.Value(tensor=frame))


def test_a_cuda_ipc_tensor_where_torch_is_missing_names_the_extra(monkeypatch):
    from stagevisor.supervisor.dataplane import cuda_ipc

    def without_torch(tensor):
        import torch  # noqa: F401 - fails: torch is hidden below

    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setattr(cuda_ipc, "decode", without_torch)
    frame = pb.Tensor(dtype="torch.float32", shape=[1], framework=cuda_ipc.FRAMEWORK)
    with pytest.raises(CodecError, match=r"torch is not installed in this process: pip install .*\[torch\]"):
        Codec().decode(pb.Value(tensor=frame))


def test_expire_gives_an_idle_pools_burst_files_back_once_the_peak_is_past_and_not_before(area):
    clock = FakeClock(0.0)
    pool = shm.SegmentPool(area, max_free=2, peak_seconds=30.0, clock=clock)
    try:
        assert pool.surplus_expires_in() is None  # nothing kept beyond max_free
        names = [pool.write(memoryview(b"x" * 4096)) for _ in range(6)]
        for name in names:
            pool.release(name)
        clock.now = 10.0
        assert pool.surplus_expires_in() == 20.0
        pool.expire()  # within the window: kept
        assert pool.files() == 6
        clock.now = 31.0
        assert pool.surplus_expires_in() == 0.0
        pool.expire()  # no use since the burst, and still trimmed
        assert pool.files() == 2 and len(area.files()) == 2 and pool.surplus_expires_in() is None
    finally:
        pool.close()
    assert area.files() == []


def test_a_codec_on_an_event_loop_trims_its_idle_pool_when_the_peak_window_ends(area):
    """The codec schedules the trim itself once the receiver released a burst; nothing else uses the pool."""

    async def scenario():
        codec = Codec(area=area, shm_threshold=16)
        codec.pool = shm.SegmentPool(area, max_free=1, peak_seconds=0.2)
        try:
            for _ in range(4):  # four buffers in flight at once
                codec.encode(b"b" * 64)
            held = codec.take_out_of_line().segments
            codec.release(held)
            assert codec.pool.files() == 4  # kept for the peak window
            deadline = asyncio.get_running_loop().time() + 10
            while codec.pool.files() > 1 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
            assert codec.pool.files() == 1 and len(area.files()) == 1
        finally:
            codec.close()

    asyncio.run(scenario())
    assert area.files() == []


def test_the_idle_trim_is_scheduled_once_just_after_the_peak_window_ends(area):
    """After the window (so the pool's strict `past the window` test holds), within a second of it, one timer."""

    async def scenario():
        loop = asyncio.get_running_loop()
        scheduled = []
        schedule = loop.call_later

        def recording(delay, callback, *args):
            scheduled.append(delay)
            return schedule(3600, callback, *args)  # recorded, never run within the test

        loop.call_later = recording
        codec = Codec(area=area, shm_threshold=16)
        codec.pool = shm.SegmentPool(area, max_free=1, peak_seconds=30.0, clock=FakeClock(0.0))
        try:
            for _ in range(4):
                codec.encode(b"b" * 64)
            held = list(codec.take_out_of_line().segments)
            codec.release(held[:2])
            assert len(scheduled) == 1 and 30.0 < scheduled[0] <= 31.0
            codec.release(held[2:])  # a trim is already pending: no second timer
            assert len(scheduled) == 1
        finally:
            codec.close()
            del loop.call_later

    asyncio.run(scenario())
    assert area.files() == []


def test_a_release_outside_an_event_loop_keeps_the_burst_for_the_next_use(area):
    codec = Codec(area=area, shm_threshold=16)
    codec.pool = shm.SegmentPool(area, max_free=1, peak_seconds=30.0, clock=FakeClock(0.0))
    try:
        for _ in range(4):
            codec.encode(b"b" * 64)
        codec.release(codec.take_out_of_line().segments)  # no running loop: nothing to schedule on, no error
        assert codec.pool.files() == 4
    finally:
        codec.close()
    assert area.files() == []


def test_a_torch_dtype_where_torch_is_missing_is_quoted_cut_to_forty_characters(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError, as without torch
    dtype = "torch." + "x" * 34 + "TAIL-NEVER-SHOWN"
    frame = pb.Tensor(dtype=dtype, shape=[2], data=b"\0" * 8, framework="torch")
    with pytest.raises(CodecError) as caught:
        Codec().decode(pb.Value(tensor=frame))
    assert f"a torch tensor ({dtype[:40]}) came, but torch is not installed" in str(caught.value)


def test_a_pooled_buffer_the_receiver_cannot_map_is_handed_back_to_its_writer(area, monkeypatch):
    """A receiver out of descriptors fails the request, and the writer's file is free again (not busy until
    the link breaks, filling the shared memory one failed request at a time)."""
    sender, receiver, source = Codec(area=area, shm_threshold=1024), Codec(area=area), Source()
    value = sender.encode({"t": np.zeros(4096, dtype=np.float32)})
    source.receive(sender)
    assert sender.pool is not None and sender.pool.busy() == 1

    def out_of_descriptors(name, size):
        raise shm.SharedMemoryError(errno.EMFILE, "cannot open shared buffer: Too many open files", name)

    monkeypatch.setattr(area, "map", out_of_descriptors)
    with pytest.raises(CodecError, match="Too many open files"):
        receiver.decode(pb.Value.FromString(value.SerializeToString()), source)
    sender.release(source.released)
    assert sender.pool.busy() == 0
    sender.close()
