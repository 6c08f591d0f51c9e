"""Errors about a config file entry start with `file:line:column` and carry the location as data.

Each YAML text below marks the line the error must point at; the planner never sees the file, the
location is attached from the loader's map of config paths.
"""

import textwrap

import pytest

from stagevisor.supervisor.config import PipelineConfig, StageConfig, parse_config_source
from stagevisor.supervisor.errors import ConfigError, ErrorCode, SourceLocation, StagevisorError
from stagevisor.supervisor.placement.nodes import apply_process_nodes
from stagevisor.supervisor.placement.planner import plan_pipeline
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement

FILE = "pipeline.yaml"


def yaml_text(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def schema_error(text: str) -> StagevisorError:
    with pytest.raises(ConfigError) as caught:
        parse_config_source(yaml_text(text), FILE)
    return caught.value


def plan_error(text: str, model_path: str | None = None, **options: tuple[str, ...]) -> StagevisorError:
    request = PlacementRequest(model_path, FILE, config_text=yaml_text(text), **options)
    with pytest.raises(StagevisorError) as caught:
        plan_placement(request)
    return caught.value


def line_of(text: str, marker: str) -> int:
    """The 1-based line of the YAML text that carries `# <- marker`."""
    lines = yaml_text(text).splitlines()
    return next(number for number, line in enumerate(lines, 1) if line.endswith(f"# <- {marker}"))


def assert_at(error: StagevisorError, line: int, column: int) -> None:
    assert error.location == SourceLocation(FILE, line, column)
    assert error.message.startswith(f"{FILE}:{line}:{column}: ")
    assert {k: error.to_json()["error"][k] for k in ("file", "line", "column")} == {
        "file": FILE,
        "line": line,
        "column": column,
    }


PIPELINE = """
pipeline:
  name: my-tts
  stages:
    - name: frontend
      process: pipeline
      next: [engine]
    - name: engine
      process: pipeline
      next: [vocoder]
      stream_to: [vocoder]
    - name: vocoder
      process: pipeline
"""


# -- schema errors ---------------------------------------------------------------------------------


def test_an_unknown_key_points_at_the_key():
    text = """
    model_path: demo
    stages:
      - name: vocoder
        proces: vocoder   # <- here
    """
    error = schema_error(text)
    assert_at(error, line_of(text, "here"), 5)
    assert "stages[0].proces: unknown key" in error.message


def test_a_value_of_the_wrong_type_points_at_its_key():
    text = """
    model_path: demo
    stages:
      - name: vocoder
        gpu: zero   # <- here
    """
    error = schema_error(text)
    assert_at(error, line_of(text, "here"), 5)
    assert "stages[0].gpu: gpu must be null" in error.message


def test_a_missing_field_points_at_its_entry():
    text = """
    pipeline:
      name: my-tts
      stages:
        - {name: a, process: p}
        - {process: p}   # <- here
    """
    error = schema_error(text)
    assert_at(error, line_of(text, "here"), 7)
    assert "pipeline.stages[1].name: required field is missing" in error.message


def test_malformed_yaml_points_at_the_parsers_mark():
    error = schema_error("model_path: demo\nstages: [unclosed\n")
    assert_at(error, 3, 1)
    assert "malformed YAML" in error.message


# -- structure errors ------------------------------------------------------------------------------


def test_an_unknown_stream_to_target_points_at_the_target():
    text = PIPELINE.replace("stream_to: [vocoder]", "stream_to: [decoder]   # <- here")
    error = plan_error(text)
    assert error.code is ErrorCode.INVALID_CONFIG
    assert_at(error, line_of(text, "here"), 19)
    assert error.message == (
        f"{FILE}:{line_of(text, 'here')}:19: stage 'engine': stream_to 'decoder' is not a stage; "
        "stages are 'frontend', 'engine', 'vocoder'"
    )


def test_an_unknown_next_target_points_at_the_target():
    text = PIPELINE.replace("next: [engine]", "next: [engin]   # <- here")
    error = plan_error(text)
    assert_at(error, line_of(text, "here"), 14)
    assert "stage 'frontend': next 'engin' is not a stage" in error.message


def test_a_cycle_points_at_the_next_link_that_closes_it():
    text = """
    pipeline:
      name: my-tts
      stages:
        - {name: a, process: p, next: [b]}
        - {name: b, process: p, next: [c]}
        - {name: c, process: p, next: [a]}   # <- here
    """
    error = plan_error(text)
    assert error.code is ErrorCode.INVALID_CONFIG and "form a cycle" in error.message
    assert_at(error, line_of(text, "here"), 36)


def test_a_duplicate_stage_name_points_at_the_second_declaration():
    text = """
    pipeline:
      name: my-tts
      stages:
        - {name: a, process: p, next: [b]}
        - {name: b, process: p}
        - name: b   # <- here
          process: p
    """
    error = plan_error(text)
    assert "stage 'b' is declared twice" in error.message
    assert_at(error, line_of(text, "here"), 7)


def test_a_stage_without_a_process_points_at_its_entry():
    text = """
    pipeline:
      name: my-tts
      stages:
        - {name: a, gpu: 0}   # <- here
    """
    error = plan_error(text)
    assert error.code is ErrorCode.MISSING_PROCESS
    assert_at(error, line_of(text, "here"), 7)


def test_an_override_of_an_unknown_stage_points_at_its_name():
    text = """
    model_path: qwen3-tts
    stages:
      - name: decoder   # <- here
        process: p
    """
    error = plan_error(text)
    assert error.code is ErrorCode.UNKNOWN_STAGE
    assert_at(error, line_of(text, "here"), 5)


def test_an_override_that_breaks_a_models_stage_points_at_the_field_it_set():
    text = """
    model_path: qwen3-tts
    stages:
      - name: vocoder
        gpu: [0, 1]   # <- here
    """
    error = plan_error(text)
    assert "lists GPUs [0, 1] but tp_size is 1" in error.message
    assert_at(error, line_of(text, "here"), 5)


# -- placement errors that name a config entry -------------------------------------------------------


def test_replicas_of_an_unknown_process_point_at_its_entry():
    text = """
    model_path: qwen3-tts
    processes:
      decoder: {replicas: 2}   # <- here
    """
    error = plan_error(text)
    assert error.code is ErrorCode.MISSING_PROCESS
    assert_at(error, line_of(text, "here"), 3)
    assert error.message.startswith(f"{FILE}:3:3: processes.decoder: there is no process group named 'decoder'")


def test_an_unsafe_split_the_config_made_points_at_the_process_it_set():
    """The docs promise FILE:LINE:COLUMN for every placement error about an entry of the file; UNSAFE_EDGE from
    an override's `process` read the same as the command-line option's, with no word of the file."""
    text = """
    model_path: voxtral-tts
    stages:
      - name: preprocessing
        process: pre   # <- here
    """
    error = plan_error(text)
    assert error.code is ErrorCode.UNSAFE_EDGE and error.edge == ("preprocessing", "tts_generation")
    assert_at(error, line_of(text, "here"), 5)


def test_an_unsafe_split_a_placement_option_made_names_no_config_entry():
    text = """
    model_path: voxtral-tts
    stages:
      - {name: preprocessing, args: {}}
    """
    error = plan_error(text, isolate_stages=("preprocessing",))
    assert error.code is ErrorCode.UNSAFE_EDGE
    assert error.location is None


def test_a_process_spanning_gpus_points_at_the_gpu_the_config_set():
    text = """
    model_path: audar-tts
    stages:
      - {name: vocoder, gpu: 1}   # <- here
    """
    error = plan_error(text)
    assert error.code is ErrorCode.GROUP_SPANS_GPUS
    assert_at(error, line_of(text, "here"), 21)


def test_a_process_spanning_gpus_because_of_an_option_names_the_option_not_the_gpu_entry():
    text = """
    model_path: audar-tts
    stages:
      - {name: vocoder, process: vocoder, gpu: 1, runtime: {resources: {total_gpu_memory_fraction: 0.5}}}
    """
    error = plan_error(text, stage_processes=("vocoder=pipeline",))
    assert error.code is ErrorCode.GROUP_SPANS_GPUS
    assert error.location is None and error.gpu == 1
    assert error.message.startswith(
        "--stage-process 'vocoder=pipeline' would put stages on different GPUs in process 'pipeline' "
        "('reference_encoder' on GPU 0, 'tts_engine' on GPU 0, 'vocoder' on GPU 1)"
    )


def test_an_unknown_model_path_points_at_the_key():
    text = """
    placement: {max_total_gpu_memory_fraction_per_gpu: 1.0}
    model_path: no-such-model   # <- here
    """
    error = plan_error(text)
    assert error.code is ErrorCode.UNKNOWN_MODEL
    assert_at(error, line_of(text, "here"), 1)


def test_a_node_for_no_process_group_names_the_node_entry():
    # replicate() refuses an unknown process first in plan_placement; the node check names its entry too.
    plan = plan_placement(PlacementRequest("qwen3-tts"))
    config = parse_config_source(yaml_text("processes:\n  decoder: {node: gpu-box}\n"), FILE)
    with pytest.raises(ConfigError) as caught:
        apply_process_nodes(plan, config.config)
    assert caught.value.config_path == ("processes", "decoder", "node")
    assert_at(config.locations.locate(caught.value), 2, 13)


def test_a_model_path_option_beside_a_full_pipeline_points_at_the_pipeline():
    error = plan_error(PIPELINE, model_path="qwen3-tts")
    assert "declared in full" in error.message
    assert_at(error, 1, 1)


def test_a_collision_made_by_a_placement_option_names_no_config_entry():
    """The declared names pass; only `--stage-process` makes the collision, so the file is not blamed."""
    text = """
    pipeline:
      name: my-tts
      stages:
        - {name: a, process: p, next: [b]}
        - {name: b, tp_size: 2, gpu: [0, 1], process: big}
    """
    error = plan_error(text, stage_processes=("a=big_tp0",))
    assert error.code is ErrorCode.NAME_COLLISION
    assert error.location is None and "line" not in error.to_json()["error"]


# -- without a file --------------------------------------------------------------------------------


def test_a_pipeline_built_in_code_keeps_its_message_and_has_no_location():
    pipeline = PipelineConfig(
        name="p",
        stages=(StageConfig(name="a", process="p", next=("b",)),),
    )
    with pytest.raises(ConfigError) as caught:
        plan_pipeline(pipeline)
    error = caught.value
    assert error.message == "pipeline: stage 'a': next 'b' is not a stage; stages are 'a'"
    assert error.location is None
    assert set(error.to_json()["error"]) == {"code", "message", "stages"}
