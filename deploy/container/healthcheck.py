"""Container HEALTHCHECK and Kubernetes liveness probe: exit 0 while the daemon's public gRPC health service answers.

This is liveness, as HTTP `/health` is: any answer, SERVING or NOT_SERVING, means the daemon is alive. Readiness
(NOT_SERVING while a process group restarts, reloads its model or has a silent worker) moves traffic away; it must
not get the container restarted, which would throw away the restart the daemon is already doing. The readiness
status is printed, so `docker inspect` shows it in the health log.
"""

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVICE = "stagevisor.v1.Synthesis"


def check(address: str, timeout: float = 3.0) -> int:
    """0 when the daemon at `address` answers its health check, whatever the status; 1 when it does not."""
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=SERVICE), timeout=timeout
            )
    except grpc.RpcError as error:
        print(f"unhealthy: the daemon does not answer at {address}: {error.code().name}", file=sys.stderr)
        return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"alive: {SERVICE} is {status} (readiness) at {address}")
    return 0


if __name__ == "__main__":
    sys.exit(check(os.environ.get("STAGEVISOR_HEALTH_ADDRESS", "127.0.0.1:50551")))
