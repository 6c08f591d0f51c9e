"""Placement rules of the spec, exercised through plan_placement on the built-in models."""

import pytest

from stagevisor.models.registry import builtin_models, resolve_model
from stagevisor.supervisor.errors import ErrorCode, PlacementError, StagevisorError
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement


def topology(plan):
    return [(g.name, list(g.stages)) for g in plan.groups]


def fractions(plan):
    return {s.name: (s.total_gpu_memory_fraction, s.fraction_source) for s in plan.stages}


def plan_error(model, isolate=(), assign=()) -> StagevisorError:
    with pytest.raises(StagevisorError) as caught:
        plan_placement(PlacementRequest(model, None, isolate, assign))
    return caught.value


HIGGS_TOPOLOGY = [
    ("tts_frontend", ["preprocessing", "audio_encoder"]),
    ("pipeline", ["tts_engine"]),
    ("vocoder", ["vocoder"]),
]


# --- no options and no-ops -------------------------------------------------


@pytest.mark.parametrize("model", [d.key for d in builtin_models()])
def test_omitting_both_options_preserves_the_declared_topology(model):
    plan = plan_placement(PlacementRequest(model, None))
    declared = resolve_model(model).pipeline
    assert plan.changed is False
    assert [(s.name, s.process, s.total_gpu_memory_fraction) for s in plan.stages] == [
        (s.name, s.process, s.fraction) for s in declared.stages
    ]


def test_higgs_stage_process_example_reproduces_the_declared_topology_as_a_no_op():
    plan = plan_placement(
        PlacementRequest(
            "bosonai/higgs-tts-3-4b",
            None,
            stage_processes=["preprocessing=tts_frontend", "audio_encoder=tts_frontend"],
        )
    )
    assert topology(plan) == HIGGS_TOPOLOGY
    assert plan.changed is False
    assert plan == plan_placement(PlacementRequest("bosonai/higgs-tts-3-4b", None))


def test_reisolating_higgs_vocoder_is_a_no_op():
    plan = plan_placement(PlacementRequest("higgs-tts", None, isolate_stages=["vocoder"]))
    assert plan.changed is False
    assert topology(plan) == HIGGS_TOPOLOGY


def test_isolating_a_stage_alone_under_another_name_keeps_its_declared_process_name():
    plan = plan_placement(PlacementRequest("higgs-tts", None, isolate_stages=["tts_engine"]))
    assert plan.changed is False
    assert plan.group_of("tts_engine").name == "pipeline"


def test_no_op_returns_every_declared_fraction_unchanged():
    plan = plan_placement(PlacementRequest("higgs-tts", None, isolate_stages=["vocoder"]))
    assert fractions(plan) == {
        "preprocessing": (None, None),
        "audio_encoder": (0.03, "declared"),
        "tts_engine": (0.85, "declared"),
        "vocoder": (0.10, "declared"),
    }


def test_higgs_frontend_stages_can_be_fully_separated():
    plan = plan_placement(PlacementRequest("higgs-tts", None, isolate_stages=["preprocessing", "audio_encoder"]))
    assert plan.changed is True
    assert [g.stages for g in plan.groups][:2] == [("preprocessing",), ("audio_encoder",)]


def test_higgs_frontend_can_be_regrouped_under_another_process_name():
    plan = plan_placement(
        PlacementRequest("higgs-tts", None, stage_processes=["preprocessing=front", "audio_encoder=front"])
    )
    assert topology(plan)[0] == ("front", ["preprocessing", "audio_encoder"])
    assert plan.changed is True
    assert fractions(plan)["audio_encoder"] == (0.03, "declared")


# --- isolation and grouping -----------------------------------------------


def test_isolate_vocoder_on_fishaudio_applies_the_recommended_fractions():
    plan = plan_placement(PlacementRequest("fishaudio/s2-pro", None, isolate_stages=["vocoder"]))
    assert topology(plan) == [
        ("preprocessing", ["preprocessing"]),
        ("pipeline", ["tts_engine"]),
        ("vocoder", ["vocoder"]),
    ]
    assert fractions(plan)["tts_engine"] == (0.85, "recommended")
    assert fractions(plan)["vocoder"] == (0.10, "recommended")
    assert plan.gpus[0].total_gpu_memory_fraction == 0.95


