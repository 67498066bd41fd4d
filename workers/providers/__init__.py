"""Model provider adapters, one module per vendor, created once per worker process.

Vendor SDKs are imported only when a worker first calls that vendor (``import
anthropic`` alone costs seconds), and each process keeps one adapter — so one HTTP
connection pool — per (provider, base_url, key variable).
"""

from __future__ import annotations

import importlib
import threading

from orchestration.agents import AgentSpec
from orchestration.errors import ConfigError

from .base import Completion, Message, Provider

__all__ = ["Completion", "Message", "Provider", "provider_for", "PROVIDER_MODULES"]

#: provider name -> "module:Class" of its adapter.
PROVIDER_MODULES = {
    "sim": "workers.providers.sim:SimProvider",
    "openai": "workers.providers.openai:OpenAIProvider",
    "anthropic": "workers.providers.anthropic:AnthropicProvider",
}

_adapters: dict[tuple[str, str | None, str | None], Provider] = {}
_lock = threading.Lock()


def provider_for(agent: AgentSpec) -> Provider:
    """The process-wide adapter for this agent's (provider, base_url, key variable)."""
    key = (agent.provider, agent.base_url, agent.api_key_env)
    adapter = _adapters.get(key)
    if adapter is not None:
        return adapter
    with _lock:
        adapter = _adapters.get(key)
        if adapter is None:
            try:
                target = PROVIDER_MODULES[agent.provider]
            except KeyError:
                raise ConfigError(
                    f"unknown provider {agent.provider!r}; known: {', '.join(PROVIDER_MODULES)}"
                ) from None
            module_name, _, class_name = target.partition(":")
            cls = getattr(importlib.import_module(module_name), class_name)
            adapter = cls(base_url=agent.base_url, api_key_env=agent.api_key_env)
            _adapters[key] = adapter
    return adapter
