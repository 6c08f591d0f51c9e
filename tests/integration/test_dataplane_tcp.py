"""Links to a peer on another node: TCP on a port the system picks, the run's token, and TLS when configured.

In one process (a listener and a LinkPool on one event loop), on 127.0.0.1 port 0: what `--launcher ray`
uses between workers on two Ray nodes (tests/integration/test_ray_launcher.py runs it across real nodes).
"""

import asyncio

import grpc
import pytest

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.dataplane.link.outbound import GRPC_OPTIONS, LinkPool
from stagevisor.supervisor.dataplane.link.server import serve_links, stop_server
from stagevisor.supervisor.dataplane.peers import DataPlaneSecurity, Peer, PeerDirectory, bind_tcp

FAR = "unix:/nonexistent/g1.sock"
"""The far peer's address in `routes`: never dialled as such, since it runs on another node."""


async def exchange(server_security: DataPlaneSecurity, client_security: DataPlaneSecurity, unix_path=None):
    """Serve links on TCP (and a unix socket) with `server_security`, dial with `client_security`; return
    (frames the listener got, errors the dialler's links broke with, whether each arrived over TCP)."""
    received: list[pb.Frame] = []
    broken: list[BaseException] = []
    server = grpc.aio.server(options=GRPC_OPTIONS, interceptors=server_security.interceptors())
    tcp_links: dict[str, bool] = {}

    def on_frame(frame, link):
        received.append(frame)
        tcp_links[frame.request_id] = link.tcp

    serve_links(server, on_frame)
    tcp = bind_tcp(server, "127.0.0.1", server_security)
    if unix_path is not None:
        server.add_insecure_port(f"unix:{unix_path}")
    await server.start()
    near = f"unix:{unix_path}" if unix_path is not None else "unix:/nonexistent/none.sock"
    directory = PeerDirectory("node-a", {FAR: Peer("node-b", tcp), near: Peer("node-a", "")}, client_security)
    pool = LinkPool("test", lambda frame: None, lambda link, error: broken.append(error), directory=directory)
    try:
        targets = [FAR] + ([near] if unix_path is not None else [])
        for address in targets:
            link = pool.get(address)
            assert link.remote == (address == FAR)
            link.send(pb.Frame(request_id=address, cancel=pb.Cancel(reason="hello")))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while len(received) < len(targets) and len(broken) < len(targets) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        return sorted(f.request_id for f in received), broken, tcp_links
    finally:
        await pool.close()
        await stop_server(server)


def test_a_far_peer_is_reached_over_tcp_with_the_runs_token_and_a_near_one_on_its_unix_socket(tmp_path):
    security = DataPlaneSecurity(token="a" * 43)
    received, broken, tcp_links = asyncio.run(exchange(security, security, tmp_path / "near.sock"))
    assert received == sorted([FAR, f"unix:{tmp_path / 'near.sock'}"]) and broken == []
    assert tcp_links == {FAR: True, f"unix:{tmp_path / 'near.sock'}": False}  # the listener tells them apart


def test_a_link_without_the_runs_token_is_refused():
    received, broken, _ = asyncio.run(exchange(DataPlaneSecurity(token="a" * 43), DataPlaneSecurity(token="b" * 43)))
    assert received == [] and len(broken) == 1
    assert isinstance(broken[0], grpc.aio.AioRpcError) and broken[0].code() is grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("client", ["same", "plaintext", "other certificate"])
def test_with_tls_only_a_peer_holding_the_runs_certificate_gets_through(client):
    security = DataPlaneSecurity.generate(tls=True)
    dialler = {
        "same": security,
        "plaintext": DataPlaneSecurity(token=security.token),
        "other certificate": DataPlaneSecurity(security.token, *_other_pem()),
    }[client]
    received, broken, _ = asyncio.run(exchange(security, dialler))
    if client == "same":
        assert received == [FAR] and broken == []
    else:
        assert received == [] and len(broken) == 1, (received, broken)


def _other_pem() -> tuple[bytes, bytes]:
    other = DataPlaneSecurity.generate(tls=True)
    return other.cert_pem, other.key_pem
