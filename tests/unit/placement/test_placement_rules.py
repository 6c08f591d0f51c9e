"""Placement rules on pipelines built in the test: TP, GPU accounting, recommendations, YAML splits."""

import dataclasses
import itertools
import textwrap

import pytest

from stagevisor.supervisor.config import PipelineConfig, PlacementConfig
from stagevisor.supervisor.errors import ErrorCode, StagevisorError
from stagevisor.supervisor.placement.planner import plan_pipeline
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement
from stagevisor.supervisor.placement.groups import layout_groups
from stagevisor.supervisor.placement.wording import fraction_text


def pipeline(*stages, safe=(), resources=(), aliases=None, name="custom"):
    """A chain of stages: each dict gets `next` to the following one unless it sets its own."""
    stages = [dict(s) for s in stages]
    for stage, following in itertools.pairwise(stages):
        stage.setdefault("next", [following["name"]])
    return PipelineConfig.model_validate(
        {
            "name": name,
            "stages": stages,
            "process_safe_edges": [list(e) for e in safe],
            "process_edge_resources": [{"edge": list(e), "fractions": f} for e, f in resources],
            "role_aliases": aliases or {},
        }
    )


def error_of(call) -> StagevisorError:
    with pytest.raises(StagevisorError) as caught:
        call()
    return caught.value


def write(tmp_path, text: str) -> str:
    path = tmp_path / "cfg.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


TP = pipeline(
    {"name": "front", "process": "pipeline"},
    {
        "name": "engine",
        "gpu": [0, 1],
        "tp_size": 2,
        "process": "engine",
        "runtime": {"resources": {"total_gpu_memory_fraction": 0.8}},
    },
    {"name": "vocoder", "process": "pipeline", "gpu": 0, "runtime": {"resources": {"total_gpu_memory_fraction": 0.1}}},
    safe=[("front", "engine"), ("engine", "vocoder")],
)


# --- tensor parallelism ------------------------------------------------------


def test_tp_stage_runs_one_process_per_rank_named_with_the_rank():
    plan = plan_pipeline(TP)
    ranks = [g for g in plan.groups if g.stages == ("engine",)]
    assert [(g.name, g.tp_rank, g.tp_size, g.gpu) for g in ranks] == [("engine_tp0", 0, 2, 0), ("engine_tp1", 1, 2, 1)]
    assert plan.stage("engine").gpu == (0, 1)


def test_tp_rank_groups_follow_group_order_by_first_stage():
    assert [g.name for g in plan_pipeline(TP).groups] == ["pipeline", "engine_tp0", "engine_tp1"]


def test_tp_stage_without_process_is_named_after_the_stage():
    tp = TP.model_copy(
        update={"stages": tuple(s.model_copy(update={"process": None}) if s.name == "engine" else s for s in TP.stages)}
    )
    assert [g.name for g in plan_pipeline(tp).groups][1:] == ["engine_tp0", "engine_tp1"]


def test_each_gpu_counts_every_rank_on_it():
    gpus = {g.id: (g.total_gpu_memory_fraction, g.groups) for g in plan_pipeline(TP).gpus}
    assert gpus == {0: (0.9, ("pipeline", "engine_tp0")), 1: (0.8, ("engine_tp1",))}


def test_a_tp_stage_cannot_be_moved():
    error = error_of(lambda: plan_pipeline(TP, stage_processes=["engine=elsewhere"]))
    assert (error.code, error.stages) == (ErrorCode.TP_STAGE, ("engine",))


@pytest.mark.parametrize("isolate, assign", [(["engine"], []), ([], ["engine=engine"])])
def test_isolating_a_tp_stage_is_the_spec_no_op_its_ranks_already_run_alone(isolate, assign):
    """The spec: requesting a stage the model already runs alone is an idempotent no-op; a TP stage's ranks share
    no process, and `--isolate-stage engine` was refused as TP_STAGE."""
    plan = plan_pipeline(TP, isolate_stages=isolate, stage_processes=assign)
    assert plan == plan_pipeline(TP) and plan.changed is False


def test_a_process_named_like_a_tp_rank_is_a_name_collision():
    error = error_of(lambda: plan_pipeline(TP, stage_processes=["front=engine_tp1"]))
    assert error.code is ErrorCode.NAME_COLLISION
    assert "collides with the process of rank 1 of TP stage 'engine'" in error.message


def test_tp_size_must_match_the_gpu_list():
    bad = pipeline({"name": "engine", "gpu": [0], "tp_size": 2, "process": "p"})
    assert error_of(lambda: plan_pipeline(bad)).code is ErrorCode.INVALID_CONFIG


