"""The planner's rules: option parsing, isolating around TP stages, recommendation conflicts and warnings,
error messages, and the Plan's rounded totals and model path.
"""

from __future__ import annotations

from dataclasses import replace

import dataclasses
import itertools
import textwrap

import pytest

from stagevisor.supervisor.config import PipelineConfig
from stagevisor.supervisor.errors import ErrorCode, StagevisorError
from stagevisor.supervisor.placement.options import apply_assignments, parse_assignments, parse_replica_options
from stagevisor.supervisor.placement.planner import plan_pipeline, rescale
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement


def chain(*stages, safe=(), resources=(), name="custom"):
    """A pipeline whose stages each hand off to the next one."""
    stages = [dict(s) for s in stages]
    for stage, following in itertools.pairwise(stages):
        stage.setdefault("next", [following["name"]])
    return PipelineConfig.model_validate(
        {
            "name": name,
            "stages": stages,
            "process_safe_edges": [list(e) for e in safe],
            "process_edge_resources": [{"edge": list(e), "fractions": f} for e, f in resources],
        }
    )


def on_gpu(name, process, fraction=None, gpu=0, **extra):
    stage = {"name": name, "process": process, "gpu": gpu, **extra}
    if fraction is not None:
        stage["runtime"] = {"resources": {"total_gpu_memory_fraction": fraction}}
    return stage


def error_of(call) -> StagevisorError:
    with pytest.raises(StagevisorError) as caught:
        call()
    return caught.value


CPU_CHAIN = chain(
    {"name": "s1", "process": "p1"},
    {"name": "s2", "process": "p2"},
    {"name": "s3", "process": "p3"},
    safe=[("s1", "s2"), ("s2", "s3")],
)


# --- options ---------------------------------------------------------------------


def test_parsed_assignments_are_immutable_values():
    (assignment,) = parse_assignments(["vocoder"], [])
    with pytest.raises(dataclasses.FrozenInstanceError):
        assignment.process = "elsewhere"
    assert assignment == parse_assignments(["vocoder"], [])[0]
    assert len({assignment, parse_assignments(["vocoder"], [])[0]}) == 1


def test_isolate_stage_with_a_process_name_points_to_stage_process():
    error = error_of(lambda: parse_assignments(["vocoder=voc"], []))
    assert error.code is ErrorCode.MALFORMED_ASSIGNMENT
    assert "--stage-process STAGE=GROUP" in error.message


# --- isolating a stage that is already alone ----------------------------------------


def test_isolating_a_lone_stage_renames_its_process_when_another_stage_moves_into_it():
    plan = plan_pipeline(CPU_CHAIN, isolate_stages=["s2"], stage_processes=["s3=p2"])
    assert [(g.name, g.stages) for g in plan.groups] == [("p1", ("s1",)), ("s2", ("s2",)), ("p2", ("s3",))]


def test_placing_a_lone_stage_in_a_process_of_its_own_name_is_the_same_no_op_as_isolating_it():
    """`--isolate-stage X` is shorthand for `--stage-process X=X`: the long form renamed the declared process (and
    made `changed` true), so a `--process-replicas` naming the declared process then failed."""
    replicas = parse_replica_options(["p2=2"])
    isolated = plan_pipeline(CPU_CHAIN, isolate_stages=["s2"], replicas=replicas)
    long_form = plan_pipeline(CPU_CHAIN, stage_processes=["s2=s2"], replicas=replicas)
    assert long_form.groups == isolated.groups and long_form.changed is isolated.changed is True  # the replicas
    assert plan_pipeline(CPU_CHAIN, stage_processes=["s2=s2"]).changed is False


