"""The gateway's books of requests: what it sends a request's workers, and how every request ends, whatever ends it.

No worker runs: the gateway's links are a recorder (`RecordedLinks`), and the frames workers would send its sink are
handed to it as its sink server would (`from_worker`). A request's outcome is read as a client reads it.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pytest

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane.admission import Admission, AdmissionLimits, AdmissionRejected
from stagevisor.supervisor.dataplane.codec import Codec
from stagevisor.supervisor.dataplane.gateway import Gateway
from stagevisor.supervisor.dataplane.peers import Peer, PeerDirectory
from stagevisor.supervisor.dataplane.request_handle import RequestHandle
from stagevisor.supervisor.dataplane.routing import SINK
from stagevisor.supervisor.errors import RequestFailed
from tests.fakes import RecordedLink, RecordedLinks, outcome
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement

ENTRY = "unix:/nonexistent/pipeline.sock"
VOCODER = "unix:/nonexistent/vocoder.sock"
REPLICAS = ("unix:/nonexistent/pipeline-0.sock", "unix:/nonexistent/pipeline-1.sock")
"""The entry group's replicas, where a test replicates it: the gateway picks one per request."""
VOCODER_REPLICAS = ("unix:/nonexistent/vocoder-0.sock", "unix:/nonexistent/vocoder-1.sock")
"""The vocoder's, where a test replicates it: the entry worker picks one, the gateway only cancels on them."""
TEXT = {"text": "Hello there."}


def gateway(
    tmp_path, *, replicated: str = "", admission: Admission | None = None, links: RecordedLinks | None = None
) -> Gateway:
    """The demo's gateway with the vocoder in a process of its own, started on recorded links; `replicated`:
    "entry" or "vocoder", that group in two replicas."""
    plan = plan_placement(PlacementRequest("demo", isolate_stages=("vocoder",)))
    routes = {s.name: VOCODER if s.name == "vocoder" else ENTRY for s in plan.stages}
    built = Gateway(plan, routes, "unix:/nonexistent/sink.sock", admission=admission, shm_root=tmp_path)
    built.links = links or RecordedLinks()  # what start() opens, without a server
    if replicated == "entry":
        built.push_replicas({ENTRY: REPLICAS}, (), {})
    elif replicated == "vocoder":
        built.push_replicas({VOCODER: VOCODER_REPLICAS}, (), {})
    return built


def sent(built: Gateway) -> RecordedLinks:
    return built.links  # type: ignore[return-value]


def from_worker(built: Gateway, frame: pb.Frame, link: RecordedLink | None = None) -> None:
    """A frame a worker sent the gateway's sink."""
    built._on_frame(frame, link or RecordedLink("worker"))


def done(request_id: str) -> pb.Frame:
    return pb.Frame(request_id=request_id, src="vocoder", dst=SINK, done=pb.Done())


def audio(request_id: str, sample_rate: int = 24000) -> pb.Frame:
    value = Codec().encode({"audio": np.zeros(240, np.float32), "sample_rate": sample_rate})
    return pb.Frame(request_id=request_id, src="vocoder", dst=SINK, chunk=pb.Chunk(value=value))


def cancels(built: Gateway, address: str) -> list[str]:
    return [f.request_id for f in sent(built).links.get(address, RecordedLink(address)).frames if f.HasField("cancel")]


@pytest.fixture
def bad_frames_logged(monkeypatch):
    """Warnings about bad frames are rate-limited per process: other tests' may have used up the window."""
    from stagevisor.supervisor.dataplane import gateway as module
    from stagevisor.supervisor.dataplane.link.frames import log
    from stagevisor.supervisor.logs import Throttled

    monkeypatch.setattr(module, "bad_frames_log", Throttled(log))


def one_slot() -> Admission:
    return Admission(AdmissionLimits(max_concurrent=1, max_queued=4, queue_timeout=0.0))


async def running_and_queued(built: Gateway) -> tuple[RequestHandle, asyncio.Future]:
    """A request holding the gateway's one admission slot, and one queued behind it (not yet admitted)."""
    running = await built.submit(TEXT)
    queued = asyncio.ensure_future(built.submit(TEXT))
    await asyncio.sleep(0.01)
    return running, queued