# --- structure -----------------------------------------------------------


def test_stage_without_process_in_a_full_pipeline_is_missing_process():
    bad = pipeline({"name": "a", "process": "p"}, {"name": "b"})
    error = error_of(lambda: plan_pipeline(bad))
    assert (error.code, error.stages) == (ErrorCode.MISSING_PROCESS, ("b",))


def test_fan_in_is_rejected():
    bad = pipeline(
        {"name": "a", "process": "p", "next": ["c"]},
        {"name": "b", "process": "p", "next": ["c"]},
        {"name": "c", "process": "p"},
    )
    error = error_of(lambda: plan_pipeline(bad))
    assert error.code is ErrorCode.INVALID_CONFIG and "two upstream" in error.message


def test_fan_out_is_accepted():
    tree = pipeline(
        {"name": "a", "process": "p", "next": ["b", "c"]},
        {"name": "b", "process": "p", "next": []},
        {"name": "c", "process": "p"},
    )
    assert [e.dst for e in plan_pipeline(tree).edges] == ["b", "c"]


def test_a_cycle_is_rejected():
    bad = pipeline({"name": "a", "process": "p", "next": ["b"]}, {"name": "b", "process": "p", "next": ["a"]})
    assert "cycle" in error_of(lambda: plan_pipeline(bad)).message


def test_next_naming_an_unknown_stage_is_rejected():
    bad = pipeline({"name": "a", "process": "p", "next": ["ghost"]})
    assert "'ghost'" in error_of(lambda: plan_pipeline(bad)).message


def test_stream_to_must_also_be_a_next_link():
    bad = pipeline({"name": "a", "process": "p", "next": [], "stream_to": ["b"]}, {"name": "b", "process": "p"})
    error = error_of(lambda: plan_pipeline(bad))
    assert error.code is ErrorCode.INVALID_CONFIG and "next" in error.message


def test_duplicate_stage_names_are_rejected():
    bad = pipeline({"name": "a", "process": "p", "next": []}, {"name": "a", "process": "p"})
    assert "twice" in error_of(lambda: plan_pipeline(bad)).message


def test_process_safe_edge_that_is_not_a_link_is_rejected():
    bad = pipeline({"name": "a", "process": "p"}, {"name": "b", "process": "p"}, safe=[("b", "a")])
    assert error_of(lambda: plan_pipeline(bad)).code is ErrorCode.INVALID_CONFIG


# --- GPU accounting ------------------------------------------------------------


def test_a_process_group_spanning_two_gpus_is_rejected():
    bad = pipeline({"name": "a", "process": "p", "gpu": 0}, {"name": "b", "process": "p", "gpu": 1}, safe=[("a", "b")])
    error = error_of(lambda: plan_pipeline(bad))
    assert (error.code, error.stages) == (ErrorCode.GROUP_SPANS_GPUS, ("a", "b"))


def test_grouping_stages_from_two_gpus_via_the_cli_is_rejected():
    ok = pipeline({"name": "a", "process": "p", "gpu": 0}, {"name": "b", "process": "q", "gpu": 1}, safe=[("a", "b")])
    assert error_of(lambda: plan_pipeline(ok, stage_processes=["b=p"])).code is ErrorCode.GROUP_SPANS_GPUS


def test_a_cpu_stage_does_not_make_its_group_use_a_gpu():
    plan = plan_pipeline(
        pipeline({"name": "a", "process": "p"}, {"name": "b", "process": "q", "gpu": 0}, safe=[("a", "b")])
    )
    assert [(g.name, g.gpu) for g in plan.groups] == [("p", None), ("q", 0)]


def test_one_process_alone_on_a_gpu_needs_no_fractions():
    plan = plan_pipeline(
        pipeline({"name": "a", "process": "p", "gpu": 0}, {"name": "b", "process": "q", "gpu": 1}, safe=[("a", "b")])
    )
    assert [g.total_gpu_memory_fraction for g in plan.gpus] == [None, None]  # nothing declared: null, not a share of 0


def fractions_pipeline(a, b, c):
    return pipeline(
        *(
            {
                "name": n,
                "process": "p" if n != "c" else "q",
                "gpu": 0,
                "runtime": {"resources": {"total_gpu_memory_fraction": f}},
            }
            for n, f in (("a", a), ("b", b), ("c", c))
        ),
        safe=[("a", "b"), ("b", "c")],
    )


