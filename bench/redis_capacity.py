"""How many model calls a second one Redis primary carries: worker processes are added
until something saturates, and redis-server's own CPU is read per call.

    python -m bench.redis_capacity [--processes 1,2,3] [--runs 600] [--json]

Each step: a fresh embedded Redis, N real ``celery -A workers worker`` processes x 50
threads (as ``duet worker`` starts one), one batch of runs the critic approves in round 1
on the in-process ``sim`` model at 0 ms (2 calls a run, no HTTP: every call is Duet's own
work), ``--runs`` per process. Per step: calls/s, redis-server's CPU per call from its
own ``INFO cpu`` (``used_cpu_user`` + ``used_cpu_sys``, deltas over the batch), the
workers' CPU per call, how busy Redis's one core was, how busy the machine was, and the
projected ceiling of one primary: 1 core / Redis CPU per call — the calls/s at which
redis-server would be the bottleneck, whatever the workers.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from .harness import wait_batch
from .suite import client_on, cpu_s, loop_team, redis_server, workers

THREADS = 50


def redis_cpu_s(client: Any) -> float:
    """redis-server's CPU so far (user + system), as it reports it."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def step(processes: int, runs: int) -> dict[str, Any]:
    """One batch on ``processes`` worker processes; its figures."""
    with (
        redis_server() as server,
        workers(server.url, processes, THREADS) as pids,
        client_on(server.url),
    ):
        team = loop_team("sim?latency_ms=0", "sim:critic?latency_ms=0&scores=0.95", None, 1)
        wait_batch(team.submit_batch([f"warm-up {n}" for n in range(4 * processes)]), 120)
        items = [f"snippet {n}: def f(x): return eval(x)" for n in range(runs)]
        redis0, workers0 = redis_cpu_s(server.client), sum(cpu_s(p) for p in pids)
        t0 = time.perf_counter()
        wait_batch(team.submit_batch(items), 600)
        wall = time.perf_counter() - t0
        redis_s = redis_cpu_s(server.client) - redis0
        workers_s = sum(cpu_s(p) for p in pids) - workers0
    calls = 2 * runs
    redis_ms = 1000 * redis_s / calls
    return {
        "processes": processes,
        "threads": THREADS,
        "runs": runs,
        "calls": calls,
        "wall_s": wall,
        "calls_per_s": calls / wall,
        "redis_cpu_ms_per_call": redis_ms,
        "workers_cpu_ms_per_call": 1000 * workers_s / calls,
        "redis_busy": redis_s / wall,
        "machine_busy": (redis_s + workers_s) / wall / (os.cpu_count() or 1),
        "ceiling_calls_per_s": 1000 / redis_ms if redis_ms else float("inf"),
    }


def report(rows: list[dict[str, Any]]) -> str:
    """The RESULTS.md section."""
    cores = os.cpu_count() or 1
    best = max(rows, key=lambda f: f["calls_per_s"])
    lowest = min(f["ceiling_calls_per_s"] for f in rows)
    lines = [
        "## Redis capacity: calls/s one primary carries",
        "",
        f"`python -m bench.redis_capacity` ({time.strftime('%Y-%m-%d', time.gmtime())}, {cores} "
        f"cores shared): worker processes x {THREADS} threads added one at a time, each step a "
        "fresh embedded Redis and one batch of runs approved in round 1 on `sim` at 0 ms (2 calls "
        "a run, every call Duet's own work). Redis CPU is redis-server's own (`INFO cpu` user + "
        "sys, deltas over the batch; it is the broker too, so its queue traffic is in it); its "
        'ceiling is 1 core / Redis CPU per call. "Our share of the cores": redis-server\'s and '
        "the workers' CPU over the wall time and the cores (the rest went to the submitting "
        "client and to the other work on this shared machine).",
        "",
        "| worker processes | calls | calls/s | Redis CPU ms per call | Redis core busy | workers CPU ms per call | our share of the cores | projected ceiling, calls/s |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {f['processes']} | {f['calls']:,} | {f['calls_per_s']:.0f} | "
            f"{f['redis_cpu_ms_per_call']:.3f} | {100 * f['redis_busy']:.0f} % | "
            f"{f['workers_cpu_ms_per_call']:.2f} | {100 * f['machine_busy']:.0f} % | "
            f"{f['ceiling_calls_per_s']:,.0f} |"
            for f in rows
        ),
        "",
        f"On this machine the workers run out of CPU long before Redis does: calls/s stops "
        f"growing at {best['calls_per_s']:.0f} (with {best['processes']} worker process(es); more only "
        f"share the same {cores} cores) while redis-server uses at most "
        f"{100 * max(f['redis_busy'] for f in rows):.0f} % of one core, so Redis's ceiling "
        "cannot be reached here, only projected. What a deployment plans "
        f"on is the projection: one primary carries about **{lowest:,.0f} calls/s** (the lowest "
        "ceiling measured) before redis-server's one core is the bottleneck, given enough worker "
        "machines. Each worker process needs about "
        f"{min(f['workers_cpu_ms_per_call'] for f in rows):.1f} ms of CPU per call on this "
        "workload, so that is roughly "
        f"{lowest * min(f['workers_cpu_ms_per_call'] for f in rows) / 1000:.0f} worker cores per "
        "primary.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.redis_capacity", description=__doc__)
    parser.add_argument("--processes", default="1,2,3", help="worker processes at each step")
    parser.add_argument("--runs", type=int, default=600, help="runs per worker process")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON last")
    args = parser.parse_args(argv)
    rows = []
    for n in (int(p) for p in args.processes.split(",")):
        rows.append(step(n, args.runs * n))
        print(
            f"{n} process(es): {rows[-1]['calls_per_s']:.0f} calls/s, Redis "
            f"{rows[-1]['redis_cpu_ms_per_call']:.3f} ms a call",
            flush=True,
        )
    print(report(rows))
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
