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


def test_the_restart_backoff_the_operator_docs_describe_is_the_daemon_s():
    """deploy/README.md and docs/operations/supervision.md give the backoff's cap in prose; an operator
    reading 30 s while the daemon retries every 10 s misreads a crash loop's events."""
    import re
    from pathlib import Path

    from stagevisor.supervisor.daemon.options import DaemonOptions

    root = Path(__file__).resolve().parents[2]
    cap = f"{DaemonOptions.backoff_max:g} s"
    for doc in ("deploy/README.md", "docs/operations/supervision.md"):
        caps = re.findall(r"capped at (\d+(?:\.\d+)? s)\b", (root / doc).read_text())
        assert caps and set(caps) == {cap}, f"{doc} gives the backoff cap as {caps}; the daemon's is {cap}"


def test_the_models_guide_table_states_each_declarations_safe_edges_and_recommended_fractions():
    """docs/guides/models.md restates the applicability table by hand; a declaration that changes an edge's
    safety or a recommended fraction must change the guide with it."""
    from pathlib import Path

    from stagevisor.models.registry import builtin_models

    root = Path(__file__).resolve().parents[2]
    rows = {}
    for line in (root / "docs/guides/models.md").read_text().splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0].strip("`")] = cells
    for model in builtin_models():
        pipeline = model.pipeline
        _, _, stages, safe, recommended = rows[model.key]
        assert stages == " -> ".join(pipeline.stage_names), model.key
        assert safe == ("; ".join(f"{a} -> {b}" for a, b in pipeline.process_safe_edges) or "none"), model.key
        for resources in pipeline.process_edge_resources:
            values = ", ".join(f"{stage} {value:.2f}" for stage, value in resources.fractions.items())
            assert recommended == f"{resources.edge[0]} -> {resources.edge[1]}: {values}", model.key
        if not pipeline.process_edge_resources:
            assert recommended.startswith("none") or recommended == "-", model.key


def test_the_cli_reference_is_the_same_whoever_generates_it(monkeypatch):
    """The admin socket's and the voices directory's defaults were written as the generating user's
    (`unix:/tmp/stagevisor-0/admin.sock`, `/root/.local/share/...`): wrong for every other user, and
    the committed file went stale for anyone else who ran the generator."""
    for name in ("STAGEVISOR_RUNTIME_DIR", "XDG_RUNTIME_DIR", "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)
    here = generate.cli_reference()
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/4242")
    monkeypatch.setenv("XDG_DATA_HOME", "/home/someone/.data")
    assert generate.cli_reference() == here
    assert "`unix:<runtime-dir>/admin.sock`" in here and "`<data-home>/stagevisor/voices`" in here


def test_every_error_code_is_documented():
    """INSECURE_ENDPOINT, which `serve` and the admin commands print with --format json, was in no document."""
    from pathlib import Path

    from stagevisor.supervisor.errors import ErrorCode

    root = Path(__file__).resolve().parents[2]
    docs = [*sorted((root / "docs").rglob("*.md")), root / "deploy" / "README.md"]
    text = "\n".join(doc.read_text() for doc in docs)
    assert [code.value for code in ErrorCode if f"`{code.value}`" not in text] == []
