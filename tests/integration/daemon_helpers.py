"""Helpers for the daemon integration tests: hand-built Plans, a daemon in a subprocess, /proc, bounded polls.

The daemon runs through its test entry `python -m tests.integration.daemon_entry --plan-pickle PATH`
(see daemon_entry.py), so these tests do not depend on the placement code.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from stagevisor.supervisor.plan import Edge, GpuBudget, Plan, PlannedStage, ProcessGroup
from tests.integration import exec_as

ROOT = Path(__file__).resolve().parents[2]
ECHO = "tests.integration.daemon_stages:make_echo"
BROKEN = "tests.integration.daemon_stages:make_broken"
StageRow = tuple[str, str, "int | None", "float | None"]  # name, process, gpu, fraction

# What `stagevisor topology --format json` adds to the plan's JSON at run time.
RUNTIME_GROUP_FIELDS = (
    "pid",
    "state",
    "restarts",
    "started_at",
    "fraction_enforced",
    "physical_gpu",
    "device",
    "resources",
    "host",
    "node_id",
    "silent_s",
)
RUNTIME_EDGE_FIELDS = ("transport", "src_group", "dst_group", "requests")
RUNTIME_GPU_FIELDS = ("total_bytes", "measured_bytes", "over_limit")


def plan_part(topology: dict) -> dict:
    """A topology's JSON without its runtime fields: what `stagevisor plan --format json` printed."""
    stripped = dict(topology)
    stripped["groups"] = [{k: v for k, v in g.items() if k not in RUNTIME_GROUP_FIELDS} for g in topology["groups"]]
    stripped["edges"] = [{k: v for k, v in e.items() if k not in RUNTIME_EDGE_FIELDS} for e in topology["edges"]]
    stripped["gpus"] = [{k: v for k, v in b.items() if k not in RUNTIME_GPU_FIELDS} for b in topology["gpus"]]
    return stripped


def make_plan(model: str, rows: Sequence[StageRow], *, factories: dict[str, str] | None = None) -> Plan:
    """A Plan for a linear pipeline: stages in order, groups by first stage, last edge also streams."""
    factories = factories or {}
    names = [row[0] for row in rows]
    stages = tuple(
        PlannedStage(
            name=name,
            process=process,
            gpu=gpu,
            tp_size=1,
            total_gpu_memory_fraction=fraction,
            fraction_source="declared" if fraction is not None else None,
            factory=factories.get(name, ECHO),
            args={"name": name},
            next=(names[i + 1],) if i + 1 < len(names) else (),
            stream_to=(names[i + 1],) if i + 2 == len(names) else (),
        )
        for i, (name, process, gpu, fraction) in enumerate(rows)
    )
    order: list[str] = []
    for stage in stages:
        if stage.process not in order:
            order.append(stage.process)
    groups = []
    for process in order:
        members = [s for s in stages if s.process == process]
        gpus = {s.gpu for s in members if s.gpu is not None}
        fractions = [s.total_gpu_memory_fraction for s in members if s.total_gpu_memory_fraction is not None]
        groups.append(
            ProcessGroup(
                name=process,
                stages=tuple(s.name for s in members),
                gpu=next(iter(gpus)) if gpus else None,
                total_gpu_memory_fraction=round(sum(fractions), 6) if fractions else None,
            )
        )
    edges = []
    for stage in stages:
        for kind, targets in (("next", stage.next), ("stream_to", stage.stream_to)):
            for dst in targets:
                edges.append(
                    Edge(stage.name, dst, kind, stage.process != next(s for s in stages if s.name == dst).process, True)
                )
    budgets = {}
    for group in groups:
        if group.gpu is not None:
            budgets.setdefault(group.gpu, []).append(group)
    gpus = tuple(
        GpuBudget(
            id=gpu,
            total_gpu_memory_fraction=round(sum(g.total_gpu_memory_fraction or 0 for g in gs), 6),
            limit=1.0,
            groups=tuple(g.name for g in gs),
        )
        for gpu, gs in budgets.items()
    )
    return Plan(
        model=model,
        model_path=f"test/{model}",
        changed=True,
        stages=stages,
        groups=tuple(groups),
        edges=tuple(edges),
        gpus=gpus,
    )


def higgs_isolated_audio_encoder(**kw: Any) -> Plan:
    """Higgs-TTS with --isolate-stage audio_encoder."""
    return make_plan(
        "higgs-tts",
        [
            ("preprocessing", "tts_frontend", None, None),
            ("audio_encoder", "audio_encoder", 0, 0.03),
            ("tts_engine", "pipeline", 0, 0.85),
            ("vocoder", "vocoder", 0, 0.10),
        ],
        **kw,
    )