# ---- opening a request ------------------------------------------------------------------------------------


def test_a_request_goes_to_the_entry_stage_with_its_text_and_a_fresh_id(tmp_path):
    built = gateway(tmp_path)
    first, second = built.open(TEXT), built.open(TEXT)
    assert first.request_id != second.request_id
    frames = sent(built).links[ENTRY].frames
    assert [(f.request_id, f.src, f.dst, f.WhichOneof("body")) for f in frames] == [
        (first.request_id, SINK, "preprocessing", "submit"),
        (second.request_id, SINK, "preprocessing", "submit"),
    ]
    assert Codec().decode(frames[0].submit.request)["text"] == "Hello there."
    assert built.in_flight() == 2 and built.request_ids() == {first.request_id, second.request_id}
    assert sent(built).bodies(VOCODER) == []  # the entry worker hands it on


def test_a_request_with_an_unusable_text_is_refused_before_any_worker_hears_of_it(tmp_path):
    built = gateway(tmp_path)
    with pytest.raises(RequestFailed) as refused:
        built.open({"text": ""})
    assert refused.value.status == "INVALID_ARGUMENT"
    assert sent(built).links == {} and built.in_flight() == 0


def test_a_gateway_not_started_or_stopping_refuses_requests_as_unavailable(tmp_path):
    plan = plan_placement(PlacementRequest("demo"))
    unstarted = Gateway(plan, {s.name: ENTRY for s in plan.stages}, "unix:/nonexistent/s.sock", shm_root=tmp_path)
    stopping = gateway(tmp_path)
    stopping.stop_accepting()
    for built in (unstarted, stopping):
        with pytest.raises(RequestFailed, match="not accepting requests") as refused:
            built.open(TEXT)
        assert refused.value.status == "UNAVAILABLE" and built.in_flight() == 0


def test_a_request_the_gateway_cannot_send_fails_at_once_and_frees_its_replica(tmp_path, caplog):
    built = gateway(tmp_path, replicated="entry", links=RecordedLinks(refuse=REPLICAS[0]))
    with pytest.raises(RequestFailed) as failed:
        built.open(TEXT)  # to the first replica, which cannot be reached
    assert failed.value.status == "INTERNAL" and "cannot reach" not in failed.value.message
    assert built.in_flight() == 0 and built.replica_in_flight(REPLICAS[0]) == 0
    assert "could not be submitted" in caplog.text


def test_a_request_to_a_replicated_entry_goes_to_one_replica_which_counts_it_until_it_closes(tmp_path):
    built = gateway(tmp_path, replicated="entry")
    first, second = built.open(TEXT), built.open(TEXT)
    assert {first.replica, second.replica} == set(REPLICAS)
    assert [sent(built).bodies(r) for r in REPLICAS] == [["submit"], ["submit"]]
    assert sent(built).bodies(ENTRY) == []  # the group's own address holds no request
    assert [built.replica_in_flight(r) for r in REPLICAS] == [1, 1]
    replica = first.replica
    built.close_request(first)
    assert first.replica is None and built.replica_in_flight(replica or "") == 0
    assert built.replica_in_flight(second.replica or "") == 1


def test_a_request_to_a_replicated_entry_is_watched_on_the_unreplicated_workers_after_it(tmp_path):
    built = gateway(tmp_path, replicated="entry")
    handle = built.open(TEXT)
    built.on_link_broken(sent(built).get(VOCODER), ConnectionResetError())
    error = asyncio.run(outcome(handle))
    assert isinstance(error, RequestFailed) and error.stage == "vocoder"


def test_a_request_behind_an_unreplicated_entry_has_no_replica_of_its_own(tmp_path):
    built = gateway(tmp_path, replicated="vocoder")
    assert built.open(TEXT).replica is None  # the entry worker picks the vocoder's replica, not the gateway


def test_each_stage_is_named_with_its_process_group(tmp_path):
    assert gateway(tmp_path).stage_groups == {
        "preprocessing": "pipeline",
        "tts_engine": "pipeline",
        "vocoder": "vocoder",
    }


# ---- how requests end ---------------------------------------------------------------------------------------


