"""`stagevisor serve`'s options and their defaults: endpoints, workers, limits, metrics, HTTP, speech, TLS."""

from __future__ import annotations

import argparse
import os

from stagevisor.supervisor.worker.app_paths import add_app_dir_option
from stagevisor.supervisor.addresses import DEFAULT_HTTP, DEFAULT_LISTEN, default_admin_address
from stagevisor.supervisor.dataplane.admission import AdmissionLimits
from stagevisor.supervisor.dataplane.limits import RequestLimits
from stagevisor.supervisor.http.settings import ConnectionLimits
from stagevisor.supervisor.security.files import GENERATE_KEY


def add_serve_options(parser: argparse.ArgumentParser) -> None:
    """Every option of `stagevisor serve`, with its default."""
    from stagevisor.supervisor.commands.placement_options import add_launcher_options, add_placement_options
    from stagevisor.supervisor.commands.requirements import add_stand_ins_option

    add_placement_options(parser)
    add_stand_ins_option(parser)
    add_launcher_options(parser)
    parser.add_argument(
        "--admin-address",
        metavar="ADDRESS",
        default=default_admin_address(),
        help="admin API endpoint: unix:PATH (default %(default)s, a private directory) "
        "or host:port (needs --admin-api-key-file; off loopback also --tls-cert/--tls-key)",
    )
    parser.add_argument(
        "--listen",
        metavar="ADDRESS",
        default=DEFAULT_LISTEN,
        help="public endpoint for synthesis, health and reflection (default %(default)s)",
    )
    parser.add_argument(
        "--http",
        default=DEFAULT_HTTP,
        metavar="HOST:PORT",
        help="OpenAI-compatible HTTP API, health/readiness and the playground page "
        "(default %(default)s; port 0 picks a free port; 'none' turns it off)",
    )
    parser.add_argument(
        "--max-concurrent-requests",
        type=int,
        default=AdmissionLimits.max_concurrent,
        metavar="N",
        help="synthesis requests (gRPC and HTTP together) running at once; 0 = unbounded (default %(default)s)",
    )
    parser.add_argument(
        "--max-queued-requests",
        type=int,
        default=AdmissionLimits.max_queued,
        metavar="N",
        help="requests waiting for a slot; beyond them HTTP 429 + Retry-After / gRPC "
        "RESOURCE_EXHAUSTED, before any worker sees the request; 0 = no waiting "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--queue-timeout",
        type=float,
        default=AdmissionLimits.queue_timeout,
        metavar="SECONDS",
        help="how long a queued request waits for a slot before it gets 429 / "
        "RESOURCE_EXHAUSTED; 0 = as long as it takes (default %(default)s)",
    )
    add_app_dir_option(parser)
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="daemon and worker log level (default %(default)s)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on shutdown, how long in-flight requests may finish (default %(default)s)",
    )
    parser.add_argument(
        "--stop-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long a worker has to exit after SIGTERM before SIGKILL (default %(default)s)",
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long a worker may take to build its stages (default %(default)s)",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=None,
        metavar="N",
        help="consecutive restarts of a crashing group before it is FAILED until `stagevisor restart`; by "
        "default a crashing group is retried for as long as it crashes, with a backoff from 0.5 s doubling "
        "up to 10 s (status DEGRADED, a BACKOFF event per try, stagevisor_group_consecutive_crashes)",
    )
    parser.add_argument(
        "--metrics",
        default=None,
        metavar="HOST:PORT",
        help="serve Prometheus /metrics on this address (e.g. 127.0.0.1:9464); "
        "the HTTP API serves /metrics too when it is on",
    )
    parser.add_argument(
        "--no-metrics",
        action="store_true",
        help="collect no metrics and no per-request stage timings (budgets are still checked)",
    )
    parser.add_argument(
        "--rss-budget",
        action="append",
        default=[],
        metavar="GROUP=SIZE",
        help="warn when the group's worker holds more resident (CPU) memory than SIZE "
        "(e.g. vocoder=2G); repeatable. GPU groups are also checked against their "
        "declared fraction of GPU memory, where NVML can measure it",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="a READY worker whose event loop does not answer its heartbeat this long (a stage "
        "blocked it, or the process is stopped) is killed and restarted; its requests fail "
        "with UNAVAILABLE; 0 turns heartbeats off (default %(default)s)",
    )
    parser.add_argument(
        "--worker-start",
        choices=["forkserver", "spawn"],
        default="forkserver",
        help="forkserver: workers fork from a server process that has imported the worker's "
        "modules once, so a restarted worker is READY sooner; spawn: each worker is a fresh "
        "interpreter (default %(default)s)",
    )
    parser.add_argument(
        "--standby-worker",
        action="append",
        default=[],
        metavar="GROUP",
        help="keep a second, built worker for this CPU process group; it takes over when the "
        "group's worker dies (after the backoff) or is restarted, READY without loading "
        "models again. Costs one more worker's memory per group (per replica of a replicated group); "
        "repeatable",
    )
    speech = parser.add_argument_group("names and audio of the HTTP speech API")
    speech.add_argument(
        "--served-model-name",
        action="append",
        default=[],
        metavar="NAME",
        help="a name clients may send as `model` for the served model; the first is the id /v1/models lists "
        "first; repeatable",
    )
    speech.add_argument(
        "--no-openai-aliases",
        action="store_true",
        help="refuse OpenAI's model names (tts-1, tts-1-hd, gpt-4o-mini-tts and its dated snapshots), accepted by "
        "default as aliases",
    )
    speech.add_argument(
        "--sample-rate",
        type=int,
        default=None,
        metavar="HZ",
        help="the rate of every response format when a request gives no sample_rate (8000 to 48000; "
        "default: pcm at 24000 like OpenAI's, the other formats at the model's rate)",
    )
    speech.add_argument(
        "--voices-dir",
        default=default_voices_dir(),
        metavar="DIR",
        help="where voices uploaded through POST /v1/audio/voices are kept across restarts "
        "(default %(default)s, created on the first upload; 'none' turns uploads off)",
    )
    http = parser.add_argument_group(
        "HTTP connections",
        "Limits a client of the HTTP API must keep: slow or idle connections are closed, so a few "
        "clients cannot hold every descriptor of the daemon.",
    )
    http.add_argument(
        "--http-header-timeout",
        type=float,
        default=ConnectionLimits.header_timeout,
        metavar="SECONDS",
        help="close a connection whose request head (request line and headers) is not complete this long "
        "after it opened or after its previous response, answering 408 if part of it came (default %(default)s)",
    )
    http.add_argument(
        "--http-body-timeout",
        type=float,
        default=ConnectionLimits.body_timeout,
        metavar="SECONDS",
        help="answer 408 and close a connection whose request body is not complete this long after its head "
        "(default %(default)s)",
    )
    http.add_argument(
        "--http-keep-alive-timeout",
        type=float,
        default=ConnectionLimits.keep_alive_timeout,
        metavar="SECONDS",
        help="close an idle keep-alive connection after this long (default %(default)s)",
    )
    http.add_argument(
        "--http-max-connections",
        type=int,
        default=None,
        metavar="N",
        help="open HTTP connections at once; at the cap a new one replaces the oldest idle one, or when all are "
        "busy takes one of 4 more that answer only health probes (others get 503) "
        "(default: half the descriptors left after gRPC, worker links and shared memory, from ulimit -n)",
    )
    http.add_argument(
        "--http-allowed-host",
        action="append",
        default=[],
        metavar="HOST",
        help="a Host header value the HTTP API accepts (`*.example.com` patterns; `*` for any); repeatable "
        "(default: localhost, 127.0.0.1 and ::1 when --http is a loopback address, else any)",
    )
    http.add_argument(
        "--http-cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin (e.g. https://app.example.com) allowed to call the HTTP API cross-origin; "
        "repeatable (default: none, no CORS headers)",
    )
    limits = parser.add_argument_group("per-request limits of the public endpoints")
    limits.add_argument(
        "--max-audio-seconds",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="end a request whose audio passes this length with RESOURCE_EXHAUSTED (default %(default)s)",
    )
    limits.add_argument(
        "--request-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="end a request running longer with DEADLINE_EXCEEDED (default %(default)s)",
    )
    limits.add_argument(
        "--pipeline-idle-timeout",
        type=float,
        default=RequestLimits.pipeline_idle_timeout,
        metavar="SECONDS",
        help="end a request with UNAVAILABLE when the pipeline sends it nothing for this long and no worker "
        "holds it (a worker holding a request, running or queueing it, says so every 5 s; one that died or lost "
        "it cannot); more than 10 s (default %(default)s)",
    )
    limits.add_argument(
        "--stream-idle-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="cancel a request whose client reads no audio for this long; a client that reads, however slowly, "
        "is not idle (default %(default)s)",
    )
    security = parser.add_argument_group(
        "TLS and authentication",
        "TLS and the API key protect the public endpoints (--listen, and HTTP); the admin API on TCP uses "
        "the same certificate and its own token. Generate a token with "
        f"`{GENERATE_KEY.replace('FILE', 'api.key')}`.",
    )
    security.add_argument("--tls-cert", metavar="FILE", help="PEM certificate chain of the server")
    security.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert (unencrypted)")
    security.add_argument(
        "--tls-client-ca",
        metavar="FILE",
        help="PEM CA bundle; clients must present a certificate it signed (mutual TLS)",
    )
    security.add_argument(
        "--api-key-file",
        metavar="FILE",
        help="file holding the bearer token every public call must carry "
        "(`authorization: Bearer TOKEN`; gRPC health, /health, /ready and the playground page stay open: "
        "the page asks for the token)",
    )
    security.add_argument(
        "--admin-allow-uid",
        action="append",
        type=_allowed_uid,
        default=[],
        metavar="UID",
        help="on a unix --admin-address, also let this user in (the daemon's own user and root always may; "
        "others are refused by their socket credentials); repeatable",
    )
    security.add_argument(
        "--admin-api-key-file",
        metavar="FILE",
        help="file holding the admin API's token; required for a TCP --admin-address",
    )


def default_voices_dir() -> str:
    """$XDG_DATA_HOME/stagevisor/voices, else ~/.local/share/stagevisor/voices."""
    data_home = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(data_home, "stagevisor", "voices")


def _allowed_uid(value: str) -> int:
    from stagevisor.supervisor.admin.peer_gate import allowed_uid

    try:
        return allowed_uid(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