def colocated_pipeline(**kw: Any) -> Plan:
    """MOSS-TTS-Delay as declared: three stages in one `pipeline` process (stand-ins; Qwen3-TTS, with the same
    stages, now runs its real executors, which need a checkpoint)."""
    return make_plan(
        "moss-tts-delay",
        [
            ("preprocessing", "pipeline", None, None),
            ("tts_engine", "pipeline", 0, None),
            ("vocoder", "pipeline", 0, None),
        ],
        **kw,
    )


def ming_isolated_audio_decode(**kw: Any) -> Plan:
    """Ming-Omni-TTS with --isolate-stage vocoder (the alias of audio_decode), fractions recommended."""
    return make_plan(
        "ming-omni-tts",
        [
            ("preprocessing", "pipeline", None, None),
            ("reference_encode", "pipeline", 0, 0.08),
            ("tts_engine", "pipeline", 0, 0.72),
            ("audio_decode", "audio_decode", 0, 0.12),
        ],
        **kw,
    )


TCP_ESTABLISHED = 1
"""tcpi_state of an open connection (linux/tcp.h); a reset one is TCP_CLOSE, one the peer closed TCP_CLOSE_WAIT."""


def still_open(sock: socket.socket) -> bool:
    """Whether the server still holds `sock`'s connection open: it has neither reset nor closed it (Linux)."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0] == TCP_ESTABLISHED


def poll_until(
    predicate: Callable[[], Any], *, timeout: float = 60.0, interval: float = 0.05, message: str = "condition"
) -> Any:
    """Return the first truthy value of `predicate()`; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


# -- /proc ---------------------------------------------------------------------


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a live process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[1] == pid and stat[0] != "Z":
                found.append(int(entry))
    return sorted(found)


def descendants(pid: int) -> list[int]:
    result, frontier = [], [pid]
    while frontier:
        kids = children(frontier.pop())
        result.extend(kids)
        frontier.extend(kids)
    return result


def worker_pids(daemon_pid: int) -> list[int]:
    """The daemon's worker processes: descendants that named themselves `sv:<group>`.

    Workers are children of the daemon's fork server (or of the daemon with
    --worker-start spawn); other processes (the fork server, multiprocessing's
    resource tracker) are not workers.
    """
    return sorted(pid for pid in descendants(daemon_pid) if comm(pid).startswith("sv:"))


# -- a daemon in a subprocess ---------------------------------------------------


HIDE_TORCH = ROOT / "tests" / "integration" / "hide_torch"
"""On PYTHONPATH, makes `import torch` fail: see `without_torch`."""

WORKERS_IMPORT_TORCH = True
"""Whether the daemons these helpers start may import torch (their GPU groups' workers do, to bind a device).

tests/integration/conftest.py sets it to False for each integration test not marked
`worker_torch`: without CUDA, a GPU group's worker behaves the same without torch (it
runs its stages on CPU, fraction not enforced, with the same warning), and each import
of torch costs seconds of CPU in every GPU group's worker. The GPU tests and the
benchmarks keep the default.
"""


def graph_cache() -> Path:
    """The session's optimized voice graphs (STAGEVISOR_CACHE_DIR of every process `child_env` prepares).

    By default each daemon keeps them in its own runtime directory, so every test's daemon
    would optimize the embedded voice's graphs again in its first workers (about a second of
    CPU each); one directory for the session, as an operator's persistent STAGEVISOR_CACHE_DIR,
    does it once. The audio is bit-identical (tests/unit/stages/test_voice_cache.py, which also covers
    the cache itself). In the session's private temp directory (each xdist worker's own), read when
    called: pytest imports this module before tests/conftest.py sets that directory when it is given
    a path under tests/integration; conftest.py removes it at the end.
    """
    return Path(tempfile.gettempdir()) / "voice-graphs"


def child_env(env: dict[str, str]) -> dict[str, str]:
    """`env` for a process a test starts: without torch unless WORKERS_IMPORT_TORCH, and with the
    session's graph_cache() unless `env` names its own STAGEVISOR_CACHE_DIR."""
    env = env if "STAGEVISOR_CACHE_DIR" in env else {**env, "STAGEVISOR_CACHE_DIR": str(graph_cache())}
    return env if WORKERS_IMPORT_TORCH else without_torch(env)


def without_torch(env: dict[str, str]) -> dict[str, str]:
    """`env` with HIDE_TORCH on PYTHONPATH: `import torch` raises ImportError in those processes.

    Added last: PYTHONPATH comes before site-packages anyway, and the test's own entries keep their order.
    """
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(HIDE_TORCH)]
    return {**env, "PYTHONPATH": os.pathsep.join([*paths, str(HIDE_TORCH)])}