def test_a_request_ends_well_when_its_terminal_stage_is_done_and_its_audio_reaches_the_client(tmp_path):
    built = gateway(tmp_path)
    handle = built.open(TEXT)
    link = RecordedLink(VOCODER)
    from_worker(built, audio(handle.request_id), link)
    from_worker(built, done(handle.request_id), link)
    chunks = asyncio.run(outcome(handle))
    assert isinstance(chunks, list) and [c["sample_rate"] for c in chunks] == [24000]
    assert link.credits == 1  # the chunk's credit went back once the client took it


def test_a_chunk_for_a_request_the_gateway_no_longer_holds_is_dropped_and_its_credit_returned(tmp_path):
    built = gateway(tmp_path)
    handle = built.open(TEXT)
    built.close_request(handle)
    link = RecordedLink(VOCODER)
    from_worker(built, audio(handle.request_id), link)
    from_worker(built, audio("never-opened"), link)
    assert link.credits == 2


def test_closing_a_request_that_has_not_ended_cancels_it_on_every_worker_and_replica(tmp_path):
    built = gateway(tmp_path, replicated="vocoder")
    handle = built.open(TEXT)
    for address in VOCODER_REPLICAS:
        sent(built).get(address)  # linked: the replicas took the announcement of their set
    built.close_request(handle)
    error = asyncio.run(outcome(handle))
    assert isinstance(error, RequestFailed) and error.status == "CANCELLED"
    # The entry worker chose a vocoder replica the gateway does not know of: each is told.
    assert [cancels(built, a) for a in (ENTRY, *VOCODER_REPLICAS)] == [[handle.request_id]] * 3
    assert built.in_flight() == 0


def test_closing_a_request_that_ended_cancels_nothing(tmp_path):
    built = gateway(tmp_path)
    handle = built.open(TEXT)
    from_worker(built, done(handle.request_id))
    built.close_request(handle)
    built.close_request(handle)  # twice: the client's finally and the server's
    assert cancels(built, ENTRY) == [] and built.in_flight() == 0


def test_a_failure_a_stage_reports_ends_its_request_with_the_stages_status_and_cancels_it_elsewhere(tmp_path):
    built = gateway(tmp_path)
    failing, other = built.open(TEXT), built.open(TEXT)
    failure = pb.Failure(stage="tts_engine", code=pb.FAILURE_CODE_INVALID_ARGUMENT, message="too long")
    from_worker(built, pb.Frame(request_id=failing.request_id, src="tts_engine", dst=SINK, failure=failure))
    error = asyncio.run(outcome(failing))
    assert isinstance(error, RequestFailed) and (error.status, error.stage) == ("INVALID_ARGUMENT", "tts_engine")
    assert "too long" in error.message
    assert cancels(built, ENTRY) == [failing.request_id] and cancels(built, VOCODER) == [failing.request_id]
    assert not other.ended


def test_a_frame_the_gateway_cannot_read_fails_only_its_own_request_as_internal(tmp_path, caplog, bad_frames_logged):
    built = gateway(tmp_path)
    broken, other = built.open(TEXT), built.open(TEXT)
    bad = pb.Frame(request_id=broken.request_id, src="vocoder", dst=SINK, done=pb.Done(trace=["not a hop"]))
    with caplog.at_level("WARNING"):
        from_worker(built, bad)
    error = asyncio.run(outcome(broken))
    assert isinstance(error, RequestFailed) and error.status == "INTERNAL"
    assert "a worker sent a frame the daemon could not read" in error.message
    assert not other.ended and cancels(built, ENTRY) == [broken.request_id]
    assert f"refusing a done frame for request {broken.request_id}" in caplog.text


def test_a_replica_link_that_breaks_fails_the_requests_sent_to_it_and_takes_it_out_of_rotation(tmp_path):
    built = gateway(tmp_path, replicated="entry")
    held = {}
    for _ in range(4):
        handle = built.open(TEXT)
        held.setdefault(handle.replica, []).append(handle)
    assert sorted(held) == sorted(REPLICAS)
    lost, kept = REPLICAS
    built.on_link_broken(sent(built).get(lost), ConnectionResetError())
    for handle in held[lost]:
        error = asyncio.run(outcome(handle))
        assert isinstance(error, RequestFailed) and (error.status, error.stage) == ("UNAVAILABLE", "")
    assert not any(handle.ended for handle in held[kept])
    assert {built.open(TEXT).replica for _ in range(3)} == {kept}  # until the daemon announces it again


