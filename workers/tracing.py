"""OpenTelemetry traces of runs, optional: Duet's ``otel`` extra and ``DUET_OTEL=1``.

One trace per run. The run's first coordinator transition opens its root span
(``invoke_agent actor_critic``); its W3C trace context travels in a ``traceparent``
message header of every task of the run — never in the arguments, which stay ids — and
each task forwards the header it got, so every span of the run is a child of the root.
Each step is a span ``chat {model}`` with the GenAI semantic-convention attributes
(``gen_ai.operation.name``, ``gen_ai.provider.name``, ``gen_ai.request.model``,
``gen_ai.usage.input_tokens`` / ``output_tokens``, ``gen_ai.response.finish_reasons``)
plus Duet's (``duet.run_id``, ``duet.step_key``, ``duet.cost_usd``, the critique's
``duet.critique.score``); the run's end is a span ``duet.run.finished`` with its status
and reason. A run resumed from the client starts a new trace.

Off (the default), nothing of OpenTelemetry is imported, no header is added, and each
hook costs one module attribute read.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from celery import current_task

from workers.metrics import model_label

log = logging.getLogger(__name__)

#: Whether spans are made (see :func:`enable`).
ENABLED = False
#: The W3C trace-context header carried by every task message of a traced run.
TRACE_HEADER = "traceparent"

_tracer: Any = None


def enable(provider: Any = None) -> None:
    """Make spans from now on, with ``provider`` (default: the global TracerProvider)."""
    global ENABLED, _tracer
    from opentelemetry import trace

    _tracer = (provider or trace.get_tracer_provider()).get_tracer("duet")
    ENABLED = True


def disable() -> None:
    global ENABLED, _tracer
    ENABLED = False
    _tracer = None


def enable_from_environment() -> None:
    """A worker with ``DUET_OTEL=1``: trace with the process's TracerProvider, or, when
    none was set up (no ``opentelemetry-instrument``), an SDK provider exporting OTLP over
    HTTP as the standard ``OTEL_*`` variables say."""
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if type(provider).__name__ in ("ProxyTracerProvider", "NoOpTracerProvider"):
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            raise RuntimeError(
                "DUET_OTEL=1 needs the OpenTelemetry SDK and OTLP exporter: "
                "install Duet with its otel extra, or pip install opentelemetry-sdk "
                "opentelemetry-exporter-otlp-proto-http"
            ) from exc
        provider = TracerProvider(resource=Resource.create({"service.name": "duet-worker"}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
    enable(provider)
    log.info("OpenTelemetry traces on")


def _incoming(request: Any) -> str | None:
    return getattr(request, TRACE_HEADER, None) if request is not None else None


def traceparent() -> str | None:
    """The trace header for a message sent now: the one the running task got (so every
    span of a run hangs off its root), else the current span's."""
    task = current_task
    found = _incoming(task.request) if task else None
    if found:
        return str(found)
    from opentelemetry.propagate import inject

    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier.get(TRACE_HEADER)


def _context(request: Any) -> Any:
    from opentelemetry.propagate import extract

    header = _incoming(request)
    return extract({TRACE_HEADER: header}) if header else None


@contextlib.contextmanager
def coordinate_span(request: Any, run_id: str, seq: int) -> Iterator[None]:
    """Around a coordinator task: the run's root span when it has no trace yet (its first
    transition, or a resume from the client), else the run's context made current."""
    from opentelemetry import context as otel_context

    ctx = _context(request)
    if ctx is None:
        with _tracer.start_as_current_span(
            "invoke_agent actor_critic",
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "actor_critic",
                "duet.run_id": run_id,
                "duet.seq": seq,
            },
        ):
            yield
        return
    token = otel_context.attach(ctx)
    try:
        yield
    finally:
        otel_context.detach(token)


@contextlib.contextmanager
def step_span(request: Any, run_id: str, step_key: str) -> Iterator[None]:
    """Around a step task: its span, a child of the run's root."""
    with _tracer.start_as_current_span(
        f"duet.step {step_key}",
        context=_context(request),
        attributes={"duet.run_id": run_id, "duet.step_key": step_key},
    ):
        yield


