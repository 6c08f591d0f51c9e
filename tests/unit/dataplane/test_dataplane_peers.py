"""Peers by cluster node (supervisor/dataplane/peers.py): which transport an edge takes, and the rule that
nothing crosses to another node as a shared-memory or CUDA IPC reference. No processes, no ports."""

import asyncio
from dataclasses import replace

import numpy as np
import pytest

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane import shm
from stagevisor.supervisor.dataplane.codec import Codec
from stagevisor.supervisor.worker.endpoint import WorkerEndpoint, worker_directory
from stagevisor.supervisor.dataplane.peers import (
    TLS_NAME,
    DataPlaneSecurity,
    Peer,
    PeerDirectory,
    is_remote,
    transport,
)
from stagevisor.supervisor.dataplane.runtime import StageRuntime
from stagevisor.supervisor.dataplane.trace import parse_hop
from stagevisor.supervisor.plan import ProcessGroup
from stagevisor.supervisor.worker.spec import WorkerSpec
from tests.fakes import poll_until
from tests.fakes import RecordedLinks
from tests.unit.dataplane.runtime_driver import inbound_link, planned

HERE, THERE = "node-a" * 8, "node-b" * 8
SINK = "unix:/run/sv/gateway.sock"
NEAR = "unix:/run/sv/g1.sock"
"""A worker on this node, in another process."""
FAR = "unix:/run/sv/g2.sock"
"""A worker on the other node."""
BIG = 512 * 1024


def directory(security=None):
    return PeerDirectory(
        HERE,
        {SINK: Peer(HERE, "10.0.0.1:5001"), NEAR: Peer(HERE, "10.0.0.1:5002"), FAR: Peer(THERE, "10.0.0.2:5003")},
        security,
    )


def test_the_transport_is_chosen_by_node_id_and_unknown_counts_as_the_same_node():
    assert is_remote(HERE, Peer(THERE)) and transport(True) == "grpc_tcp"
    assert not is_remote(HERE, Peer(HERE)) and transport(False) == "grpc"
    assert not is_remote("", Peer(THERE))  # the local launcher: no node at all
    assert not is_remote(HERE, None) and not is_remote(HERE, Peer(""))  # not announced yet
    peers = directory()
    assert [peers.transport(a) for a in (SINK, NEAR, FAR, "unix:/run/sv/g9.sock")] == [
        "grpc",
        "grpc",
        "grpc_tcp",
        "grpc",
    ]
    assert not PeerDirectory().remote(FAR) and not peers.remote(None)


def test_same_node_peers_are_dialled_at_their_unix_address_and_others_on_tcp_with_the_token():
    peers = directory(DataPlaneSecurity(token="t" * 43))
    near, far = peers.dial(NEAR), peers.dial(FAR)
    assert (near.target, near.remote, near.credentials) == (NEAR, False, None)
    assert (far.target, far.remote, far.credentials, far.options) == ("10.0.0.2:5003", True, None, [])
    assert near.metadata == far.metadata == (("authorization", "Bearer " + "t" * 43),)
    peers.peers[FAR] = Peer(THERE, "")
    with pytest.raises(ConnectionError, match="announced no TCP address"):
        peers.dial(FAR)


def test_with_tls_links_to_other_nodes_pin_the_runs_own_certificate():
    security = DataPlaneSecurity.generate(tls=True)
    assert security.tls and len(security.token) >= 40 and b"BEGIN CERTIFICATE" in security.cert_pem
    assert DataPlaneSecurity.generate(tls=True).token != security.token
    far = directory(security).dial(FAR)
    assert far.credentials is not None and far.options == [("grpc.ssl_target_name_override", TLS_NAME)]
    assert directory(security).dial(NEAR).credentials is None  # a unix socket on this node: no TLS
    assert not DataPlaneSecurity.generate(tls=False).tls


def test_an_older_announcement_never_overwrites_a_newer_one():
    peers = directory()
    assert peers.update(3, [(FAR, THERE, "10.0.0.2:6000")])
    assert not peers.update(2, [(FAR, THERE, "10.0.0.2:1")])
    assert peers.peers[FAR].tcp == "10.0.0.2:6000"


@pytest.fixture
def area(tmp_path):
    area = shm.SharedArea.create(tmp_path / "area")
    yield area
    area.remove()


def shared_buffers(value: pb.Value) -> list[pb.SharedBuffer]:
    kind = value.WhichOneof("kind")
    if kind == "map":
        return [b for item in value.map.values for b in shared_buffers(item)]
    if kind == "list":
        return [b for item in value.list.items for b in shared_buffers(item)]
    if kind == "shared_raw":
        return [value.shared_raw]
    if kind == "tensor" and value.tensor.HasField("shared"):
        return [value.tensor.shared]
    return []