def test_isolating_a_lone_stage_while_another_stage_is_placed_in_the_process_it_names_is_a_collision():
    """`--isolate-stage s2` claims a process `s2` of its own; s3 placed there made s2 keep its declared process and
    s3 take the name, so `--process-replicas s2=2` would have replicated s3."""
    with pytest.raises(StagevisorError) as caught:
        plan_pipeline(CPU_CHAIN, isolate_stages=["s2"], stage_processes=["s3=s2"])
    assert caught.value.code is ErrorCode.NAME_COLLISION
    assert "--isolate-stage 's2' would put 's2' in process 's2', which also holds 's3'" in caught.value.message
    grouped = plan_pipeline(CPU_CHAIN, stage_processes=["s2=s2", "s3=s2"])  # the long form may group
    assert [(g.name, g.stages) for g in grouped.groups] == [("p1", ("s1",)), ("s2", ("s2", "s3"))]


def test_a_tp_stage_sharing_a_lone_stages_process_name_does_not_make_its_isolation_a_change():
    declared = chain(
        {"name": "front", "process": "engine"},
        on_gpu("engine", "engine", 0.8, gpu=[0, 1], tp_size=2),
        safe=[("front", "engine")],
    )
    plan = plan_pipeline(declared, isolate_stages=["front"])
    assert plan.changed is False
    assert [g.name for g in plan.groups] == ["engine", "engine_tp0", "engine_tp1"]


def test_moving_a_stage_leaves_the_declaration_unshared():
    placed = apply_assignments(CPU_CHAIN, parse_assignments([], ["s3=p2"]))
    assert placed.stage("s3").process == "p2"
    placed.stage("s3").args["added"] = 1
    assert CPU_CHAIN.stage("s3").args == {}


# --- recommendations ------------------------------------------------------------


def test_two_splits_recommending_the_same_fraction_do_not_conflict():
    declared = chain(
        on_gpu("a", "p"),
        on_gpu("b", "p"),
        on_gpu("c", "p"),
        safe=[("a", "b"), ("b", "c")],
        resources=[(("a", "b"), {"a": 0.2, "b": 0.3}), (("b", "c"), {"b": 0.3, "c": 0.2})],
    )
    plan = plan_pipeline(declared, isolate_stages=["a", "c"])
    assert (plan.stage("b").total_gpu_memory_fraction, plan.stage("b").fraction_source) == (0.3, "recommended")


# a, b and c share GPU 0 in one process; isolating b splits both edges. The split of a -> b
# recommends 0.5 for c, the split of b -> c 0.3: the larger recommendation is the one to warn about.
RECOMMENDING = chain(
    on_gpu("a", "p", 0.1),
    on_gpu("b", "p", 0.1),
    on_gpu("c", "p", 0.2),
    safe=[("a", "b"), ("b", "c")],
    resources=[(("a", "b"), {"c": 0.5}), (("b", "c"), {"c": 0.3})],
)


def test_an_explicit_fraction_is_warned_about_against_the_largest_recommendation():
    plan = plan_pipeline(RECOMMENDING, isolate_stages=["b"])
    (warning,) = [w for w in plan.warnings if "'c'" in w]
    assert "below the 0.5 the model recommends when" in warning
    assert "0.3" not in warning


def test_an_explicit_fraction_equal_to_the_recommendation_is_not_warned_about():
    declared = chain(
        on_gpu("a", "p", 0.1),
        on_gpu("b", "p", 0.1),
        on_gpu("c", "p", 0.5),
        safe=[("a", "b"), ("b", "c")],
        resources=[(("a", "b"), {"c": 0.5})],
    )
    plan = plan_pipeline(declared, isolate_stages=["b"])
    assert plan.stage("c").total_gpu_memory_fraction == 0.5
    assert plan.warnings == ()


def test_a_declared_crossing_of_a_safe_edge_is_not_warned_about():
    plan = plan_pipeline(CPU_CHAIN)
    assert all(e.cross_process for e in plan.edges)
    assert plan.warnings == ()


# --- unsafe edges -----------------------------------------------------------------


