"""The handle of a worker's host actor as the daemon calls it: the WorkerHost methods (cluster/host.py), remotely.

The seam between RayWorker (cluster/worker.py) and Ray: a Ray actor handle
has one attribute per method of its class, whose `.remote(*args)` sends the
call and returns an ObjectRef at once. Typed here so that the launcher names
the methods it calls, and a fake actor (tests/unit/cluster) stands in for Ray.
No Ray import: the daemon imports this module whether or not Ray is installed.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import ParamSpec, Protocol, TypeVar

from stagevisor.supervisor.cluster.host import HostHandshake

P = ParamSpec("P")
R = TypeVar("R")


class ObjectRef(Protocol[R]):
    """What `.remote()` returns (Ray's ObjectRef): the call's result to come, as a concurrent Future."""

    def future(self) -> Future[R]: ...


class RemoteMethod(Protocol[P, R]):
    """One method of an actor handle: `.remote(*args)` sends the call to the actor, without waiting for it."""

    def remote(self, *args: P.args, **kwargs: P.kwargs) -> ObjectRef[R]: ...


class HostActor(Protocol):
    """The WorkerHost methods RayWorker calls on its actor, each with the arguments and result of host.py's own."""

    @property
    def pid(self) -> RemoteMethod[[], int]: ...

    @property
    def devices(self) -> RemoteMethod[[], dict[str, str]]: ...

    @property
    def launch(self) -> RemoteMethod[[str], int]: ...

    @property
    def handshake(self) -> RemoteMethod[[float], HostHandshake]: ...

    @property
    def wait_exit(self) -> RemoteMethod[[], int | None]: ...

    @property
    def unresponsive(self) -> RemoteMethod[[float], float | None]: ...

    @property
    def next_beat(self) -> RemoteMethod[[], bool]: ...

    @property
    def signal(self) -> RemoteMethod[[int], None]: ...
