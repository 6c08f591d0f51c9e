"""Handoff records of `stagevisor check --verify-edges`: canonical values and the first differing field path."""

from __future__ import annotations

import asyncio
import math
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from stagevisor.stages.base import StagePayload
from stagevisor.supervisor.worker import handoffs
from stagevisor.supervisor.dataplane.codec import Codec
from stagevisor.supervisor.dataplane.trace import IN_PROCESS, hop
from stagevisor.supervisor.worker.handoffs import CHUNK, END, NEXT, canonical, read_handoffs, record_handoffs


def diff(together, split):
    return handoffs.first_difference(canonical(together), canonical(split))


def test_identical_trees_have_no_difference_even_as_other_objects():
    tree = {
        "tokens": np.arange(6, dtype=np.int64).reshape(2, 3),
        "meta": {"speaker": "a", "rate": 0.5},
        "blob": b"\x00\x01",
        "steps": [1, 2, {"k": None, "b": True}],
    }
    copy = {
        "tokens": np.arange(6, dtype=np.int64).reshape(2, 3),
        "meta": {"speaker": "a", "rate": 0.5},
        "blob": bytes([0, 1]),
        "steps": [1, 2, {"k": None, "b": True}],
    }
    assert diff(tree, copy) is None


def test_the_first_differing_field_is_named_by_its_path_with_both_values():
    found = diff({"a": {"b": [1, 2, 3]}, "c": "x"}, {"a": {"b": [1, 2, 4]}, "c": "y"})
    assert found.path == 'data["a"]["b"][2]' and (found.together, found.split) == ("3", "4")
    assert str(found) == 'data["a"]["b"][2]: 3 in one process, 4 split'


def test_tensors_compare_by_value_and_name_the_first_differing_element():
    a = np.zeros((2, 3), dtype=np.float32)
    b = a.copy()
    b[1, 2] = 0.5
    found = diff({"latent": a}, {"latent": b})
    assert found.path == 'data["latent"][1][2]' and (found.together, found.split) == ("0.0", "0.5")
    assert diff({"latent": a}, {"latent": a.copy()}) is None


def test_dtype_shape_and_kind_of_a_tensor_count():
    a = np.zeros(4, dtype=np.float32)
    assert "float64" in diff({"x": a}, {"x": a.astype(np.float64)}).split
    assert "[2, 2]" in diff({"x": a}, {"x": a.reshape(2, 2)}).split
    found = diff({"x": a}, {"x": a.tolist()})
    assert found.path == 'data["x"]' and found.together.startswith("ndarray") and found.split == "list[4]"


def test_nan_equals_nan_whatever_its_bits_but_not_a_number():
    quiet = np.array([1.0, np.nan], dtype=np.float32)
    other_nan = quiet.copy()
    other_nan.view(np.uint32)[1] = 0x7FC00001  # another NaN payload
    assert math.isnan(other_nan[1])
    assert diff({"x": quiet}, {"x": other_nan}) is None
    assert diff({"x": float("nan")}, {"x": -float("nan")}) is None
    found = diff({"x": quiet}, {"x": np.array([1.0, 2.0], dtype=np.float32)})
    assert found.path == 'data["x"][1]' and found.together == "nan" and found.split == "2.0"
    assert diff({"x": float("nan")}, {"x": 1.0}).path == 'data["x"]'


def test_floats_compare_bit_for_bit():
    assert diff({"x": 0.0}, {"x": -0.0}) is not None
    assert diff({"x": np.zeros(2)}, {"x": -np.zeros(2)}).path == 'data["x"][0]'
    assert struct.pack("<d", 0.1 + 0.2) != struct.pack("<d", 0.3)
    assert diff({"x": 0.1 + 0.2}, {"x": 0.3}) is not None


def test_order_missing_and_extra_fields():
    assert diff([1, 2], [2, 1]).path == "data[0]"
    assert diff([1, 2], [1, 2, 3]).path == "data"
    found = diff({"a": 1, "b": 2}, {"a": 1})
    assert found.path == 'data["b"]' and found.split == "missing"
    found = diff({"a": 1}, {"a": 1, "z": 0})
    assert found.path == 'data["z"]' and found.together == "missing"
    # Keys in another order hold the same fields: the codec keeps order, dicts compare by key.
    assert diff({"a": 1, "b": 2}, {"b": 2, "a": 1}) is None


