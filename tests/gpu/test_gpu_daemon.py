"""The GPU half on real hardware: allocator caps, two groups on one GPU, CUDA tensors across processes, NVML.

Skipped without a CUDA device (conftest.py). Run them with tests/gpu/run.sh.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import grpc
import pytest

from stagevisor.supervisor.worker.spec import physical_gpu
from tests.gpu.gpu_stages import MIB, REPORT_DIR
from tests.integration.daemon_helpers import DaemonProcess, make_plan, poll_until, synthesize

STAGES = "tests.gpu.gpu_stages"
GIB = 1 << 30


def report(directory: Path, stage: str, tag: str) -> dict:
    return json.loads((directory / f"{stage}-{tag}.json").read_text())


@pytest.fixture(scope="module")
def reports():
    directory = Path(tempfile.mkdtemp(prefix="svgpu", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def two_groups(reports):
    """Groups `ga` (fraction 0.4) and `gb` (0.5) on GPU 0, then a CPU sink."""
    plan = make_plan(
        "two-groups",
        [("a", "ga", 0, 0.4), ("b", "gb", 0, 0.5), ("sink", "out", None, None)],
        factories={"a": f"{STAGES}:make_allocator", "b": f"{STAGES}:make_allocator", "sink": f"{STAGES}:make_sink"},
    )
    with DaemonProcess(plan, env={REPORT_DIR: str(reports)}) as daemon:
        daemon.wait_serving(timeout=240)
        yield daemon


def request(daemon, **options: str) -> None:
    synthesize(daemon.listen, "gpu", {k: str(v) for k, v in options.items()})


def test_two_groups_with_fractions_0_4_and_0_5_both_load_and_serve_on_one_gpu(two_groups, reports):
    request(two_groups, alloc_a=0.1, alloc_b=0.1, tag="both")
    a, b = report(reports, "a", "both"), report(reports, "b", "both")
    assert a["pid"] != b["pid"]
    assert a["held"] >= 0.1 * a["device_total"] - 1 and b["held"] >= 0.1 * b["device_total"] - 1
    groups = {g["name"]: g for g in two_groups.topology()["groups"]}
    for name in ("ga", "gb"):
        assert groups[name]["fraction_enforced"] is True
        assert groups[name]["device"].startswith("cuda:0 (")
        assert groups[name]["physical_gpu"] == physical_gpu(0, two_groups.env)
    assert a["visible_devices"] == b["visible_devices"] == physical_gpu(0, two_groups.env)


def test_allocating_past_the_group_fraction_fails_that_stages_request_only(two_groups, reports):
    pids = {g["name"]: g["pid"] for g in two_groups.topology()["groups"]}
    with pytest.raises(grpc.RpcError) as caught:
        request(two_groups, alloc_a=0.5, tag="over")  # group ga is capped at 0.4 of the device
    assert caught.value.code() is grpc.StatusCode.INTERNAL
    # The message names torch's exception (the daemon log has its text, the client none of it).
    assert "stage 'a' failed with OutOfMemoryError" in caught.value.details()
    request(two_groups, alloc_a=0.1, alloc_b=0.45, tag="after")  # both groups still serve, gb up to its cap
    status = two_groups.status()
    assert status["state"] == "SERVING" and status["root_cause"] is None
    assert {g["name"]: g["pid"] for g in two_groups.topology()["groups"]} == pids


def test_nvml_per_worker_memory_matches_what_its_torch_reserved(two_groups, reports):
    """NVML's per-process figure is torch's reserved memory plus the CUDA context (well under 1.5 GiB)."""
    pynvml = pytest.importorskip("pynvml")
    request(two_groups, alloc_a=0.2, alloc_b=0.2, tag="nvml")
    seen = {r["pid"]: r["reserved"] for r in (report(reports, "a", "nvml"), report(reports, "b", "nvml"))}
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        used = {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        device_used = pynvml.nvmlDeviceGetMemoryInfo(handle).used
    finally:
        pynvml.nvmlShutdown()
    if set(seen) <= set(used):
        for pid, reserved in seen.items():
            assert 0 <= used[pid] - reserved <= 1.5 * GIB, (pid, used[pid], reserved)
    else:  # another PID namespace (a container): compare the device total instead
        assert 0 <= device_used - sum(seen.values()) <= 1.5 * GIB * (len(used) or 2) + GIB, (device_used, seen)


@pytest.fixture(scope="module")
def handoff(reports):
    """producer (GPU 0) -> consumer (GPU 0, another process: CUDA IPC) -> host_consumer (CPU: a host copy)."""
    plan = make_plan(
        "handoff",
        [
            ("producer", "gp", 0, 0.3),
            ("consumer", "gc", 0, 0.3),
            ("host_consumer", "gh", None, None),
            ("sink", "out", None, None),
        ],
        factories={
            "producer": f"{STAGES}:make_producer",
            "consumer": f"{STAGES}:make_consumer",
            "host_consumer": f"{STAGES}:make_consumer",
            "sink": f"{STAGES}:make_sink",
        },
    )
    with DaemonProcess(plan, env={REPORT_DIR: str(reports)}) as daemon:
        daemon.wait_serving(timeout=240)
        yield daemon


def test_a_cuda_tensor_crosses_to_a_worker_on_the_same_gpu_on_the_device_bit_exact(handoff, reports):
    request(handoff, mib=64, forward=1, tag="ipc")
    got = report(reports, "consumer", "ipc")
    assert (got["arrived_on"], got["equal"], got["nbytes"]) == ("cuda", True, 64 * MIB)


def test_a_cuda_tensor_for_a_cpu_worker_arrives_as_a_bit_exact_host_copy(handoff, reports):
    request(handoff, mib=16, forward=1, tag="host")
    got = report(reports, "host_consumer", "host")
    assert (got["arrived_on"], got["equal"], got["nbytes"]) == ("cpu", True, 16 * MIB)


def test_the_senders_memory_returns_to_its_baseline_after_the_request(handoff, reports):
    request(handoff, mib=0, tag="base")
    baseline = report(reports, "producer", "base")["allocated"]
    for index in range(3):
        request(handoff, mib=128, tag=f"send{index}")
    attempt = iter(range(10_000))

    def back_to_baseline():
        tag = f"probe{next(attempt)}"
        request(handoff, mib=0, tag=tag)
        return report(reports, "producer", tag)["allocated"] <= baseline

    poll_until(back_to_baseline, timeout=30, interval=0.5, message="producer memory back to its baseline")
