"""The data plane with real spawned workers, real links and the Synthesis service on unix sockets."""

import asyncio
import os
import tempfile
from pathlib import Path

import grpc
import numpy as np
import pytest

from stagevisor.supervisor._proto import synthesis_pb2 as spb
from stagevisor.supervisor._proto import synthesis_pb2_grpc as sgrpc
from tests.integration.dataplane_stages import (
    BlobSink,
    BlobSource,
    Cluster,
    Echo,
    Engine,
    Firehose,
    Slow,
    Tokenize,
    Vocoder,
    poll_until,
    synthesize,
)

CHAIN = {"tokenize": (Tokenize, {}), "engine": (Engine, {}), "vocoder": (Vocoder, {})}


def chain(engine_process="pipeline", vocoder_process="pipeline"):
    return [
        ("tokenize", "pipeline", ["engine"], []),
        ("engine", engine_process, ["vocoder"], ["vocoder"]),
        ("vocoder", vocoder_process, [], []),
    ]


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def cluster_fixture(decls, factories):
    @pytest.fixture(scope="module")
    def fixture(loop):
        cluster = loop.run_until_complete(Cluster(decls, factories).start())
        yield cluster
        loop.run_until_complete(cluster.stop())

    return fixture


colocated = cluster_fixture(chain(), CHAIN)
split = cluster_fixture(chain(vocoder_process="vocoder"), CHAIN)
all_split = cluster_fixture(chain(engine_process="engine", vocoder_process="vocoder"), CHAIN)
slow_pair = cluster_fixture(
    [("a", "first", ["b"], ["b"]), ("b", "second", [], [])],
    {"a": (Slow, {"name": "a"}), "b": (Slow, {"name": "b"})},
)
blobs = cluster_fixture(
    [("source", "one", ["sink"], []), ("sink", "two", [], [])],
    {"source": (BlobSource, {}), "sink": (BlobSink, {})},
)

firehose = cluster_fixture(
    [("source", "one", ["hose"], []), ("hose", "two", [], [])],
    {"source": (Echo, {}), "hose": (Firehose, {})},
)

TEXT = "the quick brown fox jumps over the lazy dog"


def run(loop, coro, timeout=60):
    return loop.run_until_complete(asyncio.wait_for(coro, timeout))


async def audio_of(cluster, text=TEXT, **options):
    async with cluster.channel() as channel:
        chunks = await synthesize(channel, text, **options)
    return chunks


async def status_of(cluster, text, **options):
    try:
        await audio_of(cluster, text, **options)
    except grpc.aio.AioRpcError as error:
        return error.code(), error.details()
    return grpc.StatusCode.OK, ""


def test_colocated_and_split_chains_stream_identical_audio(loop, colocated, split, all_split):
    results = [run(loop, audio_of(c)) for c in (colocated, split, all_split)]
    pcm = [b"".join(ch.pcm for ch in chunks) for chunks in results]
    assert len(results[0]) == len(TEXT.split()) and pcm[0]
    assert pcm[0] == pcm[1] == pcm[2]


def test_chunks_reach_the_client_in_the_order_they_were_produced(loop, split):
    chunks = run(loop, audio_of(split))
    assert [c.sequence for c in chunks] == list(range(len(TEXT.split())))
    # The test vocoder's chunk i is a sine whose frequency encodes len(word_i) + i.
    expected = [float(len(w) + i) for i, w in enumerate(TEXT.split())]
    for chunk, value in zip(chunks, expected, strict=True):
        samples = np.frombuffer(chunk.pcm, "<i2")
        reference = np.clip(np.sin(np.arange(160, dtype=np.float32) * np.float32(value) / 50.0), -1, 1) * 32767
        assert np.array_equal(samples, reference.astype("<i2"))


def test_concurrent_requests_multiplex_over_the_links(loop, all_split):
    texts = [" ".join(["word"] * n) for n in range(1, 25)]

    async def many():
        async with all_split.channel() as channel:
            return await asyncio.gather(*(synthesize(channel, t) for t in texts))

    results = run(loop, many())
    assert [len(r) for r in results] == list(range(1, 25))


