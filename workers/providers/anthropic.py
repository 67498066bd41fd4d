"""Anthropic's Messages API via the ``anthropic`` SDK.

The SDK is imported on first use, never at module import. One client (so one HTTP
connection pool) per adapter, created on the first call with ``max_retries=0``: retries
are ours, done by rescheduling the Celery task with the classified error's hints.

The endpoint is the SDK's: ``ANTHROPIC_BASE_URL`` when set, else api.anthropic.com.
The installed SDK's ``messages.create`` takes no ``temperature``; an agent's
temperature is therefore not sent (logged once per adapter).
"""

from __future__ import annotations

import logging
from typing import Any

from orchestration.agents import AgentSpec

from .base import Completion, Message, StopReason
from .sdk import SDKProvider

log = logging.getLogger(__name__)

_STOP_REASONS: dict[str | None, StopReason] = {
    "end_turn": "end",
    "stop_sequence": "end",
    "max_tokens": "max_tokens",
}


class AnthropicProvider(SDKProvider):
    """Claude models through the Messages API."""

    name = "anthropic"
    default_key_env = "ANTHROPIC_API_KEY"

    def __init__(self, *, base_url: str | None = None, api_key_env: str | None = None) -> None:
        super().__init__(base_url=base_url, api_key_env=api_key_env)
        self._warned_temperature = False

    def _new_client(self, key: str) -> Any:
        import anthropic  # heavy: only when a worker first calls Anthropic

        # An explicit api_key stops the SDK from looking for profiles or federation
        # settings; base_url None lets it read ANTHROPIC_BASE_URL.
        return anthropic.Anthropic(api_key=key, base_url=self.base_url, max_retries=0)

    def _call(self, agent: AgentSpec, messages: list[Message]) -> Completion:
        client = self.client()
        if agent.temperature is not None and not self._warned_temperature:
            self._warned_temperature = True
            log.warning(
                "anthropic: the SDK takes no temperature; %s is not sent", agent.temperature
            )
        params: dict[str, Any] = {
            "model": agent.model_name,
            "max_tokens": agent.max_tokens,
            "messages": list(messages),
            "timeout": agent.timeout_s,
        }
        if agent.instructions:
            params["system"] = agent.instructions
        response = client.messages.create(**params)
        text = "".join(
            block.text for block in response.content if getattr(block, "type", None) == "text"
        )
        usage = response.usage
        cached = getattr(usage, "cache_read_input_tokens", None) or 0
        written = getattr(usage, "cache_creation_input_tokens", None) or 0
        return Completion(
            text=text,
            # Anthropic counts cache reads and writes apart from input_tokens; Duet's
            # input_tokens include them (cached_input_tokens is the part read from cache).
            input_tokens=usage.input_tokens + cached + written,
            output_tokens=usage.output_tokens,
            cached_input_tokens=cached,
            stop_reason=_STOP_REASONS.get(response.stop_reason, "other"),
            raw_stop_reason=response.stop_reason,
        )


def preload() -> None:
    """Import the SDK now (a worker at start) rather than on the first call."""
    import anthropic  # noqa: F401
