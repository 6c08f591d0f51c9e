"""The start-up warning when shared memory cannot be used gives the advice that fits the cause."""

import logging
import os

from stagevisor.supervisor.dataplane import shm
from stagevisor.supervisor.dataplane.gateway import Gateway
from stagevisor.supervisor.placement.request import PlacementRequest, plan_placement


def fallback_warning(root, caplog) -> str:
    plan = plan_placement(PlacementRequest("demo"))
    routes = {s.name: "unix:/nonexistent/g0.sock" for s in plan.stages}
    gateway = Gateway(plan, routes, "unix:/nonexistent/sink.sock", shm_root=root)
    with caplog.at_level(logging.WARNING, logger="stagevisor.supervisor.dataplane.gateway"):
        gateway._start_shared_memory()
    assert gateway.shm_room is not None and not gateway.shm_room.ok
    (message,) = [r.getMessage() for r in caplog.records if "SHM_FALLBACK" in r.getMessage()]
    return message


def test_a_shared_memory_directory_this_user_cannot_write_to_is_to_be_fixed_not_enlarged(tmp_path, caplog, monkeypatch):
    access = os.access
    monkeypatch.setattr(shm.os, "access", lambda path, mode: not mode & os.W_OK and access(path, mode))
    message = fallback_warning(tmp_path, caplog)  # as root every directory is writable: the denial is simulated
    assert f"{tmp_path} is not a writable directory" in message
    assert f"make {tmp_path} a directory this user can write to" in message and "STAGEVISOR_SHM_DIR" in message
    assert "--shm-size" not in message and "more room" not in message


def test_a_shared_memory_directory_too_small_is_to_be_enlarged(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(shm, "free_bytes", lambda root: 1024 * 1024)
    message = fallback_warning(tmp_path, caplog)
    assert "--shm-size" in message and f"give {tmp_path} more room" in message
