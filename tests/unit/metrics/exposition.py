"""Metrics as the tests read and feed them: a registry's exposition parsed as a Prometheus scrape reads it
(`parse`), and a worker's MetricsReport (`report`)."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stagevisor.supervisor._proto import dataplane_pb2 as pb
from stagevisor.supervisor.metrics.buckets import bin_values


def parse(registry) -> dict:
    """{(sample name, frozenset(labels)): value} of a registry's exposition, via the client's own parser."""
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def report(pid, count, handoffs, in_flight=0, calls=None):
    """The MetricsReport worker `pid` of group g2 sends: `count` calls of stage c, `handoffs` on the edge b -> c."""
    message = pb.MetricsReport(group="g2", pid=pid)
    message.stages.add(
        stage="c",
        count=count,
        sum=0.01 * count,
        buckets=bin_values([0.01] * count),
        in_flight=in_flight,
        calls=count if calls is None else calls,
    )
    message.edges.add(
        src="b",
        dst="c",
        transport="grpc",
        handoffs=handoffs,
        bytes=100 * handoffs,
        latency_count=handoffs,
        latency_sum=0.001 * handoffs,
        latency_buckets=bin_values([0.001] * handoffs),
    )
    return message
