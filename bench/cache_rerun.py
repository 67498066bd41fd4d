"""A rerun with the model-call cache on: vendor requests it makes and its CPU against the
CPU of reading the same results (``duet results FILE``), for the 22-input example and a
1,000-input batch, on the embedded default against the stand-in (docs/cache.md).

    python -m bench.cache_rerun            # prints the RESULTS.md section
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from duet.standin.server import FakeLLM

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_INPUTS = ROOT / "examples" / "inputs.jsonl"


def _config(url: str, rounds: int, scores: str) -> str:
    price = "price = { input_per_mtok = 2.0, output_per_mtok = 8.0 }"
    return (
        f'[actor]\ninstructions = "Fix the code."\nmodel = "openai:sim"\nbase_url = "{url}"\n'
        f'{price}\n\n[critic]\ninstructions = "Find security bugs."\n'
        f'model = "openai:sim:critic?scores={scores}"\nbase_url = "{url}"\n{price}\n\n'
        f'[loop]\nmax_rounds = {rounds}\n\n[cache]\nttl = "7d"\n'
    )


def _cpu_of(args: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(CPU s, wall s) of running ``duet ARGS`` as its own process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "duet", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
    )
    wall = time.monotonic() - start
    if done.returncode not in (0, 1):
        raise RuntimeError(f"duet {' '.join(args)}: exit {done.returncode}: {done.stderr[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def measure(name: str, inputs: Path, server: FakeLLM, rounds: int, scores: str) -> dict[str, Any]:
    """First run, rerun and ``duet results`` of one batch, in a fresh cache."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = work / "c.toml"
        config.write_text(_config(server.url, rounds, scores))
        env = {
            k: v for k, v in os.environ.items() if k not in ("DUET_REDIS_URL", "DUET_BROKER_URL")
        }
        env["DUET_CACHE_DIR"] = str(work / "cache")
        requests = lambda: int(server.stats()["requests"])  # noqa: E731
        r0 = requests()
        first_cpu, first_wall = _cpu_of(
            ["run", str(config), "-i", str(inputs), "-o", "a.jsonl"], env, work
        )
        r1 = requests()
        rerun_cpu, rerun_wall = _cpu_of(
            ["run", str(config), "-i", str(inputs), "-o", "b.jsonl"], env, work
        )
        r2 = requests()
        read_cpu, _ = _cpu_of(["results", "a.jsonl", "-o", "c.jsonl"], env, work)
        saved = sum(
            json.loads(x)["usage"].get("saved_usd", 0.0)
            for x in (work / "b.jsonl").read_text().splitlines()
        )
    return {
        "name": name,
        "first_requests": r1 - r0,
        "rerun_requests": r2 - r1,
        "first_cpu": first_cpu,
        "first_wall": first_wall,
        "rerun_cpu": rerun_cpu,
        "rerun_wall": rerun_wall,
        "read_cpu": read_cpu,
        "saved_usd": saved,
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, FakeLLM() as server:
        big = Path(tmp) / "big.jsonl"
        big.write_text(
            "".join(
                json.dumps({"id": f"i{i}", "prompt": f"os.system(cmd_{i})"}) + "\n"
                for i in range(1000)
            )
        )
        rows = [
            measure(
                "22-input example (3 rounds, never approved)", EXAMPLE_INPUTS, server, 3, "0.1"
            ),
            measure("1,000-input batch (approved in round 1)", big, server, 1, "0.95"),
        ]
    print("## Rerun with the model-call cache on\n")
    print(
        "`python -m bench.cache_rerun`: `duet run` on the embedded default against the stand-in "
        "(`duet.standin.server`, no latency), then the same command again with the cache on "
        '(`[cache] ttl = "7d"`, a disk store under `DUET_CACHE_DIR`), then `duet results '
        "FILE -o OUT` reading the first run's results. CPU of each `duet` process (user + "
        "system), one run each. The rerun serves every input from its whole-run entry "
        "(docs/cache.md): it starts no Redis and no worker.\n"
    )
    print(
        "| batch | vendor requests, first run | vendor requests, rerun | CPU s, first run | "
        "CPU s, rerun | CPU s, `duet results` | rerun / reading | rerun wall s | saved USD |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['name']} | {r['first_requests']} | {r['rerun_requests']} | {r['first_cpu']:.2f} | "
            f"{r['rerun_cpu']:.2f} | {r['read_cpu']:.2f} | {r['rerun_cpu'] / r['read_cpu']:.2f}x | "
            f"{r['rerun_wall']:.2f} | {r['saved_usd']:.4f} |"
        )


if __name__ == "__main__":
    main()