def test_fractions_summing_to_the_limit_fit_despite_rounding():
    assert 0.34 + 0.56 + 0.10 > 1.0  # inexact in binary: the case the tolerance exists for
    plan = plan_pipeline(fractions_pipeline(0.34, 0.56, 0.10))
    assert plan.gpus[0].total_gpu_memory_fraction == pytest.approx(1.0)


def test_fractions_over_the_limit_by_more_than_rounding_are_rejected():
    error = error_of(lambda: plan_pipeline(fractions_pipeline(0.34, 0.56, 0.100000002)))
    assert (error.code, error.gpu) == (ErrorCode.OVER_LIMIT, 0)


def test_a_gpu_over_its_limit_is_rejected_naming_the_gpu():
    error = error_of(lambda: plan_pipeline(fractions_pipeline(0.10, 0.85, 0.10)))
    assert (error.code, error.gpu, error.stages) == (ErrorCode.OVER_LIMIT, 0, ("a", "b", "c"))
    assert "1.05" in error.message


def test_the_placement_limit_is_configurable():
    placement = PlacementConfig(max_total_gpu_memory_fraction_per_gpu=0.9)
    error = error_of(lambda: plan_pipeline(fractions_pipeline(0.05, 0.80, 0.10), placement=placement))
    assert error.code is ErrorCode.OVER_LIMIT


def test_a_declared_same_gpu_topology_without_fractions_is_rejected():
    declared = pipeline(
        {"name": "a", "process": "p", "gpu": 0}, {"name": "b", "process": "q", "gpu": 0}, safe=[("a", "b")]
    )
    error = error_of(lambda: plan_pipeline(declared))
    assert (error.code, error.stages) == (ErrorCode.MISSING_FRACTION, ("a", "b"))


def test_a_declared_split_of_an_edge_not_marked_safe_is_its_own_baseline_but_warned():
    plan = plan_pipeline(pipeline({"name": "a", "process": "p"}, {"name": "b", "process": "q"}))
    assert plan.edges[0].cross_process and not plan.edges[0].process_safe
    assert any("process_safe_edges" in w for w in plan.warnings)


# --- recommendations -----------------------------------------------------------


REC = pipeline(
    {"name": "a", "process": "p", "gpu": 0},
    {"name": "b", "process": "p", "gpu": 0, "runtime": {"resources": {"total_gpu_memory_fraction": 0.5}}},
    {"name": "c", "process": "p", "gpu": 0, "runtime": {"resources": {"total_gpu_memory_fraction": 0.2}}},
    safe=[("a", "b"), ("b", "c")],
    resources=[(("a", "b"), {"a": 0.1, "b": 0.6}), (("b", "c"), {"b": 0.7, "c": 0.2})],
)


def test_an_explicit_fraction_is_preserved_and_warned_when_below_the_recommendation():
    plan = plan_pipeline(REC, isolate_stages=["a"])
    assert plan.stage("b").total_gpu_memory_fraction == 0.5
    assert plan.stage("b").fraction_source == "declared"
    assert plan.stage("a").fraction_source == "recommended"
    assert any("'b'" in w and "0.6" in w for w in plan.warnings)


# Like REC, but `b` declares no fraction: two splits recommend two values for it.
CONFLICT = pipeline(
    {"name": "a", "process": "p", "gpu": 0},
    {"name": "b", "process": "p", "gpu": 0},
    {"name": "c", "process": "p", "gpu": 0},
    safe=[("a", "b"), ("b", "c")],
    resources=[(("a", "b"), {"a": 0.2, "b": 0.5}), (("b", "c"), {"b": 0.6, "c": 0.2})],
)


def test_conflicting_recommendations_for_one_stage_are_rejected():
    error = error_of(lambda: plan_pipeline(CONFLICT, isolate_stages=["a", "c"]))
    assert (error.code, error.stages) == (ErrorCode.CONFLICTING_RECOMMENDATION, ("b",))
    assert "0.5" in error.message and "0.6" in error.message and "GPU 0" in error.message
    assert error.to_json()["error"]["edge"] == ["b", "c"]  # DESIGN: `edge` where one applies


def test_a_missing_fraction_with_no_recommendation_is_said_beside_the_ones_for_other_stages():
    """The advice listed only the a/b recommendation, as if it covered 'c', which has none."""
    error = error_of(lambda: plan_pipeline(CONFLICT, isolate_stages=["a"]))
    assert (error.code, error.stages) == (ErrorCode.MISSING_FRACTION, ("c",))
    assert error.message.endswith(
        "(the pipeline recommends a 0.2, b 0.5 for 'a' -> 'b'; none for 'c', so choose from a measurement)."
    )


