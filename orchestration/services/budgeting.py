"""Budget and rate-limit checks around model calls, on the fleet-wide Redis ledger.

The coordinator asks :meth:`Budgets.round_check` at the start of each round. A step asks
:meth:`Budgets.rate_permit` (fleet-wide rate limits and pauses; the pauses this process
learned lately, :meth:`Budgets.known_pauses`, its begin script need not read again),
:meth:`Budgets.reserve`
(hold the call's worst case in every scope of the run at once, or learn there is no
room; :func:`clamped` says how far the call's ``max_tokens`` may drop to fit what is
left) and, after the call, :meth:`Budgets.settle_calls` (charge the real usage once per
step, however often the step is delivered) and :meth:`Budgets.learn` (what the reported
usage says of the model's tokenizer, for the next estimates). The atomic parts are the state layer's
(:mod:`orchestration.state.budgets`, :mod:`orchestration.state.ratelimits`); this module
only decides what to ask them.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from orchestration.core import events as ev
from orchestration.core.agents import AgentSpec
from orchestration.core.budget import Amount, Refusal
from orchestration.core.completion import Message
from orchestration.core.estimate import Fit, TokenRatio, fit_output, prompt_bytes
from orchestration.core.pricing import cost_usd, rates_for
from orchestration.core.ratelimit import VendorLimits, limit_name
from orchestration.core.structured import shape_of
from orchestration.defaults import LEARNED_REFRESH_S, RATE_TABLE_TTL_S
from orchestration.prices import price_for
from orchestration.services.pauses import PauseMemory
from orchestration.state import keys
from orchestration.state.budgets import (
    DEFAULT_SETTLED_TTL_S,
    LIMIT_LOST,
    BudgetLedger,
    LimitLost,
    Spend,
    spend_of,
    warning_flag,
)
from orchestration.state.events import event_json
from orchestration.state.ratelimits import RateDecision, RateLimiter, load_rate_limits
from orchestration.state.runs import Once
from orchestration.state.scripts import ScriptCall
from orchestration.state.tokenratio import TokenRatios

log = logging.getLogger(__name__)

#: Providers whose answers carry the account's rate limits in headers (the limiter
#: learns them; until the first answer, a few probe calls go).
LEARNS_LIMITS = frozenset({"openai", "anthropic"})


def rate_name(agent: AgentSpec) -> str:
    """The name of the rate limit ``agent``'s calls are paced by: model and endpoint."""
    return limit_name(agent.provider, agent.model_name, agent.base_url)


def step_id(run_id: str, key: str) -> str:
    """The id a step's reservation and settlement share, stable across redeliveries."""
    return f"{run_id}:{key}"


def tokenizer_of(agent: AgentSpec) -> str:
    """Whose tokenizer counts the agent's tokens: its model's (every ``sim`` variant
    counts alike, a token per four characters)."""
    return "sim" if agent.provider == "sim" else agent.model_name


def prompt_size(agent: AgentSpec, messages: Sequence[Message], structured: bool = False) -> int:
    """UTF-8 bytes of what a call sends as prompt: instructions, messages and, for a
    structured call, its schema (the critique's, or the agent's output_schema)."""
    parts = [agent.instructions, *(m["content"] for m in messages)]
    if structured:
        parts.append(json.dumps(shape_of(agent).schema))
    return prompt_bytes(parts)


def estimate(
    agent: AgentSpec,
    messages: Sequence[Message],
    ratio: TokenRatio | None = None,
    structured: bool = False,
) -> Amount:
    """A call's worst case, what its reservation holds. Input: its bytes at the model's
    learned bytes-per-token ratio (one token per byte, an upper bound for BPE tokenizers,
    before it has one; see :mod:`orchestration.core.estimate`), priced as if all of it
    were written to a prompt cache (the dearest input rate); output: the agent's
    ``max_tokens``; dollars at the agent's price (0 when unknown)."""
    ratio = ratio if ratio is not None else TokenRatio()
    input_tokens = ratio.input_tokens(prompt_size(agent, messages, structured), len(messages) + 1)
    price = price_for(agent)
    usd = (
        cost_usd(price, input_tokens, agent.max_tokens, cache_write_tokens=input_tokens)
        if price
        else 0.0
    )
    return Amount(input_tokens=input_tokens, output_tokens=agent.max_tokens, usd=usd, calls=1)


