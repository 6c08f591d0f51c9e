"""Property: whatever YAML and options `stagevisor plan` gets, it exits 0 or 2 with a coded error, never a traceback.

Hypothesis builds configs near the schema (so they reach placement, not just
the YAML parser), mutates them, and adds raw text and option lists.
"""

from __future__ import annotations

import pytest
import json
import os
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stagevisor.models.registry import builtin_models
from stagevisor.supervisor.cli import main
from stagevisor.supervisor.errors import ErrorCode

# the quick subset (-m 'not slow', docs/testing.md) leaves this file out: the voice or hypothesis, minutes under load
pytestmark = pytest.mark.slow

MODELS = builtin_models()
MODEL_PATHS = [p for m in MODELS for p in m.paths] + [m.key for m in MODELS]
STAGE_NAMES = sorted({s.name for m in MODELS for s in m.pipeline.stages} | {"vocoder", "decoder", "x"})
CODES = {code.value for code in ErrorCode}

names = st.one_of(
    st.sampled_from(STAGE_NAMES),
    st.sampled_from(["pipeline", "frontend", "", "a b", "../x", "-"]),
    st.text(max_size=12),
)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True), st.text(max_size=8), st.just(10**400)
)
fractions = st.one_of(
    st.none(), st.floats(min_value=-1, max_value=2), st.sampled_from([0, 0.1, 0.5, 1, "0.2"]), scalars
)
gpus = st.one_of(st.none(), st.integers(-1, 3), st.lists(st.integers(0, 3), max_size=3), scalars)
name_lists = st.one_of(st.lists(names, max_size=3), names, scalars)


@st.composite
def stage_entry(draw):
    entry = {"name": draw(names)}
    for key, values in (
        ("process", names),
        ("gpu", gpus),
        ("next", name_lists),
        ("stream_to", name_lists),
        ("tp_size", st.one_of(st.integers(-1, 4), scalars)),
        ("factory", st.sampled_from(["stagevisor.stages.piper.executors:vocoder", "nope", "a:b:c", ""])),
        ("args", st.one_of(st.dictionaries(st.text(max_size=4), scalars, max_size=2), scalars)),
    ):
        if draw(st.booleans()):
            entry[key] = draw(values)
    if draw(st.booleans()):
        entry["runtime"] = {"resources": {"total_gpu_memory_fraction": draw(fractions)}}
    if draw(st.integers(0, 9)) == 0:
        entry[draw(st.text(max_size=6))] = draw(scalars)  # an unknown key
    return entry


@st.composite
def config(draw):
    data: dict = {}
    if draw(st.booleans()):
        data["model_path"] = draw(st.one_of(st.sampled_from(MODEL_PATHS), st.text(max_size=10), scalars))
    if draw(st.booleans()):
        data["stages"] = draw(st.one_of(st.lists(stage_entry(), max_size=4), scalars))
    if draw(st.integers(0, 3)) == 0:
        pipeline = {"name": draw(names), "stages": draw(st.lists(stage_entry(), max_size=4))}
        if draw(st.booleans()):
            pipeline["process_safe_edges"] = draw(st.lists(st.lists(names, max_size=3), max_size=3))
        if draw(st.booleans()):
            pipeline["role_aliases"] = draw(st.dictionaries(names, names, max_size=2))
        data["pipeline"] = pipeline
    if draw(st.integers(0, 5)) == 0:
        data[draw(st.text(max_size=6))] = draw(scalars)
    return data


options = st.lists(
    st.one_of(
        st.tuples(st.just("--isolate-stage"), names),
        st.tuples(
            st.just("--stage-process"),
            st.builds(lambda s, p, sep: f"{s}{sep}{p}", names, names, st.sampled_from(["=", "==", ""])),
        ),
        st.tuples(st.just("--model-path"), st.one_of(st.sampled_from(MODEL_PATHS), st.text(max_size=10))),
    ),
    max_size=4,
).map(lambda pairs: [part for pair in pairs for part in pair])

raw_yaml = st.one_of(
    st.text(max_size=200),
    st.sampled_from(
        [
            "a: &a [1, 2]\nb: &b [*a, *a, *a, *a]\nc: &c [*b, *b, *b, *b]\nd: [*c, *c, *c, *c]\n",  # alias fan-out
            "stages: !!python/object/apply:os.system ['true']\n",
            "- just\n- a list\n",
            "model_path: [unclosed\n",
            "\t",
            "stages:\n  - name: vocoder\n    gpu: 0x10\n",
        ]
    ),
)


def run_plan(capsys, text: str, argv: list[str]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "config.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        code = main(["plan", "--config", str(path), *argv, "--format", "json"])
    out, err = capsys.readouterr()
    assert code in (0, 2), (code, out, err)
    if code == 0:
        assert "groups" in json.loads(out)
        return
    body = json.loads(out)["error"]
    assert body["code"] in CODES
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert len(err) < 20_000  # echoed values are bounded


PROPERTY = settings(
    max_examples=int(os.environ.get("STAGEVISOR_HYPOTHESIS_EXAMPLES", "100")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@PROPERTY
@given(data=config(), argv=options)
def test_plan_on_random_configs_and_options_exits_0_or_2_with_a_code(capsys, data, argv):
    run_plan(capsys, yaml.safe_dump(data, allow_unicode=True), argv)


@PROPERTY
@given(text=raw_yaml, argv=options)
def test_plan_on_random_text_exits_0_or_2_with_a_code(capsys, text, argv):
    run_plan(capsys, text, argv)
