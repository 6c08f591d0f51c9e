"""Each pooled buffer a frame brings is released to its sender exactly once, however its decode or its frame fails.

A receiver that releases a buffer twice lets its sender free a file that was
handed to another request in between (shm.py ignores such a Release by its
write token; these tests check the receiver does not send one). What the
runtime and the gateway do with a frame that fails is a `discard_shared` of
the whole frame after whatever decode did, so each scenario ends that way.
"""

from __future__ import annotations

import errno
import gc
import sys

import numpy as np
import pytest

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane import shm
from stagevisor.supervisor.dataplane.codec import Codec
from stagevisor.supervisor.dataplane.codec_errors import CodecError
from stagevisor.supervisor.dataplane.out_of_line import discard_shared
from tests.fakes import CountingBufferSource

LARGE = np.zeros(1024, np.float32)
"""4 KiB: leaves the message at the sender's 1 KiB threshold."""


@pytest.fixture
def area(tmp_path):
    area = shm.SharedArea.create(tmp_path / "area")
    yield area
    area.remove()


@pytest.fixture
def sender(area):
    codec = Codec(area=area, shm_threshold=1024)
    yield codec
    codec.close()


def received(sender: Codec, obj) -> pb.Value:
    """The Value a receiver parses for `obj`; the sender's buffers stay busy until released."""
    value = sender.encode(obj)
    sender.take_out_of_line()
    return pb.Value.FromString(value.SerializeToString())


def names(value: pb.Value) -> list[str]:
    return [item.tensor.shared.name for item in value.map.values]


def all_released_once(sender: Codec, source: CountingBufferSource, expected: list[str]) -> None:
    """Each of `expected` came back once, and the sender's pool took them all: none busy, none ignored."""
    assert source.releases == {name: 1 for name in expected}
    sender.release(source.releases)
    assert sender.pool is not None and (sender.pool.busy(), sender.pool.ignored) == (0, 0)


def test_a_buffer_the_receiver_cannot_map_is_released_once_though_its_frame_is_dropped_after(area, sender, monkeypatch):
    """1. decode cannot map the buffer (out of descriptors): it releases it and raises.
    2. the frame is dropped (what on_frame does on any error): nothing more is released."""
    value, source = received(sender, {"t": LARGE}), CountingBufferSource()

    def out_of_descriptors(token, size):
        raise shm.SharedMemoryError(errno.EMFILE, "cannot open shared buffer: Too many open files", token)

    monkeypatch.setattr(area, "map", out_of_descriptors)
    with pytest.raises(CodecError, match="Too many open files"):
        Codec(area=area).decode(value, source)
    discard_shared(value, source)
    all_released_once(sender, source, names(value))


def spoil_framework(tensor, monkeypatch, area):
    tensor.framework = "jax"


def spoil_dtype(tensor, monkeypatch, area):
    tensor.dtype = "not-a-dtype"


def spoil_size(tensor, monkeypatch, area):
    tensor.shape[:] = [3]  # 12 bytes expected, 4096 announced


def spoil_mapping(tensor, monkeypatch, area):
    real, refused = area.map, tensor.shared.name

    def map_all_but_one(token, size):
        if token == refused:
            raise shm.SharedMemoryError(errno.EMFILE, "cannot open shared buffer: Too many open files", token)
        return real(token, size)

    monkeypatch.setattr(area, "map", map_all_but_one)


def spoil_torch(tensor, monkeypatch, area):
    tensor.framework = "torch"
    monkeypatch.setitem(sys.modules, "torch", None)  # mapped first, then refused: no torch in this process


