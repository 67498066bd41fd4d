"""An evicting ``maxmemory-policy`` set after the workers started (a parameter-group
change; a failover to a node with the service's default, ElastiCache's ``volatile-lru``),
with memory squeezed for a few seconds: every worker notices within its watch period,
logs one line and stops new work until the policy is ``noeviction`` again; no call is
charged twice.

Two real worker processes, the real ``openai`` SDK against the stand-in (1 s calls). The
test sets the policy, lowers ``maxmemory`` to a little above what Redis holds and writes
keys of its own (with a TTL, so ``volatile-lru`` may evict them too) for a few seconds,
then puts the policy and ``maxmemory`` back.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from duet.embedded.server import EmbeddedRedis
from duet.standin.server import FakeLLM
from orchestration import Agent, Team
from orchestration.client.team import get_budget
from orchestration.core.budget import Budget
from orchestration.core.results import FINISHED_STATUSES
from orchestration.state import keys
from tests.reliability import ENGINE, Reliability, lost_of
from tests.support import celery_worker, client_pointed_at, stored_calls, wait_for

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

RUNS = 40
#: How long memory is squeezed, seconds (the fault itself, not a wait for a condition).
SQUEEZE_S = 6.0
#: How soon every worker must have said it stopped new work.
NOTICED_S = 30.0


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM(latency_ms=2000) as server:
        yield server


def _squeeze(r: redis.Redis, seconds: float) -> int:
    """Write keys of the test's own for ``seconds`` under a ``maxmemory`` a little above
    what Redis holds; how many keys Redis evicted meanwhile."""
    before = int(r.info("stats")["evicted_keys"])
    r.config_set("maxmemory", int(r.info("memory")["used_memory"]) + 2_000_000)
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        pipe = r.pipeline(transaction=False)
        for _ in range(50):
            pipe.set(f"filler:{n}", "x" * 2000, ex=600)
            n += 1
        with contextlib.suppress(redis.exceptions.ResponseError):  # OOM: nothing to evict
            pipe.execute()
        time.sleep(0.02)
    return int(r.info("stats")["evicted_keys"]) - before


def _statuses(r: redis.Redis, run_ids: list[str]) -> list[str | None]:
    pipe = r.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.hget(keys.run(run_id), "status")
    return [s.decode() if s else None for s in pipe.execute()]


def _final(r: redis.Redis, run_ids: list[str]) -> int:
    return sum(s in FINISHED_STATUSES for s in _statuses(r, run_ids))


def _counts(r: redis.Redis, run_ids: list[str]) -> dict[str, int]:
    return dict(Counter(str(s) for s in _statuses(r, run_ids)))


@pytest.mark.parametrize("policy", ["volatile-lru", "allkeys-lru"])
def test_an_evicting_policy_set_after_start(
    llm: FakeLLM, policy: str, reliability: Reliability
) -> None:
    env = {"OPENAI_API_KEY": "sk-test-evict"}
    with EmbeddedRedis() as server, contextlib.ExitStack() as stack:
        r = stack.enter_context(redis.Redis(port=server.port))
        stack.enter_context(client_pointed_at(server.url))
        workers = [
            stack.enter_context(celery_worker(server.url, env=env, concurrency=8, name=f"ev{n}"))
            for n in range(2)
        ]
        team = Team.actor_critic(
            actor=Agent("Fix.", model="openai:sim", base_url=llm.url),
            critic=Agent("Review.", model="openai:sim?scores=0.2,0.2,0.95", base_url=llm.url),
            max_rounds=3,
        )
        batch = team.submit_batch(
            [f"task {n}" for n in range(RUNS)], budget=Budget(max_calls=100_000)
        )
        run_ids = batch.run_ids()
        # Early: no run has finished yet (a finished run's keys have a TTL: volatile-lru
        # may evict them, as it may any key with a TTL).
        wait_for(lambda: llm.stats()["requests"] >= 10, 60, "calls to be made")
        r.config_set("maxmemory-policy", policy)
        changed = time.monotonic()
        evicted = _squeeze(r, SQUEEZE_S)
        logs = [Path(w.log_path) for w in workers]
        wait_for(
            lambda: all("new work stopped" in p.read_text(errors="replace") for p in logs),
            NOTICED_S,
            "every worker to say it stopped new work",
        )
        noticed = time.monotonic() - changed
        r.config_set("maxmemory-policy", "noeviction")
        r.config_set("maxmemory", 0)
        for key in r.scan_iter("filler:*", count=1000):
            r.delete(key)
        # Every run final, or its record evicted (it can never be: waiting on it is waste).
        with contextlib.suppress(AssertionError):
            wait_for(
                lambda: all(s is None or s in FINISHED_STATUSES for s in _statuses(r, run_ids)),
                180,
                "every run final or gone",
                interval=0.5,
            )
        wait_for(
            lambda: all("new work goes on" in p.read_text(errors="replace") for p in logs),
            NOTICED_S,
            "every worker to say new work goes on",
        )
        progress = {"done": _final(r, run_ids), "counts": _counts(r, run_ids)}
        requests = llm.stats()["requests"]
        stored = stored_calls(server.url, run_ids)
        charged = int(get_budget(f"batch:{batch.batch_id}").spent.calls)
    lost = RUNS - progress["done"]
    print(
        f"{policy} after start: {evicted} keys evicted; every worker stopped new work "
        f"{noticed:.0f}s after; {progress['done']}/{RUNS} runs final {progress['counts']}; "
        f"{requests} requests, {stored} stored calls, {charged} charged"
    )
    reliability.record(
        section=ENGINE,
        fault=f"`maxmemory-policy {policy}` set after the workers started, memory squeezed "
        f"{SQUEEZE_S:.0f} s (`maxmemory` 2 MB above use, keys of the test's own written), "
        "then `noeviction` again",
        load=f"{RUNS} runs (up to 5 calls each, a batch budget), 2 worker processes",
        lost=f"{lost_of(lost, RUNS, 'runs lost or stuck')}; {max(charged - requests, 0)} calls "
        f"charged beyond the {requests} made; {evicted} keys evicted; every worker logged "
        f"'new work stopped' {noticed:.0f} s after the change",
        before="allkeys-lru: 50/50 runs lost, nothing logged; volatile-lru: 380 calls "
        "charged for 300 made (the evicted settled markers)",
    )
    assert charged <= requests  # nothing charged twice
    if policy == "volatile-lru":  # an open run's keys keep no TTL: none is evicted
        assert lost == 0, progress