def test_a_worker_link_that_breaks_fails_every_request_on_its_route_naming_its_one_stage(tmp_path):
    built = gateway(tmp_path)
    handles = [built.open(TEXT), built.open(TEXT)]
    built.on_link_broken(sent(built).get(VOCODER), ConnectionResetError())
    for handle in handles:
        error = asyncio.run(outcome(handle))
        assert isinstance(error, RequestFailed) and (error.status, error.stage) == ("UNAVAILABLE", "vocoder")
    assert cancels(built, ENTRY) == [h.request_id for h in handles]


def test_a_group_that_goes_down_fails_every_request_on_its_route(tmp_path):
    built = gateway(tmp_path)
    handles = [built.open(TEXT), built.open(TEXT)]
    built.fail_group("no-such-group", "crashed")
    assert not any(h.ended for h in handles)
    built.fail_group("vocoder", "exited with status 1")
    for handle in handles:
        error = asyncio.run(outcome(handle))
        assert isinstance(error, RequestFailed) and (error.status, error.stage) == ("UNAVAILABLE", "vocoder")
        assert error.message == "stage 'vocoder' is unavailable: its worker (group 'vocoder') went down; retry"
    assert cancels(built, ENTRY) == [h.request_id for h in handles]


def test_a_group_of_several_stages_going_down_names_no_single_stage(tmp_path):
    built = gateway(tmp_path)
    handle = built.open(TEXT)
    group = built.plan.group_of("preprocessing").name
    built.fail_group(group, "killed")
    error = asyncio.run(outcome(handle))
    assert isinstance(error, RequestFailed) and (error.status, error.stage) == ("UNAVAILABLE", "")


def test_unplayable_audio_fails_its_request_and_cancels_it_on_the_workers_still_making_it(tmp_path, caplog):
    built = gateway(tmp_path)
    handle, other = built.open(TEXT), built.open(TEXT)
    from_worker(built, audio(handle.request_id, 24000))
    with caplog.at_level("WARNING"):
        from_worker(built, audio(handle.request_id, 16000))
        from_worker(built, audio(handle.request_id, 8000))  # after the failure: dropped, nothing more logged
    error = asyncio.run(outcome(handle))
    assert isinstance(error, RequestFailed) and (error.status, error.stage) == ("INTERNAL", "vocoder")
    assert "audio at 16000 Hz after audio at 24000 Hz" in error.message
    assert cancels(built, ENTRY) == [handle.request_id] == cancels(built, VOCODER)
    assert caplog.text.count(f"request {handle.request_id} failed in stage 'vocoder'") == 1
    assert not other.ended


# ---- draining and stopping ----------------------------------------------------------------------------------


def test_stopping_waits_for_requests_within_the_grace_then_fails_the_rest_and_cancels_them(tmp_path):
    async def scenario():
        built = gateway(tmp_path)
        finishing, stuck = built.open(TEXT), built.open(TEXT)

        async def finish_soon():
            await asyncio.sleep(0.05)
            from_worker(built, done(finishing.request_id))
            built.close_request(finishing)

        loop = asyncio.get_running_loop()
        started = loop.time()
        finisher = asyncio.ensure_future(finish_soon())
        await built.stop(0.3)
        waited = loop.time() - started
        await finisher
        return built, finishing, stuck, waited

    built, finishing, stuck, waited = asyncio.run(scenario())
    assert waited >= 0.3  # the stuck request held the stop for its whole grace, no more
    assert isinstance(asyncio.run(outcome(finishing)), list)
    error = asyncio.run(outcome(stuck))
    assert isinstance(error, RequestFailed) and error.status == "UNAVAILABLE"
    assert error.message == "the daemon is shutting down"
    assert cancels(built, ENTRY) == [stuck.request_id] == cancels(built, VOCODER)
    assert sent(built).closed


def test_stopping_with_nothing_in_flight_does_not_wait_for_the_grace(tmp_path):
    async def scenario():
        built = gateway(tmp_path)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await built.stop(30.0)
        return loop.time() - started

    assert asyncio.run(scenario()) < 5.0