def test_an_unsafe_split_names_both_stages_to_keep_together_and_no_other_edge():
    declared = chain(
        {"name": "s1", "process": "p"},
        {"name": "s2", "process": "p"},
        {"name": "s3", "process": "p"},
        safe=[("s2", "s3")],
    )
    error = error_of(lambda: plan_pipeline(declared, isolate_stages=["s1"]))
    assert error.code is ErrorCode.UNSAFE_EDGE
    assert error.message.endswith(
        "the pipeline does not list this handoff in process_safe_edges. Keep 's1' and 's2' in the same process, or, "
        "if the handoff carries only data another process can read, list [s1, s2] under pipeline.process_safe_edges."
    )
    assert "also unsafe" not in error.message


def test_every_further_unsafe_edge_is_listed_after_the_first():
    declared = chain({"name": "s1", "process": "p"}, {"name": "s2", "process": "p"}, {"name": "s3", "process": "p"})
    error = error_of(lambda: plan_pipeline(declared, isolate_stages=["s2"]))
    assert error.edge == ("s1", "s2")
    assert "(also unsafe: 's2' -> 's3')" in error.message
    # every stage the unsafe handoffs chain together, not just the first edge's two (which would split the next)
    assert "Keep 's1', 's2' and 's3' in the same process" in error.message


def test_an_unsafe_edge_to_a_tensor_parallel_stage_says_it_cannot_share_a_process():
    """The advice was to keep the two stages in one process, which a TP stage's ranks never share."""
    declared = chain(
        {"name": "front", "process": "p"},
        {"name": "engine", "process": "p", "gpu": [0, 1], "tp_size": 2},
        safe=[],
    )
    model = chain({"name": "front", "process": "p"}, {"name": "engine", "process": "p"})  # the model's own
    error = error_of(lambda: plan_pipeline(declared, baseline=model))
    assert error.code is ErrorCode.UNSAFE_EDGE
    assert error.message.endswith(
        "'engine' is tensor-parallel (tp_size 2): its ranks run in processes of their own, so no stage shares one "
        "with it; run 'engine' with tp_size 1 to keep 'front' and 'engine' in one process."
    )


# --- the Plan's numbers -----------------------------------------------------------


def test_a_single_gpu_written_as_a_list_is_planned_as_that_gpu_id():
    plan = plan_pipeline(chain(on_gpu("a", "p", gpu=[1])))
    assert plan.stage("a").gpu == 1
    assert plan.stage("a").to_json()["gpu"] == 1


def test_group_and_gpu_totals_are_sums_to_the_digits_written_without_binary_rounding():
    declared = chain(
        on_gpu("a", "p", 0.1234564),
        on_gpu("b", "p", 0.0000002),
        {"name": "c", "process": "p"},
        on_gpu("d", "q", 0.3),
        {"name": "e", "process": "cpu"},
        safe=[("c", "d"), ("d", "e")],
    )
    plan = plan_pipeline(declared)
    assert [(g.name, g.total_gpu_memory_fraction) for g in plan.groups] == [
        ("p", 0.1234566),
        ("q", 0.3),
        ("cpu", None),
    ]
    assert [(b.id, b.total_gpu_memory_fraction) for b in plan.gpus] == [(0, 0.4234566)]


def test_the_plan_carries_the_model_path_from_the_option_or_else_from_the_config(tmp_path):
    assert plan_placement(PlacementRequest("higgs-tts", None)).model_path == "higgs-tts"
    config = tmp_path / "cfg.yaml"
    config.write_text(
        textwrap.dedent("""\
        model_path: bosonai/higgs-tts-3-4b
        """)
    )
    plan = plan_placement(PlacementRequest(None, str(config)))
    assert (plan.model, plan.model_path) == ("higgs-tts", "bosonai/higgs-tts-3-4b")


@pytest.mark.parametrize("option", ["vocoder=", "vocoder= "])
def test_a_stage_process_option_without_a_process_is_malformed_with_an_example(option):
    error = error_of(lambda: parse_assignments([], [option]))
    assert error.code is ErrorCode.MALFORMED_ASSIGNMENT
    assert "is malformed; write STAGE=GROUP" in error.message


