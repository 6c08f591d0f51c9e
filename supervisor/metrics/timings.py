"""Per-request timings: what each stage took and each handoff cost, as a waterfall and as OpenTelemetry spans.

Workers put Spans in a request's trace (supervisor/dataplane/trace.py); the
terminal stages hand them to the gateway with their Done frames. Here they
become a RequestTimings message (returned to a client that asks, e.g.
`stagevisor synthesize --timings`) and, only when the operator set the
standard OTLP environment variables, OpenTelemetry spans. With no OTLP
endpoint configured nothing here is imported by the request path.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Iterable, Mapping

log = logging.getLogger("stagevisor.timings")
_SEP = "\x1f"


def request_timings(
    timings: Iterable[Any], started: float, ended: float, first_audio: float | None, stage_groups: Mapping[str, str]
) -> Any:
    """A synthesis_pb2.RequestTimings from the (name, start, end) items of a request's finished branches.

    `started`/`ended` are the request's CLOCK_MONOTONIC bounds in the daemon;
    offsets in the result are seconds from `started`.
    """
    from stagevisor.supervisor._proto import synthesis_pb2 as spb

    stages: dict[tuple[str, float], tuple[str, float, float]] = {}
    hop_spans: dict[str, tuple[str, float, float]] = {}
    hops: list[str] = []
    for timing in timings:
        name, start, end = timing
        if _SEP in name:
            if start == 0.0 and end == 0.0:
                if name not in hops:
                    hops.append(name)
            else:
                hop_spans.setdefault(name, timing)
        elif start and (end or (name, start) not in stages):  # a branch that saw the stage end wins
            stages[(name, start)] = timing
    result = spb.RequestTimings(total_seconds=max(0.0, ended - started), first_audio_seconds=first_audio or 0.0)
    first_start: dict[str, tuple[str, float, float]] = {}
    for (name, start), timing in sorted(stages.items(), key=lambda item: item[0][1]):
        end = timing[2]  # 0: the stage's span left its process open and no end marker closed it
        result.stages.add(
            stage=name,
            group=stage_groups.get(name, ""),
            start_seconds=start - started,
            duration_seconds=max(0.0, end - start) if end else 0.0,
            end_unknown=not end,
        )
        first_start.setdefault(name, timing)
    for name in hops:
        transport, src, dst = name.split(_SEP)
        source, target = first_start.get(src), first_start.get(dst)
        stream = hop_spans.get(name)
        begun = stream[1] if stream is not None else (source[2] if source is not None else 0.0)
        if not begun or target is None:
            continue
        result.handoffs.add(
            src=src,
            dst=dst,
            transport=transport,
            start_seconds=begun - started,
            latency_seconds=max(0.0, target[1] - begun),
        )
    return result


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def format_waterfall(timings: Any, width: int = 40) -> str:
    """The timings as text: one bar per stage on a shared time axis, then the handoffs."""
    total = max(timings.total_seconds, 1e-9)
    rows = [(f"{t.stage} ({t.group})" if t.group else t.stage, t) for t in timings.stages]
    label = max([len(r[0]) for r in rows] + [len("first audio")])
    lines = [f"{'':<{label}}  0{'':<{width - 1}}{_ms(total)}"]
    for name, t in rows:
        start, duration = t.start_seconds, t.duration_seconds
        begin = min(width - 1, int(start / total * width))
        if t.end_unknown:  # drawn as a start mark, never as a bar to an end nobody measured
            lines.append(f"{name:<{label}}  {' ' * begin + '?':<{width}}  start {_ms(start)}, end unknown")
            continue
        length = max(1, min(width - begin, round(duration / total * width)))
        bar = " " * begin + "#" * length
        lines.append(f"{name:<{label}}  {bar:<{width}}  start {_ms(start)}, took {_ms(duration)}")
    if timings.first_audio_seconds:
        mark = min(width - 1, int(timings.first_audio_seconds / total * width))
        lines.append(f"{'first audio':<{label}}  {' ' * mark + '|':<{width}}  {_ms(timings.first_audio_seconds)}")
    for h in timings.handoffs:
        lines.append(
            f"handoff {h.src} -> {h.dst} via {h.transport}: {_ms(h.latency_seconds)} (at {_ms(h.start_seconds)})"
        )
    if not rows:
        lines.append("no stage timings: the daemon runs with --no-metrics")
    return "\n".join(lines)


def otlp_configured(environ: Mapping[str, str] = os.environ) -> bool:
    """True when the standard OTEL variables ask for OTLP trace export."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {name.strip().lower() for name in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")}
    if "otlp" not in exporters:
        return False
    return bool(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def otlp_protocol(environ: Mapping[str, str] = os.environ) -> str:
    """The OTLP protocol the standard variables ask for (default http/protobuf)."""
    return (
        (
            environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "http/protobuf"
        )
        .strip()
        .lower()
    )


_GRPC_CODES = {
    "OK": 0,
    "CANCELLED": 1,
    "UNKNOWN": 2,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "ABORTED": 10,
    "OUT_OF_RANGE": 11,
    "UNIMPLEMENTED": 12,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "DATA_LOSS": 15,
    "UNAUTHENTICATED": 16,
}


class SpanExporter:
    """Sends each finished request as OpenTelemetry spans: one `synthesize` span, a child per stage and handoff."""

    def __init__(self, tracer: Any, provider: Any = None) -> None:
        self.tracer = tracer
        self.provider = provider
        self._epoch_offset = time.time_ns() - time.monotonic_ns()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "SpanExporter | None":
        """An exporter when OTLP is configured and the `otel` extra is installed; otherwise None (no cost)."""
        if not otlp_configured(environ):
            return None
        protocol = otlp_protocol(environ)
        try:
            if protocol == "grpc":
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            else:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            from stagevisor.supervisor.install import install_command

            command = install_command("otel")
            if protocol == "grpc":
                command += " opentelemetry-exporter-otlp-proto-grpc"
            log.warning(
                "an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT) but its OpenTelemetry exporter is "
                "not installed; no spans are exported: %s",
                command,
            )
            return None
        if protocol not in ("grpc", "http/protobuf"):
            log.warning("OTLP protocol %r is not supported; exporting over http/protobuf", protocol)
        # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the exporter reads the
        # endpoint, headers, timeout and compression variables itself.
        resource = Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME", "stagevisor")})
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        log.info("exporting request spans over OTLP (%s)", protocol)
        return cls(provider.get_tracer("stagevisor"), provider)

    def _ns(self, monotonic_seconds: float) -> int:
        return int(monotonic_seconds * 1e9) + self._epoch_offset

    def export(self, timings: Any, started: float, model: str, code: str, request_id: str = "") -> None:
        """One trace: a `synthesize` root span (status ERROR unless `code` is OK) and a child per stage
        call and handoff in `timings` (a failed request may have none), each with the request id."""
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        request = {"stagevisor.request_id": request_id}
        root = self.tracer.start_span(
            "synthesize",
            kind=SpanKind.SERVER,
            start_time=self._ns(started),
            attributes={
                **request,
                "stagevisor.model": model,
                "stagevisor.status": code,
                "rpc.grpc.status_code": _GRPC_CODES.get(code, 2),
            },
        )
        if code != "OK":
            root.set_status(Status(StatusCode.ERROR, code))
        context = trace.set_span_in_context(root)
        groups = {stage.stage: stage.group for stage in timings.stages}
        for stage in timings.stages:
            begin = started + stage.start_seconds
            span = self.tracer.start_span(
                f"stage {stage.stage}",
                context=context,
                start_time=self._ns(begin),
                attributes={**request, "stagevisor.stage": stage.stage, "stagevisor.group": stage.group},
            )
            if stage.end_unknown:  # an instant at its start: an end nobody measured is not invented
                span.set_attribute("stagevisor.end_unknown", True)
            span.end(end_time=self._ns(begin + stage.duration_seconds))
        for hop in timings.handoffs:
            begin = started + hop.start_seconds
            span = self.tracer.start_span(
                f"handoff {hop.src} -> {hop.dst}",
                context=context,
                start_time=self._ns(begin),
                attributes={
                    **request,
                    "stagevisor.src": hop.src,
                    "stagevisor.dst": hop.dst,
                    "stagevisor.src_group": groups.get(hop.src, ""),
                    "stagevisor.dst_group": groups.get(hop.dst, ""),
                    "stagevisor.transport": hop.transport,
                },
            )
            span.end(end_time=self._ns(begin + hop.latency_seconds))
        root.end(end_time=self._ns(started + timings.total_seconds))

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()