def test_bytes_name_the_first_differing_offset():
    found = diff({"wav": b"abcd"}, {"wav": b"abXd"})
    assert found.path == 'data["wav"][2]'
    assert diff({"wav": b"abcd"}, {"wav": b"abc"}).together == "4 items"
    assert diff({"wav": b"a"}, {"wav": b"ab"}).together == "1 item"  # it read `1 items`


def test_a_process_local_object_is_kept_by_type_only():
    assert canonical({"q": asyncio.Queue()})[1][0][1] == ("object", "asyncio.queues.Queue")
    found = diff({"q": asyncio.Queue()}, {"q": []})
    assert found.together == "a asyncio.queues.Queue object"


def test_large_buffers_are_kept_by_block_digests_and_still_located(monkeypatch):
    monkeypatch.setattr(handoffs, "FULL_BYTES", 1024)
    monkeypatch.setattr(handoffs, "BLOCK_BYTES", 256)
    a = np.arange(1024, dtype=np.float32)  # 4 KiB
    b = a.copy()
    b[700] = -1
    node = canonical(a)
    assert node[5][0] == "blocks" and len(node[5][3]) == 16
    found = handoffs.first_difference(node, canonical(b))
    assert found.path == "data items 640..703"
    assert handoffs.first_difference(node, canonical(a.copy())) is None


@pytest.mark.torch
def test_torch_tensors_by_value_including_dtypes_numpy_lacks():
    torch = pytest.importorskip("torch")
    a = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    b = a.clone()
    b[0, 1] = 7
    assert diff({"t": a}, {"t": a.clone()}) is None
    assert diff({"t": a}, {"t": b}).path == 'data["t"][0][1]'
    found = diff({"t": torch.zeros(3)}, {"t": np.zeros(3, dtype=np.float32)})
    assert "tensor torch.float32 [3] on cpu" == found.together


payloads = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=True)
    | st.text(max_size=8)
    | st.binary(max_size=16)
    | hnp.arrays(
        st.sampled_from([np.float32, np.int16, np.uint8, np.complex64]), hnp.array_shapes(max_dims=2, max_side=3)
    ),
    lambda inner: (
        st.lists(inner, max_size=3) | st.tuples(inner, inner) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads)
def test_what_the_codec_carries_across_compares_identical_to_the_original(value):
    """A split edge hands over decode(encode(x)): the comparison must see no difference where there is none."""
    codec = Codec()
    crossed = codec.decode(codec.encode({"v": value}))
    assert handoffs.first_difference(canonical({"v": value}), canonical(crossed)) is None


class _Ctx:
    def __init__(self, trace, inbound=None, chunks=()):
        self.trace = trace
        self.inbound = inbound
        self._chunks = list(chunks)
        self.request_id = "r1"
        self.streamed = []

    async def stream(self, chunk):
        self.streamed.append(chunk)

    async def chunks(self):
        for chunk in self._chunks:
            yield chunk


class _Consumer:
    voices = [{"id": "v"}]

    async def process(self, payload, ctx):
        payload.data["mutated"] = True  # after the record: the record is what arrived
        async for chunk in ctx.chunks():
            chunk["level"] = 0.0
            await ctx.stream(chunk)
        return {}


def test_a_recording_stage_records_what_it_received_as_it_arrived(tmp_path):
    [stage] = record_handoffs(str(tmp_path), "g", {"engine": _Consumer()}).values()
    assert stage.voices == [{"id": "v"}]  # the executor's own attributes are still read through
    next_hop = (None, hop("frontend", "engine", IN_PROCESS))
    asyncio.run(stage.process(StagePayload("r1", {}, {"tokens": [1, 2]}), _Ctx(next_hop)))
    stream_hop = (None, [hop("frontend", "engine", "grpc"), 0.0, 0.0])  # a stream hop's Span (metrics on)
    payload = StagePayload("r1", {}, {"final": 1})
    ctx = _Ctx(stream_hop, inbound=object(), chunks=[{"level": 0.5}, {"level": 0.25}])
    asyncio.run(stage.process(payload, ctx))
    asyncio.run(stage.process(StagePayload("r1", {}, {}), _Ctx(None)))  # from the client: no edge
    records = list(read_handoffs(tmp_path))
    assert [(src, dst, what) for _, src, dst, what, _ in records] == [
        ("frontend", "engine", NEXT),
        ("frontend", "engine", CHUNK),
        ("frontend", "engine", CHUNK),
        ("frontend", "engine", END),
    ]
    assert records[0][4] == canonical({"tokens": [1, 2]})
    assert records[1][4] == canonical({"level": 0.5}) and records[2][4] == canonical({"level": 0.25})
    assert records[3][4] == canonical({"final": 1, "mutated": True})
    assert ctx.streamed == [{"level": 0.0}, {"level": 0.0}]


