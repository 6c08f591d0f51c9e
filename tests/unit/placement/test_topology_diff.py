"""The diff between two plans of one model, and the GPU budget a live switch needs (placement/diff.py)."""

import pytest

from stagevisor.supervisor.errors import ErrorCode, PlacementError
from stagevisor.supervisor.placement.diff import TopologyDiff, check_restart_surge, check_switch_budget, topology_diff
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement


def build_plan(model, config=None, isolate=(), stage_process=(), replicas=()):
    return plan_placement(PlacementRequest(model, config, tuple(isolate), tuple(stage_process), tuple(replicas)))


def test_the_same_plan_is_no_change():
    plan = build_plan("demo", None)
    diff = topology_diff(plan, plan)
    assert not diff.changed and diff.moved == () and diff.merged == () and diff.split == ()
    assert diff.render().startswith("no change")


def test_isolating_a_stage_splits_its_group_and_adds_one():
    diff = topology_diff(build_plan("demo", None), build_plan("demo", None, ["vocoder"]))
    kinds = {g.name: g.kind for g in diff.groups}
    assert kinds == {"pipeline": "changed", "vocoder": "added"}
    assert diff.moved == (("vocoder", "pipeline", "vocoder"),)
    assert diff.split == (("pipeline", ("pipeline", "vocoder")),) and diff.merged == ()
    assert diff.to_json()["moved"] == [{"stage": "vocoder", "from": "pipeline", "to": "vocoder"}]


def test_going_back_merges_and_removes():
    diff = topology_diff(build_plan("demo", None, ["vocoder"]), build_plan("demo", None))
    assert {g.name: g.kind for g in diff.groups} == {"pipeline": "changed", "vocoder": "removed"}
    assert diff.merged == (("pipeline", ("pipeline", "vocoder")),)
    assert diff.render().splitlines()[1] == "- vocoder: stages vocoder"


def test_replicas_and_fractions_are_details_of_a_changed_group():
    before = build_plan("fishaudio/s2-pro", None, ["vocoder"])
    after = build_plan("fishaudio/s2-pro", None, ["vocoder"], [], ["preprocessing=2"])
    change = next(g for g in topology_diff(before, after).groups if g.name == "preprocessing")
    assert change.kind == "changed" and change.details == ("replicas 1 -> 2",)
    fractions = topology_diff(build_plan("fishaudio/s2-pro", None), before)
    pipeline = next(g for g in fractions.groups if g.name == "pipeline")
    assert "fraction none -> 0.85" in pipeline.details


def test_a_switch_that_fits_both_topologies_passes():
    check_switch_budget(build_plan("demo", None), build_plan("demo", None, ["vocoder"]))  # CPU: no GPU budget
    small = build_plan("higgs-tts", None)  # 0.98 on GPU 0
    with pytest.raises(PlacementError) as caught:
        check_switch_budget(small, small)
    assert caught.value.code is ErrorCode.OVER_LIMIT and caught.value.gpu == 0
    assert "0.98 running now + 0.98 for the new topology" in caught.value.message


def test_a_switch_on_a_gpu_whose_running_process_declares_no_fraction_is_refused_as_unknown():
    """Fish Audio's engine and vocoder share GPU 0 in one process without fractions (alone there, it needs none):
    during a switch the new topology's workers share that GPU with it, so any apply there is MISSING_FRACTION,
    whatever the new topology declares, never a total that counts the undeclared process as 0."""
    declared = build_plan("fishaudio/s2-pro", None)
    isolated = build_plan("fishaudio/s2-pro", None, ["vocoder"])  # 0.85 + 0.10 recommended
    with pytest.raises(PlacementError) as caught:
        check_switch_budget(declared, isolated)
    assert caught.value.code is ErrorCode.MISSING_FRACTION and caught.value.gpu == 0
    assert caught.value.stages == ("tts_engine", "vocoder")
    assert "(running: 'tts_engine' and 'vocoder')" in caught.value.message
    with pytest.raises(PlacementError) as back:
        check_switch_budget(isolated, declared)
    assert back.value.code is ErrorCode.MISSING_FRACTION and "(new: 'tts_engine' and 'vocoder')" in back.value.message
    replicas = build_plan("fishaudio/s2-pro", None, [], [], ["preprocessing=2"])  # a CPU change: GPU 0 all the same
    with pytest.raises(PlacementError):
        check_switch_budget(declared, replicas)


def test_the_json_form_reads_back_to_the_same_diff():
    diff = topology_diff(build_plan("higgs-tts"), build_plan("higgs-tts", None, [], ["audio_encoder=pipeline"]))
    assert diff.merged and diff.split
    assert TopologyDiff.from_json(diff.to_json()) == diff


def test_a_new_factory_for_a_stage_is_a_change_of_its_group(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model_path: demo\nstages:\n  - name: vocoder\n    args: {extra: 1}\n")
    diff = topology_diff(build_plan("demo"), build_plan(None, str(config)))
    assert diff.changed and diff.groups[0].details == ("stage vocoder args",)


def test_a_restart_beside_the_worker_needs_room_for_a_second_copy_of_its_group_on_its_gpu(tmp_path):
    check_restart_surge(build_plan("demo"), "pipeline")  # CPU: no GPU budget
    full = build_plan("higgs-tts")  # 0.98 on GPU 0
    with pytest.raises(PlacementError) as caught:
        check_restart_surge(full, "vocoder")
    assert caught.value.code is ErrorCode.OVER_LIMIT and caught.value.gpu == 0
    assert "1.08 (0.98 running now + 0.1 for the new worker), over its limit 1" in caught.value.message
    assert caught.value.message.endswith(
        "`stagevisor restart vocoder --force` stops the worker first (its requests in flight fail)"
    )
    config = tmp_path / "c.yaml"
    config.write_text(
        "model_path: higgs-tts\nstages:\n  - name: vocoder\n"
        "    runtime: {resources: {total_gpu_memory_fraction: 0.05}}\n"
    )
    check_restart_surge(build_plan(None, str(config)), "vocoder")  # 0.93 + 0.05


def test_a_restart_beside_a_gpu_worker_without_fractions_is_refused_as_unknown():
    with pytest.raises(PlacementError) as caught:
        check_restart_surge(build_plan("qwen3-tts"), "pipeline")
    assert caught.value.code is ErrorCode.MISSING_FRACTION and caught.value.gpu == 0
    assert caught.value.stages == ("tts_engine", "vocoder")
