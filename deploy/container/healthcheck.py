"""Container HEALTHCHECK: exit 0 when the daemon's public gRPC health service reports SERVING."""

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

address = os.environ.get("STAGEVISOR_HEALTH_ADDRESS", "127.0.0.1:50551")
try:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="stagevisor.v1.Synthesis"), timeout=3
        )
except grpc.RpcError as error:
    print(f"unhealthy: {error.code().name} from {address}", file=sys.stderr)
    sys.exit(1)
sys.exit(0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1)
