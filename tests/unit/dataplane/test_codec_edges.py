"""The codec at its edges: rare dtypes, quoting limits on what a peer sent, size thresholds, empty values."""

from __future__ import annotations

import importlib.util
import logging
import sys

import numpy as np
import pytest

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane import shm
from stagevisor.supervisor.dataplane.codec import Codec
from stagevisor.supervisor.dataplane.codec_errors import CodecError
from stagevisor.supervisor.dataplane.out_of_line import OutOfLine


class Releases:
    def __init__(self):
        self.released = []

    def release(self, name):
        self.released.append(name)


def roundtrip(obj):
    codec = Codec()
    return codec.decode(pb.Value.FromString(codec.encode(obj).SerializeToString()))


@pytest.mark.torch
@pytest.mark.parametrize("bits, kind", [("uint8", "float8_e4m3fn"), ("int16", "bfloat16"), ("int32", "complex32")])
def test_torch_dtypes_numpy_lacks_round_trip_bit_for_bit(bits, kind):
    torch = pytest.importorskip("torch")
    raw = torch.arange(0, 120, 13).to(getattr(torch, bits))
    tensor = raw.view(getattr(torch, kind))
    back = roundtrip({"t": tensor})["t"]
    assert back.dtype == tensor.dtype and back.shape == tensor.shape
    assert torch.equal(back.view(raw.dtype), raw)


def test_a_pooled_buffer_of_the_wrong_size_is_refused_and_handed_back():
    source = Releases()
    tensor = pb.Tensor(
        dtype="<f4",
        shape=[2],
        framework="numpy",
        shared=pb.SharedBuffer(name="1-0000000000000001.1", size=7, pooled=True),
    )
    with pytest.raises(CodecError, match="needs 8 bytes, the buffer has 7"):
        Codec().decode(pb.Value(tensor=tensor), source)
    assert source.released == ["1-0000000000000001.1"]


@pytest.mark.parametrize(
    "dtype, data, problem",
    [
        ("a" * 40 + "b" * 1000, b"\0", "is not a numpy or torch dtype"),  # not a dtype at all
        (",".join(["O"] * 30), b"\0" * 240, "cannot be decoded"),  # a real dtype, of Python objects
    ],
)
def test_a_dtype_a_peer_sent_is_quoted_at_most_forty_characters_long(dtype, data, problem):
    with pytest.raises(CodecError) as caught:
        Codec().decode(pb.Value(tensor=pb.Tensor(dtype=dtype, shape=[1], data=data, framework="numpy")))
    assert f"dtype {dtype[:40]!r} " in str(caught.value)  # quoted, and cut after the 40th character
    assert problem in str(caught.value)


def test_a_shape_a_peer_sent_is_quoted_at_most_eight_dimensions_long():
    shape = [1, 2, 3, 4, 5, 6, 7, 8, -1]
    with pytest.raises(CodecError) as caught:
        Codec().decode(pb.Value(tensor=pb.Tensor(dtype="<f4", shape=shape, data=b"", framework="numpy")))
    assert "shape (1, 2, 3, 4, 5, 6, 7, 8) cannot be decoded" in str(caught.value)


@pytest.mark.parametrize(
    "number, kind",
    [
        (2**63 - 1, "integer"),
        (-(2**63), "integer"),
        (2**63, "big_integer"),
        (-(2**63) - 1, "big_integer"),
    ],
)
def test_integers_in_int64_range_use_the_integer_field_and_others_a_decimal_string(number, kind):
    value = Codec().encode(number)
    assert value.WhichOneof("kind") == kind
    assert roundtrip(number) == number


def test_out_of_line_is_empty_only_without_segments_and_pieces():
    assert not OutOfLine()
    assert OutOfLine(segments=["1-0000000000000001.1"])
    assert OutOfLine(pieces=[("i1", memoryview(b"x"))])


def test_only_the_first_fallback_from_a_full_shared_area_is_a_warning(tmp_path, monkeypatch, caplog):
    area = shm.SharedArea.create(tmp_path / "area")
    try:

        def full(size):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(area, "allocate", full)
        codec = Codec(area=area, shm_threshold=16, pieces=True)
        with caplog.at_level(logging.DEBUG, logger="stagevisor.supervisor.dataplane.codec"):
            for _ in range(3):
                codec.encode(np.arange(64, dtype=np.int64))
                codec.take_out_of_line()
        levels = [r.levelno for r in caplog.records if "shared memory unavailable" in r.getMessage()]
        assert levels == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    finally:
        area.remove()


