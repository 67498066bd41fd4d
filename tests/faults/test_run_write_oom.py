"""A run's own write that meets ``OOM`` fails the run with a clear reason, instead of being
retried as an outage and left ``running``: on a Redis whose ``maxmemory`` (``noeviction``)
leaves 2 MB of room, one run's write is bigger than that, so Redis refuses it for memory
however long the worker waits: its first step's input (a 4 MB input, which the transition
copies into the run's record), or its step's answer (the sim actor echoes a 400 KB input
with each ``y`` written 8 times: 3.2 MB). The other runs of the batch, whose writes fit,
must all finish; the big run must end ``failed`` naming Redis's memory, every call made
charged, and ``duet show`` must say so.

A real worker process and a real ``duet show``; a write's size is what Redis counts
while it holds the refused command (its arguments, in the client's query buffer).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from duet.embedded.server import EmbeddedRedis
from orchestration import Agent, Budget, Team, get_budget
from orchestration.state import keys
from tests.reliability import ENGINE, Reliability, lost_of
from tests.support import ROOT, celery_worker, client_pointed_at, environment, wait_for

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

SMALL = 8
#: The big run's input, bytes (the step's input case): twice the room Redis has left.
BIG = 4 * 1024 * 1024
#: The big run's input in the answer case, bytes: its answer is 8 times that.
ANSWERED = 400 * 1024
#: Room above what Redis holds once the batch is submitted, bytes.
ROOM = 2 * 1024 * 1024
#: Longest prompt accepted (the default, 200,000 characters, would refuse the big input).
PROMPT = {"DUET_MAX_PROMPT_CHARS": str(BIG + 100_000)}
#: What is too big, and the sim actor's model (``replace``: each ``y`` written 8 times).
CASES = {
    "input": ("x" * BIG, "sim?echo=1"),
    "answer": ("y" * ANSWERED, "sim?echo=1&replace=y=>yyyyyyyy"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_write_redis_can_never_hold_fails_its_run(case: str, reliability: Reliability) -> None:
    body, model = CASES[case]
    big_input = f"fix this:\n```\n{body}\n```\n"
    inputs = [f"small {n}:\n```\nsmall answer {n}\n```\n" for n in range(SMALL)] + [big_input]
    team = Team.actor_critic(
        actor=Agent("Fix.", model=model, max_tokens=2 * BIG),
        critic=Agent("Review.", model="sim?scores=0.95"),
        max_rounds=1,
    )
    with EmbeddedRedis() as server, contextlib.ExitStack() as stack:
        r = stack.enter_context(redis.Redis(port=server.port, decode_responses=True))
        assert r.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        stack.enter_context(environment(dict(PROMPT)))
        stack.enter_context(client_pointed_at(server.url))
        batch = team.submit_batch(inputs, budget=Budget(max_calls=1000))
        # Submitted (the big input fitted); now the room is less than its answer.
        r.config_set("maxmemory", int(r.info("memory")["used_memory"]) + ROOM)
        worker = stack.enter_context(
            celery_worker(server.url, env=dict(PROMPT), concurrency=4, name="runoom")
        )
        with contextlib.suppress(AssertionError):
            wait_for(lambda: batch.progress()["done"] == len(inputs), 120, "every run final")
        big_id = batch.run_ids()[-1]
        big = r.hgetall(keys.run(big_id))
        statuses = [r.hget(keys.run(run_id), "status") for run_id in batch.run_ids()]
        charged = int(get_budget(f"batch:{batch.batch_id}").spent.calls)
        shown = subprocess.run(
            [sys.executable, "-m", "duet", "show", big_id],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "DUET_REDIS_URL": server.url},
        )
        memory = r.info("memory")
        worker_log = Path(worker.log_path).read_text(errors="replace")
    small_done = statuses[:SMALL].count("approved")
    # Each small run: actor and critic; the big one: its actor (none with its input refused).
    calls = 2 * SMALL + (case == "answer")
    print(
        f"big run {big.get('status')} ({big.get('reason')}): {big.get('error')}; small runs "
        f"approved {small_done}/{SMALL}; charged {charged} of {calls} calls; used "
        f"{memory['used_memory']:,} of {memory['maxmemory']:,}\n--- duet show ---\n"
        f"{shown.stdout}{shown.stderr}"
    )
    said = shown.stdout + shown.stderr
    reliability.record(
        section=ENGINE,
        fault=(
            "A run's first step's input (4 MB, copied into the run's record by its transition)"
            if case == "input"
            else "A run's answer (3.2 MB: the sim actor echoes a 400 KB input, each `y` 8 times)"
        )
        + " bigger than the room Redis has left (`maxmemory` 2 MB above its use, "
        "`noeviction`), among runs whose writes fit",
        load=f"{SMALL + 1} one-round runs (one big) on 1 worker × 4 threads, a batch budget",
        lost=f"{lost_of(SMALL - small_done, SMALL, 'small runs not approved')}; the big run "
        f"`{big.get('status')}` ({big.get('reason')}), `duet show` naming Redis's memory: "
        f"{'yes' if 'maxmemory' in said else 'no'}; {charged} of {calls} calls charged",
        before="issue 37: a run's own write that met `OOM` was retried as an outage (2 min "
        "in place, then task retries for ever), the run left `running`",
    )
    assert statuses[:SMALL] == ["approved"] * SMALL, worker_log[-3000:]
    assert big.get("status") == "failed", (big, worker_log[-3000:])
    assert big.get("reason") == "actor:round_0:redis_out_of_memory", big  # the draft
    assert "maxmemory" in (big.get("error") or ""), big
    assert shown.returncode == 0, said
    assert "failed" in said and "maxmemory" in said, said
    assert charged == calls, (charged, calls)
