"""Replicas without processes: worker specs per replica, and the sender's least-in-flight, sticky routing."""

from __future__ import annotations

from pathlib import Path

from stagevisor.supervisor.daemon.specs import worker_specs
from stagevisor.supervisor.dataplane import replicas
from stagevisor.supervisor.dataplane.replicas import RECENT_ROUTES, ReplicaRouter
from stagevisor.supervisor.plan import Edge, Plan, PlannedStage, ProcessGroup
from stagevisor.supervisor.worker.spec import VISIBLE_DEVICES
from tests.unit.dataplane.runtime_driver import handed_on_to_a_replica


def plan(replicas: int = 3) -> Plan:
    stages = (
        PlannedStage("pre", "pipeline", None, 1, None, None, "m:f", next=("voc",)),
        PlannedStage("voc", "vocoder", 0, 1, 0.1, "declared", "m:f"),
    )
    groups = (
        ProcessGroup("pipeline", ("pre",), None, None),
        ProcessGroup(
            "vocoder", ("voc",), 0, 0.1, replicas=replicas, replica_gpus=(0, 1, 0)[:replicas] if replicas > 1 else ()
        ),
    )
    return Plan("m", "org/m", False, stages, groups, (Edge("pre", "voc", "next", True, True),), ())


def test_each_replica_gets_its_own_spec_socket_name_and_gpu():
    specs, _ = worker_specs(plan(), Path("/tmp/sv/d1"), parent_pid=1, log_level="INFO", environ={}, drain_timeout=12.0)
    assert list(specs) == ["pipeline", "vocoder/0", "vocoder/1", "vocoder/2"]
    assert [specs[f"vocoder/{i}"].address for i in range(3)] == [
        "unix:/tmp/sv/d1/g1.sock",
        "unix:/tmp/sv/d1/g1.1.sock",
        "unix:/tmp/sv/d1/g1.2.sock",
    ]
    assert [specs[f"vocoder/{i}"].env[VISIBLE_DEVICES] for i in range(3)] == ["0", "1", "0"]
    assert [specs[f"vocoder/{i}"].group.gpu for i in range(3)] == [0, 1, 0]
    assert specs["vocoder/1"].name == "vocoder/1" and specs["pipeline"].name == "pipeline"
    assert specs["pipeline"].routes["voc"] == specs["vocoder/0"].address  # the group's address
    assert specs["pipeline"].replica_routes == {
        specs["vocoder/0"].address: tuple(specs[f"vocoder/{i}"].address for i in range(3))
    }
    assert specs["vocoder/2"].drain_grace == 12.0 and specs["pipeline"].drain_grace == 0.0


def test_single_workers_keep_their_names_sockets_and_no_replica_routes():
    specs, _ = worker_specs(plan(1), Path("/tmp/sv/d1"), parent_pid=1, log_level="INFO", environ={})
    assert list(specs) == ["pipeline", "vocoder"]
    assert specs["vocoder"].address == "unix:/tmp/sv/d1/g1.sock" and specs["vocoder"].worker == ""
    assert all(not s.replica_routes for s in specs.values())


def test_a_new_request_goes_to_the_ready_replica_with_fewest_in_flight():
    router = ReplicaRouter({"g": ("a", "b", "c")})
    picks = [router.choose("g", f"r{i}") for i in range(3)]
    assert sorted(picks) == ["a", "b", "c"]  # one each
    router.release("b")
    assert router.choose("g", "r3") == "b"
    router.release("a")
    router.release("a")  # never below zero
    assert router.in_flight["a"] == 0


def test_ties_rotate_so_sequential_requests_visit_every_replica():
    router = ReplicaRouter({"g": ("a", "b")})
    seen = []
    for i in range(4):
        seen.append(router.choose("g", f"r{i}"))
        router.release(seen[-1])
    assert seen == ["a", "b", "a", "b"]


def test_replicas_marked_down_or_left_out_get_no_new_requests_and_an_empty_set_falls_back_to_the_group():
    router = ReplicaRouter({"g": ("a", "b")})
    router.mark_down("a")
    assert {router.choose("g", f"r{i}") for i in range(3)} == {"b"}
    router.set_ready("g", ())
    assert router.choose("g", "r9") == "g"
    assert router.choose("other", "r9") == "other"  # not replicated: its own address


