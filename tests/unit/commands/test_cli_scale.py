"""`stagevisor scale GROUP=N`: a malformed or out-of-range count is refused before any daemon is dialled;
a refusal by the placement rules exits 2, its code in the JSON error object and not in the `error:` line."""

import grpc
import pytest

from stagevisor.supervisor.cli import main
from stagevisor.supervisor.commands import workers


@pytest.mark.parametrize("assignment", ["vocoder=", "=2", "vocoder", " =2"])
def test_a_malformed_assignment_exits_2_with_the_form_to_write(capsys, tmp_path, assignment):
    code = main(["scale", assignment, "--admin-address", f"unix:{tmp_path}/none.sock"])
    assert code == 2
    assert capsys.readouterr().err == (
        f"error: {assignment!r} is malformed; write GROUP=N, e.g. stagevisor scale pipeline=3\n"
    )


def test_the_malformed_assignments_example_is_the_first_of_scale_help(capsys):
    """It said `stagevisor scale vocoder=2`, a group the quickstart daemon (the default voice as declared) lacks,
    where `--help` shows `pipeline`."""
    with pytest.raises(SystemExit):
        main(["scale", "--help"])
    assert "examples:\n  stagevisor scale pipeline=3\n" in capsys.readouterr().out


@pytest.mark.parametrize("count", ["0", "-1", "65", "99999999999"])  # the last is past the admin API's int32 too
def test_a_count_out_of_range_exits_2_naming_the_range(capsys, tmp_path, count):
    code = main(["scale", f"vocoder={count}", "--admin-address", f"unix:{tmp_path}/none.sock"])
    assert code == 2
    assert capsys.readouterr().err == f"error: 'vocoder={count}': replicas must be from 1 to 64, got {count}\n"


@pytest.mark.parametrize("count", ["two", "²", "١", "1.5", "+2"])
def test_a_count_that_is_no_whole_number_exits_2_as_process_replicas_says_it(capsys, tmp_path, count):
    """Before: `vocoder=-1` was "malformed; write GROUP=N" while `vocoder=0` named the range; then `-1` read "must be
    an integer ..., got str '-1'" (an integer, and Python's type name): out of range now, as 0 is."""
    code = main(["scale", f"vocoder={count}", "--admin-address", f"unix:{tmp_path}/none.sock"])
    assert code == 2
    assert capsys.readouterr().err == (
        f"error: 'vocoder={count}': replicas must be an integer from 1 to 64, got {count!r}\n"
    )


class _Refused(grpc.RpcError):
    """What the admin API answers a scale the placement rules refuse with."""

    def __init__(self, status: grpc.StatusCode, details: str) -> None:
        self._status, self._details = status, details

    def code(self) -> grpc.StatusCode:
        return self._status

    def details(self) -> str:
        return self._details


def _answer(monkeypatch, error: grpc.RpcError) -> None:
    def refuse(args, method):
        raise error

    monkeypatch.setattr(workers, "call", refuse)


def test_a_placement_refusal_exits_2_like_plan_and_apply_its_line_the_message_alone(capsys, monkeypatch, tmp_path):
    """A scale over the GPU budget exited 1, though `plan` and `apply` exit 2 on the same refusal; then its line read
    `error: OVER_LIMIT: GPU 0 ...` where apply's, restart's NOT_FOUND and plan's read `error: GPU 0 ...`."""
    detail = "GPU 0 would carry total_gpu_memory_fraction 1.9 (pipeline 0.85 x 2), over the limit 1"
    _answer(monkeypatch, _Refused(grpc.StatusCode.FAILED_PRECONDITION, f"OVER_LIMIT: {detail}"))
    code = main(["scale", "pipeline=2", "--admin-address", f"unix:{tmp_path}/admin.sock"])
    assert code == 2
    assert capsys.readouterr().err == f"error: {detail}\n"


def test_a_failure_that_is_not_a_placement_refusal_still_exits_1(capsys, monkeypatch, tmp_path):
    _answer(monkeypatch, _Refused(grpc.StatusCode.INTERNAL, "a new replica of group 'pipeline' failed to start"))
    code = main(["scale", "pipeline=2", "--admin-address", f"unix:{tmp_path}/admin.sock"])
    assert code == 1
    assert capsys.readouterr().err == "error: a new replica of group 'pipeline' failed to start\n"