def test_ming_vocoder_role_isolates_audio_decode_with_its_three_fractions():
    plan = plan_placement(PlacementRequest("ming-omni-tts", None, isolate_stages=["vocoder"]))
    assert topology(plan) == [
        ("pipeline", ["preprocessing", "reference_encode", "tts_engine"]),
        ("vocoder", ["audio_decode"]),
    ]
    assert fractions(plan)["reference_encode"] == (0.08, "recommended")
    assert fractions(plan)["tts_engine"] == (0.72, "recommended")
    assert fractions(plan)["audio_decode"] == (0.12, "recommended")


def test_ming_stage_process_accepts_the_role_alias_too():
    plan = plan_placement(PlacementRequest("ming-omni-tts", None, stage_processes=["vocoder=decoder"]))
    assert plan.group_of("audio_decode").name == "decoder"


def test_moss_local_split_totals_exactly_one_within_rounding():
    plan = plan_placement(PlacementRequest("moss-tts-local", None, isolate_stages=["vocoder"]))
    assert fractions(plan) == {
        "preprocessing": (0.05, "recommended"),
        "tts_engine": (0.90, "declared"),
        "vocoder": (0.05, "recommended"),
    }
    assert plan.gpus[0].total_gpu_memory_fraction == 1.0


@pytest.mark.parametrize("model", ["qwen3-tts", "moss-tts-delay"])
def test_vocoder_isolation_is_supported_with_recommended_fractions(model):
    plan = plan_placement(PlacementRequest(model, None, isolate_stages=["vocoder"]))
    assert fractions(plan)["tts_engine"] == (0.85, "recommended")
    assert fractions(plan)["vocoder"] == (0.10, "recommended")


def test_voxtral_vocoder_isolation_is_supported():
    plan = plan_placement(PlacementRequest("voxtral-tts", None, isolate_stages=["vocoder"]))
    assert fractions(plan)["tts_generation"] == (0.85, "recommended")


def test_repeating_one_process_name_colocates_stages():
    plan = plan_placement(PlacementRequest(None, None, stage_processes=["preprocessing=front", "tts_engine=front"]))
    assert topology(plan) == [("front", ["preprocessing", "tts_engine"]), ("pipeline", ["vocoder"])]


def test_groups_are_ordered_by_their_first_stage():
    plan = plan_placement(
        PlacementRequest("fishaudio-s2-pro", None, stage_processes=["preprocessing=zzz", "vocoder=aaa"])
    )
    assert [g.name for g in plan.groups] == ["zzz", "pipeline", "aaa"]


def test_renaming_a_process_is_honoured_but_applies_no_fraction():
    plan = plan_placement(
        PlacementRequest("qwen3-tts", None, stage_processes=["preprocessing=main", "tts_engine=main", "vocoder=main"])
    )
    assert topology(plan) == [("main", ["preprocessing", "tts_engine", "vocoder"])]
    assert plan.changed is True
    assert fractions(plan)["vocoder"] == (None, None)


def test_demo_stages_split_freely_on_cpu_without_fractions():
    plan = plan_placement(PlacementRequest(None, None, isolate_stages=["preprocessing", "vocoder"]))
    assert len(plan.groups) == 3
    assert plan.gpus == ()


def test_isolate_into_a_process_that_already_holds_another_stage_is_a_name_collision():
    error = plan_error("qwen3-tts", isolate=["vocoder"], assign=["preprocessing=vocoder"])
    assert error.code is ErrorCode.NAME_COLLISION
    assert "--stage-process" in error.message


