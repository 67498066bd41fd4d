"""An evicting ``maxmemory-policy`` set after the workers started (a parameter-group
change; a failover to a node with the service's default, ElastiCache's ``volatile-lru``),
with memory squeezed for a few seconds: every worker notices within its watch period,
logs one line and stops new work until the policy is ``noeviction`` again; no call is
charged twice; and no input is lost: under ``allkeys-lru`` the submitter, following its
batch (``Team.submit_batch``'s handle, or ``duet run``), submits again the runs Redis
evicted.

Two real worker processes, the real ``openai`` SDK against the stand-in (2 s calls). The
test sets the policy, lowers ``maxmemory`` to a little above what Redis holds and writes
keys of its own (with a TTL, so ``volatile-lru`` may evict them too) for a few seconds,
then puts the policy and ``maxmemory`` back.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from duet.embedded.server import EmbeddedRedis
from duet.standin.server import FakeLLM
from orchestration import Agent, Team
from orchestration.client.team import get_budget
from orchestration.core.budget import Budget
from orchestration.core.errors import RunTimeout
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
CRITIC = "openai:sim?scores=0.2,0.2,0.95"


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


@dataclass
class Outcome:
    """What the submitter ended with: each input's final status, the batch, and how many
    runs it submitted again."""

    finished: dict[str, str]
    batch_id: str
    resent: int
    run_ids: list[str]


class LibrarySubmitter:
    """``Team.submit_batch``, then the handle's results, in input order."""

    def __init__(self, url: str, llm: FakeLLM, tmp: Path) -> None:
        team = Team.actor_critic(
            actor=Agent("Fix.", model="openai:sim", base_url=llm.url),
            critic=Agent("Review.", model=CRITIC, base_url=llm.url),
            max_rounds=3,
        )
        self.batch = team.submit_batch(
            [{"id": f"i{n}", "prompt": f"task {n}"} for n in range(RUNS)],
            budget=Budget(max_calls=100_000),
        )
        self.first = self.batch.run_ids()

    def finish(self) -> Outcome:
        finished: dict[str, str] = {}
        with contextlib.suppress(RunTimeout):
            for result in self.batch.results(timeout=180):
                finished[str(result.input_id)] = result.status
        assert self.batch.kept is not None
        ids = list(dict.fromkeys(self.first + self.batch.run_ids()))
        return Outcome(finished, self.batch.batch_id, self.batch.kept.resent, ids)


class CliSubmitter:
    """``duet run`` on the cluster, its results file read when it exits."""

    def __init__(self, url: str, llm: FakeLLM, tmp: Path) -> None:
        config = tmp / "review.toml"
        config.write_text(
            f'[actor]\ninstructions = "Fix."\nmodel = "openai:sim"\nbase_url = "{llm.url}"\n'
            f'[critic]\ninstructions = "Review."\nmodel = "{CRITIC}"\nbase_url = "{llm.url}"\n'
            "[loop]\nmax_rounds = 3\n[budget]\nmax_calls = 100000\n"
        )
        inputs = tmp / "in.jsonl"
        inputs.write_text(
            "".join(json.dumps({"id": f"i{n}", "prompt": f"task {n}"}) + "\n" for n in range(RUNS))
        )
        self.out, self.err = tmp / "out.jsonl", tmp / "run.err"
        self._stack = contextlib.ExitStack()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "duet", "run", str(config), "-i", str(inputs)]
            + ["-o", str(self.out)],
            env={**os.environ, "DUET_REDIS_URL": url, "OPENAI_API_KEY": "sk-test-evict"},
            stdout=subprocess.DEVNULL,
            stderr=self._stack.enter_context(self.err.open("w")),
        )

    def finish(self) -> Outcome:
        try:
            self.proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._stack.close()
        log = self.err.read_text(errors="replace")
        records = (
            [json.loads(x) for x in self.out.read_text().splitlines()] if self.out.exists() else []
        )
        resent = sum(
            int(n) for n in re.findall(r"evicted (?:its record and )?(\d+) of its runs", log)
        )
        batch_id = next((r["batch_id"] for r in records if r.get("batch_id")), "")
        finished = {str(r["id"]): str(r["status"]) for r in records}
        print(log[-3000:])
        return Outcome(finished, batch_id, resent, [str(r.get("run_id")) for r in records])


@pytest.mark.parametrize(
    ("policy", "submitter"),
    [
        ("volatile-lru", LibrarySubmitter),
        ("allkeys-lru", LibrarySubmitter),
        ("allkeys-lru", CliSubmitter),
    ],
    ids=["volatile-lru", "allkeys-lru", "allkeys-lru-duet-run"],
)
def test_an_evicting_policy_set_after_start(
    llm: FakeLLM,
    policy: str,
    submitter: type[LibrarySubmitter | CliSubmitter],
    reliability: Reliability,
    tmp_path: Path,
) -> None:
    env = {"OPENAI_API_KEY": "sk-test-evict"}
    with EmbeddedRedis() as server, contextlib.ExitStack() as stack:
        r = stack.enter_context(redis.Redis(port=server.port))
        stack.enter_context(client_pointed_at(server.url))
        workers = [
            stack.enter_context(celery_worker(server.url, env=env, concurrency=8, name=f"ev{n}"))
            for n in range(2)
        ]
        submitted = submitter(server.url, llm, tmp_path)
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
        wait_for(
            lambda: all("new work goes on" in p.read_text(errors="replace") for p in logs),
            NOTICED_S,
            "every worker to say new work goes on",
        )
        # The submitter follows its batch: the runs that went are submitted again.
        got = submitted.finish()
        counts = dict(Counter(got.finished.values()))
        requests = llm.stats()["requests"]
        stored = stored_calls(server.url, got.run_ids)
        charged = int(get_budget(f"batch:{got.batch_id}").spent.calls)
    lost = RUNS - sum(s in FINISHED_STATUSES for s in got.finished.values())
    who = "`duet run`" if submitter is CliSubmitter else "`Team.submit_batch` and its results"
    print(
        f"{policy} after start ({who}): {evicted} keys evicted; every worker stopped new work "
        f"{noticed:.0f}s after; {got.resent} runs submitted again; {RUNS - lost}/{RUNS} inputs "
        f"final {counts}; {requests} requests, {stored} stored calls, {charged} charged"
    )
    reliability.record(
        section=ENGINE,
        fault=f"`maxmemory-policy {policy}` set after the workers started, memory squeezed "
        f"{SQUEEZE_S:.0f} s (`maxmemory` 2 MB above use, keys of the test's own written), "
        "then `noeviction` again",
        load=f"{RUNS} runs (up to 5 calls each, a batch budget), 2 worker processes; "
        f"submitted and followed by {who}",
        lost=f"{lost_of(lost, RUNS, 'inputs lost or stuck')}; {got.resent} runs submitted "
        f"again by the submitter; {max(charged - requests, 0)} calls charged beyond the "
        f"{requests} made; {evicted} keys evicted; every worker logged 'new work stopped' "
        f"{noticed:.0f} s after the change",
        before="allkeys-lru: 50/50 runs lost, nothing logged; volatile-lru: 380 calls "
        "charged for 300 made (the evicted settled markers)",
    )
    assert lost == 0, counts
    assert charged <= requests  # nothing charged twice
    if policy == "volatile-lru":  # an open run's keys keep no TTL: none is evicted
        assert got.resent == 0