def test_a_scale_that_outlasts_the_wait_says_it_goes_on_in_the_daemon(capsys, monkeypatch, tmp_path):
    """It said only `error: Deadline Exceeded`, as if the scale had failed; the daemon's scale goes on."""

    class Stub:
        def ScaleGroup(self, request, timeout):
            assert timeout == workers.START_WAIT
            raise _Refused(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    monkeypatch.setattr(workers, "call", lambda args, method: method(Stub()))
    assert main(["scale", "vocoder=2", "--admin-address", f"unix:{tmp_path}/admin.sock"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the scale of group 'vocoder' has not finished after 900 s")
    assert "goes on in the daemon" in err and "stagevisor events" in err


def test_json_reports_the_scale_and_the_workers(capsys, monkeypatch, tmp_path):
    import json

    from stagevisor.supervisor._proto import admin_pb2

    class Stub:
        def ScaleGroup(self, request, timeout):
            assert (request.name, request.replicas) == ("vocoder", 2)
            return admin_pb2.ScaleGroupResponse(
                name="vocoder", old_replicas=1, new_replicas=2, workers=["vocoder/0", "vocoder/1"], pids=[41, 0]
            )

    monkeypatch.setattr(workers, "call", lambda args, method: method(Stub()))
    assert main(["scale", "vocoder=2", "--admin-address", f"unix:{tmp_path}/admin.sock", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "group": "vocoder",
        "old_replicas": 1,
        "new_replicas": 2,
        "workers": [{"name": "vocoder/0", "pid": 41}, {"name": "vocoder/1", "pid": None}],
    }


def test_json_of_a_daemon_that_sends_no_pids_still_lists_every_worker(capsys, monkeypatch, tmp_path):
    """A daemon from before ScaleGroupResponse.pids: its workers are listed, their pids unknown (null)."""
    import json

    from stagevisor.supervisor._proto import admin_pb2

    class Stub:
        def ScaleGroup(self, request, timeout):
            return admin_pb2.ScaleGroupResponse(name="vocoder", old_replicas=2, new_replicas=1, workers=["vocoder"])

    monkeypatch.setattr(workers, "call", lambda args, method: method(Stub()))
    assert main(["scale", "vocoder=1", "--admin-address", f"unix:{tmp_path}/admin.sock", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["workers"] == [{"name": "vocoder", "pid": None}]


@pytest.mark.parametrize(
    "assignment, code",
    [("vocoder=two", "MALFORMED_ASSIGNMENT"), ("vocoder=65", "MALFORMED_ASSIGNMENT")],
)
def test_json_of_a_refused_count_is_an_error_object_on_stdout(capsys, tmp_path, assignment, code):
    import json

    argv = ["scale", assignment, "--admin-address", f"unix:{tmp_path}/none.sock", "--format", "json"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    error = json.loads(out)["error"]
    assert error["code"] == code and err == f"error: {error['message']}\n"


def test_json_of_a_placement_refusal_keeps_its_code(capsys, monkeypatch, tmp_path):
    import json

    detail = "GPU 0 would carry total_gpu_memory_fraction 1.9 (pipeline 0.85 x 2), over the limit 1"
    _answer(monkeypatch, _Refused(grpc.StatusCode.FAILED_PRECONDITION, f"OVER_LIMIT: {detail}"))
    argv = ["scale", "pipeline=2", "--admin-address", f"unix:{tmp_path}/admin.sock", "--format", "json"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err == f"error: {detail}\n"
    assert json.loads(out)["error"] == {"code": "OVER_LIMIT", "message": detail}


@pytest.mark.parametrize(
    "status, detail",
    [
        (grpc.StatusCode.FAILED_PRECONDITION, "cannot scale group 'pipeline' while the daemon is STOPPING"),
        (grpc.StatusCode.INTERNAL, "a new replica of group 'pipeline' failed to start"),
    ],
)
def test_json_of_a_refusal_that_is_no_placement_error_is_an_error_object_on_stdout(
    capsys, monkeypatch, tmp_path, status, detail
):
    """stdout was empty: a script reading the documented {"error": {"code", "message"}} got nothing."""
    import json

    _answer(monkeypatch, _Refused(status, detail))
    argv = ["scale", "pipeline=2", "--admin-address", f"unix:{tmp_path}/admin.sock", "--format", "json"]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert err == f"error: {detail}\n"
    assert json.loads(out)["error"] == {"code": "DAEMON_REFUSED", "message": detail}


@pytest.mark.parametrize(
    "old, new, said",
    [
        (1, 2, "scaled group vocoder: 1 -> 2 replicas (w pid 41)"),
        (2, 1, "scaled group vocoder: 2 -> 1 replica (w pid 41)"),
        (1, 1, "group vocoder already has 1 replica (w pid 41): nothing changed"),  # was "1 -> 1 replicas"
    ],
)
def test_the_table_says_what_the_scale_did_in_words(capsys, monkeypatch, tmp_path, old, new, said):
    from stagevisor.supervisor._proto import admin_pb2

    class Stub:
        def ScaleGroup(self, request, timeout):
            return admin_pb2.ScaleGroupResponse(
                name="vocoder", old_replicas=old, new_replicas=new, workers=["w"], pids=[41]
            )

    monkeypatch.setattr(workers, "call", lambda args, method: method(Stub()))
    assert main(["scale", f"vocoder={new}", "--admin-address", f"unix:{tmp_path}/admin.sock"]) == 0
    assert capsys.readouterr().out == said + "\n"
