"""What every model provider adapter has in common.

An adapter turns *system prompt + conversation* into a :class:`Completion`. The base
class owns error classification and timing; a subclass writes :meth:`Provider._call`
(and, for vendor SDKs, :meth:`Provider.classify`). Retries, budgets, pricing and
prompt rendering live outside the adapters.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from orchestration.core import url_credentials
from orchestration.core.agents import AgentSpec
from orchestration.core.completion import Completion, Message, StopReason
from orchestration.core.errors import ProviderError
from workers import secrets

__all__ = ["Completion", "Message", "Provider", "StopReason"]


class Provider(ABC):
    """Base adapter: call the model, classify failures into :class:`ProviderError`."""

    #: Provider name as :func:`orchestration.core.agents.resolve_model` returns it.
    name: ClassVar[str]

    def __init__(self, *, base_url: str | None = None, api_key_env: str | None = None) -> None:
        # The key itself is read from the environment at call time, never stored in specs.
        self.base_url = base_url
        self.api_key_env = api_key_env
        secrets.register_key_variable(api_key_env)  # its value is scrubbed from every message
        for name in url_credentials.variables(base_url):  # and so are base_url's credentials
            secrets.register_key_variable(name)

    def complete(
        self, agent: AgentSpec, messages: list[Message], *, structured: bool = False
    ) -> Completion:
        """Call the model with ``agent.instructions`` as system prompt and ``messages``;
        with ``structured``, ask for the critique's shape natively (vendors that can).

        Raises:
            ProviderError: every failure, classified transient or permanent.
        """
        try:
            return self._call(agent, messages, structured)
        except ProviderError:
            raise
        except Exception as exc:  # noqa: BLE001 - every vendor failure becomes one error type
            # Not chained: the vendor's exception may quote the key, and a chained
            # traceback would carry it into logs and task events. classify() keeps its
            # type and (redacted) message.
            raise self.classify(exc) from None

    def warm(self) -> None:
        """Get ready to call (e.g. create the HTTP client); errors wait for :meth:`complete`."""
        return None  # noqa: B027 - optional hook; most adapters have nothing to prepare

    @abstractmethod
    def _call(self, agent: AgentSpec, messages: list[Message], structured: bool) -> Completion:
        """Make the call. Raise anything; :meth:`classify` maps it."""

    def classify(self, exc: Exception) -> ProviderError:
        """Map an unexpected exception to a :class:`ProviderError` (permanent by default)."""
        return ProviderError(
            secrets.redact(f"{self.name}: {type(exc).__name__}: {exc}"),
            kind="unexpected",
            transient=False,
        )
