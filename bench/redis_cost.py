"""Redis commands per model call and memory per finished run, in about a minute.

    python -m bench.redis_cost [--runs 30] [--json]

The Redis section of ``bench.suite`` on small batches: one real ``celery -A workers
worker`` process x 50 threads (as ``duet worker`` starts it: task events, INFO log) on a
fresh embedded Redis, the stand-in OpenAI server at 100 ms per call. Three workloads,
each measured alone:

- ``7-call``: never-approving runs (3 rounds), as in the suite's loop table;
- ``7-call-user``: the same, each run with a ``user_id`` that has no budget set;
- ``2-call``: runs the critic approves in round 1, as in the suite's big batch.

For each: commands per call from ``INFO`` (those run inside Lua scripts count), split by
``MONITOR`` into sent by clients (a script call is one) and run inside scripts, the top
commands of each; ``used_memory`` growth per finished run, ``MEMORY USAGE`` of each kind
of a run's keys, and the finished run's TTL.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from .harness import (
    RedisCounters,
    fake_llm_process,
    fake_llm_reset,
    fake_llm_stats,
    monitored,
    tally,
    wait_batch,
)
from .overhead import prompt_for
from .suite import client_on, loop_team, redis_server, run_key_bytes, workers

WORKLOADS = {
    # name: (actor model, critic model, rounds, calls a run, user ids)
    "7-call": ("openai:sim", "openai:sim:critic?scores=0.1", 3, 7, False),
    "7-call-user": ("openai:sim", "openai:sim:critic?scores=0.1", 3, 7, True),
    # as the suite's big batch: the in-process simulator at 0 ms, approved in round 1
    "2-call": ("sim?latency_ms=0", "sim:critic?latency_ms=0&scores=0.95", 1, 2, False),
}


def measure(server: Any, base_url: str, name: str, runs: int) -> dict[str, Any]:
    actor, critic, rounds, per_run, users = WORKLOADS[name]
    http = actor.startswith("openai:")
    team = loop_team(actor, critic, base_url if http else None, rounds)
    items: list[Any] = [prompt_for(n) for n in range(runs)]
    if users:
        items = [{"prompt": p, "user_id": f"u{n % 5}"} for n, p in enumerate(items)]
    client = server.client
    wait_batch(team.submit_batch(items[:2]), 120)  # warm-up: scripts, specs, pools
    fake_llm_reset(base_url)
    with monitored(client) as seen:
        mem0 = int(client.info("memory")["used_memory"])
        before = RedisCounters.read(client)
        batch = team.submit_batch(items)
        wait_batch(batch, 300)
        after = RedisCounters.read(client)
    # Let the workers' last acks and events land before reading memory.
    time.sleep(1.0)
    mem1 = int(client.info("memory")["used_memory"])
    results = list(batch.results(timeout=120))
    calls = sum(r.model_calls for r in results)
    answered = int(fake_llm_stats(base_url)["usage"]["responses"]) if http else calls
    if answered != calls or calls != runs * per_run:
        raise SystemExit(f"{name}: {calls} calls in the results, {answered} answered")
    run_ids = batch.run_ids()
    ttl = int(client.ttl(f"duet:run:{{{run_ids[0]}}}"))
    info_commands = after.commands - before.commands - 4  # the INFO reads themselves
    return {
        "workload": name,
        "runs": runs,
        "calls": calls,
        "commands_per_call": info_commands / calls,
        **tally(seen, calls),
        "memory_per_run_bytes": (mem1 - mem0) / runs,
        "run_keys_bytes": run_key_bytes(client, run_ids[:20]),
        "run_ttl_s": ttl,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.redis_cost", description=__doc__)
    parser.add_argument("--runs", type=int, default=40, help="runs per workload")
    parser.add_argument(
        "--only", choices=sorted(WORKLOADS), action="append", help="workloads (default: all)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    out = []
    with fake_llm_process(latency_ms=100) as base_url:
        for name in args.only or list(WORKLOADS):
            with redis_server() as server, workers(server.url, 1, 50), client_on(server.url):
                out.append(measure(server, base_url, name, args.runs))
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for f in out:
        print(
            f"{f['workload']}: {f['runs']} runs, {f['calls']} calls; commands per call "
            f"{f['commands_per_call']:.1f} (INFO), sent by clients {f['sent_per_call']:.1f}, "
            f"inside Lua {f['in_scripts_per_call']:.1f} (MONITOR)"
        )
        keys = ", ".join(f"{k} {v / 1000:.2f}" for k, v in f["run_keys_bytes"].items())
        print(
            f"  memory per finished run: its keys {sum(f['run_keys_bytes'].values()) / 1000:.2f} kB "
            f"(MEMORY USAGE kB: {keys}); used_memory growth / runs "
            f"{f['memory_per_run_bytes'] / 1000:.1f} kB; TTL {f['run_ttl_s']} s"
        )
        print("  sent: " + ", ".join(f"{k} {v}" for k, v in list(f["sent"].items())))
        print("  lua:  " + ", ".join(f"{k} {v}" for k, v in list(f["in_scripts"].items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