@contextlib.contextmanager
def tool_span(request: Any, run_id: str, call: str) -> Iterator[None]:
    """Around a tool task: its span, in the run's trace (the call names its step)."""
    with _tracer.start_as_current_span(
        f"duet.tool {call}",
        context=_context(request),
        attributes={"duet.run_id": run_id, "duet.tool_call": call},
    ):
        yield


def _span() -> Any:
    from opentelemetry import trace

    return trace.get_current_span()


def _call_attributes(span: Any, agent: Any, phase: str) -> None:
    model = model_label(agent.model_name)
    span.update_name(f"chat {model}")
    span.set_attributes(
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": agent.provider,
            "gen_ai.request.model": model,
            "gen_ai.request.max_tokens": agent.max_tokens,
            "gen_ai.agent.name": "critic" if phase == "critique" else "actor",
            "duet.phase": phase,
        }
    )
    if agent.temperature is not None:
        span.set_attribute("gen_ai.request.temperature", agent.temperature)


def call_answered(agent: Any, phase: str, result: Mapping[str, Any]) -> None:
    """The step's model call answered: usage, finish reason, cost and score on its span."""
    span = _span()
    _call_attributes(span, agent, phase)
    span.set_attributes(
        {
            "gen_ai.usage.input_tokens": result["input_tokens"],
            "gen_ai.usage.output_tokens": result["output_tokens"],
            "duet.usage.cached_input_tokens": result.get("cached_input_tokens") or 0,
            "duet.cost_usd": float(result["usd"]),
        }
    )
    if result.get("stop_reason"):
        span.set_attribute("gen_ai.response.finish_reasons", [str(result["stop_reason"])])
    if result.get("score") is not None:
        span.set_attribute("duet.critique.score", float(result["score"]))


def call_failed(agent: Any, phase: str, kind: str, *, retried: bool) -> None:
    """The step's model call failed: the error kind on its span (an error unless retried)."""
    from opentelemetry.trace import Status, StatusCode

    span = _span()
    _call_attributes(span, agent, phase)
    span.set_attributes({"error.type": kind, "duet.retried": retried})
    if not retried:
        span.set_status(Status(StatusCode.ERROR, kind))


class StepObserver:
    """The step service's observer (``orchestration.services.step.StepObserver``): each
    call's outcome on the step's span."""

    def step_waits(self, agent: Any, reason: str, seconds: float) -> None:
        return None

    def call_failed(self, agent: Any, phase: str, kind: str, *, retried: bool) -> None:
        call_failed(agent, phase, kind, retried=retried)

    def call_answered(self, agent: Any, phase: str, result: Mapping[str, Any]) -> None:
        call_answered(agent, phase, result)


class ToolObserver:
    """The tool service's observer: the tool, its seconds and outcome on the tool's span."""

    def tool_called(self, name: str, seconds: float, ok: bool) -> None:
        span = _span()
        span.set_attributes({"duet.tool": name, "duet.tool_seconds": seconds, "duet.ok": ok})
        if not ok:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, "tool error"))

    def tool_cached(self, name: str, hit: bool) -> None:
        """A tool-result cache lookup: on a hit, no tool ran in this span."""
        _span().set_attributes({"duet.tool": name, "duet.tool_cached": hit})


class RunObserver:
    """A coordinator observer: the run's end as a span of its trace."""

    def run_started(self, run: Mapping[str, str]) -> None:
        if run.get("batch_id"):
            _span().set_attribute("duet.batch_id", run["batch_id"])

    def run_finished(self, run: Mapping[str, str], status: str, reason: str | None) -> None:
        attributes: dict[str, Any] = {"duet.run_id": run.get("run_id", ""), "duet.status": status}
        if reason:
            attributes["duet.reason"] = reason
        with _tracer.start_as_current_span("duet.run.finished", attributes=attributes):
            pass
