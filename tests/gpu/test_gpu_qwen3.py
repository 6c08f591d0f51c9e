"""Qwen3-TTS on the GPU: a tiny random checkpoint served declared and vocoder-isolated, weights on cuda:0.

The checkpoint is built at test time (tests/qwen3_tiny.py). Each group's
worker holds GPU memory (NVML), the isolated groups run under their
recommended fractions (0.85 and 0.10), both topologies give the same PCM, as
do three requests at once with the same seed (taking turns on the talker), and
that PCM is within one 16-bit step of qwen-tts's own generate() + decode on
the same GPU. Skipped without a CUDA device (conftest.py) or the qwen3 packages.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.integration.daemon_helpers import ServeProcess
from tests.integration.qwen3_client import FRAMES, PCM_BOUND, call, package_pcm

pytestmark = pytest.mark.qwen3


@pytest.fixture
def own_tmpdir(monkeypatch):
    """On CUDA this test left torch's inductor cache (torchinductor_<user>) and a mat-debug-<pid>.log in the
    temporary directory: it and its daemons get one of their own, removed after it. Directly
    under /tmp, as the session's is: the daemons' unix sockets go under it (at most 107 bytes a path)."""
    directory = tempfile.mkdtemp(prefix="svq", dir="/tmp")
    monkeypatch.setenv("TMPDIR", directory)
    monkeypatch.setattr(tempfile, "tempdir", directory)
    yield Path(directory)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def checkpoint(own_tmpdir) -> str:
    from tests.qwen3_tiny import build

    return str(build(own_tmpdir / "custom_voice", "custom_voice"))


def gpu_memory_by_pid() -> dict[int, int]:
    pynvml = pytest.importorskip("pynvml")
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return {p.pid: p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    finally:
        pynvml.nvmlShutdown()


def test_qwen3_serves_from_the_gpu_in_both_topologies_with_the_packages_audio(checkpoint):
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    with ServeProcess("--model-path", checkpoint) as declared:
        with ServeProcess("--model-path", checkpoint, "--isolate-stage", "vocoder") as isolated:
            declared.wait_serving(timeout=600)
            isolated.wait_serving(timeout=600)
            first, _, _ = call(declared.listen, voice="ryan")
            with ThreadPoolExecutor(3) as pool:  # in turns on the talker, each with its own CUDA generator state
                together = list(pool.map(lambda _: call(declared.listen, voice="ryan")[0], range(3)))
            second, timings, _ = call(isolated.listen, voice="ryan")
            groups = {g["name"]: g for g in isolated.topology()["groups"]}
            used = gpu_memory_by_pid()
            pids = [g["pid"] for g in groups.values()] + [g["pid"] for g in declared.topology()["groups"]]
    assert set(groups) == {"pipeline", "vocoder"}
    for group in groups.values():
        assert group["device"].startswith("cuda:0 (") and group["fraction_enforced"] is True
    if set(pids) <= set(used):  # same PID namespace: every worker holds its weights on the GPU
        assert all(used[pid] > 0 for pid in pids), (pids, used)
    assert np.array_equal(first, second)
    assert all(np.array_equal(pcm, first) for pcm in together), "requests in turns must each draw as one alone"
    expected = package_pcm(checkpoint, device="cuda:0", speaker="ryan")
    assert first.shape == expected.shape == ((FRAMES - 1) * 1920,)
    assert np.abs(first.astype(np.int32) - expected).max() <= PCM_BOUND
    assert timings.first_audio_seconds > 0
