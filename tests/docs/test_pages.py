"""What README.md and docs/ state by hand agrees with the code, and their tables render as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.S | re.M)


def _ids(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _cells(row: str) -> int:
    """The cells of a markdown table row: its unescaped pipes, less the leading and trailing ones."""
    return len(re.findall(r"(?<!\\)\|", row.strip())) - 1


@pytest.mark.parametrize("page", PAGES, ids=_ids)
def test_every_table_row_has_as_many_cells_as_its_header(page):
    """A row with a cell more than its header loses that cell when rendered: docs/guides/models.md's
    table of voices kept a fifth cell from an older layout in two rows, and no reader saw it."""
    lines = FENCE.sub(lambda block: "\n" * block.group().count("\n"), page.read_text()).splitlines()
    header = 0
    for number, line in enumerate(lines):
        row = line.strip()
        if not row.startswith("|"):
            header = 0
            continue
        if not header:
            header = _cells(row)
            continue
        assert _cells(row) == header, f"{_ids(page)}:{number + 1}: {_cells(row)} cells, its header {header}"


def test_the_grpc_page_lists_every_admin_method():
    """docs/api/grpc.md's table of Admin methods lacked `Apply`, which live-changes.md names."""
    proto = (ROOT / "proto/stagevisor/v1/admin.proto").read_text()
    methods = re.findall(r"^\s*rpc (\w+)\(", proto, re.M)
    page = (ROOT / "docs/api/grpc.md").read_text()
    assert methods and [m for m in methods if f"| `{m}` |" not in page] == []


def test_the_loopback_grpc_port_the_pages_show_is_the_daemon_s_default():
    """docs/operations/production.md showed `serve` listening on 127.0.0.1:50051; `--listen` defaults
    to 127.0.0.1:50551, so a newcomer comparing the two reads a port the daemon never uses."""
    from stagevisor.supervisor.addresses import DEFAULT_LISTEN

    host, port = DEFAULT_LISTEN.rsplit(":", 1)
    found = {
        (_ids(page), match)
        for page in PAGES
        for match in re.findall(rf"\b{re.escape(host)}:(5\d{{4}})\b", page.read_text())
        if match != port
    }
    assert found == set(), f"the default --listen port is {port}"


def test_the_http_status_table_names_json_error_codes():
    """Every HTTP error is OpenAI's JSON envelope; docs/api/http.md's status table still gave a Host refusal
    as starlette's plain-text `Invalid host header`, which the daemon answers with code `invalid_host`."""
    page = (ROOT / "docs/api/http.md").read_text()
    table = page.split("## Status codes and what a client should do", 1)[1].split("\n\n", 2)[1]
    codes = [code for row in table.splitlines()[2:] for code in re.findall(r"`([^`]*)`", row.split("|")[2])]
    assert codes and [code for code in codes if not re.fullmatch(r"[a-z_]+", code)] == []


def test_the_concepts_diagram_draws_the_demo_s_edges():
    """docs/concepts.md draws the demo's pipeline; it kept preprocessing -> tts_engine a plain `next` after
    the demo's preprocessing began streaming each sentence to the engine (a `stream_to` edge too)."""
    from stagevisor.models.registry import builtin_models

    demo = next(model.pipeline for model in builtin_models() if model.key == "demo")
    streamed = {(stage.name, target) for stage in demo.stages for target in stage.stream_to}
    drawn = FENCE.search((ROOT / "docs/concepts.md").read_text())
    assert drawn is not None
    links = re.findall(r"(\w+) (══stream══>|──>) (?=(\w+))", drawn.group())
    between_stages = {(src, dst): arrow for src, arrow, dst in links if {src, dst} <= set(demo.stage_names)}
    assert set(between_stages) == {(stage.name, target) for stage in demo.stages for target in stage.next}
    assert {edge for edge, arrow in between_stages.items() if arrow == "══stream══>"} == streamed


def test_the_config_errors_topology_md_shows_are_what_plan_says_of_its_pipeline():
    """docs/guides/topology.md shows three errors as made in its pipeline declared in full; two of them read
    `stages[0].proces` at 4:5 and `processes.decoder` at 3:3, lines of some other file: in that pipeline
    the entries are `pipeline.stages[0].proces` at 7:7 and `processes.decoder` at 28:3."""
    from stagevisor.supervisor.errors import StagevisorError
    from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement

    page = (ROOT / "docs/guides/topology.md").read_text()
    pipeline = page.split("A pipeline declared in full:\n\n```yaml\n", 1)[1].split("```", 1)[0]
    shown = page.split("pipeline for a group that does not exist:\n\n```text\n", 1)[1].split("```", 1)[0].splitlines()
    mistakes = [
        pipeline.replace("stream_to: [vocoder]", "stream_to: [decoder]"),
        pipeline.replace("      process: pipeline  ", "      proces: pipeline   ", 1),
        pipeline + "processes:\n  decoder:\n    replicas: 2\n",
    ]
    assert all(text != pipeline for text in mistakes) and len(shown) == len(mistakes)
    for text, line in zip(mistakes, shown, strict=True):
        with pytest.raises(StagevisorError) as refused:
            plan_placement(PlacementRequest(config_path="my-tts.yaml", config_text=text))
        said = f"error: {refused.value}"
        assert said == line or (line.endswith(" ...") and said.startswith(line[: -len(" ...")])), said


def test_the_admission_rejection_reasons_deploy_readme_lists_are_the_daemon_s():
    """deploy/README.md listed BUSY, QUEUE_TIMEOUT and DRAINING for stagevisor_admission_rejections_total after the
    daemon began refusing requests that come while it starts (STARTING), a series a dashboard then missed."""
    from stagevisor.supervisor.dataplane.admission import Admission

    readme = (ROOT / "deploy/README.md").read_text()
    [row] = [line for line in readme.splitlines() if line.startswith("| `stagevisor_admission_rejections_total` |")]
    listed = re.search(r"reason \(([A-Z_, ]+)\)", row)
    assert listed is not None and set(listed.group(1).split(", ")) == set(Admission().rejected)
