"""Packed values: small trees travel as one bytes field and arrive as the same objects a Value tree gives."""

from __future__ import annotations

import struct

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane import packed
from stagevisor.supervisor.dataplane.codec import Codec
from stagevisor.supervisor.dataplane.codec_errors import CodecError


def across(obj, codec):
    return codec.decode(pb.Value.FromString(codec.encode(obj).SerializeToString()))


def same(a, b) -> bool:
    """Equal values of exactly the same types; arrays with the same dtype, shape and bits; floats bit for bit."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (np.ndarray, np.generic)):
        return a.dtype == b.dtype and np.shape(a) == np.shape(b) and np.asarray(a).tobytes() == np.asarray(b).tobytes()
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    return a == b


dtypes = st.sampled_from(["<f4", "<f8", "<f2", "<i8", "<i4", "<i2", "|i1", "|u1", "<u2", "<u8", "|b1", "<c8", "<c16"])
arrays = st.builds(
    lambda dtype, shape, seed: np.random.default_rng(seed).integers(0, 255, size=shape).astype(dtype),
    dtypes,
    st.lists(st.integers(0, 5), max_size=3).map(tuple),
    st.integers(0, 2**32 - 1),
)
leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=True)
    | st.text(max_size=20)
    | st.binary(max_size=40)
    | arrays
    | st.builds(lambda a: a.reshape(-1)[0] if a.size else np.float32(0), arrays)
)
trees = st.recursive(
    leaves,
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(max_size=8), trees, max_size=5) | st.lists(trees, max_size=4) | arrays)
def test_a_packed_tree_arrives_as_the_same_objects_as_a_value_tree(tree):
    packed_codec, tree_codec = Codec(), Codec(packed=False)
    value = packed_codec.encode(tree)
    assert value.WhichOneof("kind") == "packed"
    assert tree_codec.encode(tree).WhichOneof("kind") != "packed"
    assert same(across(tree, packed_codec), across(tree, tree_codec))


def test_a_typical_chunk_is_packed_and_its_arrays_are_writable_copies():
    audio = np.arange(256, dtype=np.float32)
    chunk = {"audio": audio, "sample_rate": 22050, "final": False, "rms": np.float32(0.5), "ids": (1, 2)}
    codec = Codec()
    value = codec.encode(chunk)
    assert value.WhichOneof("kind") == "packed"
    back = across(chunk, codec)
    assert same(back, {**chunk, "ids": [1, 2]})
    back["audio"][0] = 7.0  # writable, and not the sender's array
    assert audio[0] == 0.0


def test_strided_and_zero_size_arrays_round_trip_packed():
    strided = np.arange(20, dtype=np.float64).reshape(4, 5)[:, ::2]
    empty = np.zeros((0, 3), dtype=np.int16)
    scalar = np.array(3.5)
    back = across([strided, empty, scalar], Codec())
    assert same(back, [np.ascontiguousarray(strided), empty, scalar])


class IntSubclass(int):
    pass


class DictSubclass(dict):
    pass


@pytest.mark.parametrize(
    "tree",
    [
        {"big": 2**64},  # beyond 64 bits: a decimal string in a Value tree
        {"sub": IntSubclass(3)},
        DictSubclass(a=1),
        {"swapped": np.arange(4, dtype=">i4")},  # not the machine's byte order
        {"when": np.array(["2024-01-01"], dtype="datetime64[D]")},
        {"large": np.zeros(1024, np.uint8)},  # at the shared-memory threshold given below
        {"blob": b"x" * 1024},
        {"view": memoryview(b"abc")},
        {"words": np.array(["a", "b"])},
        [[[[1]]]] + [{}],
    ],
)
def test_what_the_packed_layout_does_not_cover_goes_as_a_value_tree_and_arrives_the_same(tree):
    codec = Codec(shm_threshold=1024, pieces=True)
    value = codec.encode(tree)
    if not isinstance(tree, list):
        assert value.WhichOneof("kind") != "packed"
    codec.take_out_of_line()
    if any(
        isinstance(v, (memoryview,)) or (isinstance(v, (np.ndarray, bytes)) and len(v) >= 1024)
        for v in (tree.values() if isinstance(tree, dict) else [])
    ):
        return  # out of line: covered by the shared-memory and piece tests
    expected = across(tree, Codec(packed=False, shm_threshold=1024))
    assert same(across(tree, Codec(shm_threshold=1024)), expected)


def test_deep_trees_are_not_packed_and_unsupported_values_are_still_named_by_path():
    deep: list = []
    node = deep
    for _ in range(packed.MAX_DEPTH + 1):
        node.append([])
        node = node[0]
    assert Codec().encode(deep).WhichOneof("kind") == "list"
    with pytest.raises(CodecError, match=r"data\['outer'\]\[1\].*object"):
        Codec().encode({"outer": [1, object()]})
    with pytest.raises(CodecError, match="only str keys"):
        Codec().encode({"fine": 1, "nested": {2: "two"}})


def packed_value(data: bytes) -> pb.Value:
    return pb.Value(packed=data)


def test_every_truncation_of_a_packed_value_is_a_codec_error():
    blob = (
        Codec()
        .encode(
            {
                "a": np.arange(6, dtype=np.int32).reshape(2, 3),
                "s": "text",
                "l": [1, 2.5, None, b"b"],
                "t": True,
                "g": np.float16(2),
            }
        )
        .packed
    )
    assert Codec().decode(packed_value(blob))["s"] == "text"
    for end in range(len(blob)):
        with pytest.raises(CodecError):
            Codec().decode(packed_value(blob[:end]))
    with pytest.raises(CodecError, match="1 bytes after its end"):
        Codec().decode(packed_value(blob + b"\xc0"))


def ext(code: int, data: bytes) -> bytes:
    return msgpack.packb(msgpack.ExtType(code, data))


def array_header(dtype: bytes, *shape: int) -> bytes:
    return bytes((len(dtype),)) + dtype + bytes((len(shape),)) + struct.pack(f"<{len(shape)}q", *shape)


@pytest.mark.parametrize(
    "blob, message",
    [
        (b"\xc1", "starts no msgpack value"),
        (b"\xdd\xff\xff\xff\xff", "4294967295 exceeds max_array_len"),
        (b"\x85", "5 exceeds max_map_len"),
        (b"\x91" * (packed.MAX_DEPTH + 1) + b"\xc0", "nested deeper than"),
        (b"\x91" * 5000 + b"\xc0", "nested deeper than"),
        (b"\xa2\xff\xfe", "not UTF-8"),
        (b"\x81\x01\xc0", "int is not allowed for map key"),
        (ext(9, b"\0"), "unknown extension type 9"),
        (ext(1, b"\x03<f4"), "header cut short"),
        (ext(1, array_header(b"|O8", 1) + b"\0" * 8), "cannot be decoded"),
        (ext(1, array_header(b"torch.float32", 1) + b"\0" * 4), "torch.float32"),
        (ext(1, array_header(b"<f4", -1)), "shape (-1,)"),
        (ext(1, array_header(b"<f4", 1 << 40)), "needs 4398046511104 bytes"),
        (ext(1, array_header(b"<f4", 2) + b"\0" * 9), "needs 8 bytes, 9 came"),
        (ext(1, array_header(b"zz9", 1) + b"\0"), "is not a numpy or torch dtype"),
        (ext(2, array_header(b"<f4", 1) + b"\0" * 4), "packed array of 1 dimensions"),
    ],
)
def test_malformed_packed_values_are_codec_errors_saying_what_is_wrong(blob, message):
    with pytest.raises(CodecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Codec().decode(packed_value(blob))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_packed_bytes_decode_or_are_codec_errors(blob):
    try:
        Codec().decode(packed_value(blob))
    except CodecError:
        pass


def test_packed_bytes_are_plain_msgpack_with_arrays_as_extension_types():
    blob = (
        Codec()
        .encode({"step": 1, "name": "a", "raw": b"\x00", "ids": (1, 2), "tensor": np.arange(3, dtype="<i2")})
        .packed
    )
    plain = msgpack.unpackb(blob, raw=False)
    assert list(plain) == ["step", "name", "raw", "ids", "tensor"]
    assert plain["raw"] == b"\x00" and plain["ids"] == [1, 2]
    assert plain["tensor"] == msgpack.ExtType(1, array_header(b"<i2", 3) + np.arange(3, dtype="<i2").tobytes())


def test_unsigned_64_bit_ints_are_packed_and_arrive_as_from_a_value_tree():
    tree = {"big": 2**64 - 1, "small": -(2**63)}
    assert Codec().encode(tree).WhichOneof("kind") == "packed"
    assert same(across(tree, Codec()), across(tree, Codec(packed=False)))
