"""What the daemon's apply refuses before anything starts (the live switch itself runs in tests/integration)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from stagevisor.supervisor.daemon.core import Daemon, DaemonOptions
from stagevisor.supervisor.errors import ErrorCode, PlacementError
from tests.unit.daemon.test_daemon_shutdown import SwitchingGateway, cpu_plan
from tests.unit.daemon.test_lifecycle_runner import FakeLauncher


def test_an_apply_for_another_model_is_refused_naming_the_model_path_to_give_apply(tmp_path):
    """`stagevisor apply --isolate-stage vocoder` without --model-path plans the default voice: against a daemon
    serving Higgs-TTS the refusal tells the operator which --model-path to add, not only to start another daemon."""

    async def scenario():
        daemon = Daemon(
            cpu_plan("pipeline", "pipeline", "pipeline", "pipeline"),
            DaemonOptions(run_dir=tmp_path / "d1", stop_timeout=1.0),
            launcher=FakeLauncher([]).factory,
            gateway_factory=SwitchingGateway,
        )
        await daemon.start()
        try:
            with pytest.raises(PlacementError) as refused:
                await daemon.apply_plan(replace(cpu_plan("a", "b", "c", "d"), model="demo", model_path="demo"))
        finally:
            await asyncio.wait_for(daemon.shutdown(0.0), 30)
        return refused.value

    refusal = asyncio.run(scenario())
    assert refusal.code is ErrorCode.INVALID_CONFIG
    assert "--model-path test/higgs-tts" in refusal.message