def test_a_structure_error_from_a_yaml_override_names_the_config_file(tmp_path):
    config = tmp_path / "cfg.yaml"
    config.write_text("model_path: higgs-tts\nstages:\n  - {name: vocoder, gpu: [0, 1]}\n")
    error = error_of(lambda: plan_placement(PlacementRequest(None, str(config))))
    assert error.message.startswith(f"{config}:3:21: stage 'vocoder' lists GPUs [0, 1] but tp_size is 1")


AUDAR_ENGINE_FRACTION = """\
model_path: audar-tts
stages:
  - name: tts_engine
    runtime: {resources: {total_gpu_memory_fraction: 0.5}}
"""
"""Audar-TTS (no recommended fractions) with its engine's fraction declared, the rest of its GPU stages without."""


def missing_fraction_in(tmp_path, text: str, isolate: tuple[str, ...] = ()) -> StagevisorError:
    config = tmp_path / "cfg.yaml"
    config.write_text(textwrap.dedent(text))
    error = error_of(lambda: plan_placement(PlacementRequest(None, str(config), isolate_stages=list(isolate))))
    assert error.code is ErrorCode.MISSING_FRACTION, error.message
    return error


def test_a_missing_fraction_from_a_models_stage_moved_in_the_file_is_located_at_its_process_entry(tmp_path):
    """The file's `process: vocoder` split the shared GPU: the error leads with that entry, as other config errors
    lead with theirs, not with no location at all."""
    error = missing_fraction_in(tmp_path, AUDAR_ENGINE_FRACTION + "  - name: vocoder\n    process: vocoder\n")
    assert error.message.startswith(f"{tmp_path / 'cfg.yaml'}:6:5: GPU 0 is shared by processes"), error.message
    assert (error.location.line, error.location.column) == (6, 5)


def test_a_missing_fraction_in_a_pipeline_declared_in_full_is_located_at_the_second_processs_entry(tmp_path):
    error = missing_fraction_in(
        tmp_path,
        """\
        pipeline:
          name: p
          stages:
            - {name: a, factory: 'm:f', gpu: 0, process: one, next: [b]}
            - {name: b, factory: 'm:f', gpu: 0, process: two}
          process_safe_edges: [[a, b]]
        """,
    )
    assert error.message.startswith(f"{tmp_path / 'cfg.yaml'}:5:41: GPU 0 is shared"), error.message


def test_a_missing_fraction_from_a_placement_option_has_no_location_in_the_file(tmp_path):
    """--isolate-stage split the GPU, not the file: no entry of it is to blame."""
    error = missing_fraction_in(tmp_path, AUDAR_ENGINE_FRACTION, isolate=("vocoder",))
    assert error.location is None and error.message.startswith("GPU 0 is shared"), error.message


def test_conflicting_recommendations_for_a_tp_stage_name_its_first_shared_gpu():
    declared = chain(
        {"name": "x", "process": "p"},
        {"name": "y", "process": "p"},
        on_gpu("w", "p", 0.1),
        on_gpu("engine", "engine", gpu=[0, 1], tp_size=2),
        on_gpu("voc", "q", 0.1, gpu=1),
        safe=[("x", "y"), ("y", "w"), ("w", "engine"), ("engine", "voc")],
        resources=[(("x", "y"), {"engine": 0.5}), (("y", "w"), {"engine": 0.6})],
    )
    error = error_of(lambda: plan_pipeline(declared, isolate_stages=["y"]))
    assert (error.code, error.gpu) == (ErrorCode.CONFLICTING_RECOMMENDATION, 0)
    assert "shares GPU 0 after placement" in error.message


# --- replica options and rescaling -------------------------------------------------


