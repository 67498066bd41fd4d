"""Anthropic's Messages API via the ``anthropic`` SDK.

The SDK is imported on first use, never at module import. One client (so one HTTP
connection pool) per adapter, created on the first call with ``max_retries=0``: retries
are ours, done by rescheduling the Celery task with the classified error's hints.

The endpoint is the SDK's: ``ANTHROPIC_BASE_URL`` when set, else api.anthropic.com.
The request is posted as JSON through the SDK's client (see ``SDKProvider._post``), so
fields the installed SDK's typed method lacks, like ``temperature``, are still sent.
"""

from __future__ import annotations

from typing import Any

from orchestration.core.agents import AgentSpec
from workers.providers.base import Completion, Message, StopReason
from workers.providers.sdk import REPLY_SHAPE_ERRORS, SDKProvider

_STOP_REASONS: dict[str | None, StopReason] = {
    "end_turn": "end",
    "stop_sequence": "end",
    "max_tokens": "max_tokens",
}


class AnthropicProvider(SDKProvider):
    """Claude models through the Messages API."""

    name = "anthropic"
    default_key_env = "ANTHROPIC_API_KEY"

    def _new_client(self, key: str) -> Any:
        import anthropic  # heavy: only when a worker first calls Anthropic

        # An explicit api_key stops the SDK from looking for profiles or federation
        # settings; base_url None lets it read ANTHROPIC_BASE_URL.
        return anthropic.Anthropic(api_key=key, base_url=self.base_url, max_retries=0)

    def _call(self, agent: AgentSpec, messages: list[Message]) -> Completion:
        body: dict[str, Any] = {
            "model": agent.model_name,
            "max_tokens": agent.max_tokens,
            "messages": list(messages),
        }
        if agent.instructions:
            body["system"] = agent.instructions
        if agent.temperature is not None:
            body["temperature"] = agent.temperature
        data = self._post("/v1/messages", body, agent.timeout_s)
        try:
            text = "".join(
                block.get("text") or "" for block in data["content"] if block.get("type") == "text"
            )
            usage = data.get("usage") or {}
            cached = int(usage.get("cache_read_input_tokens") or 0)
            written = int(usage.get("cache_creation_input_tokens") or 0)
            return Completion(
                text=text,
                # Anthropic counts cache reads and writes apart from input_tokens; Duet's
                # input_tokens include them (cached_input_tokens: the part read from cache).
                input_tokens=int(usage.get("input_tokens") or 0) + cached + written,
                output_tokens=int(usage.get("output_tokens") or 0),
                cached_input_tokens=cached,
                stop_reason=_STOP_REASONS.get(data.get("stop_reason"), "other"),
                raw_stop_reason=data.get("stop_reason"),
            )
        except REPLY_SHAPE_ERRORS as exc:
            raise self._bad_reply(exc) from exc


def preload() -> None:
    """Import the SDK now (a worker at start) rather than on the first call."""
    import anthropic  # noqa: F401
