"""Everything in one run, written to ``bench/RESULTS.md`` (``make bench``).

    python -m bench.suite [--repeat 3] [--runs 300] [--quick] [--out bench/RESULTS.md]
                          [--ref-python /tmp/loomvenv/bin/python] [--loop-only]

Sections (each measured in this run, on this machine, the references interleaved with
Duet's configurations so that a busy neighbour hits them alike):

1. The loop table: ``--runs`` never-approving runs (3 rounds, 7 calls each) through the
   stand-in OpenAI server (``duet.standin.server``, 100 ms per call), 50 slots: Duet with one
   ``celery -A workers worker`` process x 50 threads, two x 25 and one x 50 with
   ``DUET_FAST_PATHS=off`` (the stock libraries), the in-process reference
   (loomflow, from a separate venv: ``--ref-python``) and the raw ``openai`` SDK. CPU of
   every process but the stand-in's (workers, redis-server, the submitting client), wall
   time against the latency-bound ideal, calls in flight from the stand-in's arrival log.
   Redis commands, bytes and memory per finished run come from the Duet 1 x 50 batches.
2. The Celery no-op floor (``bench.celery_floor``, Duet's transport, events on).
3. Scaling 1 -> 2 -> 4 worker processes x 50 threads, ``sim`` model at 500 ms.
4. Worker RSS with 200 calls in flight (one process, 200 threads, 2 s calls).
5. A 10,000-input batch (``--big``): submit, drain with 1 and with 2 worker processes,
   read the results; time and Redis memory, against a quarter-size batch for linearity.
6. Budget utilisation (``bench.budget_utilisation``) when that module exists.
7. Persistent conversations (``bench.history``): CPU and input tokens per call as one
   user's conversation grows, wave after wave.
8. Redis capacity (``bench.redis_capacity``): worker processes added until something
   saturates; calls/s, redis-server's CPU per call and the projected ceiling of a primary.
9. At the vendor limit (``bench.vendor_limit``): a batch against a stand-in enforcing 600
   requests a minute per second, with the limit configured and learned from headers.

Nothing here asserts a timing; the figures go to the file and the terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import ceiling, celery_floor
from .harness import (
    RedisCounters,
    fake_llm_process,
    fake_llm_reset,
    fake_llm_stats,
    monitored,
    tally,
    wait_batch,
)
from .overhead import ACTOR_INSTRUCTIONS, CRITIC_INSTRUCTIONS, prompt_for
from .sim_throughput import in_flight

ROOT = Path(__file__).resolve().parent.parent
LATENCY_MS = 100.0
ROUNDS = 3
CALLS_PER_RUN = 1 + 2 * ROUNDS
QUEUES = "actor,critic,coordinator"


# --------------------------------------------------------------------------- processes


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (and its waited-for children)."""
    import psutil

    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system + t.children_user + t.children_system)


def rss_bytes(pid: int) -> int:
    import psutil

    return int(psutil.Process(pid).memory_info().rss)


@contextlib.contextmanager
def redis_server() -> Iterator[Any]:
    """A fresh embedded Redis (child process); yields it with ``.pid`` and ``.client``."""
    import redis

    from duet.embedded.server import EmbeddedRedis

    with EmbeddedRedis() as server:
        server.pid = server._proc.pid  # type: ignore[attr-defined]  # noqa: SLF001 - bench only
        server.client = redis.Redis.from_url(server.url)  # type: ignore[attr-defined]
        try:
            yield server
        finally:
            server.client.close()  # type: ignore[attr-defined]


@contextlib.contextmanager
def workers(
    redis_url: str, processes: int, threads: int, extra_env: dict[str, str] | None = None
) -> Iterator[list[int]]:
    """``processes`` real worker processes, started the way ``duet worker`` starts one
    (threads pool, task events, INFO log to a file), ``extra_env`` added to their
    environment; yields their pids once all answer."""
    from celery import Celery

    env = {**os.environ, "DUET_REDIS_URL": redis_url, "PYTHONPATH": str(ROOT), **(extra_env or {})}
    env.pop("DUET_BROKER_URL", None)
    logdir = tempfile.TemporaryDirectory(prefix="duet-bench-")
    procs = []
    for i in range(processes):
        log = open(Path(logdir.name) / f"w{i}.log", "wb")  # noqa: SIM115 - closed below
        procs.append(
            (
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "celery",
                        "-A",
                        "workers",
                        "worker",
                        "--pool",
                        "threads",
                        "-c",
                        str(threads),
                        "-E",
                        "-Q",
                        QUEUES,
                        "--loglevel",
                        "INFO",
                        "--hostname",
                        f"bench{i}-{os.getpid()}@%h",
                    ],
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                ),
                log,
            )
        )
    from orchestration.state.keys import BROKER_PREFIX

    probe = Celery("probe", broker=redis_url, set_as_current=False)
    # The workers' broker keys (their control channels too) are under Duet's prefix.
    probe.conf.broker_transport_options = {"global_keyprefix": BROKER_PREFIX}
    try:
        deadline = time.monotonic() + 90
        while True:
            dead = [p for p, _ in procs if p.poll() is not None]
            if dead:
                raise RuntimeError(
                    f"a worker exited: {Path(logdir.name, 'w0.log').read_text()[-1500:]}"
                )
            answered = probe.control.ping(timeout=0.5) or []
            if len(answered) >= processes:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(answered)} of {processes} workers answered in 90 s")
        yield [p.pid for p, _ in procs]
    finally:
        probe.close()
        for p, _ in procs:
            if p.poll() is None:
                p.terminate()
        for p, log in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            log.close()
        logdir.cleanup()


