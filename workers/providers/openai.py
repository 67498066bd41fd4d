"""OpenAI and OpenAI-compatible servers (vLLM, Ollama, LiteLLM...) via the ``openai`` SDK.

The SDK is imported on first use, never at module import. One client (so one HTTP
connection pool) per adapter, created on the first call with ``max_retries=0``: retries
are ours, done by rescheduling the Celery task with the classified error's hints.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

from orchestration.agents import AgentSpec
from orchestration.errors import ProviderError

from .base import Completion, Message, Provider, StopReason
from .errors import classify_exception

#: Key sent to an OpenAI-compatible server (explicit ``base_url``) when no key is set.
PLACEHOLDER_KEY = "not-needed"
#: Models that take ``max_completion_tokens`` and reject ``max_tokens``.
_REASONING_PREFIXES = ("o1", "o3", "o4", "gpt-5")
_STOP_REASONS: dict[str | None, StopReason] = {"stop": "end", "length": "max_tokens"}


class OpenAIProvider(Provider):
    """Chat Completions on api.openai.com or any server that speaks that API."""

    name = "openai"

    def __init__(self, *, base_url: str | None = None, api_key_env: str | None = None) -> None:
        super().__init__(base_url=base_url, api_key_env=api_key_env)
        self._client: Any = None
        self._key: str | None = None
        self._lock = threading.Lock()

    def client(self) -> Any:
        """The adapter's one ``openai.OpenAI`` client, created on first use."""
        client = self._client
        if client is not None:
            return client
        with self._lock:
            if self._client is None:
                key = os.environ.get(self.api_key_env) if self.api_key_env else None
                if not key:
                    if self.base_url is None:
                        raise ProviderError(
                            f"openai: no API key: environment variable "
                            f"{self.api_key_env or 'OPENAI_API_KEY'} is not set on this worker",
                            kind="missing_key",
                            transient=False,
                        )
                    key = PLACEHOLDER_KEY
                import openai  # heavy: only when a worker first calls OpenAI

                # base_url None lets the SDK read OPENAI_BASE_URL, else api.openai.com.
                self._key = key
                self._client = openai.OpenAI(api_key=key, base_url=self.base_url, max_retries=0)
            return self._client

    def _call(self, agent: AgentSpec, messages: list[Message]) -> Completion:
        client = self.client()
        params: dict[str, Any] = {
            "model": agent.model_name,
            "messages": [{"role": "system", "content": agent.instructions}, *messages],
            "timeout": agent.timeout_s,
        }
        if agent.model_name.startswith(_REASONING_PREFIXES):
            params["max_completion_tokens"] = agent.max_tokens
        else:
            params["max_tokens"] = agent.max_tokens
        if agent.temperature is not None:
            params["temperature"] = agent.temperature
        response = client.chat.completions.create(**params)
        if not response.choices:
            raise ProviderError(
                "openai: response has no choices", kind="bad_response", transient=False
            )
        choice = response.choices[0]
        usage = response.usage
        details = getattr(usage, "prompt_tokens_details", None) if usage else None
        return Completion(
            text=choice.message.content or "",
            input_tokens=usage.prompt_tokens if usage else 0,
            output_tokens=usage.completion_tokens if usage else 0,
            cached_input_tokens=(getattr(details, "cached_tokens", None) or 0) if details else 0,
            stop_reason=_STOP_REASONS.get(choice.finish_reason, "other"),
            raw_stop_reason=choice.finish_reason,
        )

    def classify(self, exc: Exception) -> ProviderError:
        return classify_exception(exc, provider=self.name, secrets=[self._key])

    def warm(self) -> None:
        # A missing key is reported by complete(), on the run; here it is not an error.
        with contextlib.suppress(ProviderError):
            self.client()

    def close(self) -> None:
        """Close the HTTP connection pool (the next call opens a new client)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


def preload() -> None:
    """Import the SDK now (a worker at start) rather than on the first call."""
    import openai  # noqa: F401