def test_a_process_counts_received_out_of_line_bytes_from_zero(monkeypatch):
    # A fresh copy of the module that counts them, as a new worker process has: nothing received yet.
    from stagevisor.supervisor.dataplane import decoding

    spec = importlib.util.spec_from_file_location("decoding_fresh_copy", decoding.__file__)
    fresh = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, fresh)  # removed again after the test
    spec.loader.exec_module(fresh)
    assert (fresh.shared_bytes_received(), fresh.inline_bytes_received()) == (0, 0)


@pytest.mark.parametrize(
    "message",
    [
        pb.Value(shared_raw=pb.SharedBuffer(name="n" * 40 + "x" * 100, size=8, pooled=True)),
        pb.Value(tensor=pb.Tensor(dtype="<f4", shape=[1], data=b"\0" * 4, framework="n" * 40 + "x" * 100)),
    ],
)
def test_a_buffer_name_or_framework_a_peer_sent_is_quoted_at_most_forty_characters_long(message):
    with pytest.raises(CodecError) as caught:
        Codec().decode(message)
    assert repr("n" * 40) in str(caught.value)


def test_a_big_integer_that_is_not_decimal_is_a_codec_error_quoting_forty_characters():
    with pytest.raises(CodecError, match="big_integer is not a decimal integer: '12x'"):
        Codec().decode(pb.Value(big_integer="12x"))
    with pytest.raises(CodecError) as caught:
        Codec().decode(pb.Value(big_integer="9" * 40 + "x" * 100))
    assert str(caught.value).endswith(repr("9" * 40))


def test_an_empty_shared_buffer_decodes_to_empty_bytes_and_is_released_at_once(tmp_path):
    area = shm.SharedArea.create(tmp_path / "area")
    try:
        source = Releases()
        value = pb.Value(shared_raw=pb.SharedBuffer(name="1-0000000000000001.1", size=0, pooled=True))
        assert Codec(area=area).decode(value, source) == b""
        assert source.released == ["1-0000000000000001.1"]
    finally:
        area.remove()


@pytest.mark.parametrize("make", [lambda n: b"x" * n, lambda n: np.zeros(n, np.uint8)], ids=["bytes", "array"])
def test_a_buffer_of_exactly_the_threshold_leaves_the_message_and_one_byte_less_stays(make):
    codec = Codec(shm_threshold=64, pieces=True)
    at, below = codec.encode(make(64)), codec.encode(make(63))
    out = codec.take_out_of_line()
    assert [buffer.nbytes for _, buffer in out.pieces] == [64]
    assert "inline: true" in str(at) and "inline" not in str(below)


@pytest.mark.parametrize("dtype", ["|S0", "|V0", "torch.float32.x"])
def test_zero_width_and_dotted_torch_dtypes_are_refused(dtype):
    with pytest.raises(CodecError):
        Codec().decode(pb.Value(tensor=pb.Tensor(dtype=dtype, shape=[2], data=b"", framework="torch")))


@pytest.mark.torch
def test_an_eight_byte_torch_dtype_sent_as_bits_is_decoded():
    torch = pytest.importorskip("torch")
    data = np.array([1.5, -2.0]).astype("<f8").tobytes()
    back = Codec().decode(pb.Value(tensor=pb.Tensor(dtype="torch.float64", shape=[2], data=data, framework="torch")))
    assert back.dtype == torch.float64 and back.tolist() == [1.5, -2.0]


@pytest.mark.torch
def test_torch_objects_that_are_not_tensors_are_not_encoded_as_tensors():
    torch = pytest.importorskip("torch")
    assert roundtrip({"size": torch.Size([2, 3])}) == {"size": [2, 3]}
    with pytest.raises(CodecError, match="cannot cross a process boundary"):
        Codec().encode(torch.float32)


@pytest.mark.parametrize("shared", [True, False], ids=["pooled", "inline"])
def test_a_shape_in_a_size_mismatch_is_quoted_at_most_eight_dimensions_long(shared):
    tensor = pb.Tensor(dtype="|u1", shape=[1, 2, 1, 2, 1, 2, 1, 2, 1], framework="numpy")
    if shared:
        tensor.shared.MergeFrom(pb.SharedBuffer(name="1-0000000000000001.1", size=1, pooled=True))
    else:
        tensor.data = b"\0"
    with pytest.raises(CodecError) as caught:
        Codec().decode(pb.Value(tensor=tensor), Releases())
    assert "tensor of shape (1, 2, 1, 2, 1, 2, 1, 2) needs 16 bytes" in str(caught.value)