def test_a_draining_gateway_refuses_new_requests_and_ends_those_queued(tmp_path):
    async def scenario():
        admission = one_slot()
        built = gateway(tmp_path, admission=admission)
        running, queued = await running_and_queued(built)
        built.stop_accepting()
        with pytest.raises(AdmissionRejected) as queued_refusal:
            await queued
        with pytest.raises(AdmissionRejected) as new_refusal:
            await built.submit(TEXT)
        assert not running.ended  # what runs goes on: the drain
        return queued_refusal.value, new_refusal.value

    queued, new = asyncio.run(scenario())
    assert queued.status == new.status == "UNAVAILABLE"


def test_a_request_queued_when_its_gateway_is_retired_goes_to_the_successor_and_frees_its_slot(tmp_path):
    async def scenario():
        admission = one_slot()
        old, new = gateway(tmp_path, admission=admission), gateway(tmp_path, admission=admission)
        running, queued = await running_and_queued(old)
        old.retire(new)
        old.close_request(running)  # its slot goes to the queued request, which then finds the gateway retired
        handle = await asyncio.wait_for(queued, 5.0)
        return old, new, handle

    old, new, handle = asyncio.run(scenario())
    assert handle.request_id in new.request_ids() and old.in_flight() == 0
    assert sent(new).bodies(ENTRY) == ["submit"]


def test_a_request_given_a_slot_as_the_daemon_starts_draining_is_refused_as_unavailable(tmp_path):
    """A slot freed as the drain begins goes to the first queued request, which then finds the gateway closed:
    it is refused as any request during a drain is, and its slot goes back."""

    async def scenario():
        admission = one_slot()
        built = gateway(tmp_path, admission=admission)
        running, queued = await running_and_queued(built)
        built.close_request(running)  # the slot goes to the queued request, which has not run since
        built.stop_accepting()
        with pytest.raises(RequestFailed) as refused:
            await queued
        return refused.value, admission

    refused, admission = asyncio.run(scenario())
    assert refused.status == "UNAVAILABLE" and "not accepting requests" in refused.message
    assert admission.snapshot()["running"] == 0


def test_a_request_refused_after_its_admission_gives_its_slot_back(tmp_path):
    async def scenario():
        built = gateway(tmp_path, admission=Admission(AdmissionLimits(max_concurrent=1, max_queued=0)))
        with pytest.raises(RequestFailed):
            await built.submit({"text": ""})
        return await asyncio.wait_for(built.submit(TEXT), 5.0)  # the one slot is free again

    assert not asyncio.run(scenario()).ended


def test_stopping_with_no_grace_fails_what_is_in_flight_at_once(tmp_path):
    async def scenario():
        built = gateway(tmp_path)
        stuck = built.open(TEXT)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await built.stop(0.0)
        return stuck, loop.time() - started

    stuck, waited = asyncio.run(scenario())
    assert stuck.ended and waited < 1.0  # no wait at all: 1 s would be a poll or a minimum grace


# ---- replica announcements ---------------------------------------------------------------------------------


def test_each_replica_announcement_has_a_new_version_and_waits_for_every_workers_answer(tmp_path):
    async def scenario():
        built = gateway(tmp_path)
        workers = {"pipeline": ENTRY, "vocoder": VOCODER}
        first = built.push_replicas({VOCODER: REPLICAS}, (), workers)
        second = built.push_replicas({VOCODER: REPLICAS[:1]}, (), workers)
        frames = [f.replicas for f in sent(built).links[ENTRY].frames if f.HasField("replicas")]
        built.on_reply(pb.Frame(src="pipeline", replicas=pb.Replicas(version=second)))
        built.on_reply(pb.Frame(src="vocoder", replicas=pb.Replicas(version=first)))
        missing = await built.wait_replicas(second, workers, 0.05)
        assert await built.wait_replicas(first, {"new": REPLICAS[0]}, 0.05) == ["new"]  # it never answered
        built.on_reply(pb.Frame(src="vocoder", replicas=pb.Replicas(version=second)))
        return first, second, frames, missing, await built.wait_replicas(second, workers, 5.0)

    first, second, frames, missing, none_missing = asyncio.run(scenario())
    assert (first, second) == (1, 2)
    assert [(m.version, [list(s.ready) for s in m.sets]) for m in frames] == [
        (1, [list(REPLICAS)]),
        (2, [list(REPLICAS[:1])]),
    ]
    assert missing == ["vocoder"] and none_missing == []


