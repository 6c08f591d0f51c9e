"""Replicas of a process group in the Plan: declaration, GPU accounting, output, and run-time rescaling."""

import json
from dataclasses import replace

import pytest

from stagevisor.models.registry import builtin_models
from stagevisor.supervisor.cli import main
from stagevisor.supervisor.errors import ConfigError, ErrorCode, PlacementError, StagevisorError
from stagevisor.supervisor.placement.options import parse_replica_options
from stagevisor.supervisor.placement.planner import rescale
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement
from tests.unit.placement.configs import PIPELINE_WITH_TP


def error_of(*args, **kwargs) -> StagevisorError:
    with pytest.raises(StagevisorError) as caught:
        plan_placement(PlacementRequest(*args, **kwargs))
    return caught.value


def write(tmp_path, text, name="c.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# --- replica count 1 changes nothing ---------------------------------------------


@pytest.mark.parametrize("model", [d.key for d in builtin_models()])
def test_one_replica_everywhere_is_the_plan_of_today(model):
    processes = sorted({g.name for g in plan_placement(PlacementRequest(model, None)).groups})
    same = plan_placement(PlacementRequest(model, None, process_replicas=[f"{p}=1" for p in processes]))
    assert same == plan_placement(PlacementRequest(model, None))
    assert all("replicas" not in g for g in same.to_json()["groups"])


# --- declaration -----------------------------------------------------------------


def test_cli_replicas_run_that_many_named_workers_of_one_group():
    plan = plan_placement(PlacementRequest(None, None, ["vocoder"], process_replicas=["vocoder=3"]))
    vocoder = plan.group("vocoder")
    assert vocoder.replicas == 3 and vocoder.stages == ("vocoder",)
    assert [w.name for w in plan.workers()] == ["pipeline", "vocoder/0", "vocoder/1", "vocoder/2"]
    assert [w.replica for w in vocoder.workers()] == [0, 1, 2]
    assert plan.group("pipeline").workers()[0].replica is None


def test_replication_never_splits_an_edge():
    single = plan_placement(PlacementRequest(None, None, ["vocoder"]))
    replicated = plan_placement(PlacementRequest(None, None, ["vocoder"], process_replicas=["pipeline=2", "vocoder=3"]))
    assert replicated.edges == single.edges
    assert [(g.name, g.stages) for g in replicated.groups] == [(g.name, g.stages) for g in single.groups]


SMALL_GPU_PIPELINE = """\
pipeline:
  name: small
  stages:
    - {name: front, process: front, factory: "m:f", next: vocoder}
    - {name: vocoder, process: vocoder, factory: "m:f", gpu: 0,
       runtime: {resources: {total_gpu_memory_fraction: 0.2}}}
processes:
  vocoder: {replicas: 3, gpus: [1, 0]}
"""


def test_yaml_processes_spread_replicas_round_robin_from_the_declared_gpu(tmp_path):
    plan = plan_placement(PlacementRequest(None, write(tmp_path, SMALL_GPU_PIPELINE)))
    assert [(w.name, w.gpu) for w in plan.group("vocoder").workers()] == [
        ("vocoder/0", 0),
        ("vocoder/1", 1),
        ("vocoder/2", 0),
    ]
    assert {b.id: (b.groups, b.total_gpu_memory_fraction) for b in plan.gpus} == {
        0: (("vocoder/0", "vocoder/2"), 0.4),
        1: (("vocoder/1",), 0.2),
    }


def test_the_cli_count_overrides_the_yaml_count_and_keeps_its_gpus(tmp_path):
    config = write(
        tmp_path,
        "model_path: higgs-tts\nplacement: {max_total_gpu_memory_fraction_per_gpu: 1.0}\n"
        "processes:\n  vocoder: {replicas: 4, gpus: [0, 1]}\n",
    )
    plan = plan_placement(PlacementRequest(None, config, process_replicas=["vocoder=2"]))
    assert [(w.name, w.gpu) for w in plan.group("vocoder").workers()] == [("vocoder/0", 0), ("vocoder/1", 1)]
    assert {b.id: b.total_gpu_memory_fraction for b in plan.gpus} == {0: 0.98, 1: 0.1}


# --- GPU accounting ---------------------------------------------------------------


def test_each_replica_counts_its_fraction_against_its_gpu():
    # higgs: 0.03 + 0.85 + 0.10 = 0.98; a second vocoder replica on GPU 0 makes 1.08.
    error = error_of("higgs-tts", None, process_replicas=["vocoder=2"])
    assert error.code is ErrorCode.OVER_LIMIT and error.gpu == 0
    assert "vocoder 0.1 x 2 replicas" in error.message and "1.08" in error.message


def test_replicas_spread_over_two_gpus_fit_where_one_gpu_would_not(tmp_path):
    config = write(tmp_path, "model_path: higgs-tts\nprocesses:\n  vocoder: {replicas: 2, gpus: [0, 1]}\n")
    plan = plan_placement(PlacementRequest(None, config))
    assert {b.id: (b.groups, b.total_gpu_memory_fraction) for b in plan.gpus} == {
        0: (("tts_frontend", "pipeline", "vocoder/0"), 0.98),
        1: (("vocoder/1",), 0.1),
    }


def test_replicas_sharing_a_gpu_need_a_fraction():
    # Fish Audio S2 Pro declares no fractions: one process may have GPU 0 to itself, two may not.
    error = error_of("fishaudio/s2-pro", None, process_replicas=["pipeline=2"])
    assert error.code is ErrorCode.MISSING_FRACTION and error.gpu == 0
    assert "'pipeline/0', 'pipeline/1'" in error.message


def test_cpu_replicas_need_no_fraction():
    plan = plan_placement(PlacementRequest(None, None, process_replicas=["pipeline=2"]))
    assert plan.gpus == () and plan.group("pipeline").replicas == 2


def test_a_tensor_parallel_group_cannot_be_replicated(tmp_path):
    config = write(tmp_path, PIPELINE_WITH_TP)
    for name in ("engine", "engine_tp1"):
        error = error_of(None, config, process_replicas=[f"{name}=2"])
        assert error.code is ErrorCode.TP_STAGE and list(error.stages) == ["engine"]


def test_a_processes_entry_that_only_pins_a_tp_stage_to_a_node_is_not_replication(tmp_path):
    config = write(tmp_path, PIPELINE_WITH_TP + "processes:\n  engine: {node: tts-a}\n")
    assert [g.replicas for g in plan_placement(PlacementRequest(None, config)).groups if g.tp_size > 1] == [1, 1]
    config = write(tmp_path, PIPELINE_WITH_TP + "processes:\n  engine: {node: tts-a, replicas: 2}\n")
    assert error_of(None, config).code is ErrorCode.TP_STAGE


def test_an_unknown_process_names_the_groups_there_are():
    error = error_of(None, None, process_replicas=["vocoder=2"])
    assert error.code is ErrorCode.MISSING_PROCESS
    assert "'pipeline'" in error.message and "--isolate-stage" in error.message


def test_replica_names_apply_after_placement_options():
    assert (
        plan_placement(PlacementRequest(None, None, ["vocoder"], process_replicas=["vocoder=2"]))
        .group("vocoder")
        .replicas
        == 2
    )


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("processes:\n  pipeline: {replicas: 0}\n", "from 1 to 64"),
        ("processes:\n  pipeline: {replicas: true}\n", "must be an integer"),
        ("processes:\n  pipeline: {replicas: 2, gpus: []}\n", "non-empty list"),
        ("processes:\n  pipeline: {replicas: 2, gpus: [0, 0]}\n", "twice"),
        ("processes:\n  pipeline: {replica: 2}\n", "replica"),
        ("processes: [pipeline]\n", "mapping"),
    ],
)
def test_bad_processes_entries_are_config_errors(tmp_path, text, fragment):
    error = error_of(None, write(tmp_path, text))
    assert isinstance(error, ConfigError) and error.code is ErrorCode.INVALID_CONFIG
    assert fragment in error.message


