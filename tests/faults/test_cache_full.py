"""The model-call cache yields to run state: on a Redis with a ``maxmemory`` a few MB above
what it holds (``noeviction``), a batch whose answers fill the cache leaves the next batch
the room to finish; the cache keeps a share of ``maxmemory`` free and gives entries back
when a run's write meets ``OOM``.

Real worker processes, the real ``openai`` SDK against the stand-in; long drafts (the
``words`` option) so that 40 runs' answers fill megabytes, once in run state and once in
the cache.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import redis

from duet.embedded.server import EmbeddedRedis
from duet.standin.server import FakeLLM
from orchestration import Agent, Team
from tests.reliability import ENGINE, Reliability, lost_of
from tests.support import celery_worker, client_pointed_at, wait_for

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

RUNS = 40
#: Room above what Redis holds at the start, bytes.
ROOM = 8 * 1024 * 1024


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM(latency_ms=100) as server:
        yield server


def test_a_full_cache_leaves_the_next_batch_room(llm: FakeLLM, reliability: Reliability) -> None:
    env = {"OPENAI_API_KEY": "sk-test-cache-full"}
    with EmbeddedRedis() as server, contextlib.ExitStack() as stack:
        r = stack.enter_context(redis.Redis(port=server.port, decode_responses=True))
        stack.enter_context(client_pointed_at(server.url))
        stack.enter_context(celery_worker(server.url, env=env, concurrency=8, name="cachefull"))
        r.config_set("maxmemory", int(r.info("memory")["used_memory"]) + ROOM)
        team = Team.actor_critic(
            actor=Agent("Fix.", model="openai:sim?words=6000", base_url=llm.url, max_tokens=30_000),
            critic=Agent("Review.", model="openai:sim:critic?scores=0.95", base_url=llm.url),
            max_rounds=1,
            cache=True,
        )
        first = team.submit_batch([f"first {n}" for n in range(RUNS)])
        wait_for(lambda: first.progress()["done"] == RUNS, 120, "the first batch")
        cached = int(r.hget("duet:{cache}:stats", "bytes") or 0)
        second = team.submit_batch([f"second {n}" for n in range(RUNS)])
        with contextlib.suppress(AssertionError):
            wait_for(lambda: second.progress()["done"] == RUNS, 120, "the second batch")
        progress = second.progress()
        memory = r.info("memory")
        left = int(r.hget("duet:{cache}:stats", "bytes") or 0)
    print(
        f"cache {cached:,} bytes after the first batch, {left:,} after the second; "
        f"second batch {progress['done']}/{RUNS} final {progress['counts']}; "
        f"used {memory['used_memory']:,} of {memory['maxmemory']:,}"
    )
    reliability.record(
        section=ENGINE,
        fault="The model-call cache filling a Redis whose `maxmemory` is 8 MB above its use "
        "(`noeviction`, the cache's default cap 512 MB)",
        load=f"2 batches × {RUNS} runs with ~40 KB drafts, cache on",
        lost=f"{lost_of(RUNS - progress['done'], RUNS, 'runs of the second batch not final')}"
        f": the cache held {cached:,} bytes after the first batch, {left:,} after the second",
        before="39/40 runs of the second batch stuck `running`; submit raised a bare "
        "`OutOfMemoryError`",
    )
    assert progress["done"] == RUNS, progress