def test_a_recommendation_for_an_edge_is_no_leave_to_split_it():
    """The spec: a recommendation is not a capability. An edge with recommended fractions but not listed as
    process-safe stays unsafe."""
    unsafe = pipeline(
        {"name": "a", "process": "p", "gpu": 0},
        {"name": "b", "process": "p", "gpu": 0},
        safe=[],
        resources=[(("a", "b"), {"a": 0.2, "b": 0.5})],
    )
    error = error_of(lambda: plan_pipeline(unsafe, isolate_stages=["b"]))
    assert (error.code, error.edge) == (ErrorCode.UNSAFE_EDGE, ("a", "b"))


def test_two_recommendations_for_a_stage_with_an_explicit_fraction_do_not_conflict():
    plan = plan_pipeline(REC, isolate_stages=["a", "c"])
    assert plan.stage("b").total_gpu_memory_fraction == 0.5
    assert plan.stage("b").fraction_source == "declared"
    assert any("'b'" in w and "0.7" in w for w in plan.warnings)


def test_two_recommendations_for_cpu_stages_do_not_conflict():
    cpu = pipeline(
        {"name": "a", "process": "p"},
        {"name": "b", "process": "p"},
        {"name": "c", "process": "p"},
        safe=[("a", "b"), ("b", "c")],
        resources=[(("a", "b"), {"a": 0.2, "b": 0.5}), (("b", "c"), {"b": 0.6, "c": 0.2})],
    )
    plan = plan_pipeline(cpu, isolate_stages=["a", "c"])
    assert [g.stages for g in plan.groups] == [("a",), ("b",), ("c",)]
    assert all(s.total_gpu_memory_fraction is None for s in plan.stages)


def test_missing_fraction_names_the_recommended_values_when_the_model_has_them(tmp_path):
    # The YAML splits the vocoder without fractions: recommendations apply only to CLI options.
    config = write(tmp_path, "model_path: fishaudio/s2-pro\nstages:\n  - {name: vocoder, process: vocoder}\n")
    error = error_of(lambda: plan_placement(PlacementRequest(None, config)))
    assert error.code is ErrorCode.MISSING_FRACTION
    assert "tts_engine 0.85, vocoder 0.1" in error.message


# --- YAML against the built-in baseline --------------------------------------------


def test_a_yaml_split_is_judged_against_the_models_built_in_topology(tmp_path):
    config = write(tmp_path, "model_path: qwen3-tts\nstages:\n  - {name: preprocessing, process: pre}\n")
    error = error_of(lambda: plan_placement(PlacementRequest(None, config)))
    assert (error.code, error.edge) == (ErrorCode.UNSAFE_EDGE, ("preprocessing", "tts_engine"))


def test_a_yaml_isolation_with_fractions_then_the_same_cli_option_is_a_no_op(tmp_path):
    config = write(
        tmp_path,
        """
        model_path: fishaudio/s2-pro
        stages:
          - {name: tts_engine, runtime: {resources: {total_gpu_memory_fraction: 0.8}}}
          - {name: vocoder, process: vocoder, runtime: {resources: {total_gpu_memory_fraction: 0.15}}}
        """,
    )
    plan = plan_placement(PlacementRequest(None, config, isolate_stages=["vocoder"]))
    assert plan.changed is False
    assert plan.stage("tts_engine").total_gpu_memory_fraction == 0.8


def test_a_cli_option_brings_no_recommendation_to_an_edge_the_yaml_split(tmp_path):
    # The YAML splits tts_engine -> vocoder without fractions; the option only renames the
    # preprocessing process, so it newly splits nothing and no recommendation applies.
    config = write(tmp_path, "model_path: fishaudio/s2-pro\nstages:\n  - {name: vocoder, process: vocoder}\n")
    request = PlacementRequest(None, config, stage_processes=["preprocessing=front"])
    error = error_of(lambda: plan_placement(request))
    assert (error.code, error.stages) == (ErrorCode.MISSING_FRACTION, ("tts_engine", "vocoder"))


def test_cli_model_path_and_a_config_naming_another_model_conflict(tmp_path):
    config = write(tmp_path, "model_path: qwen3-tts\n")
    assert error_of(lambda: plan_placement(PlacementRequest("zonos2", config))).code is ErrorCode.INVALID_CONFIG


