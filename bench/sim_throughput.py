"""Runs/s and calls/s of one worker process on the offline ``sim`` model.

    python -m bench.sim_throughput [--runs 500] [--latency-ms 50] [--concurrency 200]

An embedded Redis (subprocess) and an in-process worker with ``--concurrency`` threads
run ``--runs`` runs of a loop whose critic never approves (1 + 2 x rounds calls each),
every call sleeping ``--latency-ms`` like a model's wall time. Printed: runs/s, calls/s,
the in-flight estimate by Little's law (calls/s x latency) and the in-flight count
measured from the stored steps' start/finish times (peak and time-weighted mean).

With a zero-CPU model, calls/s would be threads / latency; what stops it short is the
CPU each call costs the process (see ``bench.overhead``).

A second, shorter phase ("hold") runs ``--hold-runs`` one-round runs whose calls take
``--hold-latency-ms`` (closer to a real model) on the same worker and measures how many
calls the one process really holds in flight at once (``--no-hold`` skips it).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from .harness import embedded_duet, today, wait_batch


def in_flight(intervals: list[tuple[float, float]]) -> tuple[int, float]:
    """Peak and time-weighted mean number of overlapping ``(start, end)`` intervals."""
    if not intervals:
        return 0, 0.0
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    level = peak = 0
    area = 0.0
    last = edges[0][0]
    for t, step in edges:
        area += level * (t - last)
        last = t
        level += step
        peak = max(peak, level)
    span = edges[-1][0] - edges[0][0]
    return peak, (area / span if span > 0 else float(peak))


def run(
    runs: int, rounds: int, latency_ms: float, concurrency: int, *, warmup: int = 8
) -> dict[str, Any]:
    """One batch on the running embedded worker; figures from the clock and the steps."""
    import time as _time

    from orchestration import Agent, Team
    from orchestration.client.handles import store

    lat = f"latency_ms={latency_ms:g}"
    team = Team.actor_critic(
        actor=Agent("Fix the code.", model=f"sim?{lat}"),
        critic=Agent("Review it; strict JSON.", model=f"sim:critic?{lat}&scores=0.1"),
        max_rounds=rounds,
        approval_threshold=0.9,
    )
    if warmup:
        wait_batch(team.submit_batch([f"warm-up {n}" for n in range(warmup)]), 60)

    cpu0, wall0 = _time.process_time(), _time.perf_counter()
    batch = team.submit_batch([f"snippet {n}: def f(x): return eval(x)" for n in range(runs)])
    wait_batch(batch, timeout_s=300)
    cpu, wall = _time.process_time() - cpu0, _time.perf_counter() - wall0

    st = store()
    intervals: list[tuple[float, float]] = []
    statuses: dict[str, int] = {}
    for run_id in batch.run_ids():
        record, steps = st.load_run(run_id)
        statuses[record["status"]] = statuses.get(record["status"], 0) + 1
        intervals.extend((s["started_at"], s["finished_at"]) for s in steps.values())
    calls = len(intervals)
    expected = runs * (1 + 2 * rounds)
    if statuses != {"max_rounds_reached": runs} or calls != expected:
        raise SystemExit(f"unexpected outcomes: {statuses}, {calls} calls, expected {expected}")
    peak, mean = in_flight(intervals)
    calls_per_s = calls / wall
    return {
        "date": today(),
        "runs": runs,
        "calls": calls,
        "latency_ms": latency_ms,
        "concurrency": concurrency,
        "wall_s": wall,
        "runs_per_s": runs / wall,
        "calls_per_s": calls_per_s,
        "cpu_ms_per_call": cpu * 1000 / calls,
        "in_flight_littles_law": calls_per_s * latency_ms / 1000,
        "in_flight_peak_measured": peak,
        "in_flight_mean_measured": mean,
        "ceiling_calls_per_s": concurrency / (latency_ms / 1000) if latency_ms > 0 else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sim_throughput", description=__doc__)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--concurrency", type=int, default=200, help="worker threads")
    parser.add_argument("--hold-runs", type=int, default=200)
    parser.add_argument("--hold-latency-ms", type=float, default=2000.0)
    parser.add_argument("--no-hold", dest="hold", action="store_false", help="skip the hold phase")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    with embedded_duet(args.concurrency):
        fig = run(args.runs, args.rounds, args.latency_ms, args.concurrency)
        hold = (
            run(args.hold_runs, 1, args.hold_latency_ms, args.concurrency, warmup=0)
            if args.hold
            else None
        )
    total_s = time.perf_counter() - started
    if args.json:
        print(json.dumps({"throughput": fig, "hold": hold, "total_s": total_s}, indent=2))
        return 0
    ceiling = fig["ceiling_calls_per_s"]
    rows = [
        ("runs/s", f"{fig['runs_per_s']:.1f}"),
        ("calls/s", f"{fig['calls_per_s']:.0f}"),
        ("in flight, Little's law (calls/s x latency)", f"{fig['in_flight_littles_law']:.1f}"),
        ("in flight, measured peak", f"{fig['in_flight_peak_measured']}"),
        ("in flight, measured time-weighted mean", f"{fig['in_flight_mean_measured']:.1f}"),
        ("process CPU ms/call", f"{fig['cpu_ms_per_call']:.2f}"),
        (
            "ceiling if calls cost no CPU (threads / latency), calls/s",
            f"{ceiling:.0f}" if ceiling else "-",
        ),
    ]
    if hold is not None:
        rows += [
            (
                f"hold: {hold['runs']} runs x 3 calls of {hold['latency_ms']:g} ms, calls/s",
                f"{hold['calls_per_s']:.0f}",
            ),
            ("hold: in flight, Little's law", f"{hold['in_flight_littles_law']:.1f}"),
            ("hold: in flight, measured peak", f"{hold['in_flight_peak_measured']}"),
            (
                "hold: in flight, measured time-weighted mean",
                f"{hold['in_flight_mean_measured']:.1f}",
            ),
        ]
    width = max(len(k) for k, _ in rows)
    print(
        f"Duet sim throughput, {fig['date']}: {fig['runs']} runs x {1 + 2 * args.rounds} calls "
        f"= {fig['calls']} calls of {args.latency_ms:g} ms, one process, "
        f"{args.concurrency} worker threads, {fig['wall_s']:.1f} s (total {total_s:.0f} s)"
    )
    for k, v in rows:
        print(f"  {k:<{width}}  {v:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
