"""Token usage and cost, as plain values that add up."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Usage(BaseModel):
    """Tokens, calls and dollars spent by one call, one role or one whole run."""

    model_config = ConfigDict(frozen=True)

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    """The part of ``input_tokens`` read from a prompt cache."""
    cache_write_tokens: int = 0
    """The part of ``input_tokens`` written to a prompt cache."""
    calls: int = 0
    usd: float = 0.0
    cached_calls: int = 0
    """Calls served from Duet's model-call cache (billed nothing; not in ``calls``)."""
    saved_usd: float = 0.0
    """What those calls would have cost."""
    tool_calls: int = 0
    """Tool calls the agents' turns asked for (each run as a task of its own)."""

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def turns(self) -> int:
        """Model calls made (each turn of an agent run is one), as the reference counts."""
        return self.calls

    @property
    def tokens_in(self) -> int:
        """``input_tokens``, by the reference's name."""
        return self.input_tokens

    @property
    def tokens_out(self) -> int:
        """``output_tokens``, by the reference's name."""
        return self.output_tokens

    @property
    def cost_usd(self) -> float:
        """``usd``, by the reference's name."""
        return self.usd

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_input_tokens=self.cached_input_tokens + other.cached_input_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            calls=self.calls + other.calls,
            usd=round(self.usd + other.usd, 10),
            cached_calls=self.cached_calls + other.cached_calls,
            saved_usd=round(self.saved_usd + other.saved_usd, 10),
            tool_calls=self.tool_calls + other.tool_calls,
        )