@pytest.mark.parametrize("order", [["preprocessing", "audio_encoder"], ["audio_encoder", "preprocessing"]])
def test_isolating_both_grouped_stages_names_each_process_after_its_stage_in_any_order(order):
    plan = plan_placement(PlacementRequest("higgs-tts", None, isolate_stages=order))
    assert topology(plan)[:2] == [("preprocessing", ["preprocessing"]), ("audio_encoder", ["audio_encoder"])]


def test_isolate_stage_names_the_process_after_the_stage_when_another_option_empties_its_group():
    # The vocoder shares `pipeline` as declared, so isolating it is `vocoder=vocoder`
    # even though moving tts_engine away would leave it alone in `pipeline`.
    plan = plan_placement(
        PlacementRequest("fishaudio/s2-pro", None, isolate_stages=["vocoder"], stage_processes=["tts_engine=eng"])
    )
    assert plan.group_of("vocoder").name == "vocoder"
    assert plan.group_of("tts_engine").name == "eng"


def test_isolate_stage_matches_the_equivalent_stage_process_option():
    isolated = plan_placement(
        PlacementRequest("fishaudio/s2-pro", None, isolate_stages=["vocoder"], stage_processes=["tts_engine=eng"])
    )
    assigned = plan_placement(
        PlacementRequest("fishaudio/s2-pro", None, stage_processes=["tts_engine=eng", "vocoder=vocoder"])
    )
    assert isolated == assigned


# --- option errors ----------------------------------------------------------


@pytest.mark.parametrize("option", ["vocoder", "vocoder=", "=vocoder", "a=b=c", " = "])
def test_malformed_stage_process_is_rejected(option):
    assert plan_error("qwen3-tts", assign=[option]).code is ErrorCode.MALFORMED_ASSIGNMENT


@pytest.mark.parametrize("process", ["..", "-x", ".x", "_x"])
def test_a_process_name_that_starts_with_punctuation_is_refused_naming_the_rule_it_breaks(process):
    """`vocoder=..` read "use letters, digits, '_', '.', '-'", which '..' does: the rule is also to start with a
    letter or digit, as the YAML's message says."""
    error = plan_error("qwen3-tts", assign=[f"vocoder={process}"])
    assert error.code is ErrorCode.MALFORMED_ASSIGNMENT
    assert error.message.endswith("use letters, digits, '_', '.', '-' and start with a letter or digit")


def test_stage_process_strips_whitespace():
    plan = plan_placement(PlacementRequest("qwen3-tts", None, stage_processes=[" vocoder = voc "]))
    assert plan.group_of("vocoder").name == "voc"


def test_isolate_stage_strips_whitespace_like_its_stage_process_form():
    isolated = plan_placement(PlacementRequest("qwen3-tts", None, isolate_stages=[" vocoder "]))
    assert isolated == plan_placement(PlacementRequest("qwen3-tts", None, stage_processes=[" vocoder = vocoder "]))
    assert isolated.group_of("vocoder").name == "vocoder"


def test_empty_isolate_stage_is_malformed():
    assert plan_error("qwen3-tts", isolate=[" "]).code is ErrorCode.MALFORMED_ASSIGNMENT


def test_unknown_stage_names_the_stages_and_roles():
    error = plan_error("ming-omni-tts", isolate=["decoder"])
    assert error.code is ErrorCode.UNKNOWN_STAGE
    assert "'audio_decode'" in error.message and "vocoder -> audio_decode" in error.message


def test_naming_a_stage_twice_in_one_option_is_a_duplicate():
    error = plan_error("qwen3-tts", isolate=["vocoder", "vocoder"])
    assert error.code is ErrorCode.DUPLICATE_ASSIGNMENT
    assert error.stages == ("vocoder",)


def test_naming_a_stage_in_both_options_is_a_duplicate():
    assert plan_error("qwen3-tts", isolate=["vocoder"], assign=["vocoder=v"]).code is ErrorCode.DUPLICATE_ASSIGNMENT


def test_a_role_and_its_stage_name_resolve_to_one_stage_and_are_a_duplicate():
    error = plan_error("ming-omni-tts", isolate=["vocoder"], assign=["audio_decode=x"])
    assert error.code is ErrorCode.DUPLICATE_ASSIGNMENT
    assert error.stages == ("audio_decode",)


