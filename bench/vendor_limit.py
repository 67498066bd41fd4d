"""At the vendor's limit: how close a batch runs to the account's rate limit.

    python -m bench.vendor_limit [--runs 150] [--rpm 600] [--latency-ms 500] [--json FILE]

The stand-in enforces ``--rpm`` the way the vendors say they may (600 a minute as 10 a
second: HTTP 429 with ``retry-after: 1`` over it) and states it in the vendors' headers;
each call takes ``--latency-ms``. ``--runs`` never-approving runs of 3 calls (actor,
critic, refine) go through one real worker process (50 threads), for four configurations
measured one after another in this run, each on a fresh Redis and a fresh stand-in:
``[rate_limits] rpm`` set as docs/budgets.md shows, and no limit configured (the fleet
learns it from the headers), with OpenAI-style and with Anthropic-style answers. Ideal:
every call at the limit's rate, ``runs x 3 / (rpm / 60)`` seconds. Figures: wall / ideal,
the share of requests answered 429, the longest gap between two accepted calls, runs
interrupted. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from typing import Any

from .harness import fake_llm_process, fake_llm_reset, fake_llm_stats, today, wait_batch
from .overhead import ACTOR_INSTRUCTIONS, CRITIC_INSTRUCTIONS, prompt_for
from .suite import client_on, redis_server, workers

CALLS_PER_RUN = 3
THREADS = 50


def warm(url: str, style: str) -> None:
    """One request, so the stand-in has built its request schemas (seconds, on a loaded
    machine) before the batch; then a second for its bucket to fill again."""
    import urllib.request

    if style == "openai":
        path, body = "/chat/completions", {"model": "warm", "messages": []}
    else:
        path, body = "/messages", {"model": "warm", "max_tokens": 1, "messages": []}
    body["messages"] = [{"role": "user", "content": "warm up"}]
    request = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=120):
        pass
    fake_llm_reset(url)  # its statistics; the limit stays
    time.sleep(1.5)


def one(style: str, configured: bool, runs: int, rpm: int, latency_ms: float) -> dict[str, Any]:
    """One batch against a fresh stand-in and Redis; its figures."""
    from orchestration import Agent, Team
    from orchestration.state.ratelimits import RateLimit, set_rate_limits

    with fake_llm_process(latency_ms, rpm=rpm) as url:
        warm(url, style)
        base_url = url if style == "openai" else url.removesuffix("/v1")
        model = f"{style}:sim?scores=0.1"  # actor and critic: one model, one limit
        env = {
            "OPENAI_API_KEY": "sk-bench",
            "ANTHROPIC_API_KEY": "sk-bench",
            "DUET_PRELOAD_PROVIDERS": style,
        }
        with (
            redis_server() as server,
            workers(server.url, 1, THREADS, env),
            client_on(server.url),
        ):
            if configured:  # what `[rate_limits."MODEL"] rpm = N` stores for the config's endpoint
                limits = {model: RateLimit(rpm=rpm, source="bench")}
                set_rate_limits(server.client, limits, base_url=base_url)
            team = Team.actor_critic(
                actor=Agent(ACTOR_INSTRUCTIONS, model=model, base_url=base_url),
                critic=Agent(CRITIC_INSTRUCTIONS, model=model, base_url=base_url),
                max_rounds=1,
                approval_threshold=0.9,
            )
            wall0 = time.perf_counter()
            batch = team.submit_batch([prompt_for(n) for n in range(runs)])
            wait_batch(batch, timeout_s=runs * CALLS_PER_RUN / (rpm / 60) * 6 + 60)
            wall = time.perf_counter() - wall0
            results = list(batch.results(timeout=120))
        stats = fake_llm_stats(url)
    accepted = sorted(a["t"] for a in stats["arrivals"] if not a.get("rate_limited"))
    refused = int(stats["by_status"].get("429", 0))
    requests = int(stats["requests"])
    answered = int(stats["usage"]["responses"])
    # the gaps that count are between calls that went through
    gaps = [b - a for a, b in zip(accepted, accepted[1:], strict=False)]
    interrupted = [r for r in results if r.status == "interrupted"]
    ideal = runs * CALLS_PER_RUN / (rpm / 60)
    return {
        "style": style,
        "limit": f"rpm = {rpm} configured" if configured else "none configured (learned)",
        "runs": runs,
        "calls": answered,
        "wall_s": round(wall, 2),
        "ideal_s": round(ideal, 2),
        "wall_over_ideal": round(wall / ideal, 3),
        "requests": requests,
        "answered_429": refused,
        "share_429": round(refused / max(requests, 1), 4),
        "longest_gap_s": round(max(gaps, default=0.0), 2),
        "interrupted": len(interrupted),
        "reasons": sorted({r.interruption_reason or "" for r in interrupted}),
        # when the 429s came, seconds after the first request
        "429_at_s": [
            round(a["t"] - stats["arrivals"][0]["t"], 2)
            for a in stats["arrivals"]
            if a.get("rate_limited")
        ][:50],
    }


def measure(
    runs: int, rpm: int, latency_ms: float, only: str | None = None
) -> list[dict[str, Any]]:
    """The four configurations, one after another (``only``: one style)."""
    rows = []
    for configured in (True, False):
        for style in ("openai", "anthropic") if only is None else (only,):
            row = one(style, configured, runs, rpm, latency_ms)
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def load_average() -> str:
    """The machine's 1-minute load average now (``?`` where there is none)."""
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            return f.read().split()[0]
    except OSError:
        return "?"


def markdown(
    rows: list[dict[str, Any]], rpm: int, latency_ms: float, load: tuple[str, str] = ("?", "?")
) -> str:
    """The rows as the table of bench/RESULTS.md's "At the vendor limit"."""
    first = rows[0]
    lines = [
        f"{today()}, load average {load[0]} at the start and {load[1]} at the end; the stand-in at {rpm} requests a minute enforced per second "
        f"({rpm // 60} a second, 429 with `retry-after: 1` over it), {latency_ms:g} ms a call, "
        f"{first['runs']} runs x {CALLS_PER_RUN} calls (ideal {first['ideal_s']:g} s), one "
        f"worker process x {THREADS} threads; `python -m bench.vendor_limit`.",
        "",
        "| headers | limit | wall / ideal | requests answered 429 | longest idle gap | runs interrupted |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['style']} | {row['limit']} | {row['wall_over_ideal']:.2f}x "
            f"({row['wall_s']:.1f} s) | {row['share_429']:.1%} ({row['answered_429']}) | "
            f"{row['longest_gap_s']:.2f} s | {row['interrupted']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=150)
    parser.add_argument("--rpm", type=int, default=600)
    parser.add_argument("--latency-ms", type=float, default=500.0)
    parser.add_argument("--json", help="write every figure to this file")
    parser.add_argument("--only", choices=["openai", "anthropic"], help="one style only")
    args = parser.parse_args(argv)
    before = load_average()
    rows = measure(args.runs, args.rpm, args.latency_ms, args.only)
    print(markdown(rows, args.rpm, args.latency_ms, (before, load_average())))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(rows, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