def test_recent_routes_name_the_requests_a_replica_was_given_and_stay_bounded():
    router = ReplicaRouter({"g": ("a", "b")})
    for i in range(4):
        router.choose("g", f"r{i}")
    assert router.routed_to("a") == ["r0", "r2"]
    router.forget("a")
    assert router.routed_to("a") == [] and router.routed_to("b") == ["r1", "r3"]
    for i in range(RECENT_ROUTES + 10):
        router.choose("g", f"x{i}")
    assert len(router.recent) == RECENT_ROUTES


def test_the_bound_on_recent_routes_forgets_the_oldest_picks_first(monkeypatch):
    monkeypatch.setattr(replicas, "RECENT_ROUTES", 3)
    router = ReplicaRouter({"g": ("a",)})
    for i in range(5):
        router.choose("g", f"r{i}")
    assert router.routed_to("a") == ["r2", "r3", "r4"]


def test_announcing_the_ready_set_again_keeps_the_requests_in_flight_on_each_replica():
    router = ReplicaRouter({"g": ("a", "b")})
    assert [router.choose("g", f"r{i}") for i in range(3)] == ["a", "b", "a"]
    router.set_ready("g", ("a", "b", "c"))
    assert router.in_flight == {"a": 2, "b": 1, "c": 0}
    assert router.choose("g", "r3") == "c"
    assert router.choose("g", "r4") == "b"


def test_a_replica_marked_down_keeps_its_group_and_comes_back_when_announced():
    router = ReplicaRouter({"g": ("a", "b")})
    router.mark_down("b")
    router.mark_down("b")
    router.mark_down("unknown")
    assert router.groups == {"g": ("a",)}
    assert router.group_of("b") == "g" and router.group_of("g") == "g" and router.group_of("unknown") is None
    router.set_ready("g", ("a", "b"))
    assert router.groups["g"] == ("a", "b")


def test_a_router_knows_groups_only_once_one_is_announced():
    assert not ReplicaRouter()
    router = ReplicaRouter()
    router.set_ready("g", ())
    assert router


def test_a_request_released_is_no_longer_counted_on_its_replica():
    router = ReplicaRouter({"g": ("a", "b")})
    router.choose("g", "r0")
    router.choose("g", "r1")
    router.release("a")
    assert router.in_flight == {"a": 0, "b": 1}
    router.release("never-routed")
    assert "never-routed" not in router.in_flight


def test_every_frame_of_a_request_reaches_the_replica_chosen_for_it():
    import asyncio

    from tests.fakes import poll_until
    from tests.unit.dataplane.runtime_driver import make_runtime, planned, submit

    class Producer:
        async def process(self, payload, ctx):
            for i in range(3):
                await ctx.stream({"i": i})
            return {"done": True}

    async def scenario():
        runtime = make_runtime(
            [planned("a", next=["b"], stream_to=["b"])], {"a": Producer()}, routes={"b": "unix:/b0.sock"}
        )
        runtime.router.set_ready("unix:/b0.sock", ("unix:/b0.sock", "unix:/b1.sock"))
        submit(runtime, "a", request_id="r1")
        submit(runtime, "a", request_id="r2")
        await poll_until(
            lambda: sum(runtime.links.bodies(a).count("end") for a in ("unix:/b0.sock", "unix:/b1.sock")) == 2
        )
        by_replica = {
            a: {f.request_id for f in runtime.links.sent.get(a, [])} for a in ("unix:/b0.sock", "unix:/b1.sock")
        }
        assert sorted(map(sorted, by_replica.values())) == [["r1"], ["r2"]]  # one request each, never split
        assert all(runtime.links.bodies(a) == ["chunk"] * 3 + ["end"] for a in by_replica)
        assert await poll_until(lambda: runtime.in_flight() == 0)
        assert runtime.router.in_flight == {"unix:/b0.sock": 0, "unix:/b1.sock": 0}

    asyncio.run(scenario())