def test_failing_stage_ends_its_request_naming_the_stage_while_others_succeed(loop, split, caplog):
    async def failing():
        try:
            await audio_of(split, "this will boom now")
        except grpc.aio.AioRpcError as error:
            return error
        raise AssertionError("the request did not fail")

    async def both():
        return await asyncio.gather(failing(), audio_of(split, "all is fine"))

    error, good = run(loop, both())
    assert len(good) == 3
    # The client gets a code, the stage and a request id; the executor's text stays in the operator's log.
    assert error.code() == grpc.StatusCode.INTERNAL
    assert error.details().startswith("stage 'engine' failed with RuntimeError; the daemon log has the details")
    assert "exploded" not in error.details()
    trailers = dict(error.trailing_metadata())
    assert trailers["stagevisor-stage"] == "engine"
    assert f"(request {trailers['stagevisor-request-id']})" in error.details()
    assert f"request {trailers['stagevisor-request-id']} failed in stage 'engine'" in caplog.text
    assert "engine exploded on purpose" in caplog.text


def test_a_request_the_daemon_cannot_submit_gets_the_error_class_and_its_id_never_the_text(
    loop, colocated, caplog, monkeypatch
):
    """
    1. encoding a request for its first worker fails in the daemon with an OSError naming a path;
    2. the gRPC client gets INTERNAL with the class and a request id (in the message and the trailers), not
       grpc.aio's `Unexpected <class 'OSError'>: <text>`;
    3. the daemon log has the path and the traceback under that id.
    """
    path = "/dev/shm/stagevisor-secret-host/pool-7"

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device", path)

    async def failing():
        try:
            await audio_of(colocated, "hello there")
        except grpc.aio.AioRpcError as error:
            return error
        raise AssertionError("the request did not fail")

    monkeypatch.setattr(colocated.gateway.codec, "encode_into", full)
    error = run(loop, failing())
    assert error.code() == grpc.StatusCode.INTERNAL
    request_id = dict(error.trailing_metadata())["stagevisor-request-id"]
    assert error.details() == f"the daemon failed with OSError; the daemon log has the details (request {request_id})"
    assert f"request {request_id} could not be submitted" in caplog.text
    assert path in caplog.text and "Traceback (most recent call last)" in caplog.text