def test_cli_model_path_and_a_config_naming_the_same_model_agree(tmp_path):
    config = write(tmp_path, "model_path: Qwen/Qwen3-TTS-12Hz-0.6B-Base\n")
    assert plan_placement(PlacementRequest("qwen3-tts", config)).model == "qwen3-tts"


def test_a_full_pipeline_uses_its_own_aliases_and_safe_edges(tmp_path):
    config = write(
        tmp_path,
        """
        pipeline:
          name: mine
          stages:
            - {name: front, process: pipeline, next: engine}
            - {name: engine, process: pipeline, next: decoder, stream_to: decoder}
            - {name: decoder, process: pipeline}
          process_safe_edges: [[engine, decoder]]
          role_aliases: {vocoder: decoder}
        """,
    )
    plan = plan_placement(PlacementRequest(None, config, isolate_stages=["vocoder"]))
    assert (plan.model, plan.group_of("decoder").name) == ("mine", "vocoder")
    error = error_of(lambda: plan_placement(PlacementRequest(None, config, isolate_stages=["front"])))
    assert error.code is ErrorCode.UNSAFE_EDGE


def test_a_full_pipeline_with_a_model_path_is_rejected(tmp_path):
    config = write(tmp_path, "pipeline:\n  name: x\n  stages: [{name: a, process: p}]\n")
    assert error_of(lambda: plan_placement(PlacementRequest("demo", config))).code is ErrorCode.INVALID_CONFIG


def test_a_gpu_list_without_matching_tp_size_asks_for_tp_size(tmp_path):
    config = write(tmp_path, "model_path: qwen3-tts\nstages:\n  - {name: tts_engine, gpu: [0, 1]}\n")
    error = error_of(lambda: plan_placement(PlacementRequest(None, config)))
    assert error.code is ErrorCode.INVALID_CONFIG and "tp_size: 2" in error.message


def test_a_yaml_can_make_a_builtin_stage_tensor_parallel(tmp_path):
    config = write(tmp_path, "model_path: demo\nstages:\n  - {name: tts_engine, gpu: [0, 1], tp_size: 2}\n")
    plan = plan_placement(PlacementRequest(None, config))
    assert [(g.name, g.stages, g.gpu) for g in plan.groups] == [
        ("pipeline", ("preprocessing", "vocoder"), None),
        ("pipeline_tp0", ("tts_engine",), 0),
        ("pipeline_tp1", ("tts_engine",), 1),
    ]


def test_a_full_pipeline_with_a_stage_unreachable_from_the_first_is_rejected():
    disconnected = pipeline({"name": "a", "process": "p", "next": []}, {"name": "b", "process": "q"})
    error = error_of(lambda: plan_pipeline(disconnected))
    assert (error.code, error.stages) == (ErrorCode.INVALID_CONFIG, ("b",))
    assert "not reachable from the first stage 'a'" in error.message


def test_a_full_pipeline_whose_first_stage_has_an_upstream_is_rejected():
    backwards = pipeline({"name": "a", "process": "p", "next": []}, {"name": "b", "process": "p", "next": ["a"]})
    error = error_of(lambda: plan_pipeline(backwards))
    assert (error.code, error.stages) == (ErrorCode.INVALID_CONFIG, ("b",))


def test_a_role_alias_pointing_to_an_unknown_stage_is_rejected():
    aliased = pipeline({"name": "a", "process": "p"}, {"name": "b", "process": "p"}, aliases={"vocoder": "c"})
    error = error_of(lambda: plan_pipeline(aliased))
    assert (error.code, error.stages) == (ErrorCode.INVALID_CONFIG, ("c",))
    assert "role alias 'vocoder'" in error.message


def test_a_literal_stage_name_wins_over_a_role_alias_that_collides_with_it():
    # `vocoder` is both a stage and an alias for `decoder`: --isolate-stage vocoder moves the stage.
    colliding = pipeline(
        {"name": "a", "process": "p"},
        {"name": "vocoder", "process": "p"},
        {"name": "decoder", "process": "p"},
        safe=[("a", "vocoder"), ("vocoder", "decoder")],
        aliases={"vocoder": "decoder"},
    )
    plan = plan_pipeline(colliding, isolate_stages=["vocoder"])
    assert [(g.name, g.stages) for g in plan.groups] == [("p", ("a", "decoder")), ("vocoder", ("vocoder",))]


