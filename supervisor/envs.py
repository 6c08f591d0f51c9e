"""Every STAGEVISOR_* environment variable stagevisor reads, with its default and meaning; read through here only.

A leaf: it imports nothing but the standard library, so any module (stage
executors included) may read its variables here. What a value means beyond
its text (a thread count, a switch, a size) is parsed where it is used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping


PREFIX = "STAGEVISOR_"
"""Every variable's prefix: the Ray launcher forwards all of them to workers on other nodes."""


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: its name, the value that stands for unset, and what it does."""

    name: str
    default: str
    meaning: str

    def get(self, environ: Mapping[str, str] | None = None) -> str:
        """Its value in `environ` (default: this process's environment), else `default`."""
        return (os.environ if environ is None else environ).get(self.name, self.default)

    def is_set(self, environ: Mapping[str, str] | None = None) -> bool:
        """Whether it is present in `environ` at all (an empty value included)."""
        return self.name in (os.environ if environ is None else environ)

    def switched_off(self, environ: Mapping[str, str] | None = None) -> bool:
        """For an on/off switch that defaults on: whether it says 0, false, no or off."""
        return self.get(environ).strip().lower() in ("0", "false", "no", "off")


RUNTIME_DIR = EnvVar(
    "STAGEVISOR_RUNTIME_DIR",
    "",
    "Directory of the admin socket and worker sockets (mode 0700); empty: $XDG_RUNTIME_DIR/stagevisor, "
    "else /tmp/stagevisor-<uid>.",
)
CACHE_DIR = EnvVar(
    "STAGEVISOR_CACHE_DIR",
    "",
    "Where stages keep what they compute once (a voice's prepared graph); unset, each worker uses its "
    "node's $XDG_CACHE_HOME/stagevisor/<version> (else ~/.cache/stagevisor/<version>), kept across "
    "daemons. Empty: no cache.",
)
SHM_DIR = EnvVar(
    "STAGEVISOR_SHM_DIR",
    "",
    "The tmpfs large handoffs are mapped in; empty: /dev/shm.",
)
SHM_BYTES_PER_REQUEST = EnvVar(
    "STAGEVISOR_SHM_BYTES_PER_REQUEST",
    "",
    "Shared memory reserved per concurrent request, in bytes; empty: 16 MiB.",
)
CUDA_IPC = EnvVar(
    "STAGEVISOR_CUDA_IPC",
    "1",
    "0/false/no/off: CUDA tensors cross processes through host memory instead of CUDA IPC handles.",
)
GPU_ISOLATION = EnvVar(
    "STAGEVISOR_GPU_ISOLATION",
    "1",
    "0/false/no/off: workers see every GPU instead of only their own (CUDA_VISIBLE_DEVICES left alone).",
)
DATAPLANE_TLS = EnvVar(
    "STAGEVISOR_DATAPLANE_TLS",
    "",
    "--launcher ray: 1 or 0 forces TLS on TCP links between nodes on or off; empty: as the public endpoint.",
)
COMPUTE_THREADS = EnvVar(
    "STAGEVISOR_COMPUTE_THREADS",
    "",
    "Threads of a worker's compute pool (built-in executors); empty: the cores it may run on.",
)
ORT_THREADS = EnvVar(
    "STAGEVISOR_ORT_THREADS",
    "",
    "Threads of each ONNX Runtime session of the embedded voice; empty: 1.",
)
API_KEY = EnvVar(
    "STAGEVISOR_API_KEY",
    "",
    "The CLI's bearer token for the public endpoint (the token itself), when --api-key-file is not given.",
)
TLS_CA = EnvVar(
    "STAGEVISOR_TLS_CA",
    "",
    "The CLI's CA bundle for the daemon's certificate (turns TLS on), when --tls-ca is not given.",
)
TLS_CLIENT_CERT = EnvVar(
    "STAGEVISOR_TLS_CLIENT_CERT",
    "",
    "The CLI's client certificate for mutual TLS, when --tls-client-cert is not given.",
)
TLS_CLIENT_KEY = EnvVar(
    "STAGEVISOR_TLS_CLIENT_KEY",
    "",
    "The private key of the CLI's client certificate, when --tls-client-key is not given.",
)
FORK_SERVER = EnvVar(
    "STAGEVISOR_FORK_SERVER",
    "",
    "Set by the daemon, never by an operator: marks the fork server's environment while it starts, so that it "
    "ignores SIGTERM, and carries the daemon's sys.path for it (supervisor/worker/fork_server.py); removed there "
    "before any worker forks.",
)

ALL = (
    RUNTIME_DIR,
    CACHE_DIR,
    SHM_DIR,
    SHM_BYTES_PER_REQUEST,
    CUDA_IPC,
    GPU_ISOLATION,
    DATAPLANE_TLS,
    COMPUTE_THREADS,
    ORT_THREADS,
    API_KEY,
    TLS_CA,
    TLS_CLIENT_CERT,
    TLS_CLIENT_KEY,
    FORK_SERVER,
)
"""Every variable, in the order the configuration reference lists them."""