def test_invalid_request_is_rejected_with_invalid_argument(loop, split):
    code, details = run(loop, status_of(split, "fine words", bad="1"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "option 'bad'" in details
    code, details = run(loop, status_of(split, "   "))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "text is empty" in details


def test_edge_transports_report_what_requests_actually_used(loop, split):
    run(loop, audio_of(split))
    transports = split.gateway.edge_transports()
    assert transports[("tokenize", "engine")] == "in_process"
    assert transports[("engine", "vocoder")] == "grpc"
    planned = {(e.src, e.dst): ("grpc" if e.cross_process else "in_process") for e in split.plan.edges}
    assert transports == planned
    assert split.gateway.edge_requests()[("engine", "vocoder")]["grpc"] >= 1


def test_client_cancel_reaches_every_stage_on_the_route(loop, slow_pair, tmp_path):
    markers = str(tmp_path)

    async def read_two_then_cancel():
        async with slow_pair.channel() as channel:
            call = sgrpc.SynthesisStub(channel).Synthesize(
                spb.SynthesizeRequest(text="forever", options={"marker_dir": markers})
            )
            received = 0
            async for _ in call:
                received += 1
                if received == 2:
                    call.cancel()
                    break
        return await poll_until(lambda: all(Path(markers, f"{s}.cancelled").exists() for s in "ab"))

    assert run(loop, read_two_then_cancel())
    assert loop.run_until_complete(poll_until(lambda: slow_pair.gateway.in_flight() == 0))


def test_large_tensor_and_bytes_cross_processes_intact(loop, blobs):
    size = 64 * 1024 * 1024
    chunks = run(loop, audio_of(blobs, "big", size=str(size)))
    assert np.frombuffer(chunks[0].pcm, "<i2")[0] > 0  # BlobSink streams +0.5 only when both arrived intact
    assert chunks[0].sample_rate == size // 4 // 1024


def test_shared_buffers_are_released_and_reused_across_requests(loop, blobs):
    """Each request hands over a tensor and a blob in pooled shared memory; released ones are reused."""

    def files():
        return blobs.gateway.shared_files()

    run(loop, audio_of(blobs, "big", size=str(1 << 20)))
    before = files()
    for _ in range(12):
        chunks = run(loop, audio_of(blobs, "big", size=str(1 << 20)))
        assert np.frombuffer(chunks[0].pcm, "<i2")[0] > 0
    # Without releases every request would leave two more files (24 here); releases
    # travel asynchronously, so a few extra files may exist while some are in flight.
    assert files() - before <= 8


def test_killed_worker_ends_its_requests_with_unavailable_without_a_hang(loop):
    cluster = loop.run_until_complete(
        Cluster(
            [("a", "first", ["b"], ["b"]), ("b", "second", [], [])],
            {"a": (Slow, {"name": "a"}), "b": (Slow, {"name": "b"})},
        ).start()
    )
    try:

        async def kill_mid_request():
            async with cluster.channel() as channel:
                call = sgrpc.SynthesisStub(channel).Synthesize(spb.SynthesizeRequest(text="forever"))
                async for _ in call:
                    cluster.processes["second"].kill()
                    break
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    async for _ in call:
                        pass
                return raised.value

        error = run(loop, kill_mid_request(), timeout=30)
        # Either the gateway or the upstream worker notices first; both name the lost stage.
        assert error.code() == grpc.StatusCode.UNAVAILABLE and "stage 'b'" in error.details()
        assert "became unreachable" in error.details()
    finally:
        loop.run_until_complete(cluster.stop())


def test_fail_group_ends_in_flight_requests_naming_the_group(loop, slow_pair):
    async def fail_while_streaming():
        async with slow_pair.channel() as channel:
            call = sgrpc.SynthesisStub(channel).Synthesize(spb.SynthesizeRequest(text="forever"))
            async for _ in call:
                slow_pair.gateway.fail_group("second", "exited with signal 9")
                break
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                async for _ in call:
                    pass
            return raised.value

    error = run(loop, fail_while_streaming(), timeout=30)
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert error.details().startswith("stage 'b' is unavailable: its worker (group 'second') went down; retry")
    assert "signal 9" not in error.details()


def test_restarted_worker_on_the_same_address_serves_again(loop):
    cluster = loop.run_until_complete(Cluster(chain(vocoder_process="vocoder"), CHAIN).start())
    try:
        before = run(loop, audio_of(cluster))
        cluster.processes["vocoder"].kill()
        cluster.processes["vocoder"].join(10)

        async def after_restart():
            # Requests during the outage fail fast instead of hanging.
            code, _ = await status_of(cluster, TEXT)
            assert code == grpc.StatusCode.UNAVAILABLE
            await asyncio.to_thread(cluster.spawn, "vocoder")
            return await audio_of(cluster)

        after = run(loop, after_restart())
        assert b"".join(c.pcm for c in after) == b"".join(c.pcm for c in before)
    finally:
        loop.run_until_complete(cluster.stop())


def test_a_client_that_stops_reading_stalls_the_producing_stage_instead_of_buffering(loop, firehose, tmp_path):
    """
    1. a client reads one chunk of a stream of 3 s chunks, then stops reading;
    2. a second client on the same stage reads 1000 chunks: the reference for "meanwhile";
    3. the first stream's producer, in the same worker, has stalled far below that: bounded buffering
       (stream window plus gRPC's flow-control windows) stops it, while an unbounded one would have kept
       pace with the second stream.
    """
    stalled_dir, flowing_dir = tmp_path / "stalled", tmp_path / "flowing"
    stalled_dir.mkdir()
    flowing_dir.mkdir()

    def produced(directory):
        counter = directory / "produced"
        return int(counter.read_text() or 0) if counter.exists() else 0

    async def stall_one_while_another_flows():
        async with firehose.channel() as channel:
            stub = sgrpc.SynthesisStub(channel)
            stalled = stub.Synthesize(spb.SynthesizeRequest(text="go", options={"marker_dir": str(stalled_dir)}))
            await stalled.read()
            flowing = stub.Synthesize(
                spb.SynthesizeRequest(text="go", options={"marker_dir": str(flowing_dir), "samples": "16"})
            )
            for _ in range(1000):
                await flowing.read()
            counts = produced(stalled_dir), produced(flowing_dir)
            flowing.cancel()
            stalled.cancel()
            return counts

    stalled_at, reference = run(loop, stall_one_while_another_flows())
    assert reference >= 1000
    assert stalled_at <= 200, f"the stalled stream produced {stalled_at} chunks while the other delivered {reference}"


def test_gateway_stop_removes_its_shared_memory_directory_with_what_a_crashed_worker_left(loop):
    from stagevisor.supervisor.dataplane import shm
    from stagevisor.supervisor.dataplane.gateway import Gateway
    from tests.integration.dataplane_stages import make_plan

    with tempfile.TemporaryDirectory(prefix="gw") as directory:
        plan = make_plan([("only", "p", [], [])])
        gateway = Gateway(plan, {"only": f"unix:{directory}/p.sock"}, f"unix:{directory}/sink.sock")
        loop.run_until_complete(gateway.start())
        assert gateway.shm_room.ok and os.path.isdir(gateway.shm_dir)
        area = shm.SharedArea.open(Path(gateway.shm_dir))
        area.allocate(64)[1].close()  # a worker's file, never released
        area.close()
        loop.run_until_complete(gateway.stop(0))
    assert not os.path.exists(gateway.shm_dir)


def test_requests_to_a_replicated_group_with_no_replica_ready_fail_fast_instead_of_hanging(loop):
    """A group announced with replicas (or restarted without a pause, which is then routed the same way) has no
    READY worker: senders hand its requests to the group's own address (ReplicaRouter.choose), where nobody
    listens. The upstream stage has streamed its few chunks and returned before its link fails, so it no longer
    holds the request: the gateway watches the group's address for it, and it fails UNAVAILABLE at once instead
    of hanging until --pipeline-idle-timeout, its admission slot taken."""
    cluster = loop.run_until_complete(Cluster(chain(vocoder_process="vocoder"), CHAIN).start())
    try:
        cluster.processes["vocoder"].kill()
        cluster.processes["vocoder"].join(10)

        async def outage():
            workers = {"pipeline": cluster.routes["tokenize"]}
            version = cluster.gateway.push_replicas({cluster.routes["vocoder"]: ()}, (), workers)
            assert not await cluster.gateway.wait_replicas(version, workers, 10)
            return await status_of(cluster, "three short words")  # fewer chunks than the stream's credits

        code, details = run(loop, outage(), timeout=30)  # --pipeline-idle-timeout is 120 s
        assert code == grpc.StatusCode.UNAVAILABLE and "stage 'vocoder'" in details, details
    finally:
        loop.run_until_complete(cluster.stop())


def wire_string(field: int, data: bytes) -> bytes:
    """One length-delimited protobuf field (tag, length, bytes), written by hand: a protobuf library refuses to
    serialize a string that is not UTF-8, as a client in another language or a buggy encoder need not."""
    assert len(data) < 128, "a one-byte length"
    return bytes([field << 3 | 2, len(data)]) + data


@pytest.mark.parametrize(
    "raw, what",
    [
        (wire_string(1, b"Hello \xff\xfe"), "bad UTF-8"),
        (
            wire_string(1, b"Hello.") + wire_string(5, wire_string(1, b"seed") + wire_string(2, b"\xed\xa0\x80")),
            "UTF-8",
        ),
        (b"\xff\xff\xff\xff", "corrupt"),
    ],
    ids=["text-not-utf8", "option-lone-surrogate", "not-protobuf"],
)
def test_a_request_that_is_not_a_synthesize_request_is_invalid_argument(loop, split, raw, what):
    async def call():
        async with split.channel() as channel:
            method = channel.unary_stream(
                "/stagevisor.v1.Synthesis/Synthesize",
                request_serializer=lambda message: message,
                response_deserializer=spb.AudioChunk.FromString,
            )
            try:
                [chunk async for chunk in method(raw, timeout=30)]
            except grpc.aio.AioRpcError as error:
                return error.code(), error.details()
        return grpc.StatusCode.OK, ""

    code, details = run(loop, call())
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert details.startswith("the request is not a stagevisor.v1.SynthesizeRequest") and what in details
    assert "Unexpected" not in details
    assert run(loop, status_of(split, "still answering"))[0] == grpc.StatusCode.OK
