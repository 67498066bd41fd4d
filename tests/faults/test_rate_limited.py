"""A burst of vendor 429s with ``retry-after`` on a batch on two workers: waiting is not
failing, and no rate permit is leaked.

Two real worker processes allow two attempts per step (``DUET_MAX_ATTEMPTS=2``), so a
429 counted as a failed attempt would end runs ``interrupted``. Each 429's permit is
given back; after the batch no permit is held in Redis. A step that waits longer than
``DUET_RATE_WAIT_MAX_S`` for rate limits in all ends its run with a reason that says so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from duet.embedded.server import EmbeddedRedis
from duet.standin.server import FakeLLM
from orchestration import Agent, Team
from orchestration.client.handles import store
from orchestration.core.ratelimit import limit_name
from orchestration.state.ratelimits import RateLimit, RateLimiter, set_rate_limits
from tests.reliability import ENGINE, Reliability, lost_of
from tests.support import celery_worker, client_pointed_at

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

RUNS = 12
BURST = 30


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM(latency_ms=100) as server:
        yield server


def _team(llm: FakeLLM) -> Team:
    return Team.actor_critic(
        actor=Agent("Fix.", model="openai:sim", base_url=llm.url),
        critic=Agent("Review.", model="openai:sim", base_url=llm.url),
        max_rounds=1,
    )


def test_a_burst_of_429s_interrupts_no_run_and_leaks_no_permit(
    llm: FakeLLM, reliability: Reliability
) -> None:
    env = {"OPENAI_API_KEY": "sk-test-429", "DUET_MAX_ATTEMPTS": "2"}
    name = limit_name("openai", "sim", llm.url)
    with EmbeddedRedis() as server, client_pointed_at(server.url), contextlib.ExitStack() as stack:
        set_rate_limits(store().r, {"openai:sim": RateLimit(rpm=600)}, base_url=llm.url)
        for n in range(2):
            stack.enter_context(celery_worker(server.url, env=env, concurrency=16, name=f"w{n}"))
        llm.set_faults(status=429, retry_after="1", times=BURST)
        handles = [_team(llm).submit(f"snippet {n}") for n in range(RUNS)]
        results = [h.result(timeout=180) for h in handles]
        permits = RateLimiter(store().r).permits(name)
        held = store().r.zcard(f"duet:rate:{name}:permits")
    stats = llm.stats()
    interrupted = [r for r in results if r.status == "interrupted"]
    reliability.record(
        section=ENGINE,
        fault=f"a burst of {BURST} vendor 429s (retry-after: 1), attempts capped at 2",
        load=f"{RUNS} runs on 2 workers, a configured rpm limit",
        lost=(
            lost_of(len(interrupted), RUNS, "runs interrupted")
            if not held
            else f"{len(interrupted)} of {RUNS} runs interrupted, {held} rate permits held"
        ),
    )
    assert stats["faulted"] == BURST, "every 429 of the burst was answered"
    assert not interrupted, [r.interruption_reason for r in interrupted]
    assert all(r.status in ("approved", "max_rounds_reached") for r in results)
    assert permits == 0 and held == 0, "a permit was leaked"


def test_a_step_that_waits_too_long_ends_its_run_saying_so(
    llm: FakeLLM, reliability: Reliability
) -> None:
    env = {"OPENAI_API_KEY": "sk-test-429", "DUET_RATE_WAIT_MAX_S": "3"}
    with EmbeddedRedis() as server, client_pointed_at(server.url), contextlib.ExitStack() as stack:
        stack.enter_context(celery_worker(server.url, env=env, concurrency=4, name="patient"))
        llm.set_faults(status=429, retry_after="1")
        result = _team(llm).submit("snippet").result(timeout=120)
        llm.set_faults()
        permits = RateLimiter(store().r).permits(limit_name("openai", "sim", llm.url))
    reason = result.interruption_reason or ""
    said = result.status == "interrupted" and reason.startswith("actor:round_0:rate_limited:")
    reliability.record(
        section=ENGINE,
        fault="A vendor answering every call 429 with `retry-after: 1`, past the configured "
        "total wait (`DUET_RATE_WAIT_MAX_S` 3 s)",
        load="1 run on 1 worker",
        lost="nothing: the run ended `interrupted` with the reason "
        f"`{reason}`; {permits} permits left held"
        if said and permits == 0
        else f"the run ended {result.status} ({reason or 'no reason'}); {permits} permits held",
    )
    assert result.status == "interrupted"
    assert reason.startswith("actor:round_0:rate_limited:waited_"), reason
    assert llm.stats()["faulted"] >= 2, "it waited through more than one 429"
    assert permits == 0
