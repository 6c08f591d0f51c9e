"""Config validation: the schema's rules (names, GPUs, replicas, processes) and how its errors are reported."""

from __future__ import annotations

import textwrap

import pytest
from pydantic import BaseModel, field_validator

from stagevisor.supervisor.config import (
    MAX_REPLICAS,
    PipelineConfig,
    StageConfig,
    StageOverride,
    config_key_lines,
    merge_overrides,
    parse_config_text,
)
from stagevisor.supervisor.config.validation import validated
from stagevisor.supervisor.errors import ConfigError, ErrorCode


def config_error(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_config_text(textwrap.dedent(text), "cfg.yaml")
    assert caught.value.code is ErrorCode.INVALID_CONFIG
    return caught.value


def test_with_fraction_returns_a_copy_that_shares_nothing_with_the_original():
    stage = StageConfig(name="engine", process="p", gpu=0, args={"engine": {"memory": 0.5}})
    changed = stage.with_fraction(0.4)
    assert (changed.fraction, stage.fraction) == (0.4, None)
    changed.args["engine"]["memory"] = 0.4
    assert stage.args == {"engine": {"memory": 0.5}}


def error_with_bad_stages(count: int):
    """A config with `count` stages whose tp_size is not an integer."""
    stages = "".join(f"  - {{name: s{i}, tp_size: x}}\n" for i in range(count))
    return config_error("model_path: demo\nstages:\n" + stages)


def test_an_error_lists_three_problems_and_counts_the_rest():
    error = error_with_bad_stages(5)
    assert error.message.count("tp_size must be an integer") == 3
    assert error.message.endswith("; and 2 more")


def test_three_problems_are_listed_without_a_count():
    error = error_with_bad_stages(3)
    assert error.message.count("tp_size must be an integer") == 3
    assert "more" not in error.message


def test_a_recursive_alias_is_reported_at_the_key_that_repeats_it():
    error = config_error("model_path: demo\nstages: &s [{name: vocoder, args: {again: *s}}]\n")
    assert "cfg.yaml:2:9: stages[0].args.again: an alias refers to a node that contains it" in error.message


def test_a_mapping_merged_into_itself_is_reported_at_its_key_or_as_the_document():
    error = config_error("model_path: demo\nplacement: &p {<<: *p}\n")
    assert error.message.startswith("cfg.yaml:2:12: placement: an alias refers to a node that contains it")
    error = config_error("&d {<<: *d}\n")
    assert error.message.startswith("cfg.yaml:1:1: document: an alias refers to a node that contains it")


def test_a_full_pipeline_needs_at_least_one_stage_and_one_is_enough():
    error = config_error("""\
        pipeline:
          name: empty
          stages: []
        """)
    assert error.message.startswith("cfg.yaml:3:3: pipeline.stages: ")
    config = parse_config_text("pipeline:\n  name: one\n  stages:\n    - {name: only, process: p}\n", "cfg.yaml")
    assert config.pipeline.stage_names == ("only",)


def test_a_factory_that_is_not_an_import_path_is_rejected():
    error = config_error("model_path: demo\nstages:\n  - {name: a, factory: nocolon}\n")
    assert (
        "cfg.yaml:3:15: stages[0].factory: factory must be an import path 'module:callable', got 'nocolon'"
        in error.message
    )


def test_a_pipeline_whose_only_stage_is_invalid_is_not_also_said_to_have_no_stages():
    error = config_error("pipeline:\n  name: p\n  stages:\n    - {name: s, factory: my_tts.stages.make, process: p}\n")
    assert error.message == (
        "cfg.yaml:4:17: pipeline.stages[0].factory: factory must be an import path 'module:callable', "
        "got 'my_tts.stages.make'"
    )


@pytest.mark.parametrize("gpu", ["-1", "[0, -1]"])
def test_a_negative_gpu_id_is_rejected(gpu):
    error = config_error(f"model_path: demo\nstages:\n  - {{name: a, gpu: {gpu}}}\n")
    assert "cfg.yaml:3:15: stages[0].gpu: gpu must be null, a GPU id (int >= 0) or a list of them" in error.message


@pytest.mark.parametrize(
    "text, where, problem",
    [
        ("model_path: demo\nstages: [unclosed\n", "3:1", "expected ',' or ']', but got '<stream end>'"),
        ("a: b: c\n", "1:5", "mapping values are not allowed here"),
    ],
)
def test_malformed_yaml_is_one_line_naming_the_problem_without_the_parsers_context(text, where, problem):
    error = config_error(text)
    assert error.message == f"cfg.yaml:{where}: malformed YAML: {problem}"
    assert f"{error.location.line}:{error.location.column}" == where


@pytest.mark.parametrize(
    "text, where, problem",
    [
        # Before: `malformed YAML: but found another document`, the start of PyYAML's sentence cut off.
        ("a: 1\n---\nb: 2\n", "2:1", "a config file holds one YAML document; found a second at line 2"),
        ("---\nmodel_path: demo\n---\n", "3:1", "a config file holds one YAML document; found a second at line 3"),
        # Before: `malformed YAML: second occurrence`.
        (
            "a: &x 1\nb: &x 2\n",
            "2:4",
            "anchor 'x' is defined a second time here (first at line 1); give each anchor its own name",
        ),
    ],
)
def test_a_yaml_problem_that_continues_its_context_is_one_whole_sentence(text, where, problem):
    error = config_error(text)
    assert error.message == f"cfg.yaml:{where}: malformed YAML: {problem}"


def test_any_other_yaml_problem_that_continues_its_context_keeps_the_context(monkeypatch):
    """Only contexts that say where the parser was (`while parsing ...`) are left out."""
    import yaml

    def fail(self):
        mark = yaml.Mark("cfg.yaml", 0, 3, 0, None, None)
        raise yaml.MarkedYAMLError("expected a thing", mark, "but found another", mark)

    monkeypatch.setattr(yaml.SafeLoader, "get_single_node", fail)
    assert config_error("a: 1\n").message == "cfg.yaml:4:1: malformed YAML: expected a thing, but found another"


def test_a_process_name_outside_the_name_alphabet_is_rejected():
    error = config_error("model_path: demo\nstages:\n  - {name: a, process: two words}\n")
    assert "cfg.yaml:3:15: stages[0].process: process 'two words' is not a valid name" in error.message


def test_a_name_with_a_final_newline_is_rejected():
    """`$` matched before a final newline: `"a\\n"` passed as a stage name, to end up in socket paths and logs."""
    error = config_error('model_path: demo\nstages:\n  - {name: "a\\n", process: p}\n')
    assert "is not a valid name" in error.message


def test_null_args_mean_no_arguments():
    config = parse_config_text(
        "pipeline:\n  name: one\n  stages:\n    - {name: only, process: p, args: null}\n", "cfg.yaml"
    )
    assert config.pipeline.stage("only").args == {}


def test_an_unknown_top_level_key_is_reported_with_its_line():
    error = config_error("model_path: demo\n\nbogus: 1\n")
    assert error.message == "cfg.yaml:3:1: bogus: unknown key (not part of the schema; check the spelling)"


def test_every_one_of_several_schema_errors_leads_with_its_file_line_and_column_in_the_message_and_json():
    """Only the first led with `file:line:column`; the others read `stages[1].runtime (line 4): ...`, and the
    JSON had no place for them."""
    error = config_error("stages:\n  - name: vocoder\n    proces: x\n  - name: engine\n    runtime: 5\nbogus: 1\n")
    assert error.message == (
        "cfg.yaml:3:5: stages[0].proces: unknown key (not part of the schema; check the spelling); "
        "cfg.yaml:5:5: stages[1].runtime: must be a mapping of settings, got 5; "
        "cfg.yaml:6:1: bogus: unknown key (not part of the schema; check the spelling)"
    )
    body = error.to_json()["error"]
    assert (body["file"], body["line"], body["column"]) == ("cfg.yaml", 3, 5)
    assert [(p["field"], p["file"], p["line"], p["column"]) for p in body["problems"]] == [
        ("stages[0].proces", "cfg.yaml", 3, 5),
        ("stages[1].runtime", "cfg.yaml", 5, 5),
        ("bogus", "cfg.yaml", 6, 1),
    ]
    assert body["problems"][1]["message"] == "must be a mapping of settings, got 5"


def test_one_schema_error_has_no_list_of_problems_in_json():
    assert "problems" not in config_error("model_path: demo\n\nbogus: 1\n").to_json()["error"]


def test_a_key_outside_the_plain_alphabet_is_quoted_in_the_field_path():
    error = config_error("model_path: demo\nbad key: 1\n")
    assert error.message.startswith("cfg.yaml:2:1: 'bad key': unknown key")


def test_a_missing_field_is_reported_at_the_line_of_its_entry():
    error = config_error("model_path: demo\nstages:\n  - {name: a}\n  - {process: p}\n")
    assert "cfg.yaml:4:5: stages[1].name: required field is missing" in error.message


def test_a_pipeline_name_outside_the_name_alphabet_is_rejected():
    error = config_error("pipeline:\n  name: two words\n  stages:\n    - {name: only, process: p}\n")
    assert "cfg.yaml:2:3: pipeline.name: pipeline name 'two words' is not a valid name" in error.message


def test_four_problems_are_three_listed_and_one_more():
    error = config_error("model_path: demo\nstages:\n" + "".join(f"  - {{name: s{i}, tp_size: x}}\n" for i in range(4)))
    assert error.message.count("tp_size must be an integer") == 3
    assert error.message.endswith("; and 1 more")


def test_engine_memory_mismatches_are_warnings_unless_made_strict():
    from stagevisor.supervisor.config import PlacementConfig

    assert PlacementConfig().strict_runtime_fractions is False


def test_args_with_a_key_that_is_not_a_string_are_rejected_by_name():
    error = config_error("model_path: demo\nstages:\n  - {name: a, args: {1: x}}\n")
    assert "cfg.yaml:3:15: stages[0].args: args must be a mapping of keyword arguments, got {1: 'x'}" in error.message


def test_an_edge_recommendation_needs_at_least_one_fraction():
    error = config_error("""\
        pipeline:
          name: p
          stages:
            - {name: a, process: p, next: [b]}
            - {name: b, process: q}
          process_edge_resources:
            - {edge: [a, b], fractions: {}}
        """)
    assert (
        "cfg.yaml:7:22: pipeline.process_edge_resources[0].fractions: fractions must be a non-empty mapping of "
        "stage -> fraction, got {}"
    ) in error.message


@pytest.mark.parametrize(
    "entries, problem",
    [
        (
            '  role_aliases:\n    decoder: b\n    "two words": b\n',
            "cfg.yaml:8:5: pipeline.role_aliases.'two words': role alias 'two words' is not a valid name",
        ),
        (
            '  role_aliases:\n    decoder: b\n    vocoder: "b c"\n',
            "cfg.yaml:8:5: pipeline.role_aliases.vocoder: role alias target (a stage) 'b c' is not a valid name",
        ),
        (
            "  process_edge_resources:\n    - edge: [a, b]\n      fractions:\n        b: 0.1\n        a: .nan\n",
            "cfg.yaml:10:9: pipeline.process_edge_resources[0].fractions.a: recommended fraction must be a number in "
            "(0, 1], got NaN",
        ),
        (
            "  process_edge_resources:\n    - edge: [a, b]\n      fractions:\n        b: 0.1\n        a: null\n",
            "cfg.yaml:10:9: pipeline.process_edge_resources[0].fractions.a: recommended fraction must be a number in "
            "(0, 1], got null; leave out a stage with none",
        ),
        (
            '  process_edge_resources:\n    - edge: [a, b]\n      fractions:\n        b: 0.1\n        "a b": 0.2\n',
            "cfg.yaml:10:9: pipeline.process_edge_resources[0].fractions.'a b': stage 'a b' is not a valid name",
        ),
    ],
)
def test_a_bad_role_alias_or_recommended_fraction_is_reported_at_its_entry(entries, problem):
    """Not at the `role_aliases:` or `fractions:` key above it: the entry's own line."""
    error = config_error(
        "pipeline:\n  name: p\n  stages:\n    - {name: a, process: p, next: [b]}\n    - {name: b, process: q}\n"
        + entries
    )
    assert error.message.startswith(problem)


def declared(fraction: float) -> PipelineConfig:
    return PipelineConfig(
        name="m",
        role_aliases={"voice": "vocoder"},
        stages=(
            StageConfig(
                name="engine",
                process="p",
                gpu=0,
                args={"engine": {"memory": fraction}},
                next=("vocoder",),
                runtime={"resources": {"total_gpu_memory_fraction": fraction}},
            ),
            StageConfig(
                name="vocoder",
                process="q",
                gpu=0,
                args={"chunk": 4},
                runtime={"resources": {"total_gpu_memory_fraction": 0.2}},
            ),
        ),
    )


@pytest.mark.parametrize("runtime", [{}, {"resources": {}}])
def test_an_override_whose_runtime_names_no_resource_keeps_the_declared_fraction(runtime):
    pipeline = declared(0.5)
    merged = merge_overrides(pipeline, (StageOverride(name="engine", runtime=runtime),), "cfg.yaml")
    assert merged.stage("engine").fraction == 0.5
    merged = merge_overrides(
        pipeline, (StageOverride(name="engine", runtime={"resources": {"total_gpu_memory_fraction": 0.3}}),), "cfg.yaml"
    )
    assert (merged.stage("engine").fraction, merged.stage("vocoder").fraction) == (0.3, 0.2)


def test_a_merged_pipeline_shares_no_mutable_argument_with_the_declaration():
    pipeline = declared(0.5)
    merged = merge_overrides(pipeline, (StageOverride(name="engine", args={"extra": 1}),), "cfg.yaml")
    merged.stage("vocoder").args["chunk"] = 99  # the stage the override left alone
    merged.stage("engine").args["engine"]["memory"] = 0.1
    assert pipeline.stage("vocoder").args == {"chunk": 4}
    assert pipeline.stage("engine").args == {"engine": {"memory": 0.5}}
    merged.role_aliases["voice"] = "engine"
    assert pipeline.role_aliases == {"voice": "vocoder"}


def test_a_long_key_is_quoted_back_cut_to_forty_characters():
    key = "k" * 39 + " tail that is never shown"
    error = config_error(f"model_path: demo\n{key}: 1\n")
    assert error.message == (f"cfg.yaml:2:1: {key[:40]!r}: unknown key (not part of the schema; check the spelling)")


def test_a_problem_message_is_cut_at_500_characters_saying_how_much_was_left_out():
    class Loud(BaseModel):
        value: int

        @field_validator("value")
        @classmethod
        def _value(cls, value: int) -> int:
            raise ValueError("x" * 620)

    with pytest.raises(ConfigError) as caught:
        validated(Loud, {"value": 1}, "cfg.yaml", ())
    assert caught.value.message == f"cfg.yaml: value: {'x' * 500}... (120 more characters)"


def test_a_key_written_as_a_number_is_reported_at_its_own_line():
    assert config_error("model_path: demo\n\n1: x\n").message == "cfg.yaml:3:1: [1]: a key must be a string, got 1"
    assert config_error("model_path: demo\nplacement:\n\n  2: x\n").message.startswith("cfg.yaml:4:3: placement[2]: ")


def test_a_key_yaml_reads_as_a_boolean_is_reported_as_such_at_its_own_line():
    # `true:` is the bool True once parsed, which pydantic's path writes as 1: it was `[1]`, at the document's first
    # line, since the node tree held the text "true" and no key path matched.
    assert (
        config_error("model_path: demo\n\ntrue: x\n").message
        == "cfg.yaml:3:1: [true]: a key must be a string, got True"
    )


@pytest.mark.parametrize(
    "text, problem",
    [
        ("processes:\n  vocoder: {}\n  null: {replicas: 2}\n", "cfg.yaml:4:3: processes[null]: process must be a "),
        ("processes:\n  ~: {replicas: 2}\n", "cfg.yaml:3:3: processes[null]: process must be a string, got null"),
        ("processes:\n  vocoder: {}\n  ? \n  : {}\n", "cfg.yaml:4:4: processes[null]: process must be a string"),
        (
            "voices:\n  alloy: heart\n  yes: heart\n",
            "cfg.yaml:4:3: voices[true]: voice name must be a string, got bool",
        ),
        ("processes:\n  1.5: {}\n", "cfg.yaml:3:3: processes[1.5]: process must be a string, got float 1.5"),
        (
            "stages:\n  - name: vocoder\n    null: 1\n",
            "cfg.yaml:4:5: stages[0][null]: a key must be a string, got null",
        ),
    ],
)
def test_a_null_or_other_non_string_key_is_reported_as_such_at_its_own_position(text, problem):
    """A null key was `processes.None` (pydantic writes the key into its path as text), at the line of
    `processes:` (1:1 where it led the file): no entry of the file is keyed 'None'."""
    error = config_error("model_path: demo\n" + text)
    assert error.message.startswith(problem), error.message
    assert ".None" not in error.message


@pytest.mark.parametrize("key", ["[a, b]", "{a: 1}"])
def test_a_list_or_mapping_as_a_key_is_the_yaml_error_at_the_key_not_a_crash(key):
    # The node tree's walk put the key's list of nodes in a set: TypeError, unhashable type: 'list'.
    error = config_error(f"model_path: demo\nprocesses:\n  {key}: {{}}\n")
    assert error.message == "cfg.yaml:3:3: malformed YAML: found unhashable key"


def test_a_control_character_is_named_by_its_code_point_and_offset():
    error = config_error("model_path: demo\n\x07\n")
    assert error.message == (
        "cfg.yaml: malformed YAML: character U+0007 at offset 17 is not allowed in YAML; remove it"
    )


def processes_of(text: str):
    return parse_config_text("model_path: demo\n" + textwrap.dedent(text), "cfg.yaml").processes


def test_process_settings_default_to_one_replica_and_every_replica_on_the_stages_gpu():
    assert processes_of("processes: null\n") == {}
    settings = processes_of("processes:\n  vocoder: {}\n")["vocoder"]
    assert (settings.replicas, settings.gpus, settings.node) == (1, None, None)
    assert processes_of("processes:\n  vocoder: {gpus: null}\n")["vocoder"].gpus is None


@pytest.mark.parametrize("replicas", [1, 2, MAX_REPLICAS])
def test_a_replica_count_from_one_to_the_maximum_is_accepted(replicas):
    assert processes_of(f"processes:\n  vocoder: {{replicas: {replicas}}}\n")["vocoder"].replicas == replicas


@pytest.mark.parametrize(
    "replicas, problem",
    [
        (0, "replicas must be from 1 to 64, got 0"),
        (MAX_REPLICAS + 1, "replicas must be from 1 to 64, got 65"),
        ("true", "replicas must be an integer from 1 to 64, got bool True"),
        ("'2'", "replicas must be an integer from 1 to 64, got str '2'"),
    ],
)
def test_a_replica_count_outside_one_to_the_maximum_is_refused(replicas, problem):
    error = config_error(f"model_path: demo\nprocesses:\n  vocoder: {{replicas: {replicas}}}\n")
    assert f"cfg.yaml:3:13: processes.vocoder.replicas: {problem}" in error.message


@pytest.mark.parametrize("gpus, expected", [("1", (1,)), ("[0, 2]", (0, 2)), ("[0]", (0,))])
def test_the_gpus_of_a_process_are_one_id_or_a_list_of_ids(gpus, expected):
    assert processes_of(f"processes:\n  vocoder: {{gpus: {gpus}}}\n")["vocoder"].gpus == expected


@pytest.mark.parametrize("gpus", ["[]", "[0, -1]", "[true]", "true", "'0'", "[0.0]"])
def test_gpus_that_are_not_a_non_empty_list_of_ids_are_refused(gpus):
    error = config_error(f"model_path: demo\nprocesses:\n  vocoder: {{gpus: {gpus}}}\n")
    assert (
        "cfg.yaml:3:13: processes.vocoder.gpus: gpus must be a non-empty list of GPU ids (int >= 0), got "
        in error.message
    )


@pytest.mark.parametrize(
    "text, problem",
    [
        (
            "processes: [vocoder]\n",
            "cfg.yaml:2:1: processes: processes must be a mapping of process name to settings, got ['vocoder']",
        ),
        (
            "processes:\n  vocoder: {}\n  two words: {}\n",
            "cfg.yaml:4:3: processes.'two words': process 'two words' is not a valid name",
        ),
    ],
)
def test_processes_are_a_mapping_keyed_by_valid_process_names(text, problem):
    assert problem in config_error("model_path: demo\n" + text).message


def test_a_process_node_is_a_non_empty_ray_resource_name():
    assert processes_of("processes:\n  vocoder: {node: a}\n")["vocoder"].node == "a"
    error = config_error("model_path: demo\nprocesses:\n  vocoder: {node: ''}\n")
    assert "cfg.yaml:3:13: processes.vocoder.node: must not be empty, got ''" in error.message


def test_a_process_node_name_is_at_most_200_characters():
    assert processes_of(f"processes:\n  vocoder: {{node: {'n' * 200}}}\n")["vocoder"].node == "n" * 200
    error = config_error(f"model_path: demo\nprocesses:\n  vocoder: {{node: {'n' * 201}}}\n")
    assert "cfg.yaml:3:13: processes.vocoder.node: must be at most 200 characters, got 201" in error.message


def test_the_length_message_says_item_for_one_and_items_for_more():
    class Pair(BaseModel):
        one: tuple[int]
        two: tuple[int, int]

    with pytest.raises(ConfigError) as caught:
        validated(Pair, {"one": [1, 2], "two": [1, 2, 3]}, "cfg.yaml", ())
    assert caught.value.message == ("cfg.yaml: one: takes at most 1 item, got 2; two: takes at most 2 items, got 3")


def test_an_edge_of_three_stages_is_said_to_take_at_most_two_items():
    error = config_error("""\
        pipeline:
          name: x
          stages:
            - {name: a, process: p}
          process_safe_edges: [[a, a, a]]
        """)
    assert error.message == "cfg.yaml:5:24: pipeline.process_safe_edges[0]: takes at most 2 items, got 3"


def test_config_key_lines_maps_each_key_path_to_its_line(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("model_path: demo\nprocesses:\n  vocoder:\n    replicas: 2\n", encoding="utf-8")
    lines = config_key_lines(path)
    assert lines[("model_path",)] == 1
    assert lines[("processes", "vocoder", "replicas")] == 4
    path.write_text("# nothing but a comment\n", encoding="utf-8")
    assert config_key_lines(path) == {}


def autoscale_of(settings: str):
    text = f"model_path: demo\nprocesses:\n  vocoder:\n    autoscale: {{{settings}}}\n"
    return parse_config_text(text, "cfg.yaml").processes["vocoder"].autoscale


def test_autoscale_defaults_are_the_documented_ones():
    rule = autoscale_of("max_replicas: 3")
    assert rule.model_dump() == {
        "min_replicas": 1,
        "max_replicas": 3,
        "target_first_audio_p90_seconds": 1.0,
        "target_stall_p90_seconds": None,
        "max_in_flight_per_replica": 4.0,
        "scale_down_ratio": 0.5,
        "scale_up_cooldown_seconds": 5.0,
        "scale_down_cooldown_seconds": 30.0,
        "window_seconds": 10.0,
    }


AUTOSCALE_BOUNDS = [
    ("target_first_audio_p90_seconds", (0.5, 600), ((0, "> 0"), (600.5, "<= 600"))),
    (
        "target_stall_p90_seconds",
        (0, 600),
        ((-0.5, ">= 0"), (600.5, "<= 600")),
    ),
    ("max_in_flight_per_replica", (0.5, 10_000), ((0, "> 0"), (10_000.5, "<= 10000"))),
    ("scale_down_ratio", (0.001, 0.5, 0.999), ((0, "> 0"), (1, "< 1"))),
    (
        "scale_up_cooldown_seconds",
        (0, 3600),
        ((-0.5, ">= 0"), (3600.5, "<= 3600")),
    ),
    (
        "scale_down_cooldown_seconds",
        (0, 3600),
        ((-0.5, ">= 0"), (3600.5, "<= 3600")),
    ),
    ("window_seconds", (0.5, 600), ((0, "> 0"), (600.5, "<= 600"))),
]


@pytest.mark.parametrize("field, accepted", [(field, accepted) for field, accepted, _ in AUTOSCALE_BOUNDS])
def test_an_autoscale_setting_at_its_bounds_is_accepted(field, accepted):
    for value in accepted:
        assert getattr(autoscale_of(f"max_replicas: 3, {field}: {value}"), field) == value


@pytest.mark.parametrize(
    "field, value, problem",
    [(field, value, problem) for field, _, refused in AUTOSCALE_BOUNDS for value, problem in refused],
)
def test_an_autoscale_setting_past_its_bounds_is_refused_naming_the_bound(field, value, problem):
    line = f"    autoscale: {{max_replicas: 3, {field}: {value}}}"
    error = config_error(f"model_path: demo\nprocesses:\n  vocoder:\n{line}\n")
    column = line.index(field) + 1
    assert error.message == (
        f"cfg.yaml:4:{column}: processes.vocoder.autoscale.{field}: must be {problem}, got {value}"
    )


@pytest.mark.parametrize(
    "settings, problem",
    [
        ("max_replicas: 3, min_replicas: 0", "4:34: .min_replicas: min_replicas must be from 1 to 64, got 0"),
        ("max_replicas: 65", "4:17: .max_replicas: max_replicas must be from 1 to 64, got 65"),
        ("max_replicas: true", "4:17: .max_replicas: max_replicas must be an integer from 1 to 64, got bool True"),
        (
            "min_replicas: 3, max_replicas: 2",
            "4:5: : min_replicas 3 is above max_replicas 2; give min_replicas <= max_replicas",
        ),
    ],
)
def test_autoscale_replica_bounds_outside_one_to_the_maximum_or_crossed_are_refused(settings, problem):
    error = config_error(f"model_path: demo\nprocesses:\n  vocoder:\n    autoscale: {{{settings}}}\n")
    where, path, detail = problem.split(": ", 2)
    assert error.message == f"cfg.yaml:{where}: processes.vocoder.autoscale{path}: {detail}"


def test_autoscale_bounds_may_be_equal():
    rule = autoscale_of("min_replicas: 2, max_replicas: 2")
    assert (rule.min_replicas, rule.max_replicas) == (2, 2)


@pytest.mark.parametrize("replicas", [2, 3, 4])
def test_replicas_within_the_autoscale_bounds_inclusive_are_accepted(replicas):
    text = f"processes:\n  vocoder:\n    replicas: {replicas}\n    autoscale: {{min_replicas: 2, max_replicas: 4}}\n"
    assert processes_of(text)["vocoder"].replicas == replicas


@pytest.mark.parametrize("replicas", [1, 5])
def test_replicas_outside_the_autoscale_bounds_are_refused(replicas):
    error = config_error(
        "model_path: demo\nprocesses:\n  vocoder:\n"
        f"    replicas: {replicas}\n    autoscale: {{min_replicas: 2, max_replicas: 4}}\n"
    )
    assert error.message == (
        f"cfg.yaml:3:3: processes.vocoder: replicas {replicas} is outside autoscale's bounds [2, 4]; "
        "drop replicas or widen the bounds"
    )


def pipeline_with_speech(speech: str) -> PipelineConfig:
    text = f"pipeline:\n  name: x\n  stages: [{{name: a, process: p}}]\n  speech: {speech}\n"
    return parse_config_text(text, "cfg.yaml").pipeline


def test_a_pipeline_without_a_speech_section_takes_nothing_beyond_text_and_voice():
    config = parse_config_text("pipeline:\n  name: x\n  stages: [{name: a, process: p}]\n", "cfg.yaml")
    speech = config.pipeline.speech
    assert (speech.clones, speech.instructions, speech.seed, speech.languages, speech.options) == (
        False,
        False,
        False,
        (),
        None,
    )


def test_speech_options_with_one_bound_or_equal_bounds_are_accepted():
    options = pipeline_with_speech(
        "{options: {low: {minimum: 0}, high: {maximum: 1}, fixed: {type: integer, minimum: 2, maximum: 2}}}"
    ).speech.options
    assert (options["low"].minimum, options["low"].maximum) == (0, None)
    assert (options["high"].minimum, options["high"].maximum) == (None, 1)
    assert (options["fixed"].type, options["fixed"].minimum, options["fixed"].maximum) == ("integer", 2, 2)


@pytest.mark.parametrize(
    "options, problem",
    [
        ("{o: {minimum: 2, maximum: 1.5}}", "4:22: pipeline.speech.options.o: minimum 2 is above maximum 1.5"),
        (
            "{o: {type: float}}",
            "4:26: pipeline.speech.options.o.type: option type 'float' is not one of number, integer, boolean, string",
        ),
        (
            "{o: {type: integer, maximum: 2.5}}",
            "4:41: pipeline.speech.options.o.maximum: an integer option's maximum must be a whole number, got 2.5",
        ),
        (
            '{"a b": {}}',
            "4:12: pipeline.speech.options: option 'a b' is not a valid name: use letters, digits, '_', '.', '-' "
            "and start with a letter or digit",
        ),
    ],
)
def test_a_speech_option_with_crossed_or_fractional_integer_bounds_an_unknown_type_or_a_bad_name_is_refused(
    options, problem
):
    error = config_error(
        f"pipeline:\n  name: x\n  stages: [{{name: a, process: p}}]\n  speech: {{options: {options}}}\n"
    )
    assert error.message == f"cfg.yaml:{problem}"


def test_a_seed_option_takes_the_models_seed_range_or_none():
    assert pipeline_with_speech("{seed: true, options: {seed: {type: integer}}}").speech.options is not None
    speech = pipeline_with_speech(
        "{seed: true, seed_maximum: 65535, options: {seed: {type: integer, minimum: 0, maximum: 65535}}}"
    ).speech
    assert speech.options is not None and speech.options["seed"].maximum == speech.seed_maximum == 65535
    assert pipeline_with_speech("{seed: true, options: {seed: {type: integer, maximum: 4294967295}}}").speech.seed


@pytest.mark.parametrize(
    "speech",
    [
        "{seed: true, options: {seed: {type: integer, minimum: 0, maximum: 65535}}}",  # seed_maximum 2^32-1
        "{seed: true, seed_maximum: 65535, options: {seed: {type: integer, minimum: 1, maximum: 65535}}}",
        "{seed: true, options: {seed: {type: number}}}",
        "{seed: true, seed_maximum: 9, options: {seed: {type: integer, maximum: 10}}}",
    ],
)
def test_a_seed_option_with_a_range_of_its_own_is_refused(speech):
    error = config_error(f"pipeline:\n  name: x\n  stages: [{{name: a, process: p}}]\n  speech: {speech}\n")
    assert "must be an integer in the model's seed range [0, " in error.message
    assert "None" not in error.message
    assert "set the largest seed once, as seed_maximum" in error.message


def test_a_seed_option_of_a_model_that_takes_no_seed_is_refused():
    error = config_error("pipeline:\n  name: x\n  stages: [{name: a, process: p}]\n  speech: {options: {seed: {}}}\n")
    assert error.message.endswith("a seed option is declared but the model takes no seed: set seed: true, or drop it")


def test_voices_map_client_names_to_the_models_voices_and_null_is_none():
    config = parse_config_text("model_path: demo\nvoices: {alloy: heart, echo: f1}\n", "cfg.yaml")
    assert config.voices == {"alloy": "heart", "echo": "f1"}
    assert parse_config_text("model_path: demo\nvoices: null\n", "cfg.yaml").voices == {}


def test_voices_that_are_not_a_mapping_are_refused_at_the_voices_key():
    error = config_error("model_path: demo\nvoices: [a]\n")
    assert error.message.startswith(
        "cfg.yaml:2:1: voices: voices must be a mapping of voice name -> the model's voice, got ['a']"
    )


@pytest.mark.parametrize(
    "entry, problem",
    [
        ('"a b": heart', "cfg.yaml:4:3: voices.'a b': voice name 'a b' is not a valid name"),
        ("1: heart", "cfg.yaml:4:3: voices[1]: voice name must be a string, got int 1"),
        ('narrator: "c d"', "cfg.yaml:4:3: voices.narrator: the model's voice it stands for 'c d' is not a valid name"),
        ("narrator: 5", "cfg.yaml:4:3: voices.narrator: the model's voice it stands for must be a string, got int 5"),
    ],
)
def test_a_bad_voices_entry_is_reported_at_that_entry(entry, problem):
    """The entry's own line, not the `voices:` key's: in a long map the operator goes straight to it."""
    error = config_error(f"model_path: demo\nvoices:\n  alloy: heart\n  {entry}\n")
    assert error.message.startswith(problem)
    assert error.config_path[0] == "voices" and len(error.config_path) == 2


def test_a_list_too_short_is_listed_beside_a_deeper_problem_elsewhere():
    """A "too short" is dropped only for a list whose own item failed (the item's error says more); a problem
    at a deeper path under another key does not hide it."""
    error = config_error("""\
        pipeline:
          name: p
          stages: []
        stages:
          - {name: a, tp_size: x}
        """)
    assert "cfg.yaml:5:15: stages[0].tp_size: tp_size must be an integer" in error.message
    assert "cfg.yaml:3:3: pipeline.stages: needs at least 1 item, got none" in error.message


# --- null sections and the schema's wording ------------------------------------------------------------------


def test_a_null_section_means_the_same_as_leaving_it_out_in_every_optional_section():
    """`placement: null` and `stages: null` were refused ("Input should be a valid dictionary or instance of
    PlacementConfig", "a valid tuple") where `voices: null` and `processes: null` were accepted."""
    left_out = parse_config_text("model_path: demo\n", "cfg.yaml")
    nulls = parse_config_text(
        "model_path: demo\nplacement: null\nstages: null\nprocesses: null\nvoices: null\n", "cfg.yaml"
    )
    assert nulls == left_out
    pipeline = parse_config_text(
        "pipeline:\n  name: one\n  stages:\n    - {name: only, process: p, runtime: null}\n"
        "    - {name: two, process: p, runtime: {resources: null}}\n"
        "  process_safe_edges: null\n  process_edge_resources: null\n  role_aliases: null\n  speech: null\n",
        "cfg.yaml",
    ).pipeline
    assert pipeline.stage("only").runtime == pipeline.stage("two").runtime == StageConfig(name="x").runtime
    assert (pipeline.process_safe_edges, pipeline.process_edge_resources, pipeline.role_aliases) == ((), (), {})
    assert processes_of("processes:\n  vocoder:\n")["vocoder"].replicas == 1


def test_a_null_where_null_has_a_meaning_keeps_it():
    config = parse_config_text("model_path: demo\nstages:\n  - {name: vocoder, gpu: null}\n", "cfg.yaml")
    assert "gpu" in config.stages[0].model_fields_set and config.stages[0].gpu is None
    assert (
        "must be a whole number, got null"
        in config_error(
            "pipeline:\n  name: one\n  stages: [{name: a, process: p}]\n  speech: {seed_maximum: null}\n"
        ).message
    )


def test_a_null_section_in_a_stage_override_changes_nothing():
    model = PipelineConfig.model_validate(
        {
            "name": "m",
            "stages": [
                {
                    "name": "v",
                    "process": "p",
                    "gpu": 0,
                    "args": {"a": 1},
                    "runtime": {"resources": {"total_gpu_memory_fraction": 0.1}},
                }
            ],
        }
    )
    override = StageOverride.model_validate({"name": "v", "args": None, "runtime": None})
    assert merge_overrides(model, (override,), "cfg.yaml").stage("v") == model.stage("v")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("model_path: demo\nplacement: 3\n", "cfg.yaml:2:1: placement: must be a mapping of settings, got 3"),
        ("model_path: demo\nstages: 3\n", "cfg.yaml:2:1: stages: must be a list, got 3"),
        ("model_path: demo\nstages: [3]\n", "stages[0]: must be a mapping of settings, got 3"),
        (
            "model_path: demo\nstages: [{name: vocoder, runtime: 3}]\n",
            "stages[0].runtime: must be a mapping of settings, got 3",
        ),
        (
            "model_path: demo\nplacement: {strict_runtime_fractions: 3}\n",
            "placement.strict_runtime_fractions: must be true or false, got 3",
        ),
        ("model_path: 3\n", "model_path: must be a string, got 3"),
        ("model_path: demo\n1: 2\n", "cfg.yaml:2:1: [1]: a key must be a string, got 1"),
        ("model_path: demo\nprocesses: {vocoder: 3}\n", "processes.vocoder: must be a mapping of settings, got 3"),
        ("model_path: demo\nprocesses: {vocoder: {node: ''}}\n", "processes.vocoder.node: must not be empty, got ''"),
        (
            "model_path: demo\nprocesses: {vocoder: {autoscale: {max_replicas: 2, target_first_audio_p90_seconds: 0}}}"
            "\n",
            "processes.vocoder.autoscale.target_first_audio_p90_seconds: must be > 0, got 0",
        ),
        (
            "model_path: demo\nprocesses:\n  vocoder:\n    autoscale:\n"
            "      {max_replicas: 2, target_first_audio_p90_seconds: .nan}\n",
            "processes.vocoder.autoscale.target_first_audio_p90_seconds: must be a number, got NaN",
        ),
        (
            "pipeline: {name: x, stages: [{name: a, process: p}], process_safe_edges: [a]}\n",
            "pipeline.process_safe_edges[0]: must be a list, got 'a'",
        ),
        (
            "pipeline: {name: x, stages: [{name: a, process: p}], process_safe_edges: [[a, 3]]}\n",
            "pipeline.process_safe_edges[0][1]: must be a string, got 3",
        ),
        (
            "pipeline: {name: x, stages: [{name: a, process: p}], speech: {options: {o: {minimum: x}}}}\n",
            "pipeline.speech.options.o.minimum: minimum must be a number or null, got 'x'",
        ),
    ],
)
def test_a_schema_error_says_what_the_entry_must_be_in_the_projects_words(text, expected):
    """pydantic's wording leaked: "Input should be a valid tuple", "a valid dictionary or instance of
    RuntimeConfig", one clause per member of `int | float` (`minimum.int`, `minimum.float`)."""
    message = config_error(text).message
    assert expected in message
    assert "Input should" not in message and "instance of" not in message and "tuple" not in message
    assert "should" not in message


