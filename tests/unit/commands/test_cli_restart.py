"""`stagevisor restart`: what it prints for one worker and for a replicated group's rolling restart."""

from stagevisor.supervisor._proto import admin_pb2
from stagevisor.supervisor.cli import main
from stagevisor.supervisor.commands import workers
from stagevisor.supervisor.reports import GroupReport, ReplicaReport, TopologyReport


class _Stub:
    """The admin API after a restart: the reply names the first old and the last new pid, as the daemon sends."""

    def __init__(self, reply: admin_pb2.RestartGroupResponse, topology: TopologyReport) -> None:
        self.reply, self.topology = reply, topology

    def RestartGroup(self, request, timeout):
        return self.reply

    def GetTopology(self, request, timeout):
        return self.topology.to_proto()


def _daemon(monkeypatch, reply: admin_pb2.RestartGroupResponse, groups: tuple[GroupReport, ...]) -> None:
    stub = _Stub(reply, TopologyReport("demo", None, False, groups, (), (), ()))
    monkeypatch.setattr(workers, "call", lambda args, method: method(stub))


def _vocoder(**fields) -> GroupReport:
    return GroupReport("vocoder", ("vocoder",), None, None, None, state="READY", **fields)


def test_a_replicated_group_names_each_replica_s_new_pid(capsys, monkeypatch, tmp_path):
    """It printed `pid 10 -> 21`: vocoder/0's old pid beside vocoder/1's new one, as if one worker had been replaced."""
    replicas = tuple(ReplicaReport(f"vocoder/{i}", i, None, 20 + i, "READY", 1) for i in range(2))
    reply = admin_pb2.RestartGroupResponse(name="vocoder", old_pid=10, new_pid=21, state="READY")
    _daemon(monkeypatch, reply, (_vocoder(pid=None, restarts=2, replicas=2, workers=replicas),))
    assert main(["restart", "vocoder", "--admin-address", f"unix:{tmp_path}/admin.sock"]) == 0
    assert capsys.readouterr().out == (
        "restarted group vocoder, one replica at a time: vocoder/0 pid 20, vocoder/1 pid 21 (READY)\n"
    )


def test_one_worker_shows_its_old_and_new_pid(capsys, monkeypatch, tmp_path):
    reply = admin_pb2.RestartGroupResponse(name="vocoder", old_pid=10, new_pid=11, state="READY")
    _daemon(monkeypatch, reply, (_vocoder(pid=11, restarts=1),))
    assert main(["restart", "vocoder", "--admin-address", f"unix:{tmp_path}/admin.sock"]) == 0
    assert capsys.readouterr().out == "restarted group vocoder: pid 10 -> 11 (READY)\n"


class _Deadline(Exception):
    def code(self):
        import grpc

        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self):
        return "Deadline Exceeded"


def test_a_restart_that_outlasts_the_wait_says_it_goes_on_in_the_daemon(capsys, monkeypatch, tmp_path):
    """It said only `error: Deadline Exceeded`, as if the restart had failed; the daemon's restart goes on."""
    import grpc

    class Slow(_Stub):
        def RestartGroup(self, request, timeout):
            assert timeout == workers.START_WAIT
            raise type("Late", (_Deadline, grpc.RpcError), {})()

    stub = Slow(admin_pb2.RestartGroupResponse(), TopologyReport("demo", None, False, (), (), (), ()))
    monkeypatch.setattr(workers, "call", lambda args, method: method(stub))
    assert main(["restart", "vocoder", "--admin-address", f"unix:{tmp_path}/admin.sock"]) == 1
    err = capsys.readouterr().err
    assert "the restart of group 'vocoder' has not finished after 900 s" in err
    assert "goes on in the daemon" in err and "stagevisor events" in err


def test_json_names_a_single_worker_s_old_and_new_pid(capsys, monkeypatch, tmp_path):
    import json

    reply = admin_pb2.RestartGroupResponse(name="vocoder", old_pid=10, new_pid=11, state="READY")
    _daemon(monkeypatch, reply, (_vocoder(pid=11, restarts=1),))
    assert main(["restart", "vocoder", "--admin-address", f"unix:{tmp_path}/admin.sock", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "group": "vocoder",
        "old_pid": 10,
        "new_pid": 11,
        "state": "READY",
        "workers": [],
    }


def test_json_of_a_rolling_restart_names_each_replica_and_no_pair_of_pids(capsys, monkeypatch, tmp_path):
    """The reply's old and new pid belong to two different replicas: JSON does not pair them as one worker's."""
    import json

    replicas = tuple(ReplicaReport(f"vocoder/{i}", i, None, 20 + i, "READY", 1) for i in range(2))
    reply = admin_pb2.RestartGroupResponse(name="vocoder", old_pid=10, new_pid=21, state="READY")
    _daemon(monkeypatch, reply, (_vocoder(pid=None, restarts=2, replicas=2, workers=replicas),))
    assert main(["restart", "vocoder", "--admin-address", f"unix:{tmp_path}/admin.sock", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "group": "vocoder",
        "old_pid": None,
        "new_pid": None,
        "state": "READY",
        "workers": [{"name": "vocoder/0", "pid": 20}, {"name": "vocoder/1", "pid": 21}],
    }


def test_json_of_an_unknown_group_is_the_missing_process_error(capsys, monkeypatch, tmp_path):
    import json

    import grpc

    class Missing(_Deadline, grpc.RpcError):
        def code(self):
            return grpc.StatusCode.NOT_FOUND

        def details(self):
            return "no process group 'vocodr'; groups: pipeline, vocoder"

    class Stub(_Stub):
        def RestartGroup(self, request, timeout):
            raise Missing()

    stub = Stub(admin_pb2.RestartGroupResponse(), TopologyReport("demo", None, False, (), (), (), ()))
    monkeypatch.setattr(workers, "call", lambda args, method: method(stub))
    assert main(["restart", "vocodr", "--admin-address", f"unix:{tmp_path}/admin.sock", "--format", "json"]) == 2
    out, err = capsys.readouterr()
    assert err == "error: no process group 'vocodr'; groups: pipeline, vocoder\n"
    assert json.loads(out)["error"] == {
        "code": "MISSING_PROCESS",
        "message": "no process group 'vocodr'; groups: pipeline, vocoder",
    }


def test_a_placement_refusal_prints_its_message_as_every_error_line_does(capsys, monkeypatch, tmp_path):
    """The line read `error: OVER_LIMIT: restarting ...` while an unknown group's read `error: no process group ...`
    (and plan's and apply's carry no code): the code is the JSON object's, the line is `error: <message>`."""
    import json

    import grpc

    detail = "restarting group 'vocoder' needs room for a second worker: GPU 0 would carry 1.9, over the limit 1"

    class Refused(_Deadline, grpc.RpcError):
        def code(self):
            return grpc.StatusCode.FAILED_PRECONDITION

        def details(self):
            return f"OVER_LIMIT: {detail}"

    class Stub(_Stub):
        def RestartGroup(self, request, timeout):
            raise Refused()

    stub = Stub(admin_pb2.RestartGroupResponse(), TopologyReport("demo", None, False, (), (), (), ()))
    monkeypatch.setattr(workers, "call", lambda args, method: method(stub))
    assert main(["restart", "vocoder", "--admin-address", f"unix:{tmp_path}/admin.sock", "--format", "json"]) == 2
    out, err = capsys.readouterr()
    assert err == f"error: {detail}\n"
    assert json.loads(out)["error"] == {"code": "OVER_LIMIT", "message": detail}