def test_inline_pieces_of_the_default_size_carry_a_small_buffer_in_one_frame():
    from stagevisor.supervisor.dataplane.out_of_line import piece_frames

    (frame,) = piece_frames("r", [("i1", memoryview(b"x" * 10))])
    assert (frame.piece.buffer, frame.piece.offset, frame.piece.data, frame.piece.total) == ("i1", 0, b"x" * 10, 10)


@pytest.mark.parametrize(
    "raised, message",
    [
        (CodecError("handle record is malformed"), "handle record is malformed"),
        (RuntimeError("cudaIpcOpenMemHandle failed"), "CUDA IPC tensor refused: cudaIpcOpenMemHandle failed"),
    ],
)
def test_a_cuda_ipc_handle_that_cannot_be_opened_is_one_codec_error(monkeypatch, raised, message):
    from stagevisor.supervisor.dataplane import cuda_ipc

    def refuse(tensor):
        raise raised

    monkeypatch.setattr(cuda_ipc, "decode", refuse)
    with pytest.raises(CodecError) as caught:
        Codec().decode(pb.Value(tensor=pb.Tensor(dtype="torch.float32", shape=[1], framework=cuda_ipc.FRAMEWORK)))
    assert str(caught.value) == message


def test_by_default_a_small_value_stays_in_the_message_and_a_large_one_leaves_it():
    codec = Codec(pieces=True)  # the default threshold (256 KiB)
    small = codec.encode(np.ones(1024, np.uint8))
    assert small.ByteSize() > 1024 and not codec.take_out_of_line()  # its bytes are in the message (packed or not)
    large = codec.encode(np.ones(1 << 20, np.uint8))
    assert large.tensor.shared.inline and large.tensor.shared.size == 1 << 20 and not large.tensor.data
    assert [view.nbytes for _, view in codec.take_out_of_line().pieces] == [1 << 20]


@pytest.mark.parametrize("threshold", [None, 16])
def test_without_shared_memory_or_pieces_a_large_value_goes_inside_the_message(threshold):
    codec = Codec() if threshold is None else Codec(shm_threshold=threshold)
    array = np.arange(1 << 18, dtype=np.float32)  # 1 MiB: above either threshold
    value = codec.encode(array)
    assert len(value.tensor.data) == array.nbytes and not value.tensor.HasField("shared")
    assert not codec.take_out_of_line()
    assert np.array_equal(codec.decode(pb.Value.FromString(value.SerializeToString())), array)


@pytest.mark.torch
def test_a_torch_dtype_name_with_a_dotted_tail_is_refused():
    pytest.importorskip("torch")
    tensor = pb.Tensor(dtype="torch.float32.extra", shape=[1], data=b"\0" * 4, framework="torch")
    with pytest.raises(CodecError, match="tensor dtype 'torch.float32.extra' is not a numpy or torch dtype"):
        Codec().decode(pb.Value(tensor=tensor))


def test_a_key_of_a_str_subclass_crosses_as_a_plain_str():
    class Name(str):
        pass

    back = roundtrip({Name("voice"): 1, np.str_("rate"): 2})
    assert back == {"voice": 1, "rate": 2} and all(type(key) is str for key in back)


def test_the_dtype_strings_remembered_from_peers_are_at_most_256():
    from stagevisor.supervisor.dataplane import dtypes

    remembered = dtypes._DTYPES
    saved = dict(remembered)
    remembered.clear()
    try:
        for width in range(1, 301):  # 300 distinct valid dtype strings, as a peer may send
            tensor = pb.Tensor(dtype=f"<U{width}", shape=[1], data=b"a\0\0\0" * width, framework="numpy")
            assert Codec().decode(pb.Value(tensor=tensor))[0] == "a" * width
        assert len(remembered) == 256
    finally:
        remembered.clear()
        remembered.update(saved)


def test_malformed_packed_bytes_are_a_codec_error():
    with pytest.raises(CodecError):
        Codec().decode(pb.Value(packed=b"\xc1 not msgpack"))


@pytest.mark.parametrize("shape", [(0,), (2, 0, 3)])
def test_an_array_with_an_empty_dimension_crosses_as_a_value_tree(shape):
    codec = Codec(packed=False)
    value = codec.encode({"empty": np.zeros(shape, np.float32)})
    assert value.WhichOneof("kind") == "map"
    back = codec.decode(value)["empty"]
    assert back.shape == shape and back.dtype == np.float32


def test_an_empty_list_in_a_value_tree_is_a_list():
    codec = Codec(packed=False)
    value = codec.encode({"items": [], "more": [1]})
    assert codec.decode(value) == {"items": [], "more": [1]}
