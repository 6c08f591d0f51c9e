"""Where data-plane peers are, by cluster node: unix sockets and shared memory on one node, TCP across nodes.

Under `--launcher ray` a worker (and the daemon's gateway) may have peers on
other Ray nodes. Every peer keeps its unix address (the one in `routes`,
which identifies it everywhere: links, replicas, errors); a `PeerDirectory`
says which Ray node each one runs on and the TCP address it also listens on.
A sender on the same node (by Ray node id, not by host name: two Ray nodes on
one machine are two nodes) dials the unix address, and may hand large buffers
over in shared memory or CUDA IPC; a sender on another node dials TCP, and
its large buffers travel inline, in pieces (`remote`). With the local
launcher nothing has a node and everything is as before.

TCP links carry a per-daemon bearer token (`DataPlaneSecurity`), checked on
every data-plane listener; with TLS configured on the daemon's public
endpoint they are also mutual TLS, with a certificate made for this daemon's
run that every listener presents and every dialler pins.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from stagevisor.supervisor.dataplane.trace import GRPC, GRPC_TCP

TLS_NAME = "stagevisor-dataplane"
"""The name in the per-run data-plane certificate; diallers verify it instead of the node's IP."""
TOKEN_BYTES = 32


@dataclass(frozen=True)
class Peer:
    """Where one data-plane endpoint runs: its Ray node and the TCP address it listens on there."""

    node_id: str
    tcp: str = ""


def is_remote(my_node: str, peer: Peer | None) -> bool:
    """True when `peer` runs on another node than `my_node`: links go over TCP, buffers inline. Pure.

    Unknown on either side (the local launcher, a peer not announced yet) counts as the same node.
    """
    return bool(my_node and peer is not None and peer.node_id and peer.node_id != my_node)


def transport(remote: bool) -> str:
    """The hop label of a cross-process edge: `grpc_tcp` to another node, `grpc` (unix, shared memory) on one."""
    return GRPC_TCP if remote else GRPC


@dataclass(frozen=True)
class DataPlaneSecurity:
    """The bearer token (and, optionally, TLS material) of one daemon's data-plane listeners.

    Empty token: none is required (the local launcher). `cert_pem`/`key_pem`: a
    self-signed certificate made for this run (`generate`); listeners require
    clients to present it too (mutual TLS) and diallers trust only it.
    """

    token: str = field(default="", repr=False)
    cert_pem: bytes = field(default=b"", repr=False)
    key_pem: bytes = field(default=b"", repr=False)

    @property
    def tls(self) -> bool:
        return bool(self.cert_pem)

    @classmethod
    def generate(cls, tls: bool) -> "DataPlaneSecurity":
        """A fresh token, and a fresh certificate when `tls`."""
        cert, key = make_certificate() if tls else (b"", b"")
        return cls(secrets.token_urlsafe(TOKEN_BYTES), cert, key)

    def describe(self) -> str:
        return ("mutual TLS" if self.tls else "plaintext") + (", bearer token" if self.token else "")

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def channel_credentials(self) -> Any:
        import grpc

        return grpc.ssl_channel_credentials(
            root_certificates=self.cert_pem, private_key=self.key_pem, certificate_chain=self.cert_pem
        )

    def server_credentials(self) -> Any:
        import grpc

        return grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)], root_certificates=self.cert_pem, require_client_auth=True
        )

    def interceptors(self) -> list[Any]:
        """Server interceptors that refuse a link without this token (none when there is no token)."""
        if not self.token:
            return []
        from stagevisor.supervisor.security.server import Security, bearer_interceptor

        return [bearer_interceptor(Security(api_key=self.token))]


def make_certificate() -> tuple[bytes, bytes]:
    """A self-signed P-256 certificate for TLS_NAME, valid for 10 years, and its key (PEM). Needs `cryptography`
    (part of the `ray` extra)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, TLS_NAME)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(TLS_NAME)]), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    return (
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )


@dataclass(frozen=True)
class Dial:
    """How to open a link to one peer: the gRPC target, TLS credentials (None: plaintext), call metadata."""

    target: str
    credentials: Any = None
    metadata: tuple[tuple[str, str], ...] = ()
    remote: bool = False

    @property
    def options(self) -> list[tuple[str, Any]]:
        return [("grpc.ssl_target_name_override", TLS_NAME)] if self.credentials is not None else []


def bind_tcp(server: Any, host: str, security: DataPlaneSecurity | None) -> str:
    """Listen on `host`, on a port the system picks, with TLS when configured; return `host:port`."""
    where = f"[{host}]:0" if ":" in host else f"{host}:0"
    if security is not None and security.tls:
        port = server.add_secure_port(where, security.server_credentials())
    else:
        port = server.add_insecure_port(where)
    if port == 0:
        raise OSError(
            f"cannot listen on TCP at {host} for peers on other nodes: {host} is not an address of this node, or "
            "it has no free port"
        )
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class PeerDirectory:
    """One process's view of where its peers run (`my_node`: its own Ray node id; empty: no cluster).

    `peers` is updated in place by the daemon's Peers frames, so every holder
    sees the latest; the sender decides per link (`dial`) and per buffer (`remote`).
    """

    def __init__(
        self, my_node: str = "", peers: Mapping[str, Peer] | None = None, security: DataPlaneSecurity | None = None
    ) -> None:
        self.my_node = my_node
        self.peers: dict[str, Peer] = dict(peers or {})
        self.security = security or DataPlaneSecurity()
        self.version = 0
        self._credentials: Any = None

    def __bool__(self) -> bool:
        return bool(self.my_node)

    def remote(self, address: str | None) -> bool:
        """True when the peer at `address` runs on another node (never for None: the caller names no peer)."""
        if not self.my_node or address is None:
            return False
        return is_remote(self.my_node, self.peers.get(address))

    def dial(self, address: str) -> Dial:
        """Where and how to dial `address`: its TCP address (with TLS, when configured) on another node,
        else the address itself; the token either way (every listener of a cluster daemon checks it)."""
        metadata = self.security.metadata()
        if not self.remote(address):
            return Dial(address, metadata=metadata)
        credentials = None
        if self.security.tls:
            if self._credentials is None:
                self._credentials = self.security.channel_credentials()
            credentials = self._credentials
        peer = self.peers[address]
        if not peer.tcp:
            raise ConnectionError(
                f"the peer at {address} runs on node {peer.node_id[:12]} but announced no TCP address"
            )
        return Dial(peer.tcp, credentials, metadata, remote=True)

    def transport(self, address: str) -> str:
        return transport(self.remote(address))

    def update(self, version: int, peers: Iterable[tuple[str, str, str]]) -> bool:
        """Take in a Peers announcement (address, node id, tcp); an older version than the last is ignored."""
        if version and version < self.version:
            return False
        self.version = max(self.version, version)
        for address, node_id, tcp in peers:
            self.peers[address] = Peer(node_id, tcp)
        return True