def test_a_stream_started_before_its_group_got_replicas_keeps_going_to_the_worker_that_holds_it():
    """A request streaming to a single worker when the daemon announces replicas of its group: its later
    chunks and its end follow the stream's first chunk, while new requests spread over the replicas."""
    import asyncio

    from stagevisor.supervisor._proto import dataplane_pb2 as pb
    from tests.fakes import poll_until
    from tests.unit.dataplane.runtime_driver import inbound_link, make_runtime, planned, submit

    go_on = asyncio.Event()

    class Producer:
        async def process(self, payload, ctx):
            await ctx.stream({"i": 0})
            if payload.request_id == "r1":
                await go_on.wait()
            for i in (1, 2):
                await ctx.stream({"i": i})
            return {"done": True}

    async def scenario():
        b0, b1 = "unix:/b0.sock", "unix:/b1.sock"
        runtime = make_runtime([planned("a", next=["b"], stream_to=["b"])], {"a": Producer()}, routes={"b": b0})
        submit(runtime, "a", request_id="r1")
        await poll_until(lambda: runtime.links.bodies(b0) == ["chunk"])
        runtime.on_frame(
            pb.Frame(replicas=pb.Replicas(version=1, sets=[pb.ReplicaSet(address=b0, ready=[b0, b1])])), inbound_link
        )
        submit(runtime, "a", request_id="r2")  # the least busy replica: b1, since r1 holds b0
        go_on.set()
        await poll_until(lambda: sum(runtime.links.bodies(a).count("end") for a in (b0, b1)) == 2)
        assert [f.request_id for f in runtime.links.sent[b0]] == ["r1"] * 4
        assert [f.request_id for f in runtime.links.sent[b1]] == ["r2"] * 4
        assert await poll_until(lambda: runtime.in_flight() == 0)
        assert runtime.router.in_flight == {b0: 0, b1: 0}

    asyncio.run(scenario())


def test_a_lost_replica_fails_the_requests_routed_to_it_and_the_daemon_gets_an_answer():
    import asyncio

    from stagevisor.supervisor._proto import dataplane_pb2 as pb
    from tests.fakes import poll_until
    from tests.unit.dataplane.runtime_driver import SINK, inbound_link, make_runtime, planned, submit

    class Quick:
        async def process(self, payload, ctx):
            return {}

    async def scenario():
        runtime = make_runtime([planned("a", next=["b"])], {"a": Quick()}, routes={"b": "unix:/b0.sock"})
        runtime.router.set_ready("unix:/b0.sock", ("unix:/b0.sock", "unix:/b1.sock"))
        for request_id in ("r1", "r2"):
            submit(runtime, "a", request_id=request_id)
            await poll_until(lambda: runtime.in_flight() == 0)
        lost = [f.request_id for f in runtime.links.sent["unix:/b1.sock"]]
        inbound_link.replies.clear()
        runtime.on_frame(
            pb.Frame(
                replicas=pb.Replicas(
                    version=7,
                    lost=["unix:/b1.sock"],
                    sets=[pb.ReplicaSet(address="unix:/b0.sock", ready=["unix:/b0.sock"])],
                )
            ),
            inbound_link,
        )
        failures = [f for f in runtime.links.sent.get(SINK, []) if f.WhichOneof("body") == "failure"]
        assert [f.request_id for f in failures] == lost and len(lost) == 1
        assert failures[0].failure.code == pb.FAILURE_CODE_UNAVAILABLE
        assert [(f.src, f.replicas.version) for f in inbound_link.replies] == [("test", 7)]
        assert runtime.router.groups["unix:/b0.sock"] == ("unix:/b0.sock",)

    asyncio.run(scenario())


def test_releasing_one_of_several_requests_on_a_replica_leaves_the_others_counted():
    router = ReplicaRouter({"g": ("a",)})
    for request in ("r1", "r2", "r3"):
        router.choose("g", request)
    router.release("a")
    assert router.in_flight["a"] == 2
    router.release("a")
    router.release("a")
    router.release("a")  # one release too many (a request failed twice): never below zero
    assert router.in_flight["a"] == 0