def test_recommendations_apply_only_to_stages_on_a_gpu_shared_after_placement():
    # Splitting a -> b recommends values for all four stages, but only a and b
    # end up on a shared GPU: the CPU stage and the stage alone on GPU 1 get none.
    mixed = pipeline(
        {"name": "pre", "process": "p"},
        {"name": "a", "process": "p", "gpu": 0},
        {"name": "b", "process": "p", "gpu": 0},
        {"name": "c", "process": "q", "gpu": 1},
        safe=[("pre", "a"), ("a", "b"), ("b", "c")],
        resources=[(("a", "b"), {"pre": 0.1, "a": 0.3, "b": 0.6, "c": 0.2})],
    )
    plan = plan_pipeline(mixed, isolate_stages=["b"])
    assert {s.name: (s.total_gpu_memory_fraction, s.fraction_source) for s in plan.stages} == {
        "pre": (None, None),
        "a": (0.3, "recommended"),
        "b": (0.6, "recommended"),
        "c": (None, None),
    }


def test_an_edge_with_no_recommendation_is_still_splittable_when_the_config_declares_fractions(tmp_path):
    config = write(
        tmp_path,
        """
        model_path: audar-tts
        stages:
          - {name: reference_encoder, runtime: {resources: {total_gpu_memory_fraction: 0.05}}}
          - {name: tts_engine, runtime: {resources: {total_gpu_memory_fraction: 0.8}}}
          - {name: vocoder, runtime: {resources: {total_gpu_memory_fraction: 0.1}}}
        """,
    )
    plan = plan_placement(PlacementRequest(None, config, isolate_stages=["vocoder"]))
    assert plan.group_of("vocoder").name == "vocoder"
    assert [s.fraction_source for s in plan.stages] == [None, "declared", "declared", "declared"]
    assert plan.gpus[0].total_gpu_memory_fraction == 0.95


# --- rules that only the mutation run showed untested ------------------------------


def test_recommended_fractions_for_an_edge_that_is_not_a_next_link_are_rejected():
    bad = pipeline(
        {"name": "a", "process": "p"},
        {"name": "b", "process": "p"},
        {"name": "c", "process": "p"},
        resources=[(("a", "c"), {"a": 0.1, "c": 0.2})],
    )
    error = error_of(lambda: plan_pipeline(bad))
    assert (error.code, error.edge) == (ErrorCode.INVALID_CONFIG, ("a", "c"))
    assert "process_edge_resources names 'a' -> 'c', which is not a `next` link" in error.message


def test_two_recommendation_entries_for_one_edge_are_rejected_naming_the_second():
    """Both were taken: a split then reported a conflict between the edge's own two recommendations."""
    bad = pipeline(
        {"name": "a", "process": "p"},
        {"name": "b", "process": "p"},
        resources=[(("a", "b"), {"a": 0.5}), (("a", "b"), {"a": 0.6})],
    )
    error = error_of(lambda: plan_pipeline(bad))
    assert (error.code, error.edge) == (ErrorCode.INVALID_CONFIG, ("a", "b"))
    assert "process_edge_resources describes 'a' -> 'b' twice (entries 0 and 1)" in error.message


def test_recommended_fractions_for_an_unknown_stage_are_rejected():
    bad = pipeline(
        {"name": "a", "process": "p"}, {"name": "b", "process": "p"}, resources=[(("a", "b"), {"a": 0.1, "ghost": 0.2})]
    )
    error = error_of(lambda: plan_pipeline(bad))
    assert (error.code, error.stages) == (ErrorCode.INVALID_CONFIG, ("ghost",))


def test_one_unreachable_stage_is_named_in_the_singular_and_several_in_the_plural():
    one = pipeline({"name": "a", "process": "p", "next": []}, {"name": "b", "process": "p"})
    assert "stage 'b' is not reachable" in error_of(lambda: plan_pipeline(one)).message
    two = pipeline(
        {"name": "a", "process": "p", "next": []}, {"name": "b", "process": "p"}, {"name": "c", "process": "p"}
    )
    assert "stages 'b', 'c' are not reachable" in error_of(lambda: plan_pipeline(two)).message


def test_a_gpu_shared_without_fractions_is_found_after_a_gpu_that_is_in_order():
    """GPU 0 is shared with every fraction declared, GPU 1 is shared without: the check must go on to GPU 1."""
    declared = pipeline(
        {"name": "a", "process": "p", "gpu": 0, "runtime": {"resources": {"total_gpu_memory_fraction": 0.4}}},
        {"name": "b", "process": "q", "gpu": 0, "runtime": {"resources": {"total_gpu_memory_fraction": 0.4}}},
        {"name": "c", "process": "r", "gpu": 1},
        {"name": "d", "process": "s", "gpu": 1},
        safe=[("a", "b"), ("b", "c"), ("c", "d")],
    )
    error = error_of(lambda: plan_pipeline(declared))
    assert (error.code, error.gpu, error.stages) == (ErrorCode.MISSING_FRACTION, 1, ("c", "d"))


