"""CPU per model call as one user's conversation grows: flat, and the history bounded.

    python -m bench.history [--waves 8] [--runs 20] [--rounds 1] [--concurrency 8] [--json]

With ``persistent_subagents`` (the default) the actor and the critic each keep a
conversation per user; a call carries the last turns of it, trimmed to the team's
``conversation_turns`` and ``conversation_max_tokens``. Here every run is the same user's:
waves of ``--runs`` runs, one wave after another, on the stand-in OpenAI server at 0 ms
(a subprocess, so its CPU is not counted), an embedded Redis and an in-process worker.
For each wave: the turns stored in the user's conversations so far, process CPU per model
call, and input tokens per call as the stand-in counted them. If history cost grew with
length, the later waves' CPU and tokens per call would climb; they level off once the
bound is reached (the first waves' calls carry less history than the bound allows).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from .harness import embedded_duet, fake_llm_process, fake_llm_stats, wait_batch
from .overhead import make_team, prompt_for

USER = "bench-history-user"


def conversation_turns(redis_url: str) -> int:
    """Turns stored in every conversation list of the test user (its actor's and critic's)."""
    import redis

    from orchestration.state import keys

    client = redis.Redis.from_url(redis_url)
    try:
        found = client.scan_iter(match=keys.conversation("*", "*", f"*{USER}*"), count=1000)
        return sum(int(client.llen(key)) for key in found)
    finally:
        client.close()


def measure(waves: int, runs: int, rounds: int, concurrency: int) -> list[dict[str, Any]]:
    rows = []
    with fake_llm_process(latency_ms=0) as base_url, embedded_duet(concurrency) as redis_url:
        team = make_team(base_url, rounds, persistent=True, memory="per_user")
        # Untimed: imports, connection pools, the SDK's first call (another user's runs).
        warm = [{"prompt": prompt_for(-n - 1), "user_id": "warm-up"} for n in range(runs)]
        wait_batch(team.submit_batch(warm), timeout_s=300)
        for wave in range(waves):
            turns = conversation_turns(redis_url)
            before = fake_llm_stats(base_url)["usage"]
            cpu0, wall0 = time.process_time(), time.perf_counter()
            batch = team.submit_batch(
                [{"prompt": prompt_for(wave * runs + n), "user_id": USER} for n in range(runs)]
            )
            wait_batch(batch, timeout_s=300)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            after = fake_llm_stats(base_url)["usage"]
            calls = after["responses"] - before["responses"]
            rows.append(
                {
                    "wave": wave + 1,
                    "turns_before": turns,
                    "calls": calls,
                    "cpu_ms_per_call": cpu * 1000 / calls,
                    "wall_s": wall,
                    "input_tokens_per_call": (after["input_tokens"] - before["input_tokens"])
                    / calls,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.history", description=__doc__)
    parser.add_argument("--waves", type=int, default=8)
    parser.add_argument("--runs", type=int, default=20, help="runs per wave")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=8, help="worker threads")
    parser.add_argument("--json", action="store_true", help="print the rows as one JSON list")
    args = parser.parse_args(argv)
    rows = measure(args.waves, args.runs, args.rounds, args.concurrency)
    if args.json:
        print(json.dumps(rows))
        return 0
    print("wave  turns stored before  CPU ms/call  input tokens/call")
    for r in rows:
        print(
            f"{r['wave']:>4}  {r['turns_before']:>19}  {r['cpu_ms_per_call']:>11.2f}  "
            f"{r['input_tokens_per_call']:>17.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
