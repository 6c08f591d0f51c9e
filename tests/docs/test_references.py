"""The generated CLI and configuration references match the parser and the schema they come from."""

from __future__ import annotations

import pytest

from tests.docs import generate


@pytest.mark.parametrize("path", sorted(generate.outputs()), ids=lambda p: p.name)
def test_generated_reference_is_current(path):
    expected = generate.outputs()[path]
    assert path.exists(), f"{path} is missing; run `python tests/docs/generate.py`"
    assert path.read_text() == expected, f"{path} is stale; run `python tests/docs/generate.py` and commit it"


def test_every_config_field_has_a_description():
    for model in generate.CONFIG_MODELS:
        for name, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{name} needs description= (it is what the reference shows)"


def test_every_command_is_in_the_cli_reference():
    text = generate.cli_reference()
    parser = generate.build_parser()
    for name in parser.commands:
        assert f"## stagevisor {name}\n" in text
