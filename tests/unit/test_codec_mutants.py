"""Codec behaviours no other test pinned: found by mutation testing (tests/mutation/run.py codec)."""

from __future__ import annotations

import pytest

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane.codec import Codec, CodecError


def roundtrip(obj):
    codec = Codec()
    return codec.decode(pb.Value.FromString(codec.encode(obj).SerializeToString()))


def test_a_one_byte_torch_dtype_numpy_lacks_round_trips_bit_for_bit():
    torch = pytest.importorskip("torch")
    bits = torch.arange(0, 256, 37, dtype=torch.uint8)
    tensor = bits.view(torch.float8_e4m3fn)
    back = roundtrip({"t": tensor})["t"]
    assert back.dtype == torch.float8_e4m3fn and back.shape == tensor.shape
    assert torch.equal(back.view(torch.uint8), bits)


def test_a_dtype_a_peer_sent_is_quoted_at_most_forty_characters_long():
    dtype = "a" * 40 + "b" * 1000
    with pytest.raises(CodecError) as caught:
        Codec().decode(pb.Value(tensor=pb.Tensor(dtype=dtype, shape=[1], data=b"\0", framework="numpy")))
    assert f"tensor dtype {'a' * 40!r} is not" in str(caught.value)  # quoted, and cut after the 40th