@contextlib.contextmanager
def client_on(redis_url: str) -> Iterator[None]:
    """This process's client API pointed at ``redis_url``."""
    from orchestration.settings import get_settings
    from orchestration.state import connection

    os.environ["DUET_REDIS_URL"] = redis_url
    os.environ.pop("DUET_BROKER_URL", None)
    get_settings.cache_clear()
    connection.use_redis(redis_url)
    try:
        yield
    finally:
        connection.reset()
        os.environ.pop("DUET_REDIS_URL", None)
        get_settings.cache_clear()


def loop_team(actor_model: str, critic_model: str, base_url: str | None, rounds: int) -> Any:
    from orchestration import Agent, Team

    extra = {"base_url": base_url} if base_url else {}
    return Team.actor_critic(
        actor=Agent(ACTOR_INSTRUCTIONS, model=actor_model, **extra),
        critic=Agent(CRITIC_INSTRUCTIONS, model=critic_model, **extra),
        max_rounds=rounds,
        approval_threshold=0.9,
    )


# --------------------------------------------------------------------------- 1. the loop


def arrivals_in_flight(stats: dict[str, Any], latency_s: float) -> dict[str, float]:
    """Calls in flight from the stand-in's arrival times (each call holds it ``latency_s``):
    time-weighted mean, and the 10th-90th percentile of the level over the busy span."""
    times = sorted(a["t"] for a in stats["arrivals"])
    if not times:
        return {"mean": 0.0, "p10": 0.0, "p50": 0.0, "p90": 0.0}
    start, end = times[0], times[-1] + latency_s
    step = 0.005
    levels = []
    lo = hi = 0
    t = start
    while t < end:
        while hi < len(times) and times[hi] <= t:
            hi += 1
        while lo < hi and times[lo] + latency_s <= t:
            lo += 1
        levels.append(hi - lo)
        t += step
    levels.sort()

    def pick(q: float) -> float:
        return float(levels[min(len(levels) - 1, int(q * len(levels)))])

    return {"mean": statistics.fmean(levels), "p10": pick(0.1), "p50": pick(0.5), "p90": pick(0.9)}


def duet_loop(
    base_url: str, runs: int, processes: int, threads: int, fast_paths: str | None = None
) -> dict[str, Any]:
    """One batch of never-approving runs on real worker processes; CPU of every process.
    ``fast_paths``: the workers' ``DUET_FAST_PATHS`` (None: this process's setting)."""
    from orchestration.state.fastpaths import SWITCH

    extra_env = {SWITCH: fast_paths} if fast_paths is not None else None
    with (
        redis_server() as server,
        workers(server.url, processes, threads, extra_env) as pids,
        client_on(server.url),
    ):
        team = loop_team("openai:sim", "openai:sim:critic?scores=0.1", base_url, ROUNDS)
        wait_batch(team.submit_batch([prompt_for(-n - 1) for n in range(2 * processes)]), 120)
        fake_llm_reset(base_url)
        mem0 = server.client.info("memory")
        counters0 = RedisCounters.read(server.client)
        cpu0 = [cpu_s(p) for p in pids] + [cpu_s(server.pid), time.process_time()]
        wall0 = time.perf_counter()
        batch = team.submit_batch([prompt_for(n) for n in range(runs)])
        wait_batch(batch, timeout_s=600)
        wall = time.perf_counter() - wall0
        cpu1 = [cpu_s(p) for p in pids] + [cpu_s(server.pid), time.process_time()]
        counters = counters0.delta(RedisCounters.read(server.client))
        mem1 = server.client.info("memory")
        stats = fake_llm_stats(base_url)
        calls = int(stats["usage"]["responses"])
        results = list(batch.results(timeout=120))
        statuses = {r.status for r in results}
        if statuses != {"max_rounds_reached"} or calls != runs * CALLS_PER_RUN:
            raise RuntimeError(f"unexpected outcomes: {statuses}, {calls} calls")
        run_id = batch.run_ids(0, 0)[0]
        ttl = int(server.client.ttl(f"duet:run:{{{run_id}}}"))
        per_run_keys = run_key_bytes(server.client, batch.run_ids(0, 19))
    spent = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
    workers_cpu, redis_cpu, client_cpu = sum(spent[:-2]), spent[-2], spent[-1]
    return {
        "config": f"{processes}x{threads}",
        "calls": calls,
        "cpu_ms_per_call": (workers_cpu + redis_cpu + client_cpu) * 1000 / calls,
        "workers_cpu_ms_per_call": workers_cpu * 1000 / calls,
        "redis_cpu_ms_per_call": redis_cpu * 1000 / calls,
        "client_cpu_ms_per_call": client_cpu * 1000 / calls,
        "wall_s": wall,
        "in_flight": arrivals_in_flight(stats, LATENCY_MS / 1000),
        "redis_commands_per_call": counters.commands / calls,
        "redis_commands_incl_scripts_per_call": sum(
            n for name, n in counters.calls_by_command.items() if not name.startswith("eval")
        )
        / calls,
        "redis_by_command": {
            k: round(v / calls, 2)
            for k, v in sorted(counters.calls_by_command.items(), key=lambda kv: -kv[1])
            if v > 0
        },
        "redis_bytes_in_per_call": counters.net_in / calls,
        "memory_per_run_bytes": (int(mem1["used_memory"]) - int(mem0["used_memory"])) / runs,
        # used_memory less the server's overhead (clients' buffers, which vary with load and
        # timing, the keyspace's own tables): what the stored data takes
        "dataset_per_run_bytes": (
            int(mem1["used_memory_dataset"]) - int(mem0["used_memory_dataset"])
        )
        / runs,
        "run_keys_bytes": per_run_keys,
        "run_ttl_s": ttl,
    }


