"""The YAML schema: both config forms, strict validation, and errors that name field, file and line."""

import textwrap

import pytest

from stagevisor.models.registry import resolve_model
from stagevisor.supervisor.config import StageOverride, load_config, merge_overrides, parse_config_text
from stagevisor.supervisor.errors import ConfigError, ErrorCode


def parse(text: str):
    return parse_config_text(textwrap.dedent(text), "cfg.yaml")


def config_error(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse(text)
    return caught.value


def test_override_form_parses_model_path_placement_and_partial_stages():
    config = parse(
        """
        model_path: fishaudio/s2-pro
        placement: {max_total_gpu_memory_fraction_per_gpu: 0.9}
        stages:
          - name: vocoder
            process: vocoder
            runtime: {resources: {total_gpu_memory_fraction: 0.10}}
        """
    )
    assert config.model_path == "fishaudio/s2-pro"
    assert config.placement.max_total_gpu_memory_fraction_per_gpu == 0.9
    assert config.stages[0].model_fields_set == {"name", "process", "runtime"}


def test_placement_limit_defaults_to_one():
    assert parse("model_path: demo\n").placement.max_total_gpu_memory_fraction_per_gpu == 1.0


def test_full_form_parses_stages_edges_resources_and_aliases():
    config = parse(
        """
        pipeline:
          name: my-tts
          stages:
            - {name: frontend, factory: "my_pkg.stages:make_frontend", args: {lang: en},
               process: pipeline, next: engine}
            - {name: engine, factory: "my_pkg.stages:make_engine", process: pipeline, gpu: 0,
               next: [vocoder], stream_to: [vocoder], runtime: {resources: {total_gpu_memory_fraction: 0.85}}}
            - {name: vocoder, factory: "my_pkg.stages:make_vocoder", process: pipeline, gpu: 0}
          process_safe_edges: [[engine, vocoder]]
          process_edge_resources:
            - edge: [engine, vocoder]
              fractions: {engine: 0.85, vocoder: 0.10}
          role_aliases: {decoder: vocoder}
        """
    )
    pipeline = config.pipeline
    assert pipeline.stage("frontend").next == ("engine",)  # a single string becomes a list
    assert pipeline.stage("engine").fraction == 0.85
    assert pipeline.process_safe_edges == (("engine", "vocoder"),)
    assert pipeline.process_edge_resources[0].fractions == {"engine": 0.85, "vocoder": 0.10}
    assert pipeline.role_aliases == {"decoder": "vocoder"}


def test_malformed_yaml_names_file_and_line():
    error = config_error("stages:\n  - name: vocoder\n    process: [unclosed\n")
    assert error.code is ErrorCode.INVALID_CONFIG
    assert error.message.startswith("cfg.yaml:4:1: malformed YAML: ")


def test_unknown_key_names_the_field_and_line():
    error = config_error(
        """
        stages:
          - name: vocoder
            proces: vocoder
        """
    )
    assert error.code is ErrorCode.INVALID_CONFIG
    assert error.message.startswith("cfg.yaml:4:5: stages[0].proces: ")
    assert "unknown key" in error.message


def test_unknown_top_level_key_is_rejected():
    assert "modelpath" in config_error("modelpath: demo\n").message


def test_wrong_type_for_gpu_is_rejected_naming_the_field():
    error = config_error("stages:\n  - name: vocoder\n    gpu: '0'\n")
    assert error.message.startswith("cfg.yaml:3:5: stages[0].gpu: ")


def test_boolean_is_not_accepted_as_gpu_id():
    assert "gpu" in config_error("stages:\n  - name: vocoder\n    gpu: true\n").message


@pytest.mark.parametrize("value", ["0", "-0.1", "1.5", ".nan", ".inf", "'0.5'"])
def test_fraction_outside_zero_one_or_not_a_number_is_rejected(value):
    error = config_error(
        f"stages:\n  - name: vocoder\n    runtime: {{resources: {{total_gpu_memory_fraction: {value}}}}}\n"
    )
    assert error.code is ErrorCode.INVALID_CONFIG
    assert error.message.startswith("cfg.yaml:3:27: stages[0].runtime.resources.total_gpu_memory_fraction: ")


def test_nan_fraction_is_named_as_nan():
    error = config_error("stages:\n  - name: v\n    runtime: {resources: {total_gpu_memory_fraction: .nan}}\n")
    assert "NaN" in error.message


@pytest.mark.parametrize(
    "value, advice",
    [("1e-3", "e.g. 0.001"), ("5E-1", "e.g. 0.5"), ("'0.5'", "e.g. 0.5"), ("1e-7", "e.g. 1.0e-07")],
)
def test_a_fraction_yaml_reads_as_text_is_refused_saying_how_to_write_it_as_a_number(value, advice):
    """PyYAML (YAML 1.1) reads a number with an exponent but no '.' as a string: the operator wrote a number and
    is told "got str", so the message says how to write it; the spelling it offers is one YAML reads as a number."""
    error = config_error(
        f"stages:\n  - name: vocoder\n    runtime: {{resources: {{total_gpu_memory_fraction: {value}}}}}\n"
    )
    assert error.message.endswith(f"(YAML reads it as text: write it unquoted with a '.', {advice})")
    written = advice.removeprefix("e.g. ")
    assert parse(
        f"stages:\n  - name: vocoder\n    runtime: {{resources: {{total_gpu_memory_fraction: {written}}}}}\n"
    ).stages[0].runtime.resources.total_gpu_memory_fraction == float(written)


def test_text_that_is_no_number_gets_no_advice_to_write_it_as_one():
    error = config_error("stages:\n  - name: v\n    runtime: {resources: {total_gpu_memory_fraction: 'nan'}}\n")
    assert error.message.endswith("got str 'nan'")


def test_fraction_of_exactly_one_is_accepted():
    config = parse("stages:\n  - name: vocoder\n    runtime: {resources: {total_gpu_memory_fraction: 1}}\n")
    assert config.stages[0].runtime.resources.total_gpu_memory_fraction == 1.0


@pytest.mark.parametrize("limit", ["0", "1.01", ".nan", "null"])
def test_placement_limit_outside_zero_one_is_rejected(limit):
    error = config_error(f"placement: {{max_total_gpu_memory_fraction_per_gpu: {limit}}}\n")
    assert "max_total_gpu_memory_fraction_per_gpu" in error.message


def test_empty_stage_name_is_rejected():
    assert "stages[0].name" in config_error("stages:\n  - name: ''\n").message


def test_missing_stage_name_is_reported_as_required():
    assert "required field is missing" in config_error("stages:\n  - process: x\n").message


def test_empty_file_is_rejected():
    assert "empty" in config_error("").message


def test_a_top_level_list_is_rejected_at_the_documents_first_line():
    error = config_error("\n- a\n- b\n")
    assert error.message.startswith("cfg.yaml:2:1: expected a mapping with `model_path`/`stages` or `pipeline`")
    assert (error.location.line, error.location.column) == (2, 1)


def test_a_parsed_config_and_its_locations_cannot_be_swapped_after_parsing():
    """Errors are located by the locations parsed with the config: one swapped for another file's would point
    an operator at the wrong lines."""
    import dataclasses

    from stagevisor.supervisor.config import parse_config_source

    sourced = parse_config_source("model_path: demo\n", "cfg.yaml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        sourced.locations = parse_config_source("model_path: demo\n", "other.yaml").locations


def test_duplicate_key_is_rejected_with_its_line():
    error = config_error("model_path: demo\nmodel_path: qwen3-tts\n")
    assert error.message == "cfg.yaml:2:1: model_path: key given twice"


def test_both_forms_in_one_file_are_rejected():
    error = config_error(
        """
        model_path: demo
        pipeline:
          name: x
          stages: [{name: a, process: p}]
        """
    )
    assert "not both" in error.message


def test_python_tags_are_not_constructed_by_the_safe_loader():
    error = config_error("model_path: !!python/object/apply:os.system ['true']\n")
    assert error.code is ErrorCode.INVALID_CONFIG


def test_unreadable_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "missing.yaml")
    assert "missing.yaml" in caught.value.message


def test_merge_changes_only_the_given_fields():
    declaration = resolve_model("fishaudio-s2-pro")
    override = StageOverride.model_validate(
        {"name": "vocoder", "process": "vocoder", "runtime": {"resources": {"total_gpu_memory_fraction": 0.1}}}
    )
    merged = merge_overrides(declaration.pipeline, (override,), "cfg.yaml")
    vocoder = merged.stage("vocoder")
    assert (vocoder.process, vocoder.fraction, vocoder.gpu) == ("vocoder", 0.1, 0)
    assert vocoder.factory == "stagevisor.stages.standins:make"
    assert merged.stage("tts_engine") == declaration.pipeline.stage("tts_engine")


def test_merge_never_mutates_the_declaration():
    declaration = resolve_model("fishaudio-s2-pro")
    before = declaration.pipeline.model_dump()
    override = StageOverride.model_validate({"name": "vocoder", "process": "vocoder", "args": {"x": 1}})
    merged = merge_overrides(declaration.pipeline, (override,), "cfg.yaml")
    assert merged is not declaration.pipeline
    assert declaration.pipeline.model_dump() == before


def test_merge_of_an_unknown_stage_is_unknown_stage():
    override = StageOverride.model_validate({"name": "decoder", "process": "x"})
    with pytest.raises(ConfigError) as caught:
        merge_overrides(resolve_model("qwen3-tts").pipeline, (override,), "cfg.yaml")
    assert caught.value.code is ErrorCode.UNKNOWN_STAGE
    assert "'decoder'" in caught.value.message and "'vocoder'" in caught.value.message


def test_merge_of_the_same_stage_twice_is_rejected():
    overrides = tuple(StageOverride.model_validate({"name": "vocoder", "process": p}) for p in ("a", "b"))
    with pytest.raises(ConfigError) as caught:
        merge_overrides(resolve_model("qwen3-tts").pipeline, overrides, "cfg.yaml")
    assert "listed twice" in caught.value.message


def test_merge_adds_args_without_dropping_the_declared_ones():
    override = StageOverride.model_validate({"name": "vocoder", "args": {"chunk": 32}})
    merged = merge_overrides(resolve_model("moss-tts-delay").pipeline, (override,), "cfg.yaml")
    assert merged.stage("vocoder").args == {"model": "moss-tts-delay", "stage": "vocoder", "chunk": 32}


def test_merge_of_a_gpu_list_without_tp_size_is_left_for_the_structure_check():
    override = StageOverride.model_validate({"name": "tts_engine", "gpu": [0, 1]})
    merged = merge_overrides(resolve_model("qwen3-tts").pipeline, (override,), "cfg.yaml")
    assert (merged.stage("tts_engine").gpu, merged.stage("tts_engine").tp_size) == ((0, 1), 1)


HUGE = "1" + "0" * 400


def test_a_huge_integer_stage_fraction_is_invalid_config_naming_the_field():
    error = config_error(
        "model_path: demo\nstages:\n"
        f"  - {{name: vocoder, runtime: {{resources: {{total_gpu_memory_fraction: {HUGE}}}}}}}\n"
    )
    assert error.code is ErrorCode.INVALID_CONFIG
    assert "total_gpu_memory_fraction" in error.message


def test_a_huge_integer_placement_limit_is_invalid_config_naming_the_field():
    error = config_error(f"model_path: demo\nplacement: {{max_total_gpu_memory_fraction_per_gpu: {HUGE}}}\n")
    assert error.code is ErrorCode.INVALID_CONFIG
    assert "max_total_gpu_memory_fraction_per_gpu" in error.message


def test_a_huge_integer_edge_resource_fraction_is_invalid_config_naming_the_field():
    error = config_error(f"""
        pipeline:
          name: t
          stages:
            - {{name: a, process: p, next: b}}
            - {{name: b, process: p}}
          process_edge_resources:
            - {{edge: [a, b], fractions: {{a: {HUGE}}}}}
        """)
    assert error.code is ErrorCode.INVALID_CONFIG
    assert "pipeline.process_edge_resources[0].fractions.a: recommended fraction must be in (0, 1]" in error.message


def test_an_integer_past_the_digit_limit_is_invalid_config_naming_the_file():
    error = config_error("model_path: demo\nstages:\n  - {name: vocoder, gpu: 1" + "0" * 5000 + "}\n")
    assert error.code is ErrorCode.INVALID_CONFIG
    assert error.message.startswith("cfg.yaml:")


def test_a_file_that_is_not_utf8_is_invalid_config_naming_the_file(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("model_path: demo\nstages:\n  - name: voc\xf6der\n".encode("latin-1"))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.code is ErrorCode.INVALID_CONFIG
    assert str(path) in caught.value.message and "UTF-8" in caught.value.message


def test_yaml_merge_keys_are_not_duplicate_keys():
    config = parse(
        """
        pipeline:
          name: t
          stages:
            - &base {name: a, process: p, next: [b]}
            - {<<: *base, name: b, next: []}
        """
    )
    assert [(s.name, s.process, s.next) for s in config.pipeline.stages] == [("a", "p", ("b",)), ("b", "p", ())]


def test_a_duplicate_key_error_names_the_file():
    error = config_error("model_path: demo\nmodel_path: qwen3-tts\n")
    assert error.message.startswith("cfg.yaml:2:1: ")
    assert (error.location.file, error.location.line, error.location.column) == ("cfg.yaml", 2, 1)


def test_a_key_repeated_next_to_a_merge_key_is_still_a_duplicate():
    error = config_error(
        """
        pipeline:
          name: t
          stages:
            - &base {name: a, process: p}
            - {<<: *base, name: b, name: c}
        """
    )
    assert "cfg.yaml:6:28: pipeline.stages[1].name: key given twice" in error.message


def test_a_recursive_alias_is_invalid_config_not_a_crash():
    error = config_error("model_path: demo\nstages: &s [{name: vocoder, args: {again: *s}}]\n")
    assert error.code is ErrorCode.INVALID_CONFIG


def test_an_invalid_override_value_names_the_file_stage_and_field(tmp_path):
    path = tmp_path / "over.yaml"
    path.write_text("model_path: demo\nstages:\n  - {name: vocoder, tp_size: 0}\n")
    from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement

    with pytest.raises(ConfigError) as caught:
        plan_placement(PlacementRequest(None, str(path)))
    assert caught.value.code is ErrorCode.INVALID_CONFIG
    assert f"{path}:3:21: stage 'vocoder': tp_size" in caught.value.message


@pytest.mark.parametrize("field", ["next", "stream_to"])
def test_an_override_of_a_builtin_models_edges_is_rejected(field):
    error = config_error(f"model_path: qwen3-tts\nstages:\n  - {{name: preprocessing, process: pre, {field}: []}}\n")
    assert error.code is ErrorCode.INVALID_CONFIG
    assert f"`{field}`" in error.message and "declare the pipeline in full" in error.message
    assert error.message.startswith("cfg.yaml:3:5: stages[0]: ")


def test_an_override_of_a_builtin_models_factory_is_allowed():
    config = parse("model_path: qwen3-tts\nstages:\n  - {name: vocoder, factory: 'my_pkg.stages:make_vocoder'}\n")
    merged = merge_overrides(resolve_model("qwen3-tts").pipeline, config.stages, "cfg.yaml")
    assert merged.stage("vocoder").factory == "my_pkg.stages:make_vocoder"
    assert merged.stage("tts_engine").next == ("vocoder",)


ALIAS_PIPELINE = """
pipeline:
  name: t
  stages:
    - {{name: a, process: p, next: [vocoder]}}
    - {{name: vocoder, process: p}}
  role_aliases: {aliases}
"""


@pytest.mark.parametrize("aliases", ['{"": a}', '{"two words": a}', "{7: a}"])
def test_an_empty_or_invalid_role_alias_name_is_rejected(aliases):
    error = config_error(ALIAS_PIPELINE.format(aliases=aliases))
    assert error.code is ErrorCode.INVALID_CONFIG
    assert "pipeline.role_aliases" in error.message and "role alias" in error.message


@pytest.mark.parametrize("target", ['""', '"not a name"', "[a]"])
def test_an_empty_or_invalid_role_alias_target_is_rejected(target):
    error = config_error(ALIAS_PIPELINE.format(aliases="{decoder: %s}" % target))
    assert error.code is ErrorCode.INVALID_CONFIG
    assert "pipeline.role_aliases" in error.message and "target" in error.message


@pytest.mark.parametrize(("field", "edges"), [("next", "next: [b, b]"), ("stream_to", "next: [b], stream_to: [b, b]")])
def test_a_stage_listed_twice_in_next_or_stream_to_is_rejected(field, edges):
    error = config_error(f"""
        pipeline:
          name: t
          stages:
            - {{name: a, process: p, {edges}}}
            - {{name: b, process: p}}
        """)
    assert error.code is ErrorCode.INVALID_CONFIG
    assert f"pipeline.stages[0].{field}" in error.message and "'b' twice" in error.message


ALIAS_BOMB = """\
a: &a ["xxxxxxxxxxxxxxxxxxxx", "xxxxxxxxxxxxxxxxxxxxxxxxx"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
model_path: demo
stages:
  - name: vocoder
    gpu: *f
"""


def test_an_alias_bomb_is_reported_in_one_short_line():
    """Every echoed value is bounded: the full repr of this value is about 3 MB."""
    with pytest.raises(ConfigError) as caught:
        parse_config_text(ALIAS_BOMB, "bomb.yaml")
    message = str(caught.value)
    assert caught.value.code is ErrorCode.INVALID_CONFIG
    assert "bomb.yaml:10:5: stages[0].gpu: gpu must be null" in message
    assert len(message) < 2000


def test_a_huge_name_is_echoed_cut():
    with pytest.raises(ConfigError) as caught:
        parse_config_text("model_path: demo\nstages:\n  - name: " + "-" * 100_000 + "\n", "huge.yaml")
    assert "is not a valid name" in str(caught.value) and len(str(caught.value)) < 2000


def test_a_list_too_short_is_said_plainly_naming_the_field_without_pydantics_words():
    message = config_error("pipeline:\n  name: x\n  stages: []\n").message
    assert message == "cfg.yaml:3:3: pipeline.stages: needs at least 1 item, got none"
    edge = config_error(
        "pipeline:\n  name: x\n  stages:\n    - {name: a, process: p}\n  process_safe_edges: [[a]]\n"
    ).message
    assert "cfg.yaml:5:24: pipeline.process_safe_edges[0][1]: position 1 is missing (the list is too short)" in edge
    assert "after validation" not in message + edge and "Tuple" not in message + edge
