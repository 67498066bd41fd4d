"""One error tree for Duet: caller mistakes apart from runtime failures."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestration.core.ratelimit import VendorLimits


class DuetError(Exception):
    """Root of every error Duet raises on purpose."""


class ConfigError(DuetError, ValueError):
    """The caller asked for something invalid (bad model name, bad config value, bad input)."""


class InputError(ConfigError):
    """One batch input is unusable (malformed line, missing prompt, duplicate id, too large)."""


class ProviderError(DuetError):
    """A model provider call failed.

    Attributes:
        kind: short machine-readable class of failure (``rate_limited``, ``auth``,
            ``bad_request``, ``server_error``, ``timeout``, ``connection``, ``missing_key``...).
        transient: whether retrying the same call later may succeed.
        retry_after: seconds the provider asked us to wait, when it said so.
        limits: the account's rate limits as the error's headers said them (None: the
            answer had none, or there was no answer).
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str,
        transient: bool,
        retry_after: float | None = None,
        status_code: int | None = None,
        limits: VendorLimits | None = None,
    ) -> None:
        super().__init__(message)
        self.limits = limits
        self.kind = kind
        self.transient = transient
        self.retry_after = retry_after
        self.status_code = status_code


class RunTimeout(DuetError, TimeoutError):
    """A run or batch did not finish within the time the caller was willing to wait."""


class SpecTampered(DuetError):
    """A stored spec does not match the content hash it is stored under (rewritten in Redis)."""
