"""Traces: the one module that knows OpenTelemetry; the layers call its thin helpers.

The MCP SDK already makes the server span of every request (``tools/call execute_code``, continuing the
``_meta.traceparent`` the client sent, SEP-414) and the client span of every outbound request (its
``traceparent`` injected into the upstream's ``_meta``); kernelexec adds the children under it: the queue
wait, the kernel's execution, installs, code mode's broker calls, recording and rendering.

Off unless the standard variables ask for OTLP (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_TRACES_EXPORTER=otlp``; ``OTEL_SDK_DISABLED=true`` wins):
then ``configure`` imports the SDK (the ``[otel]`` extra) and exports over OTLP/HTTP in batches
(``OTEL_BSP_*``). Off, every helper returns at its first line: no SDK import, no span made."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from typing import Any

_enabled = False
_tracer: Any = None


def wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether the standard OTEL_* variables ask for traces over OTLP."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = [e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()]
    if "none" in exporters:
        return False
    return "otlp" in exporters or bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def configure(service: str = "kernelexec") -> bool:
    """Set up the global tracer provider when the variables ask for it (once); whether traces are on.
    The SDK's own spans (the MCP layer's) go to it too: its tracer is a proxy of the global provider."""
    global _enabled, _tracer
    if _enabled or not wanted():
        return _enabled
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _tracer = trace.get_tracer("kernelexec")
    _enabled = True
    return True


def shutdown() -> None:
    """Flush what is batched (at the server's end)."""
    if not _enabled:
        return
    from opentelemetry import trace

    shut = getattr(trace.get_tracer_provider(), "shutdown", None)
    if shut is not None:
        shut()


def enabled() -> bool:
    return _enabled


_OFF: contextlib.nullcontext[None] = contextlib.nullcontext()


def span(name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """A child span of the current one, current inside the block (None attributes left out); off, a shared
    null context that yields None (no span object made)."""
    if not _enabled:
        return _OFF
    return _tracer.start_as_current_span(name, attributes={k: v for k, v in attributes.items() if v is not None})


def annotate(**attributes: Any) -> None:
    """Attributes on the current span (the SDK's tools/call span in a tool), None ones left out."""
    if not _enabled:
        return
    from opentelemetry import trace

    trace.get_current_span().set_attributes({k: v for k, v in attributes.items() if v is not None})


def record(name: str, start_monotonic: float, end_monotonic: float, **attributes: Any) -> None:
    """A child span of the current one for an interval already over (times from ``time.monotonic()``)."""
    if not _enabled:
        return
    offset = time.time_ns() - time.monotonic_ns()
    s = _tracer.start_span(name, start_time=int(start_monotonic * 1e9) + offset,
                           attributes={k: v for k, v in attributes.items() if v is not None})
    s.end(end_time=int(end_monotonic * 1e9) + offset)


def error(s: Any, kind: str, message: str | None = None) -> None:
    """Mark a span failed (``error.type``), when there is one."""
    if s is None:
        return
    from opentelemetry.trace import StatusCode

    s.set_attribute("error.type", kind)
    s.set_status(StatusCode.ERROR, message)
