"""Model provider adapters, one module per vendor, created once per worker process.

Vendor SDKs are imported only when a worker first calls that vendor (``import
anthropic`` alone costs seconds), and each process keeps one adapter — so one HTTP
connection pool — per (provider, base_url, key variable).
"""

from __future__ import annotations

import importlib
import threading

from orchestration.core.agents import AgentSpec
from orchestration.core.errors import ConfigError
from orchestration.settings import get_settings
from workers.providers.base import Completion, Message, Provider

__all__ = [
    "Completion",
    "Message",
    "Provider",
    "provider_for",
    "close_providers",
    "reset_providers",
    "PROVIDER_MODULES",
]

#: provider name -> "module:Class" of its adapter.
PROVIDER_MODULES = {
    "sim": "workers.providers.sim:SimProvider",
    "openai": "workers.providers.openai:OpenAIProvider",
    "anthropic": "workers.providers.anthropic:AnthropicProvider",
}

_adapters: dict[tuple[str, str | None, str | None], Provider] = {}
_lock = threading.Lock()


def provider_for(agent: AgentSpec) -> Provider:
    """The process-wide adapter for this agent's (provider, base_url, key variable), once
    the worker's key policy allows the variables it sends where it sends them.

    Raises:
        ConfigError: an unknown provider, or a variable the policy refuses (named).
    """
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
            refused = get_settings().key_policy().agent_problem(agent)
            if refused is not None:  # checked again here: a spec may be forged in Redis
                raise ConfigError(f"{agent.provider} ({agent.model}): {refused}")
            module_name, _, class_name = target.partition(":")
            cls = getattr(importlib.import_module(module_name), class_name)
            adapter = cls(base_url=agent.base_url, api_key_env=agent.api_key_env)
            _adapters[key] = adapter
    return adapter


def _close_all(adapters: list[Provider]) -> None:
    for adapter in adapters:
        close = getattr(adapter, "close", None)  # the offline simulator holds no client
        if close is not None:
            close()


def close_providers() -> None:
    """Close every adapter's HTTP client (worker shutdown). An adapter used again reconnects."""
    with _lock:
        adapters = list(_adapters.values())
    _close_all(adapters)


def reset_providers() -> None:
    """Close and forget every adapter, so the next call builds new ones (tests; new keys)."""
    with _lock:
        adapters = list(_adapters.values())
        _adapters.clear()
    _close_all(adapters)
