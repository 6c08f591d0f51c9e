"""`stagevisor serve` end to end, with the placement step replaced by a stub that loads a pickled Plan.

The stub stands in for supervisor.commands.placement_options (placement has its own tests);
what is checked here is serve's own contract: exit 2 before any worker starts
when placement fails, and a daemon that serves, answers and stops otherwise.
"""

from __future__ import annotations

import pickle
import subprocess
import sys

from tests.integration.daemon_helpers import ROOT, DaemonProcess, colocated_pipeline, poll_until

SERVE_WITH_STUB_PLACEMENT = """
import pickle, sys, types
from stagevisor.supervisor.errors import ErrorCode, PlacementError
stub = types.ModuleType("stagevisor.supervisor.commands.placement_options")
def add_placement_options(parser):  # the options serve reads itself, beside the plan's pickle
    parser.add_argument("--plan-pickle")
    parser.add_argument("--model-path")
    parser.add_argument("--config")
def add_launcher_options(parser):
    parser.add_argument("--launcher", default="local")
    parser.add_argument("--ray-address")
stub.add_placement_options = add_placement_options
stub.add_model_options = lambda parser: parser.add_argument_group("placement")
stub.add_launcher_options = add_launcher_options
def plan_from_args(args):
    if args.plan_pickle == "invalid":
        raise PlacementError(ErrorCode.UNSAFE_EDGE, "edge 'preprocessing' -> 'tts_engine' is not process-safe",
                             edge=("preprocessing", "tts_engine"))
    with open(args.plan_pickle, "rb") as f:
        return pickle.load(f)
stub.plan_from_args = plan_from_args
sys.modules["stagevisor.supervisor.commands.placement_options"] = stub
from stagevisor.supervisor.cli import main
sys.exit(main(sys.argv[1:]))
"""


def serve_argv(daemon: DaemonProcess, plan_arg: str) -> list[str]:
    return [
        sys.executable,
        "-c",
        SERVE_WITH_STUB_PLACEMENT,
        "serve",
        "--plan-pickle",
        plan_arg,
        "--admin-address",
        daemon.admin_address,
        "--listen",
        daemon.listen,
        "--stop-timeout",
        "5",
        "--http",
        "none",
    ]


def test_invalid_placement_exits_2_before_any_worker_starts():
    daemon = DaemonProcess(colocated_pipeline())
    try:
        result = subprocess.run(
            serve_argv(daemon, "invalid"), cwd=ROOT, env=daemon.env, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 2
        assert result.stderr.strip() == "error: edge 'preprocessing' -> 'tts_engine' is not process-safe"
        assert not (daemon.tmp / "run").exists()  # no runtime dir, so no worker socket was ever made
    finally:
        daemon.__exit__(None, None, None)


def test_serve_runs_the_plan_until_stop():
    plan = colocated_pipeline()
    daemon = DaemonProcess(plan)
    (daemon.tmp / "served.pkl").write_bytes(pickle.dumps(plan))
    daemon.argv = serve_argv(daemon, str(daemon.tmp / "served.pkl"))
    with daemon:
        status = daemon.wait_serving()
        assert status["groups_ready"] == 1
        result = daemon.cli("stop")
        assert result.returncode == 0, result.stderr
        assert poll_until(lambda: daemon.proc.poll() is not None, timeout=30, message="serve exits") is True
        assert daemon.proc.returncode == 0