def _plan():
    from tests.integration.daemon_helpers import make_plan

    return make_plan("t", [("frontend", "p", None, None), ("engine", "p", None, None), ("vocoder", "p", None, None)])


def _outcome(records, pcm=(b"\x01\x00",), failure=None, stage=""):
    from stagevisor.supervisor.checks.edges import Outcome

    return Outcome(list(pcm), failure, stage, [[(s, d, w, canonical(v)) for s, d, w, v in records]])


def test_the_verdict_names_the_first_differing_payload_field_before_the_audio():
    from stagevisor.supervisor.checks.edges import first_difference

    ours = [("frontend", "engine", NEXT, {"ids": [1, 2]}), ("engine", "vocoder", CHUNK, {"f": np.zeros(2)})]
    theirs = [("frontend", "engine", NEXT, {"ids": [1, 2]}), ("engine", "vocoder", CHUNK, {"f": np.ones(2)})]
    text, field = first_difference(_plan(), ("frontend", "engine"), _outcome(ours), _outcome(theirs, pcm=[b"x"]))
    assert field == {
        "edge": ["engine", "vocoder"],
        "path": 'chunks[0]["f"][0]',
        "in_process": "0.0",
        "split": "1.0",
        "request": 1,
    }
    assert text == 'request 1: chunks[0]["f"][0] of edge engine -> vocoder: 0.0 in one process, 1.0 split'
    assert first_difference(_plan(), ("frontend", "engine"), _outcome(ours), _outcome(ours)) == (None, None)


def test_a_split_run_that_failed_midway_reports_the_receiving_stage():
    from stagevisor.supervisor.checks.edges import first_difference

    ours = [("frontend", "engine", NEXT, {"ids": [1]}), ("engine", "vocoder", CHUNK, {"f": 1})]
    theirs = [("frontend", "engine", NEXT, {"ids": [1]})]
    split = _outcome(theirs, pcm=[], failure="no state", stage="engine")
    text, field = first_difference(_plan(), ("frontend", "engine"), _outcome(ours), split)
    assert text == "the receiving stage 'engine' failed: no state" and field is None
    split = _outcome(theirs, pcm=[b"\x01\x00"])  # fewer handoffs, no failure: the count is the difference
    text, field = first_difference(_plan(), ("frontend", "engine"), _outcome(ours), split)
    assert field["path"] == "chunks" and field["split"] == "0 handoffs"
    assert field["in_process"] == "1 handoff"  # it read `1 handoffs`


def test_identical_payloads_leave_the_audio_to_tell():
    from stagevisor.supervisor.checks.edges import first_difference

    same = [("frontend", "engine", NEXT, {"ids": [1]})]
    text, _ = first_difference(
        _plan(),
        ("engine", "vocoder"),
        _outcome(same, pcm=[b"\x01\x00\x02\x00"]),
        _outcome(same, pcm=[b"\x01\x00\x03\x00"]),
    )
    assert text == "request 1: audio differs from sample 1"


def test_the_request_id_inside_a_string_is_the_same_in_every_run():
    ours = canonical({"prompt_key": "abc123", "path": "/cache/abc123.wav", "abc123": 1}, "abc123")
    theirs = canonical({"prompt_key": "fff999", "path": "/cache/fff999.wav", "fff999": 1}, "fff999")
    assert handoffs.first_difference(ours, theirs) is None
    other = canonical({"prompt_key": "abc123", "path": "/cache/abc123.wav", "abc123": 1}, "fff999")
    assert handoffs.first_difference(ours, other).path == 'data["prompt_key"]'
