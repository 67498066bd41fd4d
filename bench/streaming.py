"""Depth-first against breadth-first scheduling: when records arrive, and runs in flight.

    python -m bench.streaming [--runs 1000] [--slots 50] [--latency-ms 200]

One embedded Redis and one in-process worker with ``--slots`` threads. Each run is a
draft, a critique, a refinement and an approving critique (4 calls of ``--latency-ms``).
First one run alone (its own chain of calls: the reference), then the batch twice, with
``DUET_SCHEDULING=depth`` and ``=breadth``. Printed per mode, as ratios within this one
run: the first record's time over the lone run's wall, the share of runs finished at each
quarter of the batch's wall, peak in-flight runs (first step started, last not finished)
over the slots, and the wall over breadth-first's.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from .harness import embedded_duet, today, wait_batch
from .sim_throughput import in_flight


def _team(latency_ms: float) -> Any:
    from orchestration import Agent, Team

    lat = f"latency_ms={latency_ms:g}"
    return Team.actor_critic(
        actor=Agent("Fix the code.", model=f"sim?{lat}"),
        critic=Agent("Review it; strict JSON.", model=f"sim:critic?{lat}&scores=0.3,0.95"),
        max_rounds=3,
        approval_threshold=0.9,
    )


def batch(team: Any, runs: int, mode: str) -> dict[str, Any]:
    """One batch under scheduling ``mode``; figures from its stored steps."""
    from orchestration.client.handles import store

    os.environ["DUET_SCHEDULING"] = mode  # read on every send by the in-process worker
    start = time.time()
    handle = team.submit_batch([f"snippet {n}: def f(x): return eval(x)" for n in range(runs)])
    wait_batch(handle, timeout_s=900)
    wall = time.time() - start
    st = store()
    spans = []
    for run_id in handle.run_ids():
        _, steps = st.load_run(run_id)
        spans.append(
            (
                min(s["started_at"] for s in steps.values()),
                max(s["finished_at"] for s in steps.values()),
            )
        )
    finishes = sorted(end for _, end in spans)
    peak, mean = in_flight(spans)
    quarters = [sum(f - start <= q * wall / 4 for f in finishes) / runs for q in (1, 2, 3)]
    return {
        "mode": mode,
        "wall_s": round(wall, 2),
        "first_record_s": round(finishes[0] - start, 2),
        "finished_at_quarters": [round(q, 3) for q in quarters],
        "peak_in_flight": peak,
        "mean_in_flight": round(mean, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--slots", type=int, default=50)
    parser.add_argument("--latency-ms", type=float, default=200)
    args = parser.parse_args()
    with embedded_duet(args.slots):
        team = _team(args.latency_ms)
        wait_batch(team.submit_batch(["warm-up"] * 4), 60)
        t0 = time.time()
        wait_batch(team.submit_batch(["one run alone"]), 60)
        chain = time.time() - t0
        depth = batch(team, args.runs, "depth")
        breadth = batch(team, args.runs, "breadth")
    for row in (depth, breadth):
        row["first_record_over_chain"] = round(row["first_record_s"] / chain, 2)
        row["peak_in_flight_over_slots"] = round(row["peak_in_flight"] / args.slots, 2)
        row["wall_over_breadth"] = round(row["wall_s"] / breadth["wall_s"], 3)
    print(
        json.dumps(
            {
                "date": today(),
                "runs": args.runs,
                "slots": args.slots,
                "latency_ms": args.latency_ms,
                "chain_s": round(chain, 3),
                "depth": depth,
                "breadth": breadth,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