def test_gpus_for_a_cpu_group_or_without_its_gpu_are_refused(tmp_path):
    cpu = error_of(None, write(tmp_path, "processes:\n  pipeline: {replicas: 2, gpus: [0]}\n"))
    assert cpu.code is ErrorCode.INVALID_CONFIG and "runs on CPU" in cpu.message
    other = error_of(None, write(tmp_path, "model_path: higgs-tts\nprocesses:\n  vocoder: {replicas: 2, gpus: [1]}\n"))
    assert other.code is ErrorCode.INVALID_CONFIG and "must include GPU 0" in other.message


@pytest.mark.parametrize(
    "raw, code",
    [
        ("vocoder", ErrorCode.MALFORMED_ASSIGNMENT),
        ("vocoder=", ErrorCode.MALFORMED_ASSIGNMENT),
        ("vocoder=two", ErrorCode.MALFORMED_ASSIGNMENT),
        ("vocoder=0", ErrorCode.MALFORMED_ASSIGNMENT),
        ("vocoder=65", ErrorCode.MALFORMED_ASSIGNMENT),
        ("voc/oder=2", ErrorCode.MALFORMED_ASSIGNMENT),
    ],
)
def test_malformed_replica_options(raw, code):
    with pytest.raises(PlacementError) as caught:
        parse_replica_options([raw])
    assert caught.value.code is code and "--process-replicas" in caught.value.message