def clamped(agent: AgentSpec, refusal: Refusal, worst: Amount) -> Fit:
    """How far ``agent``'s ``max_tokens`` may drop so its call fits where ``refusal`` found
    no room (see :func:`orchestration.core.estimate.fit_output`)."""
    price = price_for(agent)
    input_usd = out_rate = 0.0
    if price is not None:
        rates = rates_for(price, worst.input_tokens)
        input_usd = cost_usd(price, worst.input_tokens, 0, cache_write_tokens=worst.input_tokens)
        out_rate = rates.output_per_mtok / 1_000_000
    return fit_output(
        refusal,
        input_tokens=worst.input_tokens,
        input_usd=input_usd,
        usd_per_output_token=out_rate,
        max_tokens=agent.max_tokens,
    )


class Budgets:
    """The ledger and the rate limiter of one process.

    ``pause_recheck_s``: how long a model's fleet-wide pause, once learned, is trusted
    without reading it again (see :mod:`orchestration.services.pauses`; 0: read every call).
    """

    def __init__(
        self,
        redis_client: Any,
        *,
        settled_ttl_s: int = DEFAULT_SETTLED_TTL_S,
        pause_recheck_s: float = 0.0,
    ) -> None:
        self.redis = redis_client
        #: How long a call's settled marker is kept (the finished-run TTL, in a worker).
        self.settled_ttl_s = settled_ttl_s
        self.ledger = BudgetLedger(redis_client)
        self.limiter = RateLimiter(redis_client)
        self.pauses = PauseMemory(pause_recheck_s, time.monotonic)
        self.ratios = TokenRatios(redis_client)
        self._rates: dict[str, tuple[int | None, int | None, float]] = {}
        self._rates_at = -math.inf
        self._lock = threading.Lock()
        #: name -> (vendor limits this process last wrote, when; monotonic).
        self._learned: dict[str, tuple[VendorLimits, float]] = {}

    # --- coordinator: the check at the start of a round --------------------
    def round_check(
        self, run: Mapping[str, str], scopes: list[str]
    ) -> tuple[str | None, list[Once]]:
        """(interruption reason or None, budget.warning events) for the run's scopes.

        Each warning is a :class:`Once` on its :func:`warning_flag`: the transition that
        records it emits it if, and only if, that transition sets the flag.
        """
        try:
            status = self.ledger.round_status(scopes)
        except LimitLost as exc:  # the cap is gone from Redis: stop, never go on uncapped
            log.error("run %s: %s", run["run_id"], exc)
            return LIMIT_LOST, []
        warnings = [
            Once(
                event_json(
                    ev.BUDGET_WARNING,
                    run["run_id"],
                    scope=w.scope,
                    unit=w.unit,
                    fraction=round(w.fraction, 4),
                ),
                *warning_flag(w.scope, w.unit),
            )
            for w in status.warnings
        ]
        return status.reason, warnings

    # --- step: around the call ------------------------------------------
    def estimate(self, agent: AgentSpec, messages: Sequence[Message], structured: bool) -> Amount:
        """:func:`estimate` at the model's learned bytes-per-token ratio."""
        ratio = self.ratios.get(agent.provider, tokenizer_of(agent))
        return estimate(agent, messages, ratio, structured)

    def learn(
        self, agent: AgentSpec, messages: Sequence[Message], structured: bool, input_tokens: int
    ) -> None:
        """Note what a call's reported input tokens say of the model's tokenizer."""
        size = prompt_size(agent, messages, structured)
        self.ratios.record(agent.provider, tokenizer_of(agent), size, input_tokens)

    def reserve(
        self, sid: str, scopes: list[str], amount: Amount, lease_s: float
    ) -> Refusal | None:
        return self.ledger.reserve(sid, scopes, amount, lease_s) if scopes else None

    def settle_calls(self, sid: str, scopes: list[str], amount: Amount) -> list[ScriptCall]:
        """The settlement as script calls to run with the step's store (one round trip);
        none when the run has no budget scopes."""
        if not scopes:
            return []
        return [self.ledger.settle_call(sid, scopes, amount, marker_ttl_s=self.settled_ttl_s)]

    def spend(self, scopes: list[str], amount: Amount) -> Spend | None:
        """A call's usage for scopes that have no limit (it held nothing), to count with
        the step's store; None when the run has no budget scopes."""
        return spend_of(scopes, amount) if scopes else None

    def release(self, sid: str, scopes: list[str]) -> None:
        if scopes:
            self.ledger.release(sid, scopes)

    def charge_dead(self, sid: str, scopes: list[str]) -> None:
        """Charge the hold of a call whose worker died (its step was taken over)."""
        if scopes:
            self.ledger.charge_hold(sid, scopes)

    def known_pauses(self) -> tuple[str, ...]:
        """The pause keys learned lately: a step's begin script need not read them."""
        return self.pauses.fresh()

    def rate_permit(
        self, agent: AgentSpec, tokens: int, paused_s: float | None, hold_s: float
    ) -> RateDecision:
        """A permit for this call, booked for now or ``wait_s`` ahead; or, without a
        permit, how long to wait before asking again (0.0 and no permit: no limit
        applies, go now).

        ``paused_s`` is the model's fleet-wide pause as the step's begin script read it
        (learned here), or None when it skipped the read (its key was among
        :meth:`known_pauses`): the pause as learned then. A model with a configured limit,
        or whose vendor tells its limit in headers, is paced by the acquire script, which
        checks the pause again atomically with the booking.
        """
        name = rate_name(agent)
        key = keys.rate_pause(name)
        if paused_s is None:
            paused_s = self.pauses.paused_s(key)
        else:
            self.pauses.learned(key, paused_s)
        limits = self._rate_table().get(name)
        learn = agent.provider in LEARNS_LIMITS
        if limits is None and not learn:
            return RateDecision(wait_s=paused_s, server_time_us=0)
        rpm, tpm, window_s = limits if limits is not None else (None, None, 60.0)
        return self.limiter.try_acquire(
            name,
            rpm=rpm,
            tpm=tpm,
            tokens=min(tokens, tpm) if tpm else tokens,
            window_s=window_s,
            learn=learn,
            hold_s=hold_s,
        )

    def rate_settle_call(
        self, agent: AgentSpec, permit: str, tokens: int | None, learned: VendorLimits | None
    ) -> ScriptCall | None:
        """The settlement of a call's permit with its real ``tokens`` (None: given back)
        and what its answer's headers said, as a script call to run with the step's
        store; None when there is nothing to write (no permit, and headers this process
        noted lately)."""
        name = rate_name(agent)
        learned = self._news(name, learned)
        if not permit and learned is None:
            return None
        return self.limiter.settle_call(name, permit, tokens=tokens, learned=learned)

    def rate_refused(
        self, agent: AgentSpec, permit: str, learned: VendorLimits | None, pause_s: float = 0.0
    ) -> bool:
        """Release the permit of a request the vendor answered 429, note what the answer's
        headers said, pause the limit ``pause_s``; whether the model is paced (a
        configured or learned limit) — if not, a 429 pauses it fleet-wide instead.

        The permit is held no longer, and its tokens are given back; its request slot
        stays spent, as the request reached the vendor at that slot: given back too, the
        next call would be booked into the instant the vendor had just refused, and the
        refusals would come back each time the queue of booked calls came round."""
        name = rate_name(agent)
        configured = self._rate_table().get(name) is not None
        news = self._news(name, learned)
        if not permit and news is None and not pause_s:
            return configured or bool(learned and (learned.rpm or learned.tpm))
        _, limited = self.limiter.settle(name, permit, tokens=0, learned=news, pause_s=pause_s)
        return configured or limited

    def _news(self, name: str, learned: VendorLimits | None) -> VendorLimits | None:
        """``learned`` when this process has not noted it lately (else None)."""
        if learned is None:
            return None
        now = time.monotonic()
        with self._lock:
            last = self._learned.get(name)
            if last is not None and last[0] == learned and now - last[1] < LEARNED_REFRESH_S:
                return None
            self._learned[name] = (learned, now)
        return learned

    def pause(self, agent: AgentSpec, seconds: float) -> None:
        """A vendor said 429 + Retry-After to a model with no limit to pace by: pause
        it for the whole fleet (this process knows the pause in force at once)."""
        name = rate_name(agent)
        in_force = self.limiter.pause(name, seconds)
        self.pauses.learned(keys.rate_pause(name), in_force)

    def _rate_table(self) -> dict[str, tuple[int | None, int | None, float]]:
        now = time.monotonic()
        if now - self._rates_at > RATE_TABLE_TTL_S:
            with self._lock:
                if now - self._rates_at > RATE_TABLE_TTL_S:
                    self._rates = load_rate_limits(self.redis)
                    self._rates_at = now
        return self._rates
