"""Which request settings each model family takes, and in what range. Pure.

One table, read twice: when an agent is set up (a setting its model cannot take is refused
then, naming the key) and when a provider builds a request (only what the table allows is
sent). A model is matched by its provider and the start of its name, so a new model of a
known family follows the family's rule. See docs/models.md for the reasons.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: The widest temperature range any provider takes (OpenAI's: 0 to 2).
TEMPERATURE_RANGE = (0.0, 2.0)
#: The Anthropic API version the installed SDK speaks, whose Messages API has no sampling
#: settings (``temperature``, ``top_p``, ``top_k``).
ANTHROPIC_API_VERSION = "2026-10-21"


@dataclass(frozen=True)
class Family:
    """What the models of one family take in a request."""

    name: str
    provider: str
    #: Lower-case model-name prefixes; ``()``: every other model of the provider.
    prefixes: tuple[str, ...]
    #: The temperatures it takes, ``(low, high)``; ``None``: it takes no temperature.
    temperature: tuple[float, float] | None
    #: Why it takes no temperature (shown when one is set).
    no_temperature_because: str = ""
    #: The request key of the output token limit.
    token_limit: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    #: The reasoning efforts it takes (``Agent(effort=...)``); ``()``: none.
    efforts: tuple[str, ...] = ()


#: The families, the first match winning (so the catch-all of a provider comes last).
FAMILIES: tuple[Family, ...] = (
    Family(
        "OpenAI reasoning models",
        "openai",
        ("o1", "o3", "o4", "gpt-5"),
        None,
        "OpenAI reasoning models run only at their default temperature",
        "max_completion_tokens",
        ("minimal", "low", "medium", "high"),  # sent as reasoning_effort
    ),
    Family("OpenAI chat models", "openai", (), TEMPERATURE_RANGE),
    Family(
        "Anthropic Claude models",
        "anthropic",
        (),
        None,
        f"the Messages API (version {ANTHROPIC_API_VERSION}) has no sampling settings",
        efforts=("low", "medium", "high"),  # sent as output_config.effort
    ),
    Family(
        "the offline simulator",
        "sim",
        (),
        TEMPERATURE_RANGE,
        efforts=("minimal", "low", "medium", "high"),  # taken, changes nothing
    ),
)


def family_of(provider: str, model_name: str) -> Family:
    """The family whose rules ``model_name`` at ``provider`` follows.

    Raises:
        ValueError: a provider the table does not know.
    """
    name = model_name.strip().lower()
    for family in FAMILIES:
        if family.provider == provider and (
            not family.prefixes or name.startswith(family.prefixes)
        ):
            return family
    raise ValueError(f"no model family for provider {provider!r}")


def temperature_problem(provider: str, model_name: str, temperature: float | None) -> str | None:
    """Why ``model_name`` cannot take ``temperature`` (``None``: not set, always fine), or
    ``None`` when it can."""
    if temperature is None:
        return None
    family = family_of(provider, model_name)
    if family.temperature is None:
        return f"{model_name} takes no temperature: {family.no_temperature_because}; leave it out"
    low, high = family.temperature
    if not low <= temperature <= high:
        return f"{model_name} takes a temperature from {low:g} to {high:g}, got {temperature:g}"
    return None


def sent_temperature(provider: str, model_name: str, temperature: float | None) -> float | None:
    """The temperature a request may carry: ``temperature`` when the model takes it, else
    ``None`` (never sent)."""
    if temperature_problem(provider, model_name, temperature) is not None:
        return None
    return temperature


#: Every reasoning effort some family takes.
EFFORTS = ("minimal", "low", "medium", "high")


def effort_problem(provider: str, model_name: str, effort: str | None) -> str | None:
    """Why ``model_name`` cannot take reasoning ``effort`` (``None``: not set, always
    fine), or ``None`` when it can."""
    if effort is None:
        return None
    family = family_of(provider, model_name)
    if not family.efforts:
        return f"{model_name} takes no reasoning effort ({family.name}); leave it out"
    if effort not in family.efforts:
        return f"{model_name} takes effort {', '.join(family.efforts)}; got {effort!r}"
    return None


#: Context windows (input and output tokens of one request) by provider and model-name
#: prefix, the first match winning; a model not listed is not checked.
CONTEXT_WINDOWS: tuple[tuple[str, tuple[str, ...], int], ...] = (
    ("openai", ("gpt-4.1",), 1_047_576),
    ("openai", ("gpt-5",), 400_000),
    ("openai", ("o1", "o3", "o4"), 200_000),
    ("openai", ("gpt-4o", "chatgpt-4o"), 128_000),
    ("anthropic", ("claude-",), 200_000),
)
#: Characters per token assumed when sizing prompts against a context window: source code
#: packs fewer characters into a token than prose, so fewer than the usual four.
CHARS_PER_TOKEN_CODE = 3


def context_window(provider: str, model_name: str) -> int | None:
    """The context window of ``model_name`` at ``provider`` in tokens, or None (unknown)."""
    name = model_name.strip().lower()
    for known, prefixes, tokens in CONTEXT_WINDOWS:
        if known == provider and name.startswith(prefixes):
            return tokens
    return None


def prompt_chars_fitting(window: int, other_tokens: int) -> int:
    """The longest input (characters) a request still fits ``window`` with, when the rest
    of it (what the loop adds, the reply) is ``other_tokens``."""
    return max(0, (window - other_tokens) * CHARS_PER_TOKEN_CODE)