def run_key_bytes(client: Any, run_ids: list[str]) -> dict[str, float]:
    """``MEMORY USAGE`` of each kind of key of a run, averaged over ``run_ids``."""
    totals: dict[str, float] = {}
    for raw in run_ids:
        run_id = raw.decode() if isinstance(raw, bytes) else raw
        for key in client.scan_iter(match=f"duet:*{run_id}*", count=1000):
            name = key.decode()
            if name.startswith("duet:conv:"):
                kind = "conversations"
            elif name.startswith("duet:settled:"):
                kind = "settled markers"
            else:
                kind = name.split(f"{{{run_id}}}")[-1].lstrip(":") or "record"
            # SAMPLES 0: every field and entry counted, not an estimate from five
            totals[kind] = totals.get(kind, 0) + int(client.memory_usage(key, samples=0) or 0)
    return {k: v / max(1, len(run_ids)) for k, v in sorted(totals.items())}


def monitor_counts(base_url: str, runs: int = 20) -> dict[str, Any]:
    """Commands per call seen by ``MONITOR`` on a small 1 x 50 batch (outside the timed
    ones: MONITOR slows the server): sent by clients (each a round trip or a part of a
    pipeline; a script call is one) and run inside Lua scripts, by command and key kind."""
    with redis_server() as server, workers(server.url, 1, 50), client_on(server.url):
        team = loop_team("openai:sim", "openai:sim:critic?scores=0.1", base_url, ROUNDS)
        wait_batch(team.submit_batch([prompt_for(-n - 1) for n in range(2)]), 120)
        fake_llm_reset(base_url)
        with monitored(server.client) as seen:  # type: ignore[attr-defined]
            wait_batch(team.submit_batch([prompt_for(n) for n in range(runs)]), 300)
            calls = int(fake_llm_stats(base_url)["usage"]["responses"])
    return {"calls": calls, **tally(seen, calls)}


def reference(cmd: list[str], base_url: str) -> dict[str, Any]:
    """A reference driver in a child process: its own CPU, the stand-in's call count."""
    fake_llm_reset(base_url)
    out = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if out.returncode != 0:
        raise RuntimeError(f"{cmd[1]} failed: {out.stderr[-1500:]}")
    fig = json.loads(out.stdout.strip().splitlines()[-1])
    stats = fake_llm_stats(base_url)
    calls = int(stats["usage"]["responses"])
    return {
        "calls": calls,
        "cpu_ms_per_call": fig["cpu_s"] * 1000 / calls,
        "wall_s": fig["wall_s"],
        "in_flight": arrivals_in_flight(stats, LATENCY_MS / 1000),
    }