# --- safety --------------------------------------------------------------


@pytest.mark.parametrize("model", ["qwen3-tts", "moss-tts-delay", "moss-tts-local"])
def test_splitting_preprocessing_from_the_engine_is_unsafe(model):
    error = plan_error(model, isolate=["preprocessing"])
    assert error.code is ErrorCode.UNSAFE_EDGE
    assert error.edge == ("preprocessing", "tts_engine")
    assert "'preprocessing' -> 'tts_engine'" in error.message


def test_voxtral_rejects_splitting_preprocessing_from_generation():
    error = plan_error("voxtral-tts", isolate=["preprocessing"])
    assert (error.code, error.edge) == (ErrorCode.UNSAFE_EDGE, ("preprocessing", "tts_generation"))


@pytest.mark.parametrize(
    "stage, edge",
    [
        ("preprocessing", ("preprocessing", "reference_encode")),
        ("reference_encode", ("preprocessing", "reference_encode")),
    ],
)
def test_ming_rejects_splitting_its_front_stages(stage, edge):
    error = plan_error("ming-omni-tts", isolate=[stage])
    assert (error.code, error.edge) == (ErrorCode.UNSAFE_EDGE, edge)


@pytest.mark.parametrize("stage", ["preprocessing", "tts_engine", "vocoder"])
def test_moss_local_split_rejects_every_split(stage):
    error = plan_error("moss-tts-local-split", isolate=[stage])
    assert error.code is ErrorCode.UNSAFE_EDGE
    assert "cuda:1" in error.message


def test_grouping_keeps_a_shared_handoff_local_and_checks_only_the_crossing_edge():
    # preprocessing and reference_encode together: only reference_encode -> tts_engine crosses.
    error = plan_error("ming-omni-tts", assign=["preprocessing=front", "reference_encode=front"])
    assert error.edge == ("reference_encode", "tts_engine")


def test_an_unsafe_edge_is_reported_before_a_missing_fraction():
    # Zonos2-like shared GPU: moss-tts-local-split has no fractions and no safe edges.
    error = plan_error("moss-tts-local-split", isolate=["vocoder"])
    assert error.code is ErrorCode.UNSAFE_EDGE


# --- fractions ---------------------------------------------------------------


@pytest.mark.parametrize(
    "model, stage, missing",
    [
        ("audar-tts", "vocoder", ("reference_encoder", "tts_engine", "vocoder")),
        ("zonos2", "vocoder", ("preprocessing", "speaker_encode", "tts_engine", "vocoder")),
        ("zonos2", "preprocessing", ("preprocessing", "speaker_encode", "tts_engine", "vocoder")),
    ],
)
def test_split_on_a_shared_gpu_without_recommendations_is_missing_fraction(model, stage, missing):
    error = plan_error(model, isolate=[stage])
    assert error.code is ErrorCode.MISSING_FRACTION
    assert error.stages == missing
    assert error.gpu == 0
    assert "total_gpu_memory_fraction" in error.message


def test_audar_preprocessing_on_cpu_splits_without_fractions():
    plan = plan_placement(PlacementRequest("audar-tts", None, isolate_stages=["preprocessing"]))
    assert plan.gpus[0].groups == ("pipeline",)


def test_isolating_fishaudio_preprocessing_already_alone_is_a_no_op():
    plan = plan_placement(PlacementRequest("fishaudio-s2-pro", None, isolate_stages=["preprocessing"]))
    assert plan.changed is False  # already alone in its own process


def test_declared_errors_are_placement_errors():
    assert isinstance(plan_error("zonos2", isolate=["vocoder"]), PlacementError)


