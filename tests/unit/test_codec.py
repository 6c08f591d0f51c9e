"""The data-tree codec: what crosses a process boundary comes back equal, with dtype and shape."""

import os

import numpy as np
import pytest

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane import shm
from stagevisor.supervisor.dataplane.codec import Codec, CodecError, discard_shared
from stagevisor.supervisor.dataplane.link import frame_bytes

PREFIX = f"stagevisor-unittest{os.getpid()}"


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


def test_large_tensor_goes_through_shared_memory_and_is_unlinked_on_decode():
    codec = Codec(shm_prefix=PREFIX, shm_threshold=1024)
    array = np.arange(4096, dtype=np.float32).reshape(64, 64)
    value = codec.encode({"t": array})
    name = value.map.values[0].tensor.shared.name
    assert name.startswith(PREFIX) and value.map.values[0].tensor.data == b""
    assert os.path.exists(f"/dev/shm/{name}")
    back = codec.decode(pb.Value.FromString(value.SerializeToString()))["t"]
    np.testing.assert_array_equal(back, array)
    assert not os.path.exists(f"/dev/shm/{name}")


def test_large_bytes_go_through_shared_memory():
    codec = Codec(shm_prefix=PREFIX, shm_threshold=1024)
    blob = os.urandom(5000)
    value = codec.encode(blob)
    assert value.WhichOneof("kind") == "shared_raw"
    assert codec.decode(value) == blob


def test_discarding_a_value_unlinks_its_shared_buffers():
    codec = Codec(shm_prefix=PREFIX, shm_threshold=16)
    value = codec.encode({"a": [np.zeros(64, np.uint8)], "b": b"x" * 64})
    discard_shared(value)
    assert not list(shm.SHM_DIR.glob(f"{PREFIX}-*"))


def test_remove_leftovers_unlinks_only_this_prefix():
    mine = shm.write(PREFIX, memoryview(b"abc"))
    other = shm.write(PREFIX + "x", memoryview(b"abc"))
    try:
        assert shm.remove_leftovers(PREFIX) == 1
        assert not os.path.exists(f"/dev/shm/{mine}") and os.path.exists(f"/dev/shm/{other}")
    finally:
        shm.discard(other)


def test_batched_frames_parse_as_one_frame_batch():
    frames = [pb.Frame(request_id=str(i), cancel=pb.Cancel(reason="r" * i)) for i in range(300)]
    batch = pb.FrameBatch.FromString(b"".join(frame_bytes(f) for f in frames))
    assert [f.request_id for f in batch.frames] == [str(i) for i in range(300)]


def test_torch_tensors_round_trip_as_torch_tensors():
    torch = pytest.importorskip("torch")
    tensor = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    back = roundtrip({"t": tensor})["t"]
    assert isinstance(back, torch.Tensor) and back.dtype == torch.bfloat16 and back.shape == (2, 3)
    assert torch.equal(back, tensor)


def test_pooled_buffer_is_released_when_the_decoded_array_is_gone_and_then_reused():
    import gc

    codec = Codec(shm_prefix=PREFIX, shm_threshold=1024, pooled=True)
    released = []
    try:
        array = np.arange(2048, dtype=np.float32)
        value = codec.encode(array)
        name = value.tensor.shared.name
        assert value.tensor.shared.pooled
        back = codec.decode(pb.Value.FromString(value.SerializeToString()), released.append)
        np.testing.assert_array_equal(back, array)
        assert released == [] and os.path.exists(f"/dev/shm/{name}")  # still in use, still there
        del back
        gc.collect()
        assert released == [name]
        codec.release(released)
        again = codec.encode(array + 1)
        assert again.tensor.shared.name == name  # the released file is overwritten, not a new one
        np.testing.assert_array_equal(codec.decode(again, released.append), array + 1)
    finally:
        codec.close()
    assert not list(shm.SHM_DIR.glob(f"{PREFIX}-*"))


def test_discarding_a_pooled_value_releases_it_instead_of_unlinking():
    codec = Codec(shm_prefix=PREFIX, shm_threshold=16, pooled=True)
    released = []
    try:
        value = codec.encode(b"y" * 64)
        discard_shared(value, released.append)
        assert released == [value.shared_raw.name] and os.path.exists(f"/dev/shm/{released[0]}")
    finally:
        codec.close()


def test_orphan_sweep_removes_buffers_of_dead_writers_only(tmp_path, monkeypatch):
    monkeypatch.setattr(shm, "pid_alive", lambda pid: pid == 4242)
    orphan = tmp_path / "stagevisor-0123456789ab-999999-p0"
    live = tmp_path / "stagevisor-0123456789ab-4242-3"
    unrelated = tmp_path / "stagevisor-notes"
    for path in (orphan, live, unrelated):
        path.write_bytes(b"x")
    assert shm.remove_orphans(tmp_path) == 1
    assert not orphan.exists() and live.exists() and unrelated.exists()


def test_orphan_sweep_leaves_directories_with_a_look_alike_name(tmp_path, monkeypatch):
    monkeypatch.setattr(shm, "pid_alive", lambda pid: False)
    directory = tmp_path / "stagevisor-0-24969-c00b32317f1beaf5"
    directory.mkdir()
    assert shm.remove_orphans(tmp_path) == 0 and directory.is_dir()