def test_a_replica_announced_lost_fails_the_requests_it_held_and_leaves_the_rotation(tmp_path):
    built = gateway(tmp_path, replicated="entry")
    handles = [built.open(TEXT) for _ in range(2)]
    lost = handles[0].replica
    assert lost is not None
    built.push_replicas({ENTRY: tuple(r for r in REPLICAS if r != lost)}, (lost,), {})
    error = asyncio.run(outcome(handles[0]))
    assert isinstance(error, RequestFailed) and error.status == "UNAVAILABLE"
    assert not handles[1].ended
    assert {built.open(TEXT).replica for _ in range(3)} == {handles[1].replica}


def test_a_request_that_ends_before_replicas_are_announced_is_not_pinned_to_the_entrys_address(tmp_path):
    built = gateway(tmp_path)
    running, ended = built.open(TEXT), built.open(TEXT)
    from_worker(built, done(ended.request_id))  # ended, not yet closed by its client
    built.push_replicas({ENTRY: (ENTRY, REPLICAS[0])}, (), {})  # the entry group gets a second replica
    # What its one worker held counts as held by the replica at its address: a drain of it waits for that.
    assert (running.replica, ended.replica) == (ENTRY, None)
    assert built.replica_in_flight(ENTRY) == 1 and built.replica_in_flight("unix:/nonexistent/other.sock") == 0


def test_where_workers_run_goes_to_each_worker_with_a_new_version_once_peers_are_dialled_by_node(tmp_path):
    built = gateway(tmp_path)
    assert built.push_peers({ENTRY: Peer("node-a", "10.0.0.1:7000")}, [ENTRY]) == 0  # one host: nothing to say
    assert sent(built).bodies(ENTRY) == []
    built.directory = PeerDirectory("node-a")
    peers = {ENTRY: Peer("node-a", "10.0.0.1:7000"), VOCODER: Peer("node-b", "10.0.0.2:7000")}
    assert built.push_peers(peers, [ENTRY, VOCODER]) == 1
    assert built.push_peers(peers, [VOCODER]) == 2
    frames = [f.peers for f in sent(built).links[VOCODER].frames]
    assert [f.version for f in frames] == [1, 2]
    assert {(p.address, p.node_id, p.tcp) for p in frames[0].peers} == {
        (ENTRY, "node-a", "10.0.0.1:7000"),
        (VOCODER, "node-b", "10.0.0.2:7000"),
    }
    assert [f.peers.version for f in sent(built).links[ENTRY].frames] == [1]


# ---- what workers report ------------------------------------------------------------------------------------


def test_finished_requests_count_each_edges_transport_and_an_edge_crossed_both_ways_is_mixed(tmp_path):
    from stagevisor.supervisor.dataplane.trace import hop

    built = gateway(tmp_path)
    first, second, unknown = built.open(TEXT), built.open(TEXT), "never-opened"
    over_grpc = [hop("preprocessing", "tts_engine", "in_process"), hop("tts_engine", "vocoder", "grpc")]
    in_process = [hop("preprocessing", "tts_engine", "in_process"), hop("tts_engine", "vocoder", "in_process")]
    timings = pb.Timings(names=["vocoder"], starts=[1.0], ends=[2.5])
    for request_id, trace in ((first.request_id, over_grpc), (second.request_id, in_process), (unknown, in_process)):
        frame = done(request_id)
        frame.done.trace.extend(trace)
        if request_id == first.request_id:
            frame.done.timings.CopyFrom(timings)
        from_worker(built, frame)
    assert first.ended and second.ended
    assert first.timings == [("vocoder", 1.0, 2.5)] and second.timings == []
    assert built.edge_transports() == {
        ("preprocessing", "tts_engine"): "in_process",
        ("tts_engine", "vocoder"): "mixed",
    }
    assert built.edge_requests() == {
        ("preprocessing", "tts_engine"): {"in_process": 2},
        ("tts_engine", "vocoder"): {"grpc": 1, "in_process": 1},
    }


