"""Config behaviours no other test pinned: found by mutation testing (tests/mutation/run.py config).

Each test states a rule of the schema or of its error messages that a one-token
slip in config.py broke without any test noticing.
"""

from __future__ import annotations

import textwrap

import pytest

from stagevisor.supervisor.config import StageConfig, parse_config_text
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


def test_an_error_lists_three_problems_and_counts_the_rest():
    error = config_error("""\
        model_path: demo
        stages:
          - {name: a, tp_size: x}
          - {name: b, tp_size: x}
          - {name: c, tp_size: x}
          - {name: d, tp_size: x}
          - {name: e, tp_size: x}
        """)
    assert error.message.count("tp_size must be an integer") == 3
    assert error.message.endswith("; and 2 more")


def test_three_problems_are_listed_without_a_count():
    error = config_error("""\
        model_path: demo
        stages:
          - {name: a, tp_size: x}
          - {name: b, tp_size: x}
          - {name: c, tp_size: x}
        """)
    assert error.message.count("tp_size must be an integer") == 3
    assert "more" not in error.message


def test_a_recursive_alias_is_reported_at_the_key_that_repeats_it():
    error = config_error("model_path: demo\nstages: &s [{name: vocoder, args: {again: *s}}]\n")
    assert "cfg.yaml: stages[0].args.again (line 2): an alias refers to a node that contains it" in error.message


def test_a_mapping_merged_into_itself_is_reported_at_its_key_or_as_the_document():
    error = config_error("model_path: demo\nplacement: &p {<<: *p}\n")
    assert error.message.startswith("cfg.yaml: placement (line 2): an alias refers to a node that contains it")
    error = config_error("&d {<<: *d}\n")
    assert error.message.startswith("cfg.yaml: document (line 1): an alias refers to a node that contains it")


def test_a_full_pipeline_needs_at_least_one_stage_and_one_is_enough():
    error = config_error("""\
        pipeline:
          name: empty
          stages: []
        """)
    assert "pipeline.stages (line 3)" in error.message
    config = parse_config_text("pipeline:\n  name: one\n  stages:\n    - {name: only, process: p}\n", "cfg.yaml")
    assert config.pipeline.stage_names == ("only",)


def test_a_factory_that_is_not_an_import_path_is_rejected():
    error = config_error("model_path: demo\nstages:\n  - {name: a, factory: nocolon}\n")
    assert "stages[0].factory (line 3): factory must be an import path 'module:callable', got 'nocolon'" in error.message


@pytest.mark.parametrize("gpu", ["-1", "[0, -1]"])
def test_a_negative_gpu_id_is_rejected(gpu):
    error = config_error(f"model_path: demo\nstages:\n  - {{name: a, gpu: {gpu}}}\n")
    assert "stages[0].gpu (line 3): gpu must be null, a GPU id (int >= 0) or a list of them" in error.message


@pytest.mark.parametrize("text, line, problem", [
    ("model_path: demo\nstages: [unclosed\n", 3, "expected ',' or ']', but got '<stream end>'"),
    ("a: b: c\n", 1, "mapping values are not allowed here"),
])
def test_malformed_yaml_is_one_line_naming_the_problem_without_the_parsers_context(text, line, problem):
    error = config_error(text)
    assert error.message == f"cfg.yaml, line {line}: malformed YAML: {problem}"


def test_a_process_name_outside_the_name_alphabet_is_rejected():
    error = config_error("model_path: demo\nstages:\n  - {name: a, process: two words}\n")
    assert "stages[0].process (line 3): process 'two words' is not a valid name" in error.message


def test_null_args_mean_no_arguments():
    config = parse_config_text("pipeline:\n  name: one\n  stages:\n    - {name: only, process: p, args: null}\n",
                               "cfg.yaml")
    assert config.pipeline.stage("only").args == {}


def test_an_unknown_top_level_key_is_reported_with_its_line():
    error = config_error("model_path: demo\n\nbogus: 1\n")
    assert error.message == "cfg.yaml: bogus (line 3): unknown key (not part of the schema; check the spelling)"


def test_a_key_outside_the_plain_alphabet_is_quoted_in_the_field_path():
    error = config_error("model_path: demo\nbad key: 1\n")
    assert error.message.startswith("cfg.yaml: 'bad key' (line 2): unknown key")


def test_a_missing_field_is_reported_at_the_line_of_its_entry():
    error = config_error("model_path: demo\nstages:\n  - {name: a}\n  - {process: p}\n")
    assert "stages[1].name (line 4): required field is missing" in error.message


def test_a_pipeline_name_outside_the_name_alphabet_is_rejected():
    error = config_error("pipeline:\n  name: two words\n  stages:\n    - {name: only, process: p}\n")
    assert "pipeline.name (line 2): pipeline name 'two words' is not a valid name" in error.message


def test_four_problems_are_three_listed_and_one_more():
    error = config_error("model_path: demo\nstages:\n" + "".join(f"  - {{name: s{i}, tp_size: x}}\n" for i in range(4)))
    assert error.message.count("tp_size must be an integer") == 3
    assert error.message.endswith("; and 1 more")


def test_engine_memory_mismatches_are_warnings_unless_made_strict():
    from stagevisor.supervisor.config import PlacementConfig

    assert PlacementConfig().strict_runtime_fractions is False
