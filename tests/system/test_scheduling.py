"""Depth-first scheduling on a real worker: later steps of started runs go before drafts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from orchestration import Agent, Team
from orchestration.client.handles import RunHandle
from orchestration.core import events as ev
from tests.support import celery_worker, client_pointed_at

pytestmark = pytest.mark.system

SLOTS = 4


#: A db of their own: the session's 32-thread worker (on the system db) must not take drafts.
SCHED_DB = 10


@pytest.fixture
def small_worker(redis_url: str) -> Iterator[Any]:
    """A worker with few threads, so a batch is many times its slots, and the client on
    its db (the only worker there)."""
    url = f"{redis_url.rpartition('/')[0]}/{SCHED_DB}"
    redis.Redis.from_url(url).flushdb()
    with celery_worker(url, concurrency=SLOTS, name="sched") as proc, client_pointed_at(url):
        proc.redis_url = url
        yield proc


def _team() -> Team:
    return Team.actor_critic(
        actor=Agent("Fix.", model="sim?latency_ms=20"),
        critic=Agent("Review.", model="sim?scores=0.3,0.95&latency_ms=20"),
    )


def _timeline(run_ids: list[str]) -> tuple[list[float], list[float], list[tuple[float, float]]]:
    """Each run's draft start, finish, and (draft start, finish) span, from its events."""
    drafts, finishes, spans = [], [], []
    for run_id in run_ids:
        events = list(RunHandle(run_id).events(follow=False))
        draft = min(e.ts for e in events if e.type == ev.ACTOR_STARTED and e.round == 0)
        finish = max(e.ts for e in events if e.type == ev.RUN_FINISHED)
        drafts.append(draft)
        finishes.append(finish)
        spans.append((draft, finish))
    return drafts, finishes, spans


def _peak_in_flight(spans: list[tuple[float, float]]) -> int:
    """Most runs with a draft started and no finish at any one moment."""
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    peak = now = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def test_first_runs_finish_before_the_last_draft_starts(small_worker: Any) -> None:
    batch = _team().submit_batch([f"print({n})" for n in range(40)])
    batch.wait(timeout=120)
    drafts, finishes, spans = _timeline(batch.run_ids())
    assert min(finishes) < max(drafts)  # results stream: not all drafts first
    # The first finished run is done before most drafts have started.
    assert sum(d < min(finishes) for d in drafts) <= len(drafts) // 4
    assert _peak_in_flight(spans) <= 2 * SLOTS


def test_a_second_batch_starts_before_the_first_finishes(small_worker: Any) -> None:
    team = _team()
    first = team.submit_batch([f"print({n})" for n in range(30)])
    second = team.submit_batch([f"print({n})" for n in range(5)])
    first.wait(timeout=120)
    second.wait(timeout=120)
    _, first_finishes, _ = _timeline(first.run_ids())
    second_drafts, _, _ = _timeline(second.run_ids())
    # Drafts are FIFO among themselves: the old batch's refinements never starve them.
    assert min(second_drafts) < max(first_finishes)


def test_duet_watch_on_1000_inputs_shows_finished_runs_within_its_first_tenth(
    small_worker: Any, tmp_path: Path
) -> None:
    """Issue 26's bar, as a user sees it: ``duet watch`` (no terminal: a line every 0.2 s)
    counts finished runs before a tenth of its lines have gone by."""
    batch = _team().submit_batch([f"print({n})" for n in range(1000)])
    env = {k: v for k, v in os.environ.items() if k != "DUET_BROKER_URL"}
    env |= {"DUET_REDIS_URL": small_worker.redis_url, "PYTHONUNBUFFERED": "1"}
    watch = subprocess.run(
        [sys.executable, "-m", "duet", "watch", batch.batch_id, "--log-every", "0.2"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert watch.returncode == 0, watch.stderr[-2000:]
    done = [int(m.group(1)) for m in re.finditer(r" (\d+)/1000 done", watch.stderr)]
    assert done[-1] == 1000 and len(done) >= 20, watch.stderr[-2000:]
    first_with_finished = next(n for n, count in enumerate(done) if count > 0)
    assert first_with_finished <= len(done) // 10, done[: len(done) // 10 + 1]