def test_missing_fraction_advice_names_recommendations_touching_that_gpu_only():
    """The a -> b recommendation concerns GPU 0 through `c` (named in its fractions, not on the edge);
    the d -> f recommendation is about GPU 1 only and must not be offered for GPU 0."""
    declared = pipeline(
        {"name": "a", "process": "p"},
        {"name": "b", "process": "q"},
        {"name": "c", "process": "r", "gpu": 0},
        {"name": "e", "process": "t", "gpu": 0},
        {"name": "d", "process": "s", "gpu": 1},
        {"name": "f", "process": "u", "gpu": 1},
        safe=[("a", "b"), ("b", "c"), ("c", "e"), ("e", "d"), ("d", "f")],
        resources=[(("a", "b"), {"c": 0.3}), (("d", "f"), {"d": 0.5, "f": 0.4})],
    )
    error = error_of(lambda: plan_pipeline(declared))
    assert (error.code, error.gpu) == (ErrorCode.MISSING_FRACTION, 0)
    assert "the pipeline recommends c 0.3 for 'a' -> 'b'" in error.message
    assert "for 'd' -> 'f'" not in error.message
    # A pipeline declared whole takes its fractions in `pipeline.stages`: a top-level `stages:` beside `pipeline:`
    # is refused ("give either pipeline ... or model_path with stages overrides"), as this advice used to say.
    assert "Declare them on those stages under `pipeline.stages` in the config" in error.message


def test_missing_fraction_advice_for_a_model_says_where_a_config_overrides_its_stages():
    from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement

    error = error_of(lambda: plan_placement(PlacementRequest("zonos2", isolate_stages=("vocoder",))))
    assert error.code is ErrorCode.MISSING_FRACTION
    assert "Declare them under `stages:` in a YAML config passed with --config" in error.message


@pytest.mark.parametrize(
    "limit, advice",
    [
        (1.0, "lower the stages' fractions (the limit is 1 already, the most it may be)"),
        (0.5, "lower the stages' fractions or raise placement.max_total_gpu_memory_fraction_per_gpu (at most 1)"),
    ],
)
def test_over_limit_advice_offers_a_higher_limit_only_below_the_most_it_may_be(limit, advice):
    """At the default limit 1 the advice said to raise it, which the config refuses past 1."""
    from stagevisor.supervisor.config import PlacementConfig

    declared = pipeline(
        {"name": "a", "process": "p", "gpu": 0, "runtime": {"resources": {"total_gpu_memory_fraction": 0.6}}},
        {"name": "b", "process": "q", "gpu": 0, "runtime": {"resources": {"total_gpu_memory_fraction": 0.6}}},
        safe=[("a", "b")],
    )
    error = error_of(
        lambda: plan_pipeline(declared, placement=PlacementConfig(max_total_gpu_memory_fraction_per_gpu=limit))
    )
    assert error.code is ErrorCode.OVER_LIMIT and error.message.endswith(advice)


def test_over_limit_marks_recommended_fractions_and_says_where_to_declare_lower_ones(tmp_path):
    """The recommended values are in no config, so "lower the stages' fractions" alone left the operator looking
    for fractions to lower; a recommendation the model makes is marked, and the advice names where to declare."""
    config = write(tmp_path, "model_path: fishaudio-s2-pro\nplacement: {max_total_gpu_memory_fraction_per_gpu: 0.9}\n")
    error = error_of(lambda: plan_placement(PlacementRequest(None, config, ["vocoder"])))
    assert error.code is ErrorCode.OVER_LIMIT
    assert "(tts_engine 0.85 recommended, vocoder 0.1 recommended), over the placement limit 0.9;" in error.message
    assert (
        "(for 'tts_engine', 'vocoder', which take the recommended values, declare lower ones under `stages:` in a "
        "YAML config passed with --config)" in error.message
    )
    declared = pipeline(
        {"name": "a", "process": "p", "gpu": 0, "runtime": {"resources": {"total_gpu_memory_fraction": 0.8}}},
        {"name": "b", "process": "p", "gpu": 0},
        safe=[("a", "b")],
        resources=[(("a", "b"), {"a": 0.7, "b": 0.3})],
    )
    error = error_of(lambda: plan_pipeline(declared, isolate_stages=["b"]))
    assert "(a 0.8, b 0.3 recommended)" in error.message
    assert "(for 'b', which take the recommended values, declare lower ones under `pipeline.stages`" in error.message


