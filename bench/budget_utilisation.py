"""How much of a hard token cap a batch gets to use: ``python -m bench.budget_utilisation``.

Twenty runs start at once and share one fleet-wide budget of 5,000 tokens (an actor and
a critic on the offline simulator, 300 output tokens a call, up to 3 rounds: far more
than the cap holds). The budget is a hard cap, so the batch must never spend past it;
the figure that matters is how close it gets. Each trial uses a fresh embedded Redis, so
every trial starts with nothing learned about the model's tokenizer (the conservative
start: one token per byte).

Prints one JSON line per trial and a summary: tokens spent, the share of the cap, and
how the runs ended. Target: between 4,750 and 5,000 tokens, never more.
"""

from __future__ import annotations

import argparse
import collections
import json
import time
import uuid

from bench.harness import embedded_duet

CAP = 5_000
RUNS = 20


def trial(concurrency: int) -> dict[str, object]:
    from orchestration import Agent, Team
    from orchestration.client.handles import store
    from orchestration.core.budget import Budget
    from orchestration.state.budgets import BudgetLedger

    with embedded_duet(concurrency):
        name = f"cap-{uuid.uuid4().hex[:8]}"
        ledger = BudgetLedger(store().r)
        ledger.set_limits(f"global:{name}", Budget(max_tokens=CAP))
        team = Team.actor_critic(
            actor=Agent("Fix the code.", model="sim?latency_ms=30", max_tokens=300),
            critic=Agent("Review.", model="sim?scores=0.1&latency_ms=30", max_tokens=300),
            max_rounds=3,
            global_budgets=[name],
        )
        started = time.monotonic()
        handles = [team.submit(f"Review snippet {i}: eval(input())") for i in range(RUNS)]
        results = [h.result(timeout=300) for h in handles]
        spent = ledger.get(f"global:{name}").spent.tokens
        return {
            "spent_tokens": spent,
            "share_of_cap": round(spent / CAP, 4),
            "runs_spent": sum(r.usage.total.total_tokens for r in results),
            "ended": dict(collections.Counter(r.interruption_reason or r.status for r in results)),
            "seconds": round(time.monotonic() - started, 1),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.budget_utilisation")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args(argv)
    spent = []
    for _ in range(args.trials):
        figures = trial(args.concurrency)
        print(json.dumps(figures), flush=True)
        spent.append(int(figures["spent_tokens"]))  # type: ignore[call-overload]
    print(
        json.dumps(
            {
                "cap": CAP,
                "runs": RUNS,
                "trials": args.trials,
                "min_spent": min(spent),
                "max_spent": max(spent),
                "never_over": max(spent) <= CAP,
                "in_target": all(4_750 <= s <= CAP for s in spent),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