def test_a_request_sent_to_its_group_address_while_no_replica_took_requests_fails_when_no_worker_answers_there():
    """While none of a replicated group's replicas takes requests, they go to the group's address; the gateway
    watches the group through its senders, so a sender that has handed all of a request on must still fail it
    when its link there breaks (no worker listens), or it waits for its client's deadline."""
    import asyncio

    from stagevisor.supervisor._proto import dataplane_pb2 as pb
    from tests.fakes import poll_until
    from tests.unit.dataplane.runtime_driver import SINK, make_runtime, planned, submit

    class Streams:
        async def process(self, payload, ctx):
            await ctx.stream({"i": 0})
            return {}

    async def scenario():
        b0 = "unix:/b0.sock"
        runtime = make_runtime([planned("a", next=["b"], stream_to=["b"])], {"a": Streams()}, routes={"b": b0})
        runtime.router.set_ready(b0, ())  # no replica takes requests now
        submit(runtime, "a", request_id="r1")
        await poll_until(lambda: runtime.links.bodies(b0) == ["chunk", "end"] and runtime.in_flight() == 0)
        runtime.on_link_broken(runtime.links.get(b0), ConnectionRefusedError())
        (failure,) = runtime.links.sent[SINK]
        assert failure.request_id == "r1" and failure.failure.code == pb.FAILURE_CODE_UNAVAILABLE
        # In the gateway's words (it read "the worker serving stage 'b' became unreachable", without "retry").
        assert failure.failure.message == "stage 'b' is unavailable: its worker became unreachable; retry"
        runtime.on_link_broken(runtime.links.get(b0), ConnectionRefusedError())  # a retry that fails again
        assert len(runtime.links.sent[SINK]) == 1

    asyncio.run(scenario())


def test_a_request_routed_to_a_groups_own_address_counts_there_so_its_end_takes_no_other_requests_count():
    """With no replica taking requests, a request goes to the group's address (its first replica's); when that
    replica takes requests again, a second one is counted there. The first one's end must leave the second's
    count, or the daemon's drain of that replica (gateway.replica_in_flight) stops waiting for it."""
    router = ReplicaRouter({"G": ("G", "R1")})
    router.set_ready("G", ())
    assert router.choose("G", "early") == "G"
    router.set_ready("G", ("G",))
    assert router.choose("G", "late") == "G"
    router.release("G")  # the early request ended
    assert router.in_flight["G"] == 1
    router.release("G")
    assert router.in_flight["G"] == 0


def test_a_link_broken_for_want_of_descriptors_in_the_sender_keeps_the_replica_and_what_was_handed_on_to_it():
    """EMFILE is the sender's own limit, not a dead replica: before, the replica left the sender's rotation until
    the daemon's next announcement (which may never come) and the requests handed on to it failed though it
    still served them."""
    import asyncio
    import errno

    from tests.unit.dataplane.runtime_driver import SINK

    async def scenario():
        runtime, group, replica = await handed_on_to_a_replica()
        runtime.on_link_broken(runtime.links.get(replica), OSError(errno.EMFILE, "Too many open files"))
        assert runtime.links.sent.get(SINK, []) == []
        assert runtime.router.groups[group] == (group, replica)
        runtime.on_link_broken(runtime.links.get(replica), ConnectionRefusedError())  # its worker went away
        assert [f.request_id for f in runtime.links.sent[SINK]] == ["r1"]
        assert runtime.router.groups[group] == (group,)

    asyncio.run(scenario())


def test_a_replica_the_daemon_took_out_of_rotation_failing_its_link_fails_only_what_went_there_for_want_of_one():
    """A scale-down stops a replica on purpose once its senders know: it answers (or fails) all it holds itself.
    Its link breaking when it exits failed every request handed on to it, finished ones included, and such a
    failure could reach the gateway before that replica's own last Done (CI: one request of 86 UNAVAILABLE in a
    scale 3 -> 2). What went to the group's own address for want of a replica taking requests still fails."""
    import asyncio

    from tests.fakes import poll_until
    from tests.unit.dataplane.runtime_driver import SINK, submit

    async def scenario():
        runtime, group, replica = await handed_on_to_a_replica()
        runtime.router.set_ready(group, (group,))  # the scale-down: out of rotation, then stopped
        runtime.on_link_broken(runtime.links.get(replica), ConnectionResetError())
        assert runtime.links.sent.get(SINK, []) == []
        runtime.router.set_ready(group, ())  # the group's own worker restarts: none takes requests
        submit(runtime, "a", request_id="r2")  # to the group's address for want of one
        await poll_until(lambda: runtime.links.bodies(group) == ["chunk", "end"] and runtime.in_flight() == 0)
        runtime.on_link_broken(runtime.links.get(group), ConnectionRefusedError())  # no worker answers there
        assert [f.request_id for f in runtime.links.sent[SINK]] == ["r2"]

    asyncio.run(scenario())


