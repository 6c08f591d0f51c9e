"""`stagevisor scale GROUP=N`: a malformed or out-of-range count is refused before any daemon is dialled."""

import pytest

from stagevisor.supervisor.cli import main


@pytest.mark.parametrize("assignment", ["vocoder=", "=2", "vocoder=two", "vocoder=²", "vocoder=١", "vocoder=-1"])
def test_a_malformed_assignment_exits_2_with_the_form_to_write(capsys, tmp_path, assignment):
    code = main(["scale", assignment, "--admin-address", f"unix:{tmp_path}/none.sock"])
    assert code == 2
    assert capsys.readouterr().err == (
        f"error: {assignment!r} is malformed; write GROUP=N, e.g. stagevisor scale vocoder=2\n"
    )


@pytest.mark.parametrize("count", ["0", "65", "99999999999"])  # the last is past the admin API's int32 too
def test_a_count_out_of_range_exits_2_naming_the_range(capsys, tmp_path, count):
    code = main(["scale", f"vocoder={count}", "--admin-address", f"unix:{tmp_path}/none.sock"])
    assert code == 2
    assert capsys.readouterr().err == f"error: 'vocoder={count}': replicas must be from 1 to 64, got {count}\n"