def test_a_process_given_replicas_twice_is_a_duplicate():
    with pytest.raises(PlacementError) as caught:
        parse_replica_options(["vocoder=2", "vocoder=3"])
    assert caught.value.code is ErrorCode.DUPLICATE_ASSIGNMENT


def test_a_replica_duplicate_names_every_option_whatever_the_typing_order():
    """It named the first two in typing order and said only 'name it once'."""
    messages = set()
    for order in (["vocoder=4", "vocoder=2", "vocoder=3"], ["vocoder=3", "vocoder=4", "vocoder=2"]):
        with pytest.raises(PlacementError) as caught:
            parse_replica_options(order)
        messages.add(caught.value.message)
    assert messages == {
        "process 'vocoder' is given replicas 3 times, by --process-replicas 'vocoder=2', --process-replicas "
        "'vocoder=3', --process-replicas 'vocoder=4'; keep the one with the count you want and drop the others (e.g. "
        "keep --process-replicas 'vocoder=2' and drop --process-replicas 'vocoder=3', --process-replicas "
        "'vocoder=4'), so that each process is named once in --process-replicas"
    }


# --- output ------------------------------------------------------------------------


def test_plan_json_shows_replicas_and_where_each_goes(capsys, tmp_path):
    config = write(tmp_path, "model_path: higgs-tts\nprocesses:\n  vocoder: {replicas: 2, gpus: [0, 1]}\n")
    assert main(["plan", "--config", config, "--format", "json"]) == 0
    body = json.loads(capsys.readouterr().out)
    vocoder = next(g for g in body["groups"] if g["name"] == "vocoder")
    assert vocoder["replicas"] == 2 and vocoder["replica_gpus"] == [0, 1]
    assert [g["groups"] for g in body["gpus"]] == [["tts_frontend", "pipeline", "vocoder/0"], ["vocoder/1"]]