def test_a_stream_to_edge_missing_from_next_is_rejected():
    bad = pipeline(
        {"name": "a", "process": "p", "next": ["b"], "stream_to": ["c"]},
        {"name": "b", "process": "p", "next": ["c"]},
        {"name": "c", "process": "p"},
    )
    error = error_of(lambda: plan_pipeline(bad))
    assert (error.code, error.edge) == (ErrorCode.INVALID_CONFIG, ("a", "c"))
    assert "streams to 'c' but does not list it in `next`" in error.message


def test_a_gpu_used_by_one_process_does_not_stop_the_check_of_the_next_gpu():
    declared = pipeline(
        {"name": "a", "process": "p", "gpu": 0},
        {"name": "c", "process": "r", "gpu": 1},
        {"name": "d", "process": "s", "gpu": 1},
        safe=[("a", "c"), ("c", "d")],
    )
    error = error_of(lambda: plan_pipeline(declared))
    assert (error.code, error.gpu, error.stages) == (ErrorCode.MISSING_FRACTION, 1, ("c", "d"))


def test_groups_after_a_tensor_parallel_group_are_laid_out_too():
    plan = plan_pipeline(
        pipeline(
            {"name": "a", "process": "p", "gpu": [0, 1], "tp_size": 2}, {"name": "b", "process": "q"}, safe=[("a", "b")]
        )
    )
    assert [(g.name, g.stages) for g in plan.groups] == [("p_tp0", ("a",)), ("p_tp1", ("a",)), ("q", ("b",))]


def test_a_process_spanning_two_gpus_names_the_second_one():
    spanning = pipeline({"name": "a", "process": "p", "gpu": 0}, {"name": "b", "process": "p", "gpu": 1})
    error = error_of(lambda: plan_pipeline(spanning))
    assert (error.code, error.gpu, error.stages) == (ErrorCode.GROUP_SPANS_GPUS, 1, ("a", "b"))


def test_group_layouts_are_immutable_and_ordinary_groups_have_one_rank():
    groups = layout_groups(pipeline({"name": "a", "process": "p"}, {"name": "b", "process": "q"}, safe=[("a", "b")]))
    assert [(g.name, g.tp_rank, g.tp_size) for g in groups] == [("p", None, 1), ("q", None, 1)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        groups[0].gpu = 3  # type: ignore[misc]


def test_fractions_are_shown_with_every_digit_written_but_no_binary_rounding():
    assert fraction_text(0.34 + 0.56 + 0.10) == "1"
    assert fraction_text(0.1 + 0.2 + 0.7) == "1"
    assert fraction_text(0.12345678) == "0.12345678"
    assert fraction_text(0.7000001) == "0.7000001"
    assert fraction_text(0.0000004) == "4e-07"  # a valid fraction, never shown as 0


def test_a_total_just_over_the_limit_is_shown_over_it_not_rounded_onto_it():
    error = error_of(lambda: plan_pipeline(fractions_pipeline(0.1, 0.2, 0.7000001)))
    assert error.code is ErrorCode.OVER_LIMIT
    assert "total_gpu_memory_fraction 1.0000001 (a 0.1, b 0.2, c 0.7000001), over the placement limit 1;" in (
        error.message
    )


def test_the_plan_reports_totals_to_the_digits_written():
    plan = plan_pipeline(fractions_pipeline(0.1, 0.2, 0.6999999))
    assert 0.1 + 0.2 != 0.3  # the binary rounding the report leaves out
    assert plan.gpus[0].total_gpu_memory_fraction == 0.9999999
    assert [g.total_gpu_memory_fraction for g in plan.groups] == [0.3, 0.6999999]


def test_the_collision_message_names_the_rank_even_when_the_process_name_contains_tp():
    tp = pipeline(
        {"name": "front", "process": "front"},
        {"name": "engine", "process": "my_tpu", "gpu": [0, 1], "tp_size": 2},
        safe=[("front", "engine")],
    )
    error = error_of(lambda: plan_pipeline(tp, stage_processes=["front=my_tpu_tp1"]))
    assert error.code is ErrorCode.NAME_COLLISION
    assert "collides with the process of rank 1 of TP stage 'engine'" in error.message