def loop_table(runs: int, repeat: int, ref_python: str | None) -> dict[str, Any]:
    samples: dict[str, list[dict[str, Any]]] = {
        "1x50": [],
        "1x50-off": [],
        "2x25": [],
        "loomflow": [],
        "sdk": [],
    }
    samples["monitor"] = []
    with fake_llm_process(latency_ms=LATENCY_MS) as base_url:
        for i in range(repeat):
            print(f"  loop table, repetition {i + 1} of {repeat}", flush=True)
            samples["1x50"].append(duet_loop(base_url, runs, 1, 50))
            if ref_python:
                samples["loomflow"].append(
                    reference(
                        [
                            ref_python,
                            str(ROOT / "bench" / "ref_loomflow.py"),
                            base_url,
                            str(runs),
                            "50",
                            str(ROUNDS),
                        ],
                        base_url,
                    )
                )
            samples["2x25"].append(duet_loop(base_url, runs, 2, 25))
            samples["1x50-off"].append(duet_loop(base_url, runs, 1, 50, fast_paths="off"))
            samples["sdk"].append(
                reference(
                    [sys.executable, "-m", "bench.ref_sdk", base_url, str(runs), "50", str(ROUNDS)],
                    base_url,
                )
            )
        samples["monitor"] = [monitor_counts(base_url)]
    return samples


#: Threads of one worker process in the slots table (``slots_table``).
SLOT_COUNTS = (8, 16, 32, 50)


def slots_table() -> list[dict[str, Any]]:
    """One worker process with 8 ... 50 threads on the loop table's workload (stand-in at
    100 ms), 6 runs per thread: how many of its slots it keeps busy, and at what CPU."""
    rows = []
    with fake_llm_process(latency_ms=LATENCY_MS) as base_url:
        for threads in SLOT_COUNTS:
            fig = duet_loop(base_url, 6 * threads, 1, threads)
            fig["threads"] = threads
            rows.append(fig)
    return rows


def median(samples: list[dict[str, Any]], path: str) -> float:
    def get(s: dict[str, Any]) -> float:
        v: Any = s
        for part in path.split("."):
            v = v[part]
        return float(v)

    return statistics.median(get(s) for s in samples)


# --------------------------------------------------------------------------- 2-6


def sim_batch(
    processes: int,
    threads: int,
    runs: int,
    rounds: int,
    latency_ms: float,
    *,
    approve: bool = False,
    sample_rss: bool = False,
    read_results: bool = False,
) -> dict[str, Any]:
    """A batch on the in-process ``sim`` model (no HTTP, no stand-in CPU) on real workers."""
    lat = f"latency_ms={latency_ms:g}"
    scores = "0.95" if approve else "0.1"
    with (
        redis_server() as server,
        workers(server.url, processes, threads) as pids,
        client_on(server.url),
    ):
        team = loop_team(f"sim?{lat}", f"sim:critic?{lat}&scores={scores}", None, rounds)
        wait_batch(team.submit_batch([f"warm-up {n}" for n in range(2 * processes)]), 120)
        mem0 = int(server.client.info("memory")["used_memory"])
        peak_rss = [rss_bytes(p) for p in pids]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.1):
                for i, p in enumerate(pids):
                    peak_rss[i] = max(peak_rss[i], rss_bytes(p))

        sampler = threading.Thread(target=sample, daemon=True)
        if sample_rss:
            sampler.start()
        idle_rss = list(peak_rss)
        cpu0 = [cpu_s(p) for p in pids] + [cpu_s(server.pid)]
        t0 = time.perf_counter()
        batch = team.submit_batch([f"snippet {n}: def f(x): return eval(x)" for n in range(runs)])
        submit_s = time.perf_counter() - t0
        # When each quarter of the runs had finished: equal quarters mean a linear drain.
        quarters: list[float] = []
        deadline = time.monotonic() + 1800
        while True:
            done = batch.progress()["done"]
            while len(quarters) < 4 and done >= runs * (len(quarters) + 1) / 4:
                quarters.append(time.perf_counter() - t0)
            if done >= runs:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"batch of {runs} not done in 1800 s")
            time.sleep(0.2)
        wall = time.perf_counter() - t0
        stop.set()
        cpu = sum(
            b - a for a, b in zip(cpu0, [cpu_s(p) for p in pids] + [cpu_s(server.pid)], strict=True)
        )
        mem1 = int(server.client.info("memory")["used_memory"])
        fig: dict[str, Any] = {
            "processes": processes,
            "threads": threads,
            "runs": runs,
            "latency_ms": latency_ms,
            "submit_s": submit_s,
            "wall_s": wall,
            "cpu_s": cpu,
            "quarters_s": quarters,
            "memory_per_run_bytes": (mem1 - mem0) / runs,
            "idle_rss_mb": [r / 2**20 for r in idle_rss],
            "peak_rss_mb": [r / 2**20 for r in peak_rss],
        }
        calls = 0
        if read_results or sample_rss:
            t1 = time.perf_counter()
            results = list(batch.results(timeout=600))
            fig["results_s"] = time.perf_counter() - t1
            calls = sum(r.model_calls for r in results)
        if sample_rss:
            from orchestration.client.handles import store

            intervals = []
            for run_id in batch.run_ids():
                _, steps = store().load_run(run_id)
                intervals += [(s["started_at"], s["finished_at"]) for s in steps.values()]
            fig["in_flight_peak"], fig["in_flight_mean"] = in_flight(intervals)
        fig["calls"] = calls or runs * ((1 + 2 * rounds) if not approve else 2)
        fig["calls_per_s"] = fig["calls"] / wall
        return fig


