"""Where Duet's CPU per model call goes: thread-CPU accumulators around the hot path.

    python -m bench.breakdown [--runs 60] [--rounds 3] [--concurrency 4] [--repeat 2]
                              [--no-persistent] [--json]

The same workload as :mod:`bench.overhead` (stand-in LLM in a subprocess with latency 0,
embedded Redis, in-process worker, never-approving critic), but instead of one total
each function in :data:`PROBES` is wrapped so that every call adds its *thread* CPU time
(``time.thread_time``) to a counter. Figures are ms per model call. Probes nest (the step
task includes the SDK call, ``trace_task`` includes both tasks' bodies), so they do not
add up; ``total`` is the whole process, as in ``bench.overhead``.

Use it to see which part a change moved; use ``bench.overhead`` for the headline figure.
"""

from __future__ import annotations

import argparse
import collections
import functools
import importlib
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .harness import embedded_duet, fake_llm_process, wait_batch
from .overhead import make_team, prompt_for

#: (label, module, attribute path): the functions timed. Celery's own pieces first, then
#: Duet's (steps, coordinator, store scripts), then the vendor SDK call.
PROBES: tuple[tuple[str, str, str], ...] = (
    ("celery: trace_task (both tasks)", "celery.app.trace", "trace_task"),
    ("celery: receive (BRPOP read)", "kombu.transport.redis", "MultiChannelPoller.on_readable"),
    ("celery: task events flush", "celery.events.dispatcher", "EventDispatcher.flush"),
    ("celery: ack", "kombu.message", "Message.ack"),
    ("celery: send_task", "celery.app.base", "Celery.send_task"),
    ("duet: publish.push (a send on Redis)", "workers.publish", "push"),
    ("duet: step service", "orchestration.services.step", "StepService.run"),
    ("duet: coordinator advance", "orchestration.services.coordinator", "Coordinator.advance"),
    ("duet: dispatch (send step)", "workers.runtime", "dispatch"),
    ("duet: coordinator_send", "workers.runtime", "coordinator_send"),
    ("store: begin_step", "orchestration.state.runs", "RunStore.begin_step"),
    ("store: complete_step", "orchestration.state.runs", "RunStore.complete_step"),
    ("store: load_for_transition", "orchestration.state.runs", "RunStore.load_for_transition"),
    ("store: record_step", "orchestration.state.runs", "RunStore.record_step"),
    ("store: record_finish", "orchestration.state.runs", "RunStore.record_finish"),
    ("budgets: rate_wait", "orchestration.services.budgeting", "Budgets.rate_wait"),
    ("sdk: OpenAIProvider._call", "workers.providers.openai", "OpenAIProvider._call"),
)


class Probes:
    """Thread-CPU accumulators installed around :data:`PROBES`."""

    def __init__(self) -> None:
        self.cpu: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def install(self) -> None:
        import workers.tasks  # noqa: F401 - import the task modules before rebinding names

        for label, module_name, path in PROBES:
            owner: Any = importlib.import_module(module_name)
            *parents, name = path.split(".")
            for part in parents:
                owner = getattr(owner, part, None)
            if owner is None or not hasattr(owner, name):
                continue  # a probe point this version does not have
            original = getattr(owner, name)
            timed = self._wrap(label, original)
            setattr(owner, name, timed)
            if not parents:  # a module function: rebind it where it was imported by name
                ours = ("workers.", "orchestration.")
                for mod in list(sys.modules.values()):
                    mod_name = getattr(mod, "__name__", "")
                    if mod_name.startswith(ours) and getattr(mod, name, None) is original:
                        setattr(mod, name, timed)

    def _wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.thread_time() - start
                with self._lock:
                    self.cpu[label] += spent
                    self.calls[label] += 1

        return timed

    def reset(self) -> None:
        with self._lock:
            self.cpu.clear()
            self.calls.clear()


def measure(team: Any, probes: Probes, runs: int, rounds: int) -> dict[str, float]:
    """One batch: process CPU per call and each probe's thread CPU per call."""
    calls = runs * (1 + 2 * rounds)
    probes.reset()
    cpu0 = time.process_time()
    wait_batch(team.submit_batch([prompt_for(n) for n in range(runs)]), timeout_s=300)
    total = time.process_time() - cpu0
    out = {"total": total * 1000 / calls}
    for label, _, _ in PROBES:
        out[label] = probes.cpu[label] * 1000 / calls
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.breakdown", description=__doc__)
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4, help="worker threads")
    parser.add_argument("--repeat", type=int, default=2, help="batches; the median is shown")
    parser.add_argument(
        "--no-persistent",
        dest="persistent",
        action="store_false",
        help="plain prompts instead of per-user conversations",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)

    os.environ.setdefault("OPENAI_API_KEY", "not-needed")
    probes = Probes()
    probes.install()
    with fake_llm_process(latency_ms=0) as base_url, embedded_duet(args.concurrency):
        team = make_team(base_url, args.rounds, args.persistent)
        wait_batch(team.submit_batch([prompt_for(-n - 1) for n in range(4)]), 60)  # warm-up
        samples = [
            measure(team, probes, args.runs, args.rounds) for _ in range(max(1, args.repeat))
        ]
    figures = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
    if args.json:
        print(
            json.dumps(
                {
                    "persistent_subagents": args.persistent,
                    "ms_per_call": figures,
                    "samples": samples,
                },
                indent=2,
            )
        )
        return 0
    calls = args.runs * (1 + 2 * args.rounds)
    print(
        f"Duet CPU breakdown: {args.runs} runs x {1 + 2 * args.rounds} calls = {calls} calls, "
        f"{args.concurrency} worker threads, persistent_subagents={args.persistent}; "
        f"median of {len(samples)}; thread CPU ms per model call (probes nest)"
    )
    width = max(len(k) for k in figures)
    for label, value in figures.items():
        print(f"  {label:<{width}}  {value:7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
