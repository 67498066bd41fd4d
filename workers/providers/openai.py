"""OpenAI and OpenAI-compatible servers (vLLM, Ollama, LiteLLM...) via the ``openai`` SDK.

The SDK is imported on first use, never at module import. One client (so one HTTP
connection pool) per adapter, created on the first call with ``max_retries=0``: retries
are ours, done by rescheduling the Celery task with the classified error's hints.

Prompt caching is automatic at OpenAI for a prompt prefix seen recently: the request is
laid out so its prefix stays the same from call to call (the instructions, then the
conversation oldest first, then the new prompt), and the cached part is read from
``usage.prompt_tokens_details.cached_tokens``.

A structured critique is asked for with ``response_format`` (a strict JSON schema); the
reply's content is then that JSON object. So is an actor's ``output_schema`` (strict when
the schema meets OpenAI's strict rules).

Vendor batches: the requests are uploaded as a JSONL file (``/v1/files``, purpose
``batch``) and run by ``/v1/batches`` on ``/v1/chat/completions``; answers are read from
the batch's output file, failures from its error file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from orchestration.core.agents import AgentSpec
from orchestration.core.capabilities import family_of, sent_temperature
from orchestration.core.errors import ProviderError
from orchestration.core.structured import CRITIQUE_SHAPE, Shape, shape_of
from workers.providers.base import Completion, Message, StopReason
from workers.providers.batch import (
    BatchRequest,
    BatchStatus,
    Outcome,
    cancelled,
    expired,
)
from workers.providers.errors import error_for_status
from workers.providers.sdk import REPLY_SHAPE_ERRORS, SDKProvider, vendor_sdk
from workers.providers.toolwire import openai_calls, openai_messages, openai_tools

#: Key sent to an OpenAI-compatible server (explicit ``base_url``) when no key is set.
PLACEHOLDER_KEY = "not-needed"


def response_format(shape: Shape) -> dict[str, Any]:
    """``response_format`` of a structured call: the critique, or an agent's output_schema
    (strict only when the schema meets OpenAI's strict rules)."""
    return {
        "type": "json_schema",
        "json_schema": {"name": shape.name, "strict": shape.strict, "schema": shape.schema},
    }


#: ``response_format`` of a structured critique.
RESPONSE_FORMAT = response_format(CRITIQUE_SHAPE)
_STOP_REASONS: dict[str | None, StopReason] = {
    "stop": "end",
    "length": "max_tokens",
    "tool_calls": "end",  # the turn asks for tools; they run before the next one
}
#: The endpoint the requests of a vendor batch go to.
BATCH_ENDPOINT = "/v1/chat/completions"
_ENDED = {"completed", "failed", "expired", "cancelled"}
#: A reply the vendor's filter stopped is an outcome (a refusal is ``message.refusal``).
_STOP_REASONS["content_filter"] = "content_filter"


class OpenAIProvider(SDKProvider):
    """Chat Completions on api.openai.com or any server that speaks that API."""

    name = "openai"
    default_key_env = "OPENAI_API_KEY"
    path = "/chat/completions"

    def _new_http(self, event_hooks: dict[str, list[Any]]) -> Any:
        openai = vendor_sdk("openai")  # heavy: imported on the first call

        return openai.DefaultHttpxClient(event_hooks=event_hooks)

    def _new_client(self, key: str, http: Any) -> Any:
        openai = vendor_sdk("openai")

        # base_url None lets the SDK read OPENAI_BASE_URL, else api.openai.com.
        return openai.OpenAI(api_key=key, base_url=self.server_url, max_retries=0, http_client=http)

    def _missing_key(self) -> str:
        # A self-hosted OpenAI-compatible server (explicit base_url) often wants no key.
        return PLACEHOLDER_KEY if self.base_url is not None else super()._missing_key()

    def request(
        self, agent: AgentSpec, messages: list[Message], structured: bool = False
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": agent.model_name,
            "messages": [
                {"role": "system", "content": agent.instructions},
                *(openai_messages(messages) if agent.takes_tools else messages),
            ],
        }
        if agent.takes_tools:
            body["tools"] = openai_tools(agent.tool_specs)
            body["tool_choice"] = "auto"
            body["parallel_tool_calls"] = True
        # Only what the model takes is sent (orchestration.core.capabilities).
        body[family_of(agent.provider, agent.model_name).token_limit] = agent.max_tokens
        temperature = sent_temperature(agent.provider, agent.model_name, agent.temperature)
        if temperature is not None:
            body["temperature"] = temperature
        if agent.effort is not None:
            body["reasoning_effort"] = agent.effort
        if structured:
            body["response_format"] = response_format(shape_of(agent))
        return body

    def read(self, data: dict[str, Any], structured: bool = False) -> Completion:
        try:
            choice = data["choices"][0]
            usage = data.get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            message = choice.get("message") or {}
            text = message.get("content") or ""
            stop = _STOP_REASONS.get(choice.get("finish_reason"), "other")
            refusal = message.get("refusal")
            if refusal:  # the model declined: its refusal text, never a reply to read
                text, stop = str(refusal), "refusal"
            return Completion(
                text=text,
                input_tokens=int(usage.get("prompt_tokens") or 0),
                output_tokens=int(usage.get("completion_tokens") or 0),
                cached_input_tokens=int(details.get("cached_tokens") or 0),
                stop_reason=stop,
                raw_stop_reason=choice.get("finish_reason"),
                structured=_json_object(text) if structured and stop == "end" else None,
                tool_calls=openai_calls(message),
            )
        except REPLY_SHAPE_ERRORS as exc:
            raise self._bad_reply(exc) from exc

    # --- vendor batches ------------------------------------------------------------------
    def _submit_batch(self, requests: Sequence[BatchRequest]) -> str:
        lines = [
            {
                "custom_id": r.custom_id,
                "method": "POST",
                "url": BATCH_ENDPOINT,
                "body": self.request(r.agent, r.messages, r.structured),
            }
            for r in requests
        ]
        data = "".join(json.dumps(line) + "\n" for line in lines).encode()
        client = self.client()
        upload = client.files.create(file=("duet-batch.jsonl", data), purpose="batch")
        batch = client.batches.create(
            input_file_id=upload.id, endpoint=BATCH_ENDPOINT, completion_window="24h"
        )
        return str(batch.id)

    def _poll_batch(self, batch_id: str) -> BatchStatus:
        return _status(self.client().batches.retrieve(batch_id))

    def _cancel_batch(self, batch_id: str) -> BatchStatus:
        return _status(self.client().batches.cancel(batch_id))

    def _batch_results(
        self, batch_id: str, expected: Mapping[str, bool]
    ) -> tuple[dict[str, Outcome], BatchStatus]:
        client = self.client()
        batch = client.batches.retrieve(batch_id)
        found: dict[str, Outcome] = {}
        for file_id in (batch.output_file_id, batch.error_file_id):
            if not file_id:
                continue
            for raw in client.files.content(file_id).text.splitlines():
                if raw.strip():
                    line = json.loads(raw)
                    found[line["custom_id"]] = self._outcome(
                        line, expected.get(line["custom_id"], False)
                    )
        return found, _status(batch)

    def _outcome(self, line: dict[str, Any], structured: bool) -> Outcome:
        custom_id = line["custom_id"]
        error = line.get("error") or {}
        if error.get("code") == "batch_expired":
            return expired(custom_id, self.name)
        if error.get("code") == "batch_cancelled":
            return cancelled(custom_id, self.name)
        response = line.get("response") or {}
        status = int(response.get("status_code") or 0)
        if status == 200:
            try:
                return self.read(response.get("body") or {}, structured)
            except ProviderError as exc:
                return exc
        body = response.get("body") or {}
        message = (body.get("error") or {}).get("message") or error.get("message") or ""
        if not status:
            return ProviderError(
                f"{self.name}: {message or 'request failed in its batch'}",
                kind="batch_failed",
                transient=False,
            )
        code = (body.get("error") or {}).get("code")
        return error_for_status(
            status, None, message, provider=self.name, secrets=[self._key], code=code
        )


def _status(batch: Any) -> BatchStatus:
    counts = batch.request_counts
    total = counts.total if counts else 0
    finished = (counts.completed + counts.failed) if counts else 0
    state: Literal["in_progress", "canceling", "ended"] = (
        "ended"
        if batch.status in _ENDED
        else "canceling"
        if batch.status == "cancelling"
        else "in_progress"
    )
    return BatchStatus(str(batch.id), state, total, finished, str(batch.status))


def _json_object(text: str) -> dict[str, Any] | None:
    """The reply as a JSON object, when it is exactly one (a structured reply)."""
    if not text.startswith("{"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def preload() -> None:
    """Import the SDK now (a worker at start) rather than on the first call."""
    vendor_sdk("openai")
