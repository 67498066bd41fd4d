"""OpenTelemetry traces: with tracing on (in-memory exporter, real Redis, a real Celery
worker in this process) each run is one trace whose step spans match its steps; the trace
context rides in message headers, never in arguments; off, messages carry nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from orchestration import Agent, Team
from orchestration.state.keys import DRAFT_PRIORITY, queue_key
from tests.support import client_pointed_at, wait_for

pytestmark = pytest.mark.system

sdk = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

from workers import tracing  # noqa: E402
from workers.inprocess import InProcessWorker  # noqa: E402


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """Tracing on for this test, into memory; off again afterwards."""
    memory = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing.enable(provider)
    try:
        yield memory
    finally:
        tracing.disable()
        provider.shutdown()


def test_a_run_is_one_trace_with_a_span_per_step(
    redis_url: str, redis_client: Any, exporter: InMemorySpanExporter
) -> None:
    team = Team.actor_critic(
        actor=Agent("Fix.", model="sim"), critic=Agent("Review.", model="sim?scores=0.2,0.95")
    )
    with client_pointed_at(redis_url), InProcessWorker(redis_url, concurrency=8):
        results = [h.result(timeout=60) for h in [team.submit("one"), team.submit("two")]]
        # The last span (the run's end) is exported when its task returns.
        wait_for(
            lambda: sum(s.name == "duet.run.finished" for s in exporter.get_finished_spans()) == 2,
            10,
            "both runs' end spans",
        )
    spans = exporter.get_finished_spans()
    traces = set()
    for result in results:
        assert result.status == "approved"
        mine = [s for s in spans if s.attributes.get("duet.run_id") == result.run_id]
        (trace_id,) = {s.context.trace_id for s in mine}
        traces.add(trace_id)
        everything = [s for s in spans if s.context.trace_id == trace_id]
        assert everything == mine, "the trace holds this run's spans only"
        (root,) = [s for s in mine if s.parent is None]
        assert root.name == "invoke_agent actor_critic"
        assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
        assert all(s.parent.span_id == root.context.span_id for s in mine if s is not root)

        steps = sorted((s for s in mine if s.name.startswith("chat ")), key=lambda s: s.start_time)
        assert [s.attributes["duet.step_key"] for s in steps] == [
            "r0.generate",
            "r1.critique",
            "r1.refine",
            "r2.critique",
        ]
        assert [s.name for s in steps] == ["chat sim:actor", "chat sim:critic"] * 2
        for span in steps:
            a = span.attributes
            assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "sim"
            (finish,) = a["gen_ai.response.finish_reasons"]
            assert finish and finish != "max_tokens"
        assert sum(s.attributes["gen_ai.usage.input_tokens"] for s in steps) == (
            result.usage.total.input_tokens
        )
        assert sum(s.attributes["gen_ai.usage.output_tokens"] for s in steps) == (
            result.usage.total.output_tokens
        )
        scores = [
            s.attributes["duet.critique.score"]
            for s in steps
            if s.attributes["duet.step_key"].endswith("critique")
        ]
        assert scores == [r.score for r in result.rounds if r.score is not None] == [0.2, 0.95]
        (end,) = [s for s in mine if s.name == "duet.run.finished"]
        assert end.attributes["duet.status"] == "approved"
    assert len(traces) == 2, "one trace per run"


def _queued_headers(redis_client: Any, queue: str) -> list[dict[str, Any]]:
    lists = [queue_key(queue), queue_key(queue, DRAFT_PRIORITY)]  # later steps, drafts
    return [json.loads(raw)["headers"] for key in lists for raw in redis_client.lrange(key, 0, -1)]


@pytest.mark.parametrize("on", [False, True])
def test_trace_context_rides_in_headers_only_when_on(
    redis_url: str, redis_client: Any, on: bool, request: pytest.FixtureRequest
) -> None:
    """A coordinator-only worker: the step it dispatches waits in the actor queue."""
    if on:
        request.getfixturevalue("exporter")
    team = Team.actor_critic(actor=Agent("Fix.", model="sim"), critic=Agent("R.", model="sim"))
    with client_pointed_at(redis_url), InProcessWorker(redis_url, queues=("coordinator",)):
        handle = team.submit("x")
        drafts = queue_key("actor", DRAFT_PRIORITY)  # a draft waits in the drafts' list
        wait_for(lambda: redis_client.llen(drafts) == 1, 30, "the dispatched step")
    (headers,) = _queued_headers(redis_client, "actor")
    (raw,) = redis_client.lrange(drafts, 0, -1)
    body = json.loads(raw)
    assert headers["argsrepr"] == repr((handle.run_id, "r0.generate"))  # ids only
    assert "traceparent" not in body["body"]
    if on:
        assert headers[tracing.TRACE_HEADER].startswith("00-")
    else:
        assert tracing.TRACE_HEADER not in headers


def test_a_tool_call_is_a_span_of_its_runs_trace(
    redis_url: str, redis_client: Any, exporter: InMemorySpanExporter
) -> None:
    from workers.tools.registry import tool

    @tool(pure=True, name="traced_check")
    def traced_check(code: str) -> str:
        """Check the code.

        Args:
            code: the code.
        """
        return "checked"

    team = Team.actor_critic(
        actor=Agent("Fix.", model="sim"),
        critic=Agent("Review.", model="sim?scores=0.95", tools=["traced_check"]),
    )
    with client_pointed_at(redis_url), InProcessWorker(redis_url, concurrency=8):
        result = team.submit("one").result(timeout=60)
        wait_for(
            lambda: any(s.name == "duet.run.finished" for s in exporter.get_finished_spans()),
            10,
            "the run's end span",
        )
    assert result.status == "approved"
    spans = exporter.get_finished_spans()
    tools = [s for s in spans if s.name.startswith("duet.tool ")]
    assert [s.attributes["duet.tool"] for s in tools] == ["traced_check"]
    assert tools[0].attributes["duet.ok"] is True
    steps = [s for s in spans if s.name == "chat sim:critic"]  # the critique's two turns
    assert len(steps) == 2 and {s.context.trace_id for s in steps} == {tools[0].context.trace_id}
