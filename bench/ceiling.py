"""How many 100 ms calls one worker process could hold at best: the floor of its parts.

    python -m bench.ceiling [--calls 600] [--latency-ms 100] [--slots 50] [--json]

One worker process runs on one core at a time (the GIL), so it holds at most
``latency / cpu_per_call`` calls in flight, whatever its threads. Three parts of each call
no design in the mission's shape can remove:

* **the post**: Duet's own adapter posting one model call and reading the reply
  (``OpenAIProvider.complete`` on the stand-in at 0 ms, one thread, after a warm-up:
  the thinnest path Duet has, without the SDK's typed layers);
* **the two tasks**: every call is a Celery task and is followed by a coordinator task
  (``bench.celery_floor``: two chained no-op tasks with Duet's transport and
  task events);
* **the run state**: the round trips to Redis every call makes at the least
  (:data:`STATE_ROUND_TRIPS`: the step's begin and store scripts, the coordinator's read
  and its transition script), timed as ``PING`` on Duet's own client (a script costs more).

Their sum is the CPU per call of a worker that did nothing else; the ceiling is the
latency over it, as a share of ``--slots``. A slot target above the ceiling cannot be met
by one process on this machine; the figure says by how much. Nothing here asserts a
timing (``bench.suite`` prints the same in RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from . import celery_floor
from .harness import fake_llm_process
from .overhead import ACTOR_INSTRUCTIONS, CRITIC_INSTRUCTIONS, prompt_for


def post_cpu_ms(base_url: str, calls: int, warmup: int = 30) -> float:
    """CPU ms per model call of Duet's OpenAI adapter posting to ``base_url`` from this
    thread, actor and critic shaped calls alternating (as the loop makes them)."""
    from orchestration import Agent
    from workers.providers import Message, provider_for, reset_providers

    agents = [
        Agent(ACTOR_INSTRUCTIONS, model="openai:sim", base_url=base_url).spec,
        Agent(CRITIC_INSTRUCTIONS, model="openai:sim:critic?scores=0.1", base_url=base_url).spec,
    ]
    review = "Review this answer:\n\n" + "def parse(s):\n    return int(s)\n" * 8
    actor: list[Message] = [{"role": "user", "content": prompt_for(1)}]
    critic: list[Message] = [{"role": "user", "content": review}]
    shapes = [(agents[0], actor), (agents[1], critic)]
    try:
        for i in range(warmup):
            agent, messages = shapes[i % 2]
            provider_for(agent).complete(agent, messages)
        cpu0 = time.thread_time()
        for i in range(calls):
            agent, messages = shapes[i % 2]
            provider_for(agent).complete(agent, messages)
        return (time.thread_time() - cpu0) * 1000 / calls
    finally:
        reset_providers()


def round_trip_cpu_ms(calls: int = 2000) -> float:
    """CPU ms of one ``PING`` round trip on Duet's run-state client (its pool and
    hiredis), to an embedded Redis, from this thread."""
    from duet.embedded.server import EmbeddedRedis
    from orchestration.state import connection

    with EmbeddedRedis() as server:
        connection.use_redis(server.url)
        try:
            client = connection.get_redis()
            for _ in range(100):
                client.ping()
            cpu0 = time.thread_time()
            for _ in range(calls):
                client.ping()
            return (time.thread_time() - cpu0) * 1000 / calls
        finally:
            connection.reset()


#: Round trips to Redis a call makes at the least: the step's begin and store scripts,
#: the coordinator's read of the run and its transition script.
STATE_ROUND_TRIPS = 4


def ceiling(
    post_ms: float, floor_ms: float, round_trip_ms: float, latency_ms: float, slots: int
) -> dict[str, float]:
    """The most calls one process holds at ``latency_ms`` when a call costs at least
    ``post_ms`` + ``floor_ms`` + :data:`STATE_ROUND_TRIPS` x ``round_trip_ms`` of CPU, and
    the CPU per call that 90 % of ``slots`` busy would need (arithmetic only)."""
    state_ms = STATE_ROUND_TRIPS * round_trip_ms
    per_call = post_ms + floor_ms + state_ms
    held = latency_ms / per_call
    return {
        "latency_ms": latency_ms,
        "slots": slots,
        "post_ms": post_ms,
        "floor_ms": floor_ms,
        "state_ms": state_ms,
        "cpu_ms_per_call": per_call,
        "calls_held": held,
        "share_of_slots": min(1.0, held / slots),
        # 90 % of the slots busy: 0.9 * slots calls each latency -> this much CPU per call
        "needed_ms_for_90pct": latency_ms / (0.9 * slots),
    }


def measure(latency_ms: float, slots: int, floor_ms: float, calls: int = 600) -> dict[str, float]:
    """:func:`ceiling` with the post and the round trip measured now (the post on a stand-in
    at 0 ms of its own) and ``floor_ms`` the Celery floor (:func:`celery_floor.measured`)."""
    with fake_llm_process(latency_ms=0) as base_url:
        post = post_cpu_ms(base_url, calls)
    return ceiling(post, floor_ms, round_trip_cpu_ms(), latency_ms, slots)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ceiling", description=__doc__)
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--latency-ms", type=float, default=100.0)
    parser.add_argument("--slots", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    floor = celery_floor.measured(400)
    if floor is None:
        raise SystemExit("bench.celery_floor failed")
    fig: dict[str, Any] = measure(args.latency_ms, args.slots, floor, args.calls)
    if args.json:
        print(json.dumps(fig))
        return 0
    rows = [
        ("the post (Duet's adapter, one thread), CPU ms/call", f"{fig['post_ms']:.2f}"),
        ("two chained no-op Celery tasks, CPU ms/call", f"{fig['floor_ms']:.2f}"),
        (f"{STATE_ROUND_TRIPS} Redis round trips (PING), CPU ms/call", f"{fig['state_ms']:.2f}"),
        ("calls held at most (latency / their sum)", f"{fig['calls_held']:.1f}"),
        ("share of the slots", f"{fig['share_of_slots']:.0%}"),
        ("CPU ms/call that 90 % of the slots would need", f"{fig['needed_ms_for_90pct']:.2f}"),
    ]
    print(f"one worker process at {args.latency_ms:g} ms a call, {args.slots} slots:")
    for label, value in rows:
        print(f"  {label:<52} {value:>6}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
