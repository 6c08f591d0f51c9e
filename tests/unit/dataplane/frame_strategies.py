"""Hypothesis strategies for the data plane's wire: random frames (`frames`) and batches of them with bytes
flipped, cut or inserted (`wire_batches`), for the unit tier's runtime and the integration tier's real links."""

from __future__ import annotations

from hypothesis import strategies as st

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane.link.frames import frame_bytes

_names = st.sampled_from(["", "a", "vocoder", "nope", "../x", "a\x00"])
_values = st.recursive(
    st.one_of(
        st.builds(lambda: pb.Value(none=True)),
        st.builds(lambda t: pb.Value(text=t), st.text(max_size=8)),
        st.builds(lambda b: pb.Value(raw=b), st.binary(max_size=16)),
        st.builds(
            lambda d, s, b, f: pb.Value(tensor=pb.Tensor(dtype=d, shape=s, data=b, framework=f)),
            st.sampled_from(["<f4", "|u1", "O", "torch.bfloat16", "torch.save", "V0", "garbage", "<c16"]),
            st.lists(st.integers(-2, 1 << 33), max_size=3),
            st.binary(max_size=32),
            st.sampled_from(["numpy", "numpy-scalar", "torch", "other"]),
        ),
        st.builds(
            lambda n, s, p, i: pb.Value(shared_raw=pb.SharedBuffer(name=n, size=s, pooled=p, inline=i)),
            st.sampled_from(["1-0123456789abcdef", "../../etc/passwd", "i0", "x"]),
            st.integers(0, 1 << 40),
            st.booleans(),
            st.booleans(),
        ),
        st.builds(lambda t: pb.Value(big_integer=t), st.text(max_size=12)),
    ),
    lambda inner: st.one_of(
        st.builds(lambda items: pb.Value(list=pb.ValueList(items=items)), st.lists(inner, max_size=3)),
        st.builds(
            lambda keys, values: pb.Value(map=pb.ValueMap(keys=keys, values=values)),
            st.lists(st.text(max_size=3), max_size=3),
            st.lists(inner, max_size=3),
        ),
    ),
    max_leaves=6,
)


@st.composite
def frames(draw):
    frame = pb.Frame(request_id=draw(st.sampled_from(["x1", "x2", "", "victim"])), src=draw(_names), dst=draw(_names))
    body = draw(
        st.sampled_from(["submit", "chunk", "end", "cancel", "credit", "release", "done", "failure", "hello", "none"])
    )
    if body == "submit":
        frame.submit.request.CopyFrom(draw(_values))
        frame.submit.data.CopyFrom(draw(_values))
        frame.submit.trace.extend(draw(st.lists(st.text(max_size=6), max_size=2)))
    elif body == "chunk":
        frame.chunk.value.CopyFrom(draw(_values))
        if draw(st.booleans()):
            frame.chunk.opening.request.CopyFrom(draw(_values))
    elif body == "end":
        frame.end.has_data = draw(st.booleans())
        frame.end.data.CopyFrom(draw(_values))
    elif body == "cancel":
        frame.cancel.reason = "r"
    elif body == "credit":
        frame.credit.chunks = draw(st.integers(0, 2**32 - 1))
    elif body == "release":
        frame.release.names.extend(draw(st.lists(st.text(max_size=8), max_size=2)))
    elif body == "done":
        frame.done.trace.extend(draw(st.lists(st.text(max_size=6), max_size=2)))
    elif body == "failure":
        frame.failure.message = draw(st.text(max_size=8))
    elif body == "hello":
        frame.hello.peer = "p"
    return frame


@st.composite
def wire_batches(draw):
    """A FrameBatch on the wire: random frames, some of them with bytes flipped, cut or inserted."""
    parts = []
    for frame in draw(st.lists(frames(), min_size=1, max_size=4)):
        data = bytearray(frame_bytes(frame))
        mutation = draw(st.sampled_from(["none", "flip", "cut", "insert", "garbage"]))
        if mutation == "flip" and len(data) > 2:
            index = draw(st.integers(2, len(data) - 1))
            data[index] ^= draw(st.integers(1, 255))
        elif mutation == "cut" and len(data) > 2:
            data = data[: draw(st.integers(1, len(data) - 1))]
        elif mutation == "insert":
            index = draw(st.integers(0, len(data)))
            data[index:index] = draw(st.binary(min_size=1, max_size=8))
        elif mutation == "garbage":
            data = bytearray(draw(st.binary(max_size=40)))
        parts.append(bytes(data))
    return b"".join(parts)