def test_a_gpu_id_the_admin_api_cannot_carry_is_refused_where_it_is_written():
    """`gpu: 2147483648` planned, then the daemon's topology failed: GPU ids are int32 on the admin API."""
    assert (
        "stages[0].gpu: gpu 2147483648 is not a GPU id: ids run from 0 to 2147483647"
        in config_error("model_path: demo\nstages: [{name: vocoder, gpu: 2147483648}]\n").message
    )
    assert (
        "processes.vocoder.gpus: gpus lists 2147483648, which is not a GPU id"
        in config_error("model_path: demo\nprocesses: {vocoder: {gpus: [0, 2147483648]}}\n").message
    )
    config = parse_config_text("model_path: demo\nstages: [{name: vocoder, gpu: 2147483647}]\n", "cfg.yaml")
    assert config.stages[0].gpu == 2147483647


@pytest.mark.parametrize(
    "text, problem",
    [
        ("stages:\n  - name: null\n", "cfg.yaml:3:5: stages[0].name: stage name must be a string, got null"),
        (
            "stages:\n  - {name: vocoder, tp_size: null}\n",
            "cfg.yaml:3:21: stages[0].tp_size: tp_size must be an integer >= 1, got null",
        ),
        (
            "pipeline:\n  name: p\n  stages: [{name: a, factory: 'm:f'}]\n"
            "  process_edge_resources: [{edge: [a, a], fractions: null}]\n",
            "cfg.yaml:4:43: pipeline.process_edge_resources[0].fractions: fractions must be a non-empty mapping of "
            "stage -> fraction, got null",
        ),
        (
            "processes:\n  vocoder: {replicas: null}\n",
            "cfg.yaml:3:13: processes.vocoder.replicas: replicas must be an integer from 1 to 64, got null",
        ),
        (
            "processes:\n  vocoder:\n    autoscale: {max_replicas: null}\n",
            "cfg.yaml:4:17: processes.vocoder.autoscale.max_replicas: max_replicas must be an integer from 1 to 64, "
            "got null",
        ),
        (
            "voices:\n  alloy: null\n",
            "cfg.yaml:3:3: voices.alloy: the model's voice it stands for must be a string, got null",
        ),
        (
            "pipeline:\n  name: null\n  stages: [{name: a, factory: 'm:f'}]\n",
            "cfg.yaml:2:3: pipeline.name: pipeline name must be a string, got null",
        ),
        (
            "pipeline:\n  name: p\n  stages: [{name: a, factory: 'm:f', next: [null]}]\n",
            "cfg.yaml:3:38: pipeline.stages[0].next: next entry must be a string, got null",
        ),
        (
            "pipeline:\n  name: p\n  stages: [{name: a, factory: 'm:f'}]\n  role_aliases: {vocoder: null}\n",
            "cfg.yaml:4:18: pipeline.role_aliases.vocoder: role alias target (a stage) must be a string, got null",
        ),
    ],
)
def test_a_null_entry_is_named_null_beside_what_it_must_be_at_its_location(text, problem):
    """A null (or empty) entry said `got NoneType None`, Python's words: it is YAML's `null`, as the schema's
    own messages name it."""
    error = config_error("model_path: demo\n" + text if not text.startswith("pipeline") else text)
    assert error.message.startswith(problem), error.message
    assert "NoneType" not in error.message
