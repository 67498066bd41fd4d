"""Each model's learned bytes-per-token ratio, shared by the fleet: the Redis side of
:mod:`orchestration.core.estimate`.

One hash per (provider, model): ``samples`` (calls that reported usage) and ``min``
(the smallest ratio any showed). Recording a call is one Lua script, so concurrent
workers never lose a smaller ratio (``lua/token_ratio_record.lua``). Readers keep a copy for a few seconds.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from orchestration.core.estimate import MIN_SAMPLES, TokenRatio, observed_ratio
from orchestration.defaults import TOKEN_RATIO_CACHE_S
from orchestration.state import keys
from orchestration.state.scripts import register

#: Seconds a process trusts its copy of a model's ratio (a test sets it to 0).
CACHE_S = TOKEN_RATIO_CACHE_S


class TokenRatios:
    """The fleet's learned ratios, with a short per-process cache. Thread-safe."""

    def __init__(self, redis_client: Any) -> None:
        self.r = redis_client
        self._record = register(redis_client, "token_ratio_record")
        self._cache: dict[tuple[str, str], tuple[float, TokenRatio]] = {}
        self._lock = threading.Lock()

    def get(self, provider: str, model: str) -> TokenRatio:
        now = time.monotonic()
        cached = self._cache.get((provider, model))
        if cached is not None and now - cached[0] < CACHE_S:
            return cached[1]
        samples, low = self.r.hmget(keys.token_ratio(provider, model), "samples", "min")
        ratio = TokenRatio(int(samples or 0), float(low)) if low else TokenRatio()
        with self._lock:
            self._cache[(provider, model)] = (now, ratio)
        return ratio

    def record(self, provider: str, model: str, prompt_bytes: int, input_tokens: int) -> None:
        """Note what one call's reported usage showed. Skipped (no round trip) when the
        model has enough samples and this one is no smaller than the smallest known."""
        ratio = observed_ratio(prompt_bytes, input_tokens)
        if ratio is None:
            return
        known = self.get(provider, model)
        if known.samples >= MIN_SAMPLES and ratio >= known.min_bytes_per_token:
            return
        self._record(keys=[keys.token_ratio(provider, model)], args=[repr(ratio)])
        with self._lock:
            self._cache.pop((provider, model), None)