def test_a_replica_out_of_rotation_that_died_while_it_drained_fails_what_was_handed_on_to_it_once_the_daemon_says_so():
    """Its link broke as a stopped replica's does; the daemon then reports it lost (it died while it drained, holding
    r1). Before, the link break forgot r1 here, and r1 waited for the pipeline's idle timeout."""
    import asyncio

    from tests.unit.dataplane.runtime_driver import SINK

    async def scenario():
        runtime, group, replica = await handed_on_to_a_replica()
        runtime.router.set_ready(group, (group,))  # a scale-down: out of rotation, then stopped
        runtime.on_link_broken(runtime.links.get(replica), ConnectionResetError())
        assert runtime.links.sent.get(SINK, []) == []
        runtime.replica_lost(replica)
        assert [f.request_id for f in runtime.links.sent[SINK]] == ["r1"]
        assert runtime.router.routed_to(replica) == []  # failed once

    asyncio.run(scenario())


def test_a_replica_announced_again_after_a_clean_stop_leaves_none_of_its_old_picks():
    """A rolling restart: the old worker at the replica's address ended cleanly, a new one took the address. The old
    one's picks, kept in case it was reported lost, stayed, and the new worker's loss failed r1, which the old one
    had handed on and which may still be served downstream."""
    import asyncio

    from tests.unit.dataplane.runtime_driver import SINK

    async def scenario():
        runtime, group, replica = await handed_on_to_a_replica()
        runtime.router.set_ready(group, (group,))  # out of rotation, then stopped cleanly
        runtime.on_link_broken(runtime.links.get(replica), ConnectionResetError())
        runtime.router.set_ready(group, (group, replica))  # the new worker at that address is READY
        assert runtime.router.routed_to(replica) == []
        runtime.replica_lost(replica)  # later, the new worker dies
        assert runtime.links.sent.get(SINK, []) == []

    asyncio.run(scenario())


def test_a_replica_announced_again_is_no_longer_retired():
    router = ReplicaRouter()
    router.set_ready("g", ("g", "r1"))
    router.set_ready("g", ("g",))
    assert router.retired == {"r1"}
    router.set_ready("g", ("g", "r1"))
    assert router.retired == set()


def test_requests_sent_to_the_entry_groups_one_worker_count_on_its_replica_once_the_group_gets_replicas(tmp_path):
    """`scale pipeline=2` then `restart pipeline/0`: the drain of replica 0 waited only for the requests routed to
    it after the scale, so a long request sent before it failed when that worker stopped."""
    from stagevisor.supervisor.dataplane.gateway import Gateway
    from stagevisor.supervisor.dataplane.request_handle import RequestHandle
    from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement

    plan = plan_placement(PlacementRequest("demo"))
    entry = "unix:/nonexistent/pipeline.sock"
    gateway = Gateway(plan, {s.name: entry for s in plan.stages}, "unix:/nonexistent/sink.sock", shm_root=tmp_path)
    before = RequestHandle(gateway, "before", 1)
    gateway.requests["before"] = before
    gateway.push_replicas({entry: (entry, "unix:/nonexistent/pipeline-1.sock")}, (), {})
    assert gateway.replica_in_flight(entry) == 1
    gateway.push_replicas({entry: (entry,)}, (), {})  # announced again: counted once
    assert gateway.replica_in_flight(entry) == 1
    before.close()
    assert gateway.replica_in_flight(entry) == 0


def test_a_worker_the_daemon_renames_hears_its_new_name_once_and_still_answers_with_its_first():
    """A scale between one replica and more renames a running worker; the Replicas frame names it so. The worker
    (its process title and log lines, supervisor/worker/main.py's `renamed`) hears each new name once, and keeps
    acknowledging under the name it started with, which the daemon waits on."""
    from stagevisor.supervisor._proto import dataplane_pb2 as pb
    from tests.fakes import FakeInboundLink
    from tests.unit.dataplane.runtime_driver import make_runtime, planned

    runtime = make_runtime([planned("voc")], {"voc": object()})
    heard: list[str] = []
    runtime.on_renamed = heard.append
    link = FakeInboundLink()
    for version, name in enumerate(["test/0", "test/0", "test"], start=1):
        runtime.on_frame(pb.Frame(replicas=pb.Replicas(version=version, names={"test": name, "other": "x"})), link)
    assert heard == ["test/0", "test"] and runtime.name == "test"
    assert {frame.src for frame in link.replies} == {"test"}