def daemon_env(runtime_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["STAGEVISOR_RUNTIME_DIR"] = str(runtime_dir)
    env.pop("NOTIFY_SOCKET", None)
    return child_env(env)


class DaemonProcess:
    """`python -m tests.integration.daemon_entry` on a pickled Plan, with temporary sockets and a log file.

    Use as a context manager: on exit every process it started is killed,
    even when the test failed.
    """

    def __init__(self, plan: Plan, *extra: str, env: dict[str, str] | None = None) -> None:
        self._prepare(env)
        plan_path = self.tmp / "plan.pkl"
        plan_path.write_bytes(pickle.dumps(plan))
        self.argv = [
            sys.executable,
            "-m",
            "tests.integration.daemon_entry",
            "--plan-pickle",
            str(plan_path),
            "--admin-address",
            self.admin_address,
            "--listen",
            self.listen,
            "--stop-timeout",
            "5",
            "--backoff-initial",
            "0.1",
            *extra,
        ]

    def _prepare(self, env: dict[str, str] | None) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="sv"))
        self.admin_address = f"unix:{self.tmp / 'admin.sock'}"
        self.listen = f"unix:{self.tmp / 'public.sock'}"
        self.log_path = self.tmp / "daemon.log"
        # TMPDIR inside self.tmp: what a daemon killed on purpose leaves there (its fork server's
        # multiprocessing directory) goes with the test's own directory.
        self.env = {**daemon_env(self.tmp / "run"), "TMPDIR": str(self.tmp), **(env or {})}
        self.env = child_env(self.env)
        self.proc: subprocess.Popen | None = None
        self._seen: set[int] = set()
        self.nofile: int | None = None
        """Caps the daemon's open files (soft and hard limit), set before it starts."""
        self.new_session = False
        """Starts the daemon in a session (and process group) of its own."""

    def __enter__(self) -> "DaemonProcess":
        self.start()
        return self

    def start(self) -> None:
        log = open(self.log_path, "ab")
        # Never preexec_fn: it makes Popen fork() with gRPC live in this process (see exec_as).
        self.proc = subprocess.Popen(
            exec_as.command(self.argv, nofile=self.nofile) if self.nofile is not None else self.argv,
            cwd=getattr(self, "cwd", ROOT),
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=self.new_session,
        )
        log.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def cli(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
        """`python -m stagevisor ARGS --admin-address <this daemon>`."""
        return subprocess.run(
            [sys.executable, "-m", "stagevisor", *args, "--admin-address", self.admin_address],
            cwd=getattr(self, "cwd", ROOT),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def topology(self) -> dict[str, Any]:
        result = self.cli("topology", "--format", "json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def status(self) -> dict[str, Any] | None:
        result = self.cli("status", "--format", "json")
        return json.loads(result.stdout) if result.returncode == 0 else None

    def _admin(self, rpc: str, request: Any, from_proto: Callable[[Any], dict], fallback: Callable[[], Any]) -> Any:
        """One admin RPC from this process, as its CLI command prints it with --format json.

        None while no daemon answers on the admin socket; `fallback()` (the CLI) when the
        daemon wants credentials this process does not hold.
        """
        import grpc

        from stagevisor.supervisor._proto import admin_pb2_grpc

        if self.admin_address.startswith("unix:") and not Path(self.admin_address[len("unix:") :]).exists():
            return None
        try:
            with grpc.insecure_channel(self.admin_address) as channel:
                reply = getattr(admin_pb2_grpc.AdminStub(channel), rpc)(request, timeout=30)
        except grpc.RpcError as error:
            if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return None
            return fallback()
        return json.loads(json.dumps(from_proto(reply)))

    def admin_status(self) -> dict[str, Any] | None:
        """`status()` asked from this process: cheap enough to poll (`status()` starts a CLI
        process per call, half a second of CPU). None while no daemon answers."""
        from stagevisor.supervisor._proto import admin_pb2
        from stagevisor.supervisor.reports import StatusReport

        return self._admin(
            "GetStatus", admin_pb2.GetStatusRequest(), lambda m: StatusReport.from_proto(m).to_json(), self.status
        )

    def admin_topology(self, timeout: float = 120.0) -> dict[str, Any]:
        """`topology()` asked from this process, for polls; waits (bounded) while the daemon does not answer
        (a daemon restarting its fork server on a loaded machine can keep its admin API busy for seconds)."""
        from stagevisor.supervisor._proto import admin_pb2
        from stagevisor.supervisor.reports import TopologyReport

        def from_proto(message: Any) -> dict[str, Any]:
            return TopologyReport.from_proto(message).to_json()

        return poll_until(
            lambda: self._admin("GetTopology", admin_pb2.GetTopologyRequest(), from_proto, self.topology),
            timeout=timeout,
            interval=0.1,
            message=f"an answer on {self.admin_address}",
        )

    def wait_serving(self, timeout: float = 300.0) -> dict[str, Any]:
        """Wait until the daemon is SERVING; return its status. The bound only decides how long a
        broken start takes to fail: on the shared 2-core machine at load average 25-35, daemons
        whose GPU groups import torch took over 90 s to start (2026-11-30)."""

        def serving():
            assert self.proc is not None and self.proc.poll() is None, f"daemon exited:\n{self.log()}"
            status = self.admin_status()
            return status if status and status["state"] == "SERVING" else None

        status = poll_until(serving, timeout=timeout, interval=0.1, message="daemon SERVING")
        self._seen.update(descendants(self.pid))
        return status

    def track(self) -> list[int]:
        """Remember every current descendant so cleanup can kill it; return them."""
        pids = descendants(self.pid)
        self._seen.update(pids)
        return pids

    def http_url(self, timeout: float = 90.0) -> str:
        """The base URL of the daemon's HTTP API (started with `--http 127.0.0.1:0`), from its log."""
        import re

        def bound():
            assert self.proc is not None and self.proc.poll() is None, f"daemon exited:\n{self.log()}"
            found = re.search(r"HTTP API on (https?://\S+)", self.log())
            return found.group(1) if found else None

        return poll_until(bound, timeout=timeout, interval=0.1, message="the HTTP API's address in the log")

    def wait_exit(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self._seen.update(descendants(self.proc.pid))
            # SIGTERM first: a daemon that stops cleanly removes what it made (sockets, its
            # fork server's temp directory); SIGKILL only if it does not stop in time.
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
                self._report_unclean_stop("did not stop within 30 s of SIGTERM and was killed")
            else:
                if self.proc.returncode not in (0, -signal.SIGTERM):
                    self._report_unclean_stop(f"exited {self.proc.returncode} on SIGTERM")
        for pid in self._seen:
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _report_unclean_stop(self, what: str) -> None:
        """A daemon that did not stop cleanly leaves what it made (its shared-memory area): say so with its log's
        end, as a warning the session's summary shows even when the test passed, before the log is removed."""
        import warnings

        try:
            tail = self.log_path.read_text(errors="replace")[-4000:]
        except OSError as error:
            tail = f"(no log: {error})"
        warnings.warn(f"the daemon {' '.join(self.argv[2:4])} {what}; its log ends:\n{tail}", stacklevel=2)


class ServeProcess(DaemonProcess):
    """`python -m stagevisor serve ARGS`: the operator's path, with real model declarations and executors."""

    def __init__(self, *serve_args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> None:
        self._prepare(env)
        self.cwd = cwd
        # Defaults before the test's own options, which win (argparse keeps the last): `--http none` (tests
        # that want HTTP pass `--http 127.0.0.1:0`; no test binds the default HTTP port) and `--stop-timeout 5`.
        self.argv = [
            sys.executable,
            "-m",
            "stagevisor",
            "serve",
            "--http",
            "none",
            "--stop-timeout",
            "5",
            *serve_args,
            "--admin-address",
            self.admin_address,
            "--listen",
            self.listen,
        ]


NOISELESS: dict[str, str] = {}
"""Options for repeatable audio: none for the default voice and every stand-in (hibari's noise seed defaults to 0)."""
PIPER_NOISELESS = {"noise_scale": "0", "noise_w": "0"}
"""Both noise scales at 0: the Piper voice (`--model-path piper`) is deterministic."""


def synthesize(address: str, text: str, options: dict[str, str] = NOISELESS) -> tuple[bytes, int]:
    """One Synthesize call on a daemon's public endpoint: (the whole PCM, its sample rate)."""
    import grpc

    from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc

    pcm = bytearray()
    rate = 0
    with grpc.insecure_channel(address) as channel:
        stub = synthesis_pb2_grpc.SynthesisStub(channel)
        for chunk in stub.Synthesize(synthesis_pb2.SynthesizeRequest(text=text, options=options), timeout=120):
            pcm += chunk.pcm
            rate = chunk.sample_rate
    return bytes(pcm), rate


def long_request(address: str, seconds: int) -> str:
    """`seconds` one-second chunks of limit_stages' source, one a second, over gRPC: "OK" when all came, "SHORT n/m"
    when fewer did, else the status code's name."""
    import grpc

    from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            chunks = list(
                synthesis_pb2_grpc.SynthesisStub(channel).Synthesize(
                    synthesis_pb2.SynthesizeRequest(text="Long.", options={"seconds": str(seconds), "interval": "1"}),
                    timeout=120,
                )
            )
        except grpc.RpcError as error:
            return error.code().name
    return "OK" if len(chunks) == seconds else f"SHORT {len(chunks)}/{seconds}"


@dataclass(frozen=True)
class HttpSpeech:
    """What SpeechLoad's HTTP client posts to a daemon's /v1/audio/speech: its base URL, a model and a voice."""

    url: str
    model: str
    voice: str


class SpeechLoad:
    """Clients synthesizing one text back to back on a serving daemon until stopped, every outcome counted.

    `grpc_clients` threads call Synthesize: OK when the whole PCM equals `expected`
    (the text's audio at rest), DIFFERENT when it does not, else the gRPC status
    code's name (UNAVAILABLE, ...). With `http`, one more thread posts the text to
    /v1/audio/speech: OK on a 200 with audio, else `http <what went wrong>`.
    Entering starts them and waits until `started` requests completed OK; leaving
    stops them after their request in flight.
    """

    def __init__(
        self,
        address: str,
        text: str,
        expected: bytes,
        grpc_clients: int,
        http: HttpSpeech | None = None,
        started: int = 0,
        timeout: float = 120.0,
    ) -> None:
        self.address, self.text, self.expected, self.http = address, text, expected, http
        self.started, self.timeout = started, timeout
        self.outcomes: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._grpc, daemon=True) for _ in range(grpc_clients)]
        if http is not None:
            self._threads.append(threading.Thread(target=self._http, args=(http,), daemon=True))

    def _record(self, outcome: str) -> None:
        with self._lock:
            self.outcomes[outcome] += 1

    def _grpc(self) -> None:
        import grpc

        from stagevisor.supervisor._proto import synthesis_pb2, synthesis_pb2_grpc

        with grpc.insecure_channel(self.address) as channel:
            stub = synthesis_pb2_grpc.SynthesisStub(channel)
            while not self._stop.is_set():
                request = synthesis_pb2.SynthesizeRequest(text=self.text, options=NOISELESS)
                try:
                    pcm = b"".join(chunk.pcm for chunk in stub.Synthesize(request, timeout=120))
                    self._record("OK" if pcm == self.expected else "DIFFERENT")
                except grpc.RpcError as error:
                    print(f"speech load: {error.code().name}: {error.details()}")  # shown with a failing test
                    self._record(error.code().name)

    def _http(self, http: HttpSpeech) -> None:
        body = json.dumps({"model": http.model, "input": self.text, "voice": http.voice}).encode()
        while not self._stop.is_set():
            request = urllib.request.Request(http.url + "/v1/audio/speech", body, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=120) as response:
                    audio = response.read()
                self._record("OK" if response.status == 200 and audio else "http EMPTY")
            except Exception as error:  # noqa: BLE001 - every failure is an outcome the test counts
                self._record(f"http {type(error).__name__}: {error}")

    def count(self, outcome: str = "OK") -> int:
        with self._lock:
            return self.outcomes[outcome]

    def tally(self) -> Counter[str]:
        """A copy of the outcomes so far."""
        with self._lock:
            return Counter(self.outcomes)

    def more(self, n: int) -> None:
        """Wait until `n` more requests completed OK."""
        target = self.count() + n
        poll_until(lambda: self.count() >= target, timeout=self.timeout, message=f"{n} more complete requests")

    def __enter__(self) -> "SpeechLoad":
        for thread in self._threads:
            thread.start()
        if self.started:
            self.more(self.started)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=150)


def descriptor_limited_daemon(name: str, nofile: int, *args: str) -> DaemonProcess:
    """A daemon of two test stages that answer with audio (10 ms a word), its open files capped at `nofile`."""
    plan = make_plan(
        name,
        [("talker", "pipeline", None, None), ("speaker", "pipeline", None, None)],
        factories={
            "talker": "tests.integration.daemon_stages:make_talker",
            "speaker": "tests.integration.daemon_stages:make_speaker",
        },
    )
    daemon = DaemonProcess(plan, *args)
    daemon.nofile = nofile
    return daemon


def closed_by_server(sock: socket.socket) -> bool:
    """True once the server closed `sock` (EOF, or a reset), whatever it sent first; never blocks."""
    sock.setblocking(False)
    try:
        while sock.recv(4096):
            pass
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True