@pytest.mark.parametrize("spoil", [spoil_framework, spoil_dtype, spoil_size, spoil_mapping, spoil_torch])
def test_when_one_buffer_of_a_frame_fails_each_buffer_is_released_once(area, sender, monkeypatch, spoil):
    """A map of three pooled tensors whose second one does not decode:

    1. decode maps the first (its mapping's finalizer will release it), fails on the second, never reaches the third.
    2. the frame is dropped, then the partial result is collected.
    3. each of the three came back once: none twice, none never.
    """
    value, source = received(sender, {"a": LARGE, "b": LARGE + 1, "c": LARGE + 2}), CountingBufferSource()
    spoil(value.map.values[1].tensor, monkeypatch, area)
    with pytest.raises(CodecError):
        Codec(area=area).decode(value, source)
    discard_shared(value, source)
    gc.collect()
    all_released_once(sender, source, names(value))


def test_a_frame_dropped_after_it_decoded_releases_nothing_its_arrays_still_use(area, sender):
    """Something after decode fails (the frame's trace, its stage): the dropped frame must not free the buffer
    under the array the stage may still hold; the array's own finalizer releases it once it is gone."""
    value, source = received(sender, {"t": LARGE + 7}), CountingBufferSource()
    decoded = Codec(area=area).decode(value, source)
    discard_shared(value, source)
    assert source.releases == {}
    np.testing.assert_array_equal(decoded["t"], LARGE + 7)
    del decoded
    gc.collect()
    all_released_once(sender, source, names(value))


def test_a_receiver_without_a_shared_area_releases_the_buffer_once(sender):
    value, source = received(sender, {"t": LARGE}), CountingBufferSource()
    with pytest.raises(CodecError, match="no shared-memory area"):
        Codec().decode(value, source)
    discard_shared(value, source)
    all_released_once(sender, source, names(value))


def test_an_empty_buffer_released_at_once_is_not_released_again_when_a_later_value_fails(area):
    empty = pb.Value(shared_raw=pb.SharedBuffer(name="1-0000000000000001.1", size=0, pooled=True))
    bad = pb.Value(big_integer="12x")
    value, source = pb.Value(map=pb.ValueMap(keys=["empty", "bad"], values=[empty, bad])), CountingBufferSource()
    with pytest.raises(CodecError, match="big_integer"):
        Codec(area=area).decode(value, source)
    discard_shared(value, source)
    assert source.releases == {"1-0000000000000001.1": 1}


def test_a_frame_dropped_twice_releases_each_buffer_once(sender):
    value, source = received(sender, {"a": LARGE, "b": [LARGE, b"x" * 2048]}), CountingBufferSource()
    discard_shared(value, source)
    discard_shared(value, source)
    assert sorted(source.releases.values()) == [1, 1, 1]
    sender.release(source.releases)
    assert sender.pool is not None and (sender.pool.busy(), sender.pool.ignored) == (0, 0)


def test_a_value_decoded_a_second_time_refuses_the_buffer_the_first_decode_took(area, sender):
    value, source = received(sender, {"t": LARGE}), CountingBufferSource()
    first = Codec(area=area).decode(value, source)
    with pytest.raises(CodecError, match="nor one a decode already took"):
        Codec(area=area).decode(value, source)
    del first
    gc.collect()
    all_released_once(sender, source, names(value))


def test_a_stopping_sender_waits_for_its_pooled_writes_to_be_released_and_no_longer(sender):
    """A stopping worker closed its pool (unlinking the files) while its last frames were on their way: the
    receiver could not open the file ("cannot open shared buffer") and failed the request (CI, a scale-down)."""
    import asyncio
    import time

    async def scenario() -> tuple[float, float]:
        sender.encode({"audio": LARGE})
        [name] = sender.take_out_of_line().segments
        assert sender.pool is not None and sender.pool.busy() == 1
        asyncio.get_running_loop().call_later(0.05, sender.release, [name])  # the receiver's Release arrives
        started = time.monotonic()
        await sender.released(5.0)
        waited = time.monotonic() - started
        sender.encode({"audio": LARGE})  # never released: the wait is bounded
        started = time.monotonic()
        await sender.released(0.1)
        return waited, time.monotonic() - started

    waited, bounded = asyncio.run(scenario())
    assert 0.04 <= waited < 2.0 and sender.pool is not None and sender.pool.busy() == 1
    assert 0.09 <= bounded < 2.0
