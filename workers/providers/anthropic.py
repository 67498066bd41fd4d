"""Anthropic's Messages API via the ``anthropic`` SDK.

The SDK is imported on first use, never at module import. One client (so one HTTP
connection pool) per adapter, created on the first call with ``max_retries=0``: retries
are ours, done by rescheduling the Celery task with the classified error's hints.

The endpoint is the agent's ``base_url`` (an Anthropic-compatible gateway or proxy),
else ``ANTHROPIC_BASE_URL`` when set, else api.anthropic.com. The request is posted as
JSON through the SDK's client (see ``SDKProvider._post``); what it holds is what the
installed SDK's request type allows (on its API version, no ``temperature``: see
:mod:`orchestration.core.capabilities`).

Prompt caching: the instructions and the stable part of the conversation (every turn
before the new prompt) end in ``cache_control`` breakpoints, so a persistent
conversation reads its earlier turns from the cache at a tenth of the input price. The
new prompt itself is not marked: it is seldom sent twice, and a cache write costs more
than plain input.

A structured critique is asked for as a tool the model must call (``tool_choice``); the
tool call's input is the critique, and its JSON is the reply's text. An actor's
``output_schema`` is asked for the same way, as the tool ``structured_output``.

Vendor batches: Message Batches (``/v1/messages/batches``) take the same request bodies as
``params``; each request's result (succeeded, errored, canceled, expired) is read from the
batch's results file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from orchestration.core.agents import AgentSpec
from orchestration.core.capabilities import sent_temperature
from orchestration.core.errors import ProviderError
from orchestration.core.structured import CRITIQUE_SHAPE, SHAPE_NAMES, Shape, shape_of
from workers.providers.base import Completion, Message, StopReason
from workers.providers.batch import BatchRequest, BatchStatus, Outcome, cancelled, expired
from workers.providers.errors import error_for_status
from workers.providers.sdk import REPLY_SHAPE_ERRORS, SDKProvider, vendor_sdk
from workers.providers.toolwire import anthropic_calls, anthropic_messages, anthropic_tools

_STOP_REASONS: dict[str | None, StopReason] = {
    "end_turn": "end",
    "stop_sequence": "end",
    "max_tokens": "max_tokens",
    "tool_use": "end",  # the critique tool, or the agent's tools, were called
    "refusal": "refusal",
    "model_context_window_exceeded": "context_window",
}


def shape_tool(shape: Shape) -> dict[str, Any]:
    """The tool a structured answer (a critique, or an actor's output_schema) is written
    with: the model is made to call it, and its input is the answer."""
    return {"name": shape.name, "description": shape.description, "input_schema": shape.schema}


#: The tool a structured critique is written with.
CRITIQUE_TOOL = shape_tool(CRITIQUE_SHAPE)
#: A prompt-cache breakpoint (the default five-minute cache).
CACHE_CONTROL = {"type": "ephemeral"}


def _cached(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text, "cache_control": CACHE_CONTROL}]


class AnthropicProvider(SDKProvider):
    """Claude models through the Messages API."""

    name = "anthropic"
    default_key_env = "ANTHROPIC_API_KEY"
    path = "/v1/messages"

    def _new_http(self, event_hooks: dict[str, list[Any]]) -> Any:
        anthropic = vendor_sdk("anthropic")  # heavy: imported on the first call

        return anthropic.DefaultHttpxClient(event_hooks=event_hooks)

    def _new_client(self, key: str, http: Any) -> Any:
        anthropic = vendor_sdk("anthropic")

        # An explicit api_key stops the SDK from looking for profiles or federation
        # settings; base_url None lets it read ANTHROPIC_BASE_URL.
        return anthropic.Anthropic(
            api_key=key, base_url=self.server_url, max_retries=0, http_client=http
        )

    def request(
        self, agent: AgentSpec, messages: list[Message], structured: bool = False
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"model": agent.model_name, "max_tokens": agent.max_tokens}
        sent: list[dict[str, Any]] = (
            anthropic_messages(messages) if agent.takes_tools else list(messages)  # type: ignore[arg-type]
        )
        # The turns before the new prompt are the stable prefix; with tools, the turns
        # before the last one (its results are new).
        if len(sent) > 1 and isinstance(sent[-2]["content"], str):
            last = sent[-2]
            sent[-2] = {"role": last["role"], "content": _cached(last["content"])}
        elif len(sent) > 1 and sent[-2]["content"]:
            blocks = [dict(b) for b in sent[-2]["content"]]
            blocks[-1]["cache_control"] = CACHE_CONTROL
            sent[-2] = {"role": sent[-2]["role"], "content": blocks}
        body["messages"] = sent
        if agent.instructions:
            body["system"] = _cached(agent.instructions)
        # Only what the model takes is sent: on the current API version, no temperature
        # (orchestration.core.capabilities).
        temperature = sent_temperature(agent.provider, agent.model_name, agent.temperature)
        if temperature is not None:
            body["temperature"] = temperature
        if agent.effort is not None:
            body["output_config"] = {"effort": agent.effort}
        shape = shape_of(agent)
        if agent.takes_tools:
            # The critic's verdict (or the actor's structured output) is a tool too: a
            # turn calls the agent's tools, or ends on the answer ("any": every turn calls one).
            body["tools"] = anthropic_tools(agent.tool_specs) + (
                [shape_tool(shape)] if structured else []
            )
            body["tool_choice"] = {"type": "any"} if structured else {"type": "auto"}
        elif structured:
            body["tools"] = [shape_tool(shape)]
            body["tool_choice"] = {"type": "tool", "name": shape.name}
        return body

    def read(self, data: dict[str, Any], structured: bool = False) -> Completion:
        try:
            text = "".join(
                block.get("text") or "" for block in data["content"] if block.get("type") == "text"
            )
            native = next(
                (
                    block["input"]
                    for block in data["content"]
                    if block.get("type") == "tool_use"
                    and block.get("name") in SHAPE_NAMES
                    and isinstance(block.get("input"), dict)
                ),
                None,
            )
            if not structured:
                native = None
            stop = _STOP_REASONS.get(data.get("stop_reason"), "other")
            if stop == "refusal":  # the model declined: no critique, the refusal's words
                native = None
                text = text or str((data.get("stop_details") or {}).get("explanation") or "")
            if native is not None and not text:
                text = json.dumps(native)  # the conversation keeps the critique as text
            usage = data.get("usage") or {}
            cached = int(usage.get("cache_read_input_tokens") or 0)
            written = int(usage.get("cache_creation_input_tokens") or 0)
            return Completion(
                text=text,
                # Anthropic counts cache reads and writes apart from input_tokens; Duet's
                # input_tokens include them (cached_input_tokens: the part read from cache,
                # cache_write_tokens: the part written to it).
                input_tokens=int(usage.get("input_tokens") or 0) + cached + written,
                output_tokens=int(usage.get("output_tokens") or 0),
                cached_input_tokens=cached,
                cache_write_tokens=written,
                stop_reason=stop,
                raw_stop_reason=data.get("stop_reason"),
                structured=native,
                tool_calls=anthropic_calls(data["content"], SHAPE_NAMES if structured else ()),
            )
        except REPLY_SHAPE_ERRORS as exc:
            raise self._bad_reply(exc) from exc

    # --- vendor batches ------------------------------------------------------------------
    def _submit_batch(self, requests: Sequence[BatchRequest]) -> str:
        batch = self.client().messages.batches.create(
            requests=[
                {
                    "custom_id": r.custom_id,
                    "params": self.request(r.agent, r.messages, r.structured),
                }
                for r in requests
            ]
        )
        return str(batch.id)

    def _poll_batch(self, batch_id: str) -> BatchStatus:
        return _status(self.client().messages.batches.retrieve(batch_id))

    def _cancel_batch(self, batch_id: str) -> BatchStatus:
        return _status(self.client().messages.batches.cancel(batch_id))

    def _batch_results(
        self, batch_id: str, expected: Mapping[str, bool]
    ) -> tuple[dict[str, Outcome], BatchStatus]:
        batches = self.client().messages.batches
        status = _status(batches.retrieve(batch_id))
        found: dict[str, Outcome] = {}
        for item in batches.results(batch_id):
            data = item.model_dump(mode="json")
            custom_id, result = data["custom_id"], data["result"]
            found[custom_id] = self._outcome(custom_id, result, expected.get(custom_id, False))
        return found, status

    def _outcome(self, custom_id: str, result: dict[str, Any], structured: bool) -> Outcome:
        kind = result.get("type")
        if kind == "succeeded":
            try:
                return self.read(result.get("message") or {}, structured)
            except ProviderError as exc:
                return exc
        if kind == "expired":
            return expired(custom_id, self.name)
        if kind == "canceled":
            return cancelled(custom_id, self.name)
        error = (result.get("error") or {}).get("error") or {}
        status = _ERROR_STATUS.get(str(error.get("type")), 500)
        return error_for_status(
            status, None, error.get("message") or "", provider=self.name, secrets=[self._key]
        )


#: Anthropic error types (inside an errored batch result) -> the HTTP status they stand for.
_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}


def _status(batch: Any) -> BatchStatus:
    counts = batch.request_counts
    finished = counts.succeeded + counts.errored + counts.canceled + counts.expired
    state: Literal["in_progress", "canceling", "ended"] = (
        "ended"
        if batch.processing_status == "ended"
        else "canceling"
        if batch.processing_status == "canceling"
        else "in_progress"
    )
    return BatchStatus(
        str(batch.id), state, finished + counts.processing, finished, str(batch.processing_status)
    )


def preload() -> None:
    """Import the SDK now (a worker at start) rather than on the first call."""
    vendor_sdk("anthropic")
