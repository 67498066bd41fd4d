"""A batch's ``max_in_flight`` on a real worker: never more than N of its runs started and
not finished at once, the cap reached (not a queue of one), and every run finishing.

The peak is read two ways: polled from Redis while the batch runs (the runs whose status
is ``running``, each look woken by a finished run or 20 ms passing), and computed after
from each run's ``run.started`` / ``run.finished`` events, which the transitions that
take and give back a place emit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from orchestration import Agent, Team
from orchestration.client.handles import BatchHandle, RunHandle
from orchestration.core import events as ev
from orchestration.state import batches, keys
from orchestration.state.gates import BATCH_FIELD
from tests.support import celery_worker, client_pointed_at, peak_in_flight, wait_for

pytestmark = pytest.mark.system

SLOTS = 6
CAP = 2
#: A db of its own: the session's shared worker (on the system db) must not take its work.
GATE_DB = 11


@pytest.fixture
def small_worker(redis_url: str) -> Iterator[Any]:
    url = f"{redis_url.rpartition('/')[0]}/{GATE_DB}"
    redis.Redis.from_url(url).flushdb()
    with celery_worker(url, concurrency=SLOTS, name="gate") as proc, client_pointed_at(url):
        proc.redis_url = url
        yield proc


def _team(max_in_flight: int | None = None) -> Team:
    return Team.actor_critic(
        actor=Agent("Fix.", model="sim?latency_ms=30"),
        critic=Agent("Review.", model="sim?scores=0.3,0.95&latency_ms=30"),
        max_in_flight=max_in_flight,
    )


class PeakWatch:
    """Polls the batch's runs until it is done: the most found ``running`` at one look."""

    def __init__(self, url: str, batch: BatchHandle) -> None:
        self.r = redis.Redis.from_url(url, decode_responses=True)
        self.batch = batch
        self.peak = 0
        self.looks = 0
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        ids = self.batch.run_ids()
        after = "0-0"
        while True:
            pipe = self.r.pipeline(transaction=False)
            for run_id in ids:
                pipe.hget(keys.run(run_id), "status")
            statuses = pipe.execute()
            self.peak = max(self.peak, statuses.count("running"))
            self.looks += 1
            if statuses.count("running") == 0 and all(s != "queued" for s in statuses):
                return
            # Woken by the next finished run, or 20 ms on: a look at every change.
            for entry, _, _ in batches.finished_since(
                self.r, self.batch.batch_id, after, block_ms=20
            ):
                after = entry

    def result(self) -> int:
        self.thread.join(timeout=120)
        assert not self.thread.is_alive(), "the batch never finished"
        return self.peak


def test_a_batch_never_has_more_than_max_in_flight_runs(small_worker: Any) -> None:
    inputs = [f"print({n})" for n in range(16)]
    free = _team().submit_batch(inputs)
    free.wait(timeout=120)
    uncapped = peak_in_flight(free.run_ids())

    batch = _team(max_in_flight=CAP).submit_batch(inputs)
    watch = PeakWatch(small_worker.redis_url, batch)
    progress = batch.progress()
    assert progress["max_in_flight"] == CAP
    if progress["done"] < len(inputs) - CAP:  # some still wait: progress says so
        assert any(f"max_in_flight {CAP}:" in w for w in progress["waits"]), progress["waits"]
    batch.wait(timeout=120)
    polled = watch.result()
    peak = peak_in_flight(batch.run_ids())
    print(
        f"{len(inputs)} runs, {SLOTS} worker threads: peak in flight {uncapped} uncapped, "
        f"{peak} with max_in_flight={CAP} (polled: {polled} in {watch.looks} looks)"
    )
    assert uncapped > CAP  # the worker would run more at once: the cap is what holds it
    assert batch.progress()["counts"] == {"approved": len(inputs)}
    assert peak == CAP  # reached, never passed
    assert 1 <= polled <= CAP
    r = redis.Redis.from_url(small_worker.redis_url, decode_responses=True)
    assert r.scard(keys.batch_gate(batch.batch_id)) == 0  # every place given back
    assert r.zcard(keys.batch_waiting(batch.batch_id)) == 0


def test_max_in_flight_from_the_command_line_and_the_config(
    small_worker: Any, tmp_path: Path
) -> None:
    config = tmp_path / "review.toml"
    config.write_text(
        '[actor]\ninstructions = "Fix."\nmodel = "sim?latency_ms=30"\n'
        '[critic]\ninstructions = "Review."\nmodel = "sim?scores=0.95&latency_ms=30"\n'
        "[batch]\nmax_in_flight = 3\n"
    )
    inputs = tmp_path / "in.jsonl"
    inputs.write_text(
        "".join(json.dumps({"id": f"i{k}", "prompt": f"x{k}"}) + "\n" for k in range(9))
    )
    env = {**os.environ, "DUET_REDIS_URL": small_worker.redis_url}
    r = redis.Redis.from_url(small_worker.redis_url, decode_responses=True)
    for flag, cap in (([], 3), (["--max-in-flight", "1"], 1)):
        done = subprocess.run(
            [sys.executable, "-m", "duet", "submit", str(config), "-i", str(inputs), *flag],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        batch = BatchHandle(done.stdout.strip().splitlines()[-1])
        assert r.hget(keys.batch(batch.batch_id), BATCH_FIELD) == str(cap)
        batch.wait(timeout=120)
        assert peak_in_flight(batch.run_ids()) <= cap
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "duet.commands.main",
            "submit",
            str(config),
            "-i",
            str(inputs),
            "--max-in-flight",
            "0",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--max-in-flight" in bad.stderr


def _peak_with_resumes(run_ids: list[str]) -> int:
    """Most runs moving at one moment, from their events: a run moves from ``run.started``
    to ``run.finished``, and again from its first step after ``run.resumed`` (a re-opened
    run waiting for a place does not move) to its next finish."""
    steps = {ev.ACTOR_STARTED, ev.CRITIC_STARTED}
    edges = []
    for run_id in run_ids:
        moving, resumed = False, False
        for event in RunHandle(run_id).events(follow=False):
            if event.type == ev.RUN_STARTED or (resumed and event.type in steps):
                moving, resumed = True, False
                edges.append((event.ts, 1))
            elif event.type == ev.RUN_RESUMED:
                resumed = True
            elif event.type == ev.RUN_FINISHED and moving:
                moving = False
                edges.append((event.ts, -1))
    peak = now = 0
    for _, step in sorted(edges):
        now += step
        peak = max(peak, now)
    return peak


def test_a_run_resumed_after_cancel_waits_for_a_place(small_worker: Any) -> None:
    """Cancelled, a run gives its place back; resumed while the next run holds it, it waits
    in line (before: it went on at once, two runs of a max_in_flight=1 batch moving)."""
    team = Team.actor_critic(
        actor=Agent("Fix.", model="sim?latency_ms=300"),
        critic=Agent("Review.", model="sim?scores=0.3,0.95&latency_ms=300"),
        max_in_flight=1,
    )
    batch = team.submit_batch([f"print({n})" for n in range(3)])
    first = RunHandle(batch.run_ids()[0])
    wait_for(lambda: first.status() == "running", 60, "the first run to start")
    assert first.cancel()
    wait_for(lambda: first.status() == "cancelled", 60, "the first run to stop")
    assert first.resume()
    batch.wait(timeout=120)
    counts = batch.progress()["counts"]
    peak = _peak_with_resumes(batch.run_ids())
    print(f"3 runs, max_in_flight=1, the first cancelled and resumed: {counts}, peak {peak}")
    assert counts == {"approved": 3}
    assert peak == 1