def budget_utilisation() -> str | None:
    if importlib.util.find_spec("bench.budget_utilisation") is None:
        return None
    out = subprocess.run(
        [sys.executable, "-m", "bench.budget_utilisation"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    return out.stdout if out.returncode == 0 else f"(failed: {out.stderr[-500:]})"


def redis_capacity() -> str | None:
    """``bench.redis_capacity``'s RESULTS.md section, measured now (None if it failed)."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.redis_capacity"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    heading = "## Redis capacity"
    if out.returncode != 0 or heading not in out.stdout:
        return None
    return heading + out.stdout.split(heading, 1)[1]


def vendor_limit() -> str | None:
    """``bench.vendor_limit``'s table (four batches at the stand-in's rpm), or None."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.vendor_limit"],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=ROOT,
    )
    if out.returncode != 0 or "| headers |" not in out.stdout:
        return None
    lines = out.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if not line.startswith("{"))
    return "\n".join(lines[start:])


def history() -> list[dict[str, Any]] | None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.history", "--json"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    if out.returncode != 0:
        return None
    rows: list[dict[str, Any]] = json.loads(out.stdout.strip().splitlines()[-1])
    return rows


# --------------------------------------------------------------------------- report


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def loomflow_version(ref_python: str | None) -> str | None:
    if not ref_python:
        return None
    out = subprocess.run(
        [ref_python, "-c", "import importlib.metadata as m; print(m.version('loomflow'))"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() if out.returncode == 0 else None


def fmt_range(fig: dict[str, Any]) -> str:
    return f"{fig['p10']:.0f}–{fig['p90']:.0f} (mean {fig['mean']:.0f})"


def ceiling_lines(r: dict[str, Any]) -> list[str]:
    """What one process could hold at best (``bench.ceiling``), against the slots table and
    what the raw SDK keeps busy in the loop table."""
    c = r.get("ceiling")
    if not c:
        return []
    sdk = r["loop"]["sdk"]
    sdk_busy = (
        f" The raw SDK alone (50 coroutines in one process, the loop table) keeps "
        f"{2 * median(sdk, 'in_flight.mean'):.0f} % of its 50 busy."
        if sdk
        else ""
    )
    slots = int(c["slots"])
    return [
        f"At most, one process holds {c['calls_held']:.0f} calls of {c['latency_ms']:g} ms "
        f"({100 * c['share_of_slots']:.0f} % of {slots} slots): one core runs it, and each call costs "
        f"at least {c['cpu_ms_per_call']:.2f} ms of CPU in it — Duet's post of the call "
        f"{c['post_ms']:.2f}, the two chained tasks of the Celery floor below {c['floor_ms']:.2f} and "
        f"{ceiling.STATE_ROUND_TRIPS} Redis round trips {c['state_ms']:.2f} (`bench.ceiling`), "
        f"with nothing else of Duet's. 90 % of {slots} slots would need {c['needed_ms_for_90pct']:.2f} ms "
        f"a call for everything the process does.{sdk_busy}",
        "",
    ]


#: The loop section's heading (``--loop-only`` replaces that section of an existing report).
LOOP_HEADING = "## The loop: Duet against the in-process reference"


def loop_section(r: dict[str, Any]) -> list[str]:
    """The loop table's section of the report: its heading to the line before the next."""
    s = r["loop"]
    # Waves of 50 runs, each run's calls one after another.
    ideal = -(-r["runs"] // 50) * CALLS_PER_RUN * LATENCY_MS / 1000
    has_ref = bool(s["loomflow"])
    duet = ["1x50", "2x25"] + (["1x50-off"] if s.get("1x50-off") else [])
    cols = duet + (["loomflow"] if has_ref else []) + ["sdk"]
    names = {
        "1x50": "Duet, 1 worker x 50 threads",
        "2x25": "Duet, 2 x 25",
        "1x50-off": "Duet 1 x 50, `DUET_FAST_PATHS=off`",
        "loomflow": f"in-process reference (loomflow {r['loomflow_version']})",
        "sdk": "raw openai SDK",
    }
    ref_key = "loomflow" if has_ref else "sdk"
    lines = [LOOP_HEADING, ""]
    if r.get("loop_only"):
        lines += [
            f"Measured on its own (`python -m bench.suite --loop-only`) on {r['date']} UTC in "
            f"{r['total_s']:.0f} s, {r['machine']}; load average at start / end: "
            f"{r['load_start']} / {r['load_end']}. The other sections are from the run above.",
            "",
        ]
    lines += [
        f"{r['runs']} runs of a never-approving loop ({ROUNDS} rounds, {CALLS_PER_RUN} calls a run in Duet "
        "and the raw SDK; loomflow's actor-critic makes no refine after the last critique, so 6, "
        "and its agents' streamed calls are made as `stream=False` ones), "
        f"stand-in OpenAI server `duet.standin.server` at {LATENCY_MS:g} ms per call, 50 slots. CPU of every "
        "process but the stand-in's (worker processes, redis-server, the submitting client) per "
        f"model call the stand-in answered; medians of {r['repeat']} interleaved repetitions."
        + (
            " `DUET_FAST_PATHS=off`: the worker process runs the stock libraries (kombu's "
            "transport, Celery's publish, the SDK's per-request "
            "layers); the submitting client is as in the other columns."
            if "1x50-off" in cols
            else ""
        ),
        "",
        "| figure | " + " | ".join(names[c] for c in cols) + " |",
        "|---|" + "---|" * len(cols),
        "| CPU ms per model call | "
        + " | ".join(f"{median(s[c], 'cpu_ms_per_call'):.2f}" for c in cols)
        + " |",
        f"| ratio to {ref_key} | "
        + " | ".join(
            f"{median(s[c], 'cpu_ms_per_call') / median(s[ref_key], 'cpu_ms_per_call'):.2f}x"
            for c in cols
        )
        + " |",
        f"| wall s (latency-bound ideal {ideal:.1f}) | "
        + " | ".join(f"{median(s[c], 'wall_s'):.1f}" for c in cols)
        + " |",
        "| wall / ideal | "
        + " | ".join(f"{median(s[c], 'wall_s') / ideal:.2f}x" for c in cols)
        + " |",
        "| calls in flight of 50, p10–p90 (mean) | "
        + " | ".join(
            fmt_range({k: median(s[c], f"in_flight.{k}") for k in ("p10", "p90", "mean")})
            for c in cols
        )
        + " |",
    ]

    def split(part: str) -> str:
        return " / ".join(f"{median(s[c], f'{part}_cpu_ms_per_call'):.2f}" for c in duet)

    lines += [
        "",
        f"Duet's CPU split, ms per call ({' / '.join(duet)}): workers {split('workers')}, "
        f"redis-server {split('redis')}, client {split('client')}. "
        "Spread of CPU ms per call: "
        + "; ".join(f"{c} " + ", ".join(f"{x['cpu_ms_per_call']:.2f}" for x in s[c]) for c in cols)
        + ".",
        "",
    ]
    if not has_ref:
        lines += [
            f"loomflow could not be run ({r['ref_error']}); the raw SDK is the reference.",
            "",
        ]
    return lines


def replace_loop_section(text: str, section: list[str]) -> str:
    """``text`` (a report) with its loop section replaced by ``section``."""
    start = text.index(LOOP_HEADING)
    end = text.find("\n## ", start + len(LOOP_HEADING))
    return text[:start] + "\n".join(section) + "\n" + (text[end + 1 :] if end >= 0 else "")


def write_report(path: Path, r: dict[str, Any]) -> str:
    s = r["loop"]
    d = s["1x50"]
    mon = s["monitor"][0]
    lines = [
        "# Benchmark results",
        "",
        f"Written by `make bench` (`python -m bench.suite`) on {r['date']} UTC in {r['total_s']:.0f} s. "
        f"Machine: {r['machine']}. Load average at start / end: {r['load_start']} / {r['load_end']} "
        "(a shared machine: other sessions' tests ran alongside, so read the **ratios**, "
        "measured in the same run with the configurations interleaved).",
        "",
        *loop_section(r),
        "## Slots one worker process keeps busy",
        "",
        f"The loop's workload (stand-in at {LATENCY_MS:g} ms) on one worker process with more and "
        "more threads, 6 runs per thread (one batch each): the share of its slots holding a call "
        "(calls in flight from the stand-in's arrivals, mean / threads) and the CPU per call.",
        "",
        "| threads | calls/s | calls in flight, mean (p10–p90) | slots busy | CPU ms per call |",
        "|---|---|---|---|---|",
        *(
            f"| {f['threads']} | {f['calls'] / f['wall_s']:.0f} | {f['in_flight']['mean']:.1f} "
            f"({f['in_flight']['p10']:.0f}–{f['in_flight']['p90']:.0f}) | "
            f"{100 * f['in_flight']['mean'] / f['threads']:.0f} % | {f['cpu_ms_per_call']:.2f} |"
            for f in r["slots"]
        ),
        "",
        *ceiling_lines(r),
        "## Redis per model call and per finished run (Duet 1x50 batches)",
        "",
        "| figure | value |",
        "|---|---|",
        f"| commands per call (INFO total_commands_processed: those inside Lua scripts count) | {median(d, 'redis_commands_per_call'):.1f} |",
        f"| of which sent by clients (MONITOR; a script call is one) | {mon['sent_per_call']:.1f} |",
        f"| of which run inside Lua scripts (MONITOR) | {mon['in_scripts_per_call']:.1f} |",
        f"| bytes in per call | {median(d, 'redis_bytes_in_per_call'):.0f} |",
        f"| memory per finished run: the data (used_memory_dataset delta / runs) | {median(d, 'dataset_per_run_bytes') / 1000:.1f} kB |",
        f"| memory per finished run: all (used_memory delta / runs; with the connections' buffers, which vary with load) | {median(d, 'memory_per_run_bytes') / 1000:.1f} kB |",
        f"| TTL of a finished run | {d[0]['run_ttl_s'] / 86400:.1f} days ({d[0]['run_ttl_s']} s) |",
        "",
        "Sent by clients, per call (MONITOR, 20 runs): "
        + ", ".join(f"`{k}` {v}" for k, v in list(mon["sent"].items())[:16])
        + ".",
        "",
        "Inside Lua scripts, per call: "
        + ", ".join(f"`{k}` {v}" for k, v in list(mon["in_scripts"].items())[:16])
        + ".",
        "",
        "Bytes per run by key (MEMORY USAGE, 20 runs): "
        + ", ".join(f"`{k}` {v / 1000:.1f} kB" for k, v in d[0]["run_keys_bytes"].items())
        + ".",
    ]
    lines += ["", "## The Celery no-op floor", ""]
    if r["floor"] is not None:
        lines.append(
            f"Two chained no-op tasks with Duet's transport, consumer and task events: "
            f"**{r['floor']:.2f} ms** of CPU per pair (`bench.celery_floor`, median of 3): what "
            f"any two-task-per-call design costs before Duet does anything. Duet 1x50's "
            f"worker CPU per call is {median(d, 'workers_cpu_ms_per_call') / r['floor']:.1f}x it."
        )
    else:
        lines.append("(bench.celery_floor failed in this run)")
    sc = r["scaling"]
    base = sc[0]["calls_per_s"]
    lines += [
        "",
        f"## Scaling: worker processes x 50 threads, `sim` model at {sc[0]['latency_ms']:g} ms",
        "",
        "Runs of the same loop in proportion to the slots (two waves), on the in-process `sim` "
        "model (no HTTP; the stand-in's CPU would take a core of its own). The machine has 2 cores.",
        "",
        "| processes | runs | calls/s | speed-up | ideal calls/s (slots / latency) | CPU ms/call (workers + Redis) |",
        "|---|---|---|---|---|---|",
    ] + [
        f"| {f['processes']} | {f['runs']} | {f['calls_per_s']:.0f} | {f['calls_per_s'] / base:.2f}x | "
        f"{f['processes'] * f['threads'] / (f['latency_ms'] / 1000):.0f} | {f['cpu_s'] * 1000 / f['calls']:.2f} |"
        for f in sc
    ]
    h = r["hold"]
    lines += [
        "",
        "## Worker RSS with 200 calls in flight",
        "",
        f"One worker process, 200 threads, {h['runs']} one-round runs of `sim` at "
        f"{h['latency_ms']:g} ms: calls in flight peak {h['in_flight_peak']}, mean "
        f"{h['in_flight_mean']:.0f}; worker RSS idle {h['idle_rss_mb'][0]:.0f} MB, peak "
        f"{h['peak_rss_mb'][0]:.0f} MB.",
    ]
    b = r.get("big")
    if b:
        lines += (
            [
                "",
                f"## A {b['n']:,}-input batch",
                "",
                "Runs the critic approves in round 1 (2 calls each) on `sim` at 0 ms, so the "
                "figure is Duet's own work; submit with `Team.submit_batch`, drain, read every "
                "result back.",
                "",
                "| inputs | workers | submit s | drain s (incl. submit) | results read s | calls/s | Redis memory per run |",
                "|---|---|---|---|---|---|---|",
            ]
            + [
                f"| {f['runs']:,} | {f['processes']} x {f['threads']} | {f['submit_s']:.1f} | {f['wall_s']:.1f} | "
                f"{f.get('results_s', float('nan')):.1f} | {f['calls_per_s']:.0f} | {f['memory_per_run_bytes'] / 1000:.1f} kB |"
                for f in b["rows"]
            ]
            + [
                "",
                f"Linearity: {b['n']:,} inputs took {b['linear']:.2f}x the drain time per input "
                f"of {b['n'] // 4:,} (1 worker; 1.00x = linear). Runs finish in a burst at the end "
                "(every draft is queued before any critique), so a drain is timed whole.",
            ]
        )
    hist = r.get("history")
    lines += ["", "## Persistent conversations: CPU per call as one user's history grows", ""]
    if hist:
        lines += [
            'Waves of 20 runs (3 calls each), all one user\'s (`memory="per_user"`), one '
            "wave after another, stand-in at 0 ms, in-process worker x 8 (`bench.history`). "
            "A call carries at most the team's `conversation_turns` / "
            "`conversation_max_tokens` of history (defaults 20 / 4,000).",
            "",
            "| wave | turns stored before it | CPU ms per call | input tokens per call |",
            "|---|---|---|---|",
        ] + [
            f"| {h['wave']} | {h['turns_before']} | {h['cpu_ms_per_call']:.2f} | "
            f"{h['input_tokens_per_call']:.0f} |"
            for h in hist
        ]
    else:
        lines.append("`bench.history` failed in this run; nothing measured.")
    capacity = r.get("capacity")
    lines += [""]
    if capacity:
        lines += capacity.rstrip("\n").splitlines()
    else:
        lines += [
            "## Redis capacity: calls/s one primary carries",
            "",
            "`bench.redis_capacity` failed in this run; nothing measured.",
        ]
    lines += ["", "## At the vendor limit", ""]
    lines.append(
        r["vendor_limit"]
        if r.get("vendor_limit")
        else "`bench.vendor_limit` failed in this run; nothing measured."
    )
    lines += ["", "## Budget utilisation", ""]
    lines.append(
        f"```\n{r['budget'].strip()}\n```"
        if r["budget"]
        else "`bench.budget_utilisation` is not in this tree yet; nothing measured."
    )
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.suite", description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument(
        "--big", type=int, default=10_000, help="inputs of the big batch; 0 skips it"
    )
    parser.add_argument(
        "--ref-python",
        default=os.environ.get(
            "DUET_BENCH_REF_PYTHON", str(ROOT / "bench" / ".venv-ref" / "bin" / "python")
        ),
        help="a Python with loomflow installed (make bench installs one in bench/.venv-ref)",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "RESULTS.md"))
    parser.add_argument("--json", help="also write every figure to this file")
    parser.add_argument(
        "--loop-only",
        action="store_true",
        help="measure only the loop table and replace its section of --out",
    )
    args = parser.parse_args(argv)

    started = time.perf_counter()
    r: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.machine()}",
        "load_start": load_average(),
        "runs": args.runs,
        "repeat": args.repeat,
    }
    ref_python = args.ref_python if Path(args.ref_python).exists() else None
    r["loomflow_version"] = loomflow_version(ref_python)
    if r["loomflow_version"] is None:
        r["ref_error"] = f"no loomflow importable by {args.ref_python}"
        ref_python = None
    print("1. the loop table", flush=True)
    r["loop"] = loop_table(args.runs, args.repeat, ref_python)
    if args.loop_only:
        r.update(loop_only=True, load_end=load_average(), total_s=time.perf_counter() - started)
        if args.json:
            Path(args.json).write_text(json.dumps(r, indent=2, default=str))
        out = Path(args.out)
        out.write_text(replace_loop_section(out.read_text(), loop_section(r)))
        print("\n".join(loop_section(r)))
        return 0
    print("1b. slots one worker process keeps busy", flush=True)
    r["slots"] = slots_table()
    print("2. the Celery floor", flush=True)
    r["floor"] = celery_floor.measured(400)
    if r["floor"] is not None:
        r["ceiling"] = ceiling.measure(LATENCY_MS, 50, r["floor"])
    print("3. scaling 1 -> 2 -> 4 processes", flush=True)
    r["scaling"] = [sim_batch(p, 50, 100 * p, ROUNDS, 500) for p in (1, 2, 4)]
    print("4. RSS with 200 calls in flight", flush=True)
    r["hold"] = sim_batch(1, 200, 200, 1, 2000, sample_rss=True)
    if args.big:
        print(f"5. a {args.big}-input batch", flush=True)
        rows = [
            sim_batch(1, 50, args.big // 4, 1, 0, approve=True, read_results=True),
            sim_batch(1, 50, args.big, 1, 0, approve=True, read_results=True),
            sim_batch(2, 50, args.big, 1, 0, approve=True, read_results=True),
        ]
        per_input = [f["wall_s"] / f["runs"] for f in rows]
        r["big"] = {"n": args.big, "rows": rows, "linear": per_input[1] / per_input[0]}
    print("6. budget utilisation", flush=True)
    r["budget"] = budget_utilisation()
    print("7. persistent conversations", flush=True)
    r["history"] = history()
    print("8. Redis capacity", flush=True)
    r["capacity"] = redis_capacity()
    print("9. at the vendor limit", flush=True)
    r["vendor_limit"] = vendor_limit()
    r["load_end"] = load_average()
    r["total_s"] = time.perf_counter() - started
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=2, default=str))
    print(write_report(Path(args.out), r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