def test_plan_does_not_mutate_any_declaration():
    before = {d.key: d.pipeline.model_dump() for d in builtin_models()}
    plan_placement(PlacementRequest("ming-omni-tts", None, isolate_stages=["vocoder"]))
    plan_placement(PlacementRequest("moss-tts-local", None, isolate_stages=["vocoder"]))
    plan_placement(PlacementRequest("higgs-tts", None, stage_processes=["preprocessing=a"]))
    assert {d.key: d.pipeline.model_dump() for d in builtin_models()} == before


def test_plan_stage_args_are_copies_of_the_declaration():
    plan = plan_placement(PlacementRequest("moss-tts-delay", None))
    plan.stage("vocoder").args["stage"] = "changed"
    assert resolve_model("moss-tts-delay").pipeline.stage("vocoder").args["stage"] == "vocoder"


def test_plan_edges_have_one_entry_per_kind_with_crossing_and_safety():
    plan = plan_placement(PlacementRequest("fishaudio-s2-pro", None, isolate_stages=["vocoder"]))
    assert [(e.src, e.dst, e.kind, e.cross_process, e.process_safe) for e in plan.edges] == [
        ("preprocessing", "tts_engine", "next", True, True),
        ("tts_engine", "vocoder", "next", True, True),
        ("tts_engine", "vocoder", "stream_to", True, True),
    ]


def test_plan_stages_carry_factory_args_and_edges():
    stage = plan_placement(PlacementRequest("moss-tts-delay", None)).stage("tts_engine")
    assert (stage.factory, dict(stage.args)) == (
        "stagevisor.stages.standins:make",
        {"model": "moss-tts-delay", "stage": "tts_engine"},
    )
    assert (stage.next, stage.stream_to, stage.gpu) == (("vocoder",), ("vocoder",), 0)


def test_a_duplicate_names_every_option_in_an_order_that_does_not_depend_on_typing_order():
    first = plan_error("qwen3-tts", isolate=["vocoder"], assign=["vocoder=b", "vocoder=a"])
    second = plan_error("qwen3-tts", isolate=["vocoder"], assign=["vocoder=a", "vocoder=b"])
    assert first.message == second.message
    assert first.message.startswith(
        "stage 'vocoder' is placed 3 times by --isolate-stage 'vocoder' (process 'vocoder'), "
        "--stage-process 'vocoder=a' (process 'a'), --stage-process 'vocoder=b' (process 'b'); "
        "they name different processes ('vocoder', 'a' and 'b'): keep the one that names the process you want "
        "and drop the others"
    )


def test_a_duplicate_that_agrees_says_which_option_to_drop():
    error = plan_error("qwen3-tts", isolate=["vocoder"], assign=[" vocoder = vocoder "])
    assert error.code is ErrorCode.DUPLICATE_ASSIGNMENT
    assert "is placed twice by" in error.message
    assert (
        "they all name process 'vocoder': keep --isolate-stage 'vocoder' and drop --stage-process ' vocoder = vocoder '"
        in error.message
    )


def test_a_duplicate_through_a_role_says_which_stage_the_role_is():
    error = plan_error("ming-omni-tts", isolate=["audio_decode"], assign=["vocoder=x"])
    assert "--stage-process 'vocoder=x' (process 'x', role 'vocoder' is stage 'audio_decode')" in error.message


def test_a_gpu_where_no_stage_declares_a_fraction_reports_null_not_zero():
    """`total_gpu_memory_fraction: 0.0` for qwen3-tts's GPU read as a declared share of nothing, where its group
    and stages said null; a GPU where some stage declares one still sums what is declared."""
    from stagevisor.supervisor.commands.plan import render_plan

    plan = plan_placement(PlacementRequest("qwen3-tts", None))
    assert plan.group("pipeline").total_gpu_memory_fraction is None
    assert plan.to_json()["gpus"] == [
        {"id": 0, "total_gpu_memory_fraction": None, "limit": 1.0, "groups": ["pipeline"]}
    ]
    assert "GPU 0: pipeline alone, no fractions declared (limit 1)" in render_plan(plan)
    assert plan_placement(PlacementRequest("moss-tts-local", None)).gpus[0].total_gpu_memory_fraction == 0.9