def test_a_workers_keepalive_holds_off_the_idle_timeout_of_a_request_it_still_works_on(tmp_path):
    async def scenario():
        built = gateway(tmp_path)
        built.limits = replace(built.limits, pipeline_idle_timeout=1.0)
        kept, idle = built.open(TEXT), built.open(TEXT)
        reading = [asyncio.ensure_future(outcome(h)) for h in (kept, idle)]
        for _ in range(15):  # 1.5 s, past the idle timeout, a keepalive every 0.1 s (a tenth of it)
            await asyncio.sleep(0.1)
            from_worker(built, pb.Frame(request_id=kept.request_id, src="tts_engine", keepalive=pb.KeepAlive()))
        from_worker(built, done(kept.request_id))
        return await asyncio.gather(*reading)

    kept, idle = asyncio.run(scenario())
    assert kept == []
    assert isinstance(idle, RequestFailed) and idle.status == "UNAVAILABLE" and "sent nothing" in idle.message


def test_worker_metrics_reports_go_to_the_daemons_metrics_when_it_keeps_any(tmp_path):
    class Metrics:
        def __init__(self):
            self.reports = []

        def apply_report(self, report):
            self.reports.append(report.group)

    built = gateway(tmp_path)
    from_worker(built, pb.Frame(metrics=pb.MetricsReport(group="pipeline")))  # no metrics kept: nothing to do
    built.metrics = Metrics()  # type: ignore[assignment]
    from_worker(built, pb.Frame(metrics=pb.MetricsReport(group="vocoder")))
    assert built.metrics.reports == ["vocoder"]  # type: ignore[attr-defined]


def test_a_failure_or_keepalive_for_a_request_no_longer_held_is_ignored(tmp_path, caplog):
    built = gateway(tmp_path)
    failure = pb.Failure(stage="vocoder", code=pb.FAILURE_CODE_INTERNAL, message="late")
    with caplog.at_level("WARNING"):
        from_worker(built, pb.Frame(request_id="gone", src="vocoder", dst=SINK, failure=failure))
        from_worker(built, pb.Frame(request_id="gone", src="vocoder", keepalive=pb.KeepAlive()))
    assert caplog.text == "" and cancels(built, ENTRY) == []


def test_an_internal_failure_is_logged_with_its_stage_and_type_while_the_client_gets_no_text(tmp_path, caplog):
    built = gateway(tmp_path)
    crashed, refused = built.open(TEXT), built.open(TEXT)
    internal = pb.Failure(
        stage="vocoder", code=pb.FAILURE_CODE_INTERNAL, message="/srv/models/secret.bin", error_type="OSError"
    )
    invalid = pb.Failure(stage="vocoder", code=pb.FAILURE_CODE_INVALID_ARGUMENT, message="no such voice")
    with caplog.at_level("WARNING"):
        from_worker(built, pb.Frame(request_id=crashed.request_id, src="vocoder", dst=SINK, failure=internal))
        from_worker(built, pb.Frame(request_id=refused.request_id, src="vocoder", dst=SINK, failure=invalid))
    error = asyncio.run(outcome(crashed))
    assert isinstance(error, RequestFailed) and error.status == "INTERNAL" and "secret" not in error.message
    assert crashed.request_id in caplog.text and "(OSError)" in caplog.text and "secret.bin" in caplog.text
    assert refused.request_id not in caplog.text  # the client was told why; nothing for the operator to look up


def test_a_frame_the_link_could_not_parse_fails_the_request_it_names_and_is_logged_with_its_peer(
    tmp_path, caplog, bad_frames_logged
):
    from stagevisor.supervisor.dataplane.link.frames import BadFrame

    class Inbound:
        peer = "vocoder-worker"

    built = gateway(tmp_path)
    named, other = built.open(TEXT), built.open(TEXT)
    with caplog.at_level("WARNING"):
        built._on_bad_frame(BadFrame("", "a frame that is not protobuf"), Inbound())  # type: ignore[arg-type]
        assert not named.ended and not other.ended  # no request named: none to fail
        built._on_bad_frame(BadFrame(named.request_id, "a truncated frame"), Inbound())  # type: ignore[arg-type]
    error = asyncio.run(outcome(named))
    assert isinstance(error, RequestFailed) and error.status == "INTERNAL"
    assert error.message.startswith("a worker sent a truncated frame") and not other.ended
    assert "data-plane peer vocoder-worker sent a frame that is not protobuf" in caplog.text