def frame_buffers(frame: pb.Frame) -> list[pb.SharedBuffer]:
    body = frame.WhichOneof("body")
    if body == "submit":
        return shared_buffers(frame.submit.request) + shared_buffers(frame.submit.data)
    if body == "chunk":
        return shared_buffers(frame.chunk.value) + shared_buffers(frame.chunk.opening.request)
    if body == "end":
        return shared_buffers(frame.end.data) + shared_buffers(frame.end.opening.request)
    return []


def test_the_codec_never_sends_a_shared_memory_reference_to_another_node(area):
    codec = Codec(area=area, shm_threshold=1024, pieces=True)
    codec.remote = directory().remote
    array, blob = np.ones(BIG // 4, np.float32), bytes(BIG)
    for peer, pooled in ((NEAR, True), (SINK, True), (FAR, False)):
        value = pb.Value()
        codec.encode_into({"a": array, "b": blob}, value, peer)
        out = codec.take_out_of_line()
        buffers = shared_buffers(value)
        assert len(buffers) == 2 and all(b.pooled == pooled and b.inline == (not pooled) for b in buffers), peer
        assert (len(out.segments), len(out.pieces)) == ((2, 0) if pooled else (0, 2)), peer
        codec.drop(out.segments)
    codec.close()


@pytest.mark.torch
def test_a_cuda_tensor_for_another_node_is_copied_to_the_host_never_sent_by_ipc_handle():
    torch = pytest.importorskip("torch")

    class Ipc:
        handles = 0

        def shares_with(self, peer):
            return True  # the same placement GPU id, as two nodes' GPU 0 would be

        def encode(self, tensor, message):
            Ipc.handles += 1
            message.framework = "cuda_ipc"
            return True

    class CudaLike:
        is_cuda = True

        def __init__(self, tensor):
            self.tensor = tensor

        def detach(self):
            return self.tensor

    codec = Codec(pieces=True, cuda=Ipc())
    codec.remote = directory().remote
    for peer, handles in ((NEAR, 1), (FAR, 1)):
        value = pb.Value()
        codec._peer = peer
        codec._torch(CudaLike(torch.arange(4.0)), value)
        assert Ipc.handles == handles, peer
    assert value.tensor.framework == "torch" and value.tensor.data  # the bytes, on the host


def test_a_worker_hands_a_far_peer_inline_pieces_and_grpc_tcp_hops_and_a_near_one_shared_memory(area):
    """Stage a (here) streams to b (another node) and submits to c (this node, another process); the request
    carries a large reference audio and the chunks large arrays: only c sees shared memory."""

    class Producer:
        async def process(self, payload, ctx):
            for _ in range(3):
                await ctx.stream({"latent": np.ones(BIG // 4, np.float32)})
            return {"mel": np.zeros(BIG // 4, np.float32)}

    async def scenario():
        codec = Codec(area=area, pieces=True)
        runtime = StageRuntime(
            {s.name: s for s in (planned("a", next=["c"], stream_to=["b"]), planned("b"), planned("c"))},
            {"a": Producer()},
            {"b": FAR, "c": NEAR},
            SINK,
            "test",
            codec,
            directory=directory(),
        )
        runtime.links = RecordedLinks()
        frame = pb.Frame(request_id="r1", src="", dst="a")
        runtime.codec.encode_into({"text": "hi", "reference_audio": bytes(BIG)}, frame.submit.request)
        runtime.codec.encode_into({}, frame.submit.data)
        runtime.codec.take_out_of_line()
        runtime.on_frame(frame, inbound_link)
        assert await poll_until(lambda: runtime.links.bodies(NEAR) == ["submit"] and "end" in runtime.links.bodies(FAR))
        far, near = runtime.links.sent[FAR], runtime.links.sent[NEAR]
        far_buffers = [b for f in far for b in frame_buffers(f)]
        assert len(far_buffers) == 4 and all(b.inline and not b.pooled for b in far_buffers)  # 3 chunks, audio
        near_buffers = [b for f in near for b in frame_buffers(f)]
        assert len(near_buffers) == 2 and all(b.pooled for b in near_buffers)
        assert [parse_hop(h)[2] for h in far[0].chunk.opening.trace] == ["grpc_tcp"]
        assert [parse_hop(h)[2] for h in near[0].submit.trace] == ["grpc"]
        codec.close()

    asyncio.run(scenario())


def test_a_peers_frame_updates_where_a_worker_dials():
    runtime = StageRuntime({"a": planned("a")}, {}, {}, SINK, "test", Codec(), directory=PeerDirectory(HERE))
    assert runtime.links.directory is runtime.directory and not runtime.directory.remote(FAR)
    runtime.on_frame(
        pb.Frame(peers=pb.Peers(version=1, peers=[pb.Peer(address=FAR, node_id=THERE, tcp="10.0.0.2:7")])), inbound_link
    )
    assert runtime.directory.dial(FAR).target == "10.0.0.2:7"


def spec(**fields):
    group = ProcessGroup("voc", ("voc",), None, None)
    return replace(
        WorkerSpec(
            group=group,
            stages=(planned("voc"),),
            model_path=None,
            address=NEAR,
            sink_address=SINK,
            shm_dir="/nonexistent",
        ),
        **fields,
    )


def test_a_worker_on_another_node_than_the_daemon_opens_no_shared_memory_and_the_local_launcher_changes_nothing(area):
    assert worker_directory(spec()) is None
    peers = {SINK: (HERE, "10.0.0.1:1")}
    far = WorkerEndpoint(
        spec(node_id=THERE, node_ip="10.0.0.2", peers=peers, shm_dir=str(area.path), dataplane_token="x" * 43),
        {"voc": object()},
    )
    assert far.runtime.codec.area is None and far.runtime.directory.remote(SINK)
    assert far.runtime.directory.security.token == "x" * 43
    near = WorkerEndpoint(
        spec(node_id=HERE, node_ip="10.0.0.1", peers=peers, shm_dir=str(area.path)), {"voc": object()}
    )
    assert near.runtime.codec.area is not None and not near.runtime.directory.remote(SINK)
    near.runtime.codec.area.close()
    assert WorkerEndpoint(spec(), {"voc": object()}).runtime.directory is None


def test_tls_between_nodes_follows_the_public_endpoint_unless_the_operator_says_otherwise():
    from stagevisor.supervisor.cluster.launcher import DATAPLANE_TLS_ENV, dataplane_tls

    assert dataplane_tls(True, {}) and not dataplane_tls(False, {})
    assert dataplane_tls(False, {DATAPLANE_TLS_ENV: "1"}) and not dataplane_tls(True, {DATAPLANE_TLS_ENV: "off"})
    assert dataplane_tls(True, {DATAPLANE_TLS_ENV: "maybe"})


def test_a_ready_worker_is_announced_to_the_gateway_and_every_live_worker_before_its_group_is_ready():
    from types import SimpleNamespace

    from stagevisor.supervisor.cluster.launcher import RayLauncher

    class Gateway:
        pushes = []

        def push_peers(self, peers, targets):
            self.pushes.append((dict(peers), sorted(targets)))

    gateway = Gateway()
    launcher = RayLauncher(None, gateway=gateway)

    def ready(address, node_id, tcp):
        """A worker's READY handshake as the launcher hears it (RayWorker calls `announce` before its READY)."""
        worker = SimpleNamespace(address=address, node_id=node_id, data_address=tcp, exited=False)
        launcher.announce(worker)  # type: ignore[arg-type]  # what announce reads of a RayWorker
        return worker

    first = ready(NEAR, HERE, "10.0.0.1:1")
    ready(FAR, THERE, "10.0.0.2:2")
    assert gateway.pushes == [
        ({NEAR: Peer(HERE, "10.0.0.1:1")}, [NEAR]),
        ({FAR: Peer(THERE, "10.0.0.2:2")}, [NEAR, FAR]),
    ]
    first.exited = True  # it hears no more
    ready(FAR, THERE, "10.0.0.2:3")
    assert gateway.pushes[-1] == ({FAR: Peer(THERE, "10.0.0.2:3")}, [FAR])


def test_metrics_label_a_handoff_that_came_over_tcp_grpc_tcp():
    from stagevisor.supervisor.metrics.recorder import Recorder

    class TcpLink(type(inbound_link)):
        tcp = True

    class Done:
        async def process(self, payload, ctx):
            return None

    async def scenario():
        recorder = Recorder("test")
        runtime = StageRuntime(
            {"b": planned("b")}, {"b": Done()}, {}, SINK, "test", Codec(), recorder, directory=directory()
        )
        runtime.links = RecordedLinks()
        for request_id, link in (("r1", TcpLink()), ("r2", inbound_link)):
            frame = pb.Frame(request_id=request_id, src="a", dst="b")
            frame.submit.request.map.SetInParent()
            frame.submit.data.map.SetInParent()
            frame.submit.timings.SetInParent()
            runtime.on_frame(frame, link)
        assert await poll_until(lambda: len(runtime.links.bodies(SINK)) == 2)
        assert {key[2] for key in recorder.edges} == {"grpc_tcp", "grpc"}

    asyncio.run(scenario())
