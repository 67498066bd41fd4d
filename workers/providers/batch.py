"""What a vendor batch is to Duet: requests in, a status to poll, one outcome per request.

OpenAI's Batch API and Anthropic's Message Batches bill each request at about half the
synchronous price and answer within a window (24 h). An adapter that supports them
(:class:`~workers.providers.sdk.SDKProvider`) submits a list of :class:`BatchRequest`
as one vendor batch, polls it into a :class:`BatchStatus`, reads each request's outcome
— a :class:`~workers.providers.base.Completion`, or the :class:`ProviderError` it ended
with — and cancels it. Errors of a request are classified like a synchronous call's; a
request the vendor let expire is a transient ``batch_expired`` error (it may be asked
again), a cancelled one a permanent ``batch_cancelled``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from orchestration.core.agents import AgentSpec
from orchestration.core.errors import ConfigError, ProviderError
from workers.providers.base import Completion, Message

#: A custom id both vendors accept (Anthropic's rule is the stricter).
CUSTOM_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: A request's outcome: what the model answered, or why it did not.
Outcome = Completion | ProviderError


@dataclass(frozen=True, slots=True)
class BatchRequest:
    """One model call inside a vendor batch."""

    #: The caller's id for the request, unique in the batch (``[A-Za-z0-9_-]{1,64}``).
    custom_id: str
    agent: AgentSpec
    messages: list[Message]
    #: Ask for the critique's shape natively (see :mod:`orchestration.core.structured`).
    structured: bool = False

    def __post_init__(self) -> None:
        if not CUSTOM_ID.match(self.custom_id):
            raise ConfigError(
                f"batch custom_id {self.custom_id!r} must be 1-64 letters, digits, '_' or '-'"
            )


@dataclass(frozen=True, slots=True)
class BatchStatus:
    """Where a vendor batch is."""

    id: str
    #: ``in_progress`` (answers still coming), ``canceling``, or ``ended`` (results ready).
    state: Literal["in_progress", "canceling", "ended"]
    #: Requests in the batch, and how many have an outcome so far.
    total: int
    finished: int
    #: The vendor's own word for it (``validating``, ``finalizing``, ``expired``...).
    vendor_status: str

    @property
    def ended(self) -> bool:
        return self.state == "ended"


def expired(custom_id: str, provider: str) -> ProviderError:
    """The outcome of a request the vendor did not answer within the batch's window."""
    return ProviderError(
        f"{provider}: request {custom_id} expired in its vendor batch before it was answered",
        kind="batch_expired",
        transient=True,
    )


def cancelled(custom_id: str, provider: str) -> ProviderError:
    """The outcome of a request of a cancelled batch that was not answered."""
    return ProviderError(
        f"{provider}: request {custom_id} was cancelled with its vendor batch",
        kind="batch_cancelled",
        transient=False,
    )


def missing(custom_id: str, provider: str, status: str) -> ProviderError:
    """The outcome of a request an ended batch gave no result for."""
    return ProviderError(
        f"{provider}: vendor batch ended ({status}) without a result for request {custom_id}",
        kind="batch_failed",
        transient=False,
    )