@pytest.mark.parametrize("raw", ["=2", " =2", "vocoder=", "vocoder= "])
def test_a_replica_option_missing_either_side_is_malformed_with_the_form_to_write(raw):
    error = error_of(lambda: parse_replica_options([raw]))
    assert error.code is ErrorCode.MALFORMED_ASSIGNMENT
    assert "is malformed; write GROUP=N" in error.message


@pytest.mark.parametrize("count", ["²", "١", "+2", "2_0", "two"])
def test_a_replica_count_that_is_not_ascii_digits_is_malformed_naming_the_range(count):
    error = error_of(lambda: parse_replica_options([f"vocoder={count}"]))
    assert error.code is ErrorCode.MALFORMED_ASSIGNMENT
    assert f"--process-replicas 'vocoder={count}': replicas must be an integer from 1 to" in error.message


def small_gpu_config(tmp_path, fraction: float, extra: str = "") -> str:
    path = tmp_path / "small.yaml"
    path.write_text(
        textwrap.dedent(f"""\
        pipeline:
          name: small
          stages:
            - {{name: front, process: front, factory: "m:f", next: vocoder}}
            - {{name: vocoder, process: vocoder, factory: "m:f", gpu: 0,
               runtime: {{resources: {{total_gpu_memory_fraction: {fraction}}}}}}}
        """)
        + extra
    )
    return str(path)


def test_rescale_checks_the_plan_s_own_placement_limit(tmp_path):
    config = small_gpu_config(tmp_path, 0.2, "placement: {max_total_gpu_memory_fraction_per_gpu: 0.5}\n")
    base = plan_placement(PlacementRequest(None, config))
    assert rescale(base, "vocoder", 2).gpus[0].total_gpu_memory_fraction == pytest.approx(0.4)
    error = error_of(lambda: rescale(base, "vocoder", 3))
    assert (error.code, error.gpu) == (ErrorCode.OVER_LIMIT, 0)
    assert "placement limit 0.5" in error.message
    assert (
        error_of(lambda: plan_placement(PlacementRequest(None, config, process_replicas=["vocoder=3"]))).code
        is ErrorCode.OVER_LIMIT
    )


def test_rescale_rounds_gpu_totals_as_planning_does(tmp_path):
    config = small_gpu_config(tmp_path, 0.1234567)
    rescaled = rescale(plan_placement(PlacementRequest(None, config)), "vocoder", 2)
    planned = plan_placement(PlacementRequest(None, config, process_replicas=["vocoder=2"]))
    assert rescaled == replace(planned, changed=False)  # a scale keeps the running plan's `changed`
    assert rescaled.gpus[0].total_gpu_memory_fraction == 0.2469134


def autoscaled(tmp_path, bounds: str, *replica_options: str, before: str = ""):
    path = tmp_path / "autoscale.yaml"
    path.write_text(f"model_path: demo\nprocesses:\n{before}  vocoder:\n    autoscale: {bounds}\n")
    return plan_placement(PlacementRequest(None, str(path), ["vocoder"], [], list(replica_options))).group("vocoder")


@pytest.mark.parametrize("replicas", [2, 3])
def test_a_replica_count_on_either_autoscale_bound_is_kept(tmp_path, replicas):
    group = autoscaled(tmp_path, "{min_replicas: 2, max_replicas: 3}", f"vocoder={replicas}")
    assert group.replicas == replicas and group.autoscale.min_replicas == 2


def test_a_replica_count_below_the_autoscale_minimum_is_refused(tmp_path):
    with pytest.raises(StagevisorError, match=r"given 2 replicas, outside the autoscale bounds \[3, 4\]"):
        autoscaled(tmp_path, "{min_replicas: 3, max_replicas: 4}", "vocoder=2")


def test_a_process_without_autoscale_listed_first_does_not_stop_the_next_one_s(tmp_path):
    group = autoscaled(tmp_path, "{min_replicas: 2, max_replicas: 3}", before="  pipeline:\n    replicas: 1\n")
    assert group.replicas == 2 and group.autoscale.max_replicas == 3