def test_a_worker_that_cannot_be_told_does_not_stop_the_others_hearing_of_a_cancel_or_replicas(tmp_path):
    class Flaky(RecordedLinks):
        """The entry worker's link fails from `broken` on."""

        broken = False

        def send(self, address, frame, out=None):
            if self.broken and address == ENTRY:
                raise OSError("link gone")
            super().send(address, frame, out)

        def send_if_linked(self, address, frame):
            if self.broken and address == ENTRY:
                raise OSError("link gone")
            return super().send_if_linked(address, frame)

    links = Flaky()
    built = gateway(tmp_path, links=links)
    handle = built.open(TEXT)
    sent(built).get(VOCODER)
    links.broken = True
    built.close_request(handle)  # the cancel to the entry fails first: the vocoder still hears of it
    assert cancels(built, VOCODER) == [handle.request_id]
    assert isinstance(asyncio.run(outcome(handle)), RequestFailed)
    built.push_replicas({VOCODER: VOCODER_REPLICAS}, (), {"pipeline": ENTRY, "vocoder": VOCODER})
    assert sent(built).bodies(VOCODER)[-1] == "replicas"
    built.directory = PeerDirectory("node-a")
    built.push_peers({VOCODER: Peer("node-b", "10.0.0.2:7000")}, [ENTRY, VOCODER])
    assert sent(built).bodies(VOCODER)[-1] == "peers"


def test_waiting_for_workers_to_take_a_replica_announcement_ends_when_the_last_one_answers(tmp_path):
    async def scenario():
        built = gateway(tmp_path)
        workers = {"pipeline": ENTRY, "vocoder": VOCODER}
        version = built.push_replicas({VOCODER: VOCODER_REPLICAS}, (), workers)
        waiting = asyncio.ensure_future(built.wait_replicas(version, workers, 30.0))
        await asyncio.sleep(0.05)
        built.on_reply(pb.Frame(src="pipeline", replicas=pb.Replicas(version=version)))
        built.on_reply(pb.Frame(src="pipeline", replicas=pb.Replicas(version=0)))  # an old answer, late
        assert not waiting.done()
        built.on_reply(pb.Frame(src="vocoder", replicas=pb.Replicas(version=version)))
        return await asyncio.wait_for(waiting, 5.0)

    assert asyncio.run(scenario()) == []


# ---- shared memory ------------------------------------------------------------------------------------------


def test_shared_memory_counts_and_sweeps_nothing_before_it_is_set_up_and_survives_a_failed_sweep(tmp_path, monkeypatch):
    built = gateway(tmp_path)
    assert built.shared_files() == 0 and built.sweep_shared() == 0
    built._start_shared_memory()
    assert built.shm_room is not None and built.shm_room.ok
    assert built.shared_files() == 0
    area = built._area
    assert area is not None

    def fails() -> int:
        raise OSError("the directory went away")

    monkeypatch.setattr(area, "sweep_dead_writers", fails)
    assert built.sweep_shared() == 0
    built.remove_shared_area()


def test_shared_memory_is_sized_for_the_requests_admission_lets_run_at_once(tmp_path):
    from stagevisor.supervisor.dataplane import shm

    plan = plan_placement(PlacementRequest("demo"))
    routes = {s.name: ENTRY for s in plan.stages}

    def needed(**kwargs) -> int:
        return Gateway(plan, routes, "unix:/nonexistent/s.sock", shm_root=tmp_path, **kwargs).shm_needed

    per_request = shm.bytes_per_request()
    limited = Admission(AdmissionLimits(max_concurrent=3))
    unbounded = Admission(AdmissionLimits(max_concurrent=0))
    assert needed(admission=limited) == 3 * per_request
    assert needed(admission=limited, max_concurrent_requests=5) == 5 * per_request
    assert needed(admission=unbounded) == shm.DEFAULT_CONCURRENT_REQUESTS * per_request