def test_plan_table_shows_replicas_on_the_group_line(capsys, tmp_path):
    config = write(tmp_path, "model_path: higgs-tts\nprocesses:\n  vocoder: {replicas: 2, gpus: [0, 1]}\n")
    assert main(["plan", "--config", config]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "vocoder      : vocoder  [2 replicas: vocoder/0 gpu 0, vocoder/1 gpu 1]"
    assert lines[4:] == [
        "GPU 0: 0.98 of limit 1 (tts_frontend 0.03, pipeline 0.85, vocoder/0 0.1)",
        "GPU 1: 0.1 of limit 1 (vocoder/1 0.1)",
    ]


def test_a_replica_option_error_follows_the_error_contract(capsys):
    assert main(["plan", "--process-replicas", "pipeline=lots", "--format", "json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "MALFORMED_ASSIGNMENT"


# --- rescale (stagevisor scale) ----------------------------------------------------


def test_rescale_up_and_down_matches_planning_with_that_count(tmp_path):
    config = write(tmp_path, SMALL_GPU_PIPELINE)
    base = plan_placement(PlacementRequest(None, config))
    for count in (1, 2, 4):
        planned = plan_placement(PlacementRequest(None, config, process_replicas=[f"vocoder={count}"]))
        # `changed` says what the plan's options did to the declaration; a scale keeps the running plan's.
        assert rescale(base, "vocoder", count) == replace(planned, changed=base.changed)
    assert [w.gpu for w in rescale(base, "vocoder", 4).group("vocoder").workers()] == [0, 1, 0, 1]
    # A group scaled down to one worker still spreads over its declared GPUs when scaled up again.
    assert [w.gpu for w in rescale(rescale(base, "vocoder", 1), "vocoder", 2).group("vocoder").workers()] == [0, 1]


def test_a_scale_of_a_group_the_daemon_does_not_run_names_its_groups_without_the_plans_hint():
    """Before: it ended "(names apply after --isolate-stage and --stage-process)", advice for a plan to be made,
    not for the groups a daemon runs; --process-replicas keeps it."""
    base = plan_placement(PlacementRequest("demo", None))
    missing = pytest.raises(PlacementError, rescale, base, "nosuch", 2).value
    assert missing.code is ErrorCode.MISSING_PROCESS
    assert missing.message == "scale nosuch=2: there is no process group named 'nosuch'; process groups: 'pipeline'"
    planned = pytest.raises(
        PlacementError, plan_placement, PlacementRequest("demo", None, process_replicas=["nosuch=2"])
    ).value
    assert planned.message.endswith("(names apply after --isolate-stage and --stage-process)")


def test_rescale_refuses_what_plan_refuses():
    base = plan_placement(PlacementRequest("higgs-tts", None))
    over = pytest.raises(PlacementError, rescale, base, "vocoder", 2).value
    assert over.code is ErrorCode.OVER_LIMIT and over.gpu == 0
    missing = pytest.raises(
        PlacementError, rescale, plan_placement(PlacementRequest("fishaudio/s2-pro", None)), "pipeline", 2
    ).value
    assert missing.code is ErrorCode.MISSING_FRACTION
    unknown = pytest.raises(PlacementError, rescale, base, "nope", 2).value
    assert unknown.code is ErrorCode.MISSING_PROCESS
    zero = pytest.raises(PlacementError, rescale, base, "vocoder", 0).value
    assert zero.code is ErrorCode.MALFORMED_ASSIGNMENT


def test_rescale_a_tensor_parallel_rank_is_refused(tmp_path):
    base = plan_placement(PlacementRequest(None, write(tmp_path, PIPELINE_WITH_TP)))
    assert pytest.raises(PlacementError, rescale, base, "engine_tp0", 2).value.code is ErrorCode.TP_STAGE


def test_rescale_refuses_an_autoscaled_group_a_count_outside_its_bounds(tmp_path):
    """`scale vocoder=4` on a group autoscaled 1-2 said "scaled 1 -> 4", and the autoscaler took it back to 2
    within a second; a count within the bounds is still a scale like any other."""
    config = write(
        tmp_path,
        "model_path: demo\nstages:\n  - {name: vocoder, process: vocoder}\n"
        "processes:\n  vocoder:\n    autoscale: {min_replicas: 2, max_replicas: 3}\n",
    )
    base = plan_placement(PlacementRequest(None, config))
    assert base.group("vocoder").replicas == 2
    for count in (1, 4):
        error = pytest.raises(PlacementError, rescale, base, "vocoder", count).value
        assert error.code is ErrorCode.OUTSIDE_AUTOSCALE_BOUNDS
        assert f"scale vocoder={count}: group 'vocoder' is autoscaled between 2 and 3 replicas" in error.message
        assert "stagevisor apply" in error.message
    assert [rescale(base, "vocoder", n).group("vocoder").replicas for n in (2, 3)] == [2, 3]  # both bounds included
    assert rescale(base, "pipeline", 2).group("pipeline").replicas == 2  # a group without autoscale


def test_a_replica_option_that_changes_a_count_makes_the_plan_changed():
    """DESIGN: `changed` is false only when no option was given or every option was a no-op; it read false for
    `--process-replicas preprocessing=2`, which plans two workers."""
    asked = ["preprocessing=2"]
    assert plan_placement(PlacementRequest("fishaudio-s2-pro", None, process_replicas=asked)).changed is True
    kept = ["preprocessing=1"]
    assert plan_placement(PlacementRequest("fishaudio-s2-pro", None, process_replicas=kept)).changed is False


def test_a_replica_option_that_repeats_the_configs_count_is_a_no_op(tmp_path):
    config = write(tmp_path, SMALL_GPU_PIPELINE)  # vocoder: 3 replicas
    assert plan_placement(PlacementRequest(None, config, process_replicas=["vocoder=3"])).changed is False
    assert plan_placement(PlacementRequest(None, config, process_replicas=["vocoder=2"])).changed is True


def test_a_plain_group_named_as_a_tp_stages_ranks_share_is_replicated_as_itself(tmp_path):
    """The vocoder placed in a process named `engine` (the TP engine's ranks run as engine_tp0 and engine_tp1):
    `--process-replicas engine=2` was refused as TP_STAGE blaming the engine, and the group could not be
    replicated at all."""
    config = write(tmp_path, PIPELINE_WITH_TP)
    plan = plan_placement(PlacementRequest(None, config, [], ["vocoder=engine"], ["engine=2"]))
    assert [(g.name, g.stages, g.replicas) for g in plan.groups] == [
        ("front", ("preprocessing",), 1),
        ("engine_tp0", ("engine",), 1),
        ("engine_tp1", ("engine",), 1),
        ("engine", ("vocoder",), 2),
    ]
    refused = pytest.raises(PlacementError, plan_placement, PlacementRequest(None, config, [], [], ["engine=2"])).value
    assert refused.code is ErrorCode.TP_STAGE and refused.stages == ("engine",)


def test_replicas_sharing_a_gpu_without_fractions_are_not_called_a_split():
    """The advice said "the model recommends no values for this split" where nothing was split."""
    error = pytest.raises(
        PlacementError,
        plan_placement,
        PlacementRequest("fishaudio-s2-pro", None, process_replicas=["pipeline=2"]),
    ).value
    assert error.code is ErrorCode.MISSING_FRACTION
    assert "split" not in error.message.replace("no split shares this GPU", "")
    assert error.message.endswith(
        "(no split shares this GPU, replicas do: each replica counts its stages' fractions, so choose values "
        "that fit them all, from a measurement)."
    )
