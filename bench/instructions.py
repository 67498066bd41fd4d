"""Instructions per model call, counted by valgrind: a figure the machine's load moves little.

    python -m bench.instructions [--runs 24] [--against DIR] [--fast-paths] [--json]

CPU seconds on these shared machines drift by 10-20 % between two runs of the same
commit, more than most single changes on the hot path move them. Instructions executed
do not: valgrind's ``callgrind`` counts them, whatever else the machine runs. Each figure
is the difference of two processes under it, one doing ``--runs`` more of the work than
the other (start-up, imports and warm-up cancel out), divided by the model calls:

* **Duet**: ``--runs`` never-approving runs (3 rounds: 7 calls each) on an in-process
  worker (4 threads) and an embedded Redis, the stand-in at 0 ms, as ``bench.overhead``
  runs them; the worker, client and SDK of that one process are counted (Redis and the
  stand-in run in processes of their own, not counted);
* **SDK**: the same number of bare ``openai`` SDK calls from one thread, actor and critic
  shaped requests alternating, as ``bench.overhead``'s reference.

Valgrind runs one thread at a time, so GIL contention does not show; batching that
depends on timing (messages per pop, events per flush) and idle timers move a count by
about half a percent. ``--against DIR`` counts the same in another checkout (for example
``git worktree add /tmp/before HEAD~3``) with this venv, and prints the ratio of the two:
the way to measure one change on the hot path. About 2 minutes per figure, two at a time.
Needs ``valgrind`` on the PATH (Debian's package).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Calls a run of the loop makes (3 rounds, never approved).
CALLS_PER_RUN = 7
_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def _child(kind: str, runs: int) -> None:
    """What one counted process does: ``runs`` runs of Duet, or as many bare SDK calls.

    Run from this file in the checkout being counted (:func:`count`), whose ``bench``
    helpers and packages it imports: an older checkout need not have this file."""
    from bench.harness import embedded_duet, fake_llm_process, wait_batch
    from bench.overhead import make_team, prompt_for, sdk_reference

    with fake_llm_process(latency_ms=0) as base_url:
        if kind == "sdk":  # one call more in both: the reference divides by its calls
            sdk_reference(base_url, calls=runs * CALLS_PER_RUN + 1, warmup=30)
            return
        with embedded_duet(4):
            team = make_team(base_url, 3, True)
            wait_batch(team.submit_batch([prompt_for(-k - 1) for k in range(2)]), 900)
            if runs:
                wait_batch(team.submit_batch([prompt_for(k) for k in range(runs)]), 3600)


def count(checkout: Path, kind: str, runs: int, switch: str | None = None) -> int:
    """Instructions valgrind counts in one child process of ``checkout`` doing ``runs``
    (with ``DUET_FAST_PATHS=switch`` if given)."""
    child = (
        f"import runpy, sys; sys.path.insert(0, {str(checkout)!r}); "
        f"runpy.run_path({__file__!r}, run_name='counted')['_child']({kind!r}, {runs})"
    )
    out = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-c",
            child,
        ],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=3600,
        env={
            **os.environ,
            "PYTHONPATH": str(checkout),
            **({"DUET_FAST_PATHS": switch} if switch is not None else {}),
        },
    )
    found = _COLLECTED.findall(out.stderr)
    if out.returncode != 0 or not found:
        raise RuntimeError(f"{kind} x {runs} in {checkout} failed: {out.stderr[-1500:]}")
    return int(found[-1])


def per_call(checkouts: list[Path], runs: int) -> dict[str, dict[str, float]]:
    """Instructions per model call of Duet and of the bare SDK in each checkout."""
    jobs = [(c, kind, n) for c in checkouts for kind in ("duet", "sdk") for n in (0, runs)]
    with ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        counted = dict(zip(jobs, pool.map(lambda job: count(*job), jobs), strict=True))
    calls = runs * CALLS_PER_RUN
    return {
        str(c): {
            kind: (counted[(c, kind, runs)] - counted[(c, kind, 0)]) / calls
            for kind in ("duet", "sdk")
        }
        for c in checkouts
    }


def per_switch(switches: list[str], runs: int) -> dict[str, float]:
    """Instructions per model call of Duet under each ``DUET_FAST_PATHS`` value, and of
    the bare SDK (key ``sdk``)."""
    jobs = [(ROOT, "duet", n, s) for s in switches for n in (0, runs)]
    jobs += [(ROOT, "sdk", n, None) for n in (0, runs)]
    with ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        counted = dict(zip(jobs, pool.map(lambda job: count(*job), jobs), strict=True))
    calls = runs * CALLS_PER_RUN
    figures = {
        s: (counted[(ROOT, "duet", runs, s)] - counted[(ROOT, "duet", 0, s)]) / calls
        for s in switches
    }
    figures["sdk"] = (counted[(ROOT, "sdk", runs, None)] - counted[(ROOT, "sdk", 0, None)]) / calls
    return figures


def fast_path_switches() -> list[str]:
    """``on``, ``off`` and ``on`` with each fast path off in turn."""
    from orchestration.state.fastpaths import FAST_PATHS

    return ["on", "off", *(f"on,-{name}" for name in FAST_PATHS)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__)
    parser.add_argument("--runs", type=int, default=24)
    parser.add_argument("--against", help="another checkout to count the same in")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--fast-paths",
        action="store_true",
        help="count DUET_FAST_PATHS=on, off and on with each one off",
    )
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not on the PATH (apt-get install valgrind)")
    if args.fast_paths:
        by_switch = per_switch(fast_path_switches(), args.runs)
        if args.json:
            print(json.dumps(by_switch))
            return 0
        on = by_switch["on"]
        print(f"instructions per model call (valgrind), {args.runs * CALLS_PER_RUN} calls each:")
        for switch, figure in by_switch.items():
            print(f"  {switch:>14}: {figure / 1e6:6.2f} M  ({figure / on - 1:+.1%} against on)")
        return 0
    checkouts = [ROOT] + ([Path(args.against).resolve()] if args.against else [])
    figures = per_call(checkouts, args.runs)
    if args.json:
        print(json.dumps(figures))
        return 0
    calls = args.runs * CALLS_PER_RUN
    print(f"instructions per model call (valgrind), {calls} calls a figure:")
    for checkout, fig in figures.items():
        print(
            f"  {checkout}: Duet {fig['duet'] / 1e6:.2f} M, bare SDK {fig['sdk'] / 1e6:.2f} M, "
            f"ratio {fig['duet'] / fig['sdk']:.2f}x"
        )
    if args.against:
        this, other = figures[str(ROOT)], figures[str(checkouts[1])]
        print(
            f"  this checkout / {checkouts[1].name}: Duet {this['duet'] / other['duet']:.3f}x, "
            f"bare SDK {this['sdk'] / other['sdk']:.3f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
