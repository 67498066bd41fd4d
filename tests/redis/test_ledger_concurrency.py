"""The fleet-wide cap under real concurrency: many processes, one Redis, never overspent.

The reference implementation checks the budget in-process before a call and charges
after; 20 concurrent runs on a 5,000-token cap spent 32,970 tokens. Here 4 processes x 8
threads race reserve/settle against one cap on the real server.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
import time

import pytest

from orchestration.core.budget import Amount, Budget
from orchestration.state import keys
from orchestration.state.budgets import BudgetLedger
from orchestration.state.ratelimits import RateLimiter

pytestmark = pytest.mark.redis

CAP = 5000
FLEET = "global:fleet"
PROCESSES = 4
THREADS = 8
ATTEMPTS = 15  # per thread: 4 x 8 x 15 = 480 reservations tried


def _spawn():
    return multiprocessing.get_context("spawn")


def _worker(target, url: str, proc: int, start, results) -> None:
    """Process body: wait until every process is up, run ``target``, report its result."""
    start.wait(60)
    results.put(target(url, proc))


def _run_processes(target, url: str, while_running=None) -> list:
    """Run ``target(url, proc)`` in PROCESSES spawned processes that start together.

    ``while_running()`` is called in a loop until they finish. Returns their results.
    """
    ctx = _spawn()
    start, results = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(target, url, p, start, results)) for p in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    try:
        out = []
        deadline = time.monotonic() + 60
        while len(out) < PROCESSES:
            assert time.monotonic() < deadline, "workers did not finish"
            if while_running is not None:
                while_running()
            while not results.empty():
                out.append(results.get())
            if while_running is None and len(out) < PROCESSES:
                out.append(results.get(timeout=60))
        return out
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()


def _reserve_and_settle(url: str, proc: int) -> dict:
    """One worker process: THREADS threads reserve a worst case, then settle <= it."""
    import redis

    client = redis.Redis.from_url(url)
    ledger = BudgetLedger(client)
    scopes = [f"run:p{proc}", FLEET]
    lock, start = threading.Lock(), threading.Barrier(THREADS)
    report = {"proc": proc, "settled_tokens": 0, "settled": 0, "released": 0, "refused": 0}

    def thread(t: int) -> None:
        rng = random.Random(proc * 100 + t)
        start.wait()
        for n in range(ATTEMPTS):
            step = f"p{proc}-t{t}-{n}"
            worst = Amount(input_tokens=rng.randint(5, 40), output_tokens=rng.randint(5, 60))
            refusal = ledger.reserve(step, scopes, worst, lease_s=30)
            if refusal is not None:
                with lock:
                    report["refused"] += 1
                if refusal.exhausted:
                    return
                time.sleep(rng.random() / 200)  # back off; in-flight calls will settle
                continue
            time.sleep(rng.random() / 500)  # the model call: holds overlap
            if rng.random() < 0.1:  # the call failed: nothing spent
                assert ledger.release(step, scopes)
                with lock:
                    report["released"] += 1
                continue
            actual = Amount(
                input_tokens=worst.input_tokens,
                output_tokens=rng.randint(0, worst.output_tokens),
                calls=1,
            )
            assert ledger.settle(step, scopes, actual) is True
            if rng.random() < 0.1:  # a redelivered step settles again: charged once
                assert ledger.settle(step, scopes, actual) is False
            with lock:
                report["settled_tokens"] += actual.tokens
                report["settled"] += 1

    threads = [threading.Thread(target=thread, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    client.close()
    return report


def _token_counters(client, scope: str) -> tuple[int, int]:
    """(spent, reserved) tokens of a scope, read in one command (a consistent snapshot)."""
    fields = [
        f"{kind}:{unit}"
        for kind in ("spent", "reserved")
        for unit in ("input_tokens", "output_tokens")
    ]
    values = [int(v or 0) for v in client.hmget(keys.budget(scope), fields)]
    return values[0] + values[1], values[2] + values[3]


def test_concurrent_reservations_never_overspend_the_cap(redis_client, redis_url):
    ledger = BudgetLedger(redis_client)
    ledger.set_limits(FLEET, Budget(max_tokens=CAP))

    samples = 0

    def sample() -> None:
        nonlocal samples
        spent, reserved = _token_counters(redis_client, FLEET)
        assert spent <= CAP
        assert spent + reserved <= CAP  # holds are worst cases; settles only shrink them
        samples += 1

    reports = _run_processes(_reserve_and_settle, redis_url, while_running=sample)
    assert samples > 0

    spent, reserved = _token_counters(redis_client, FLEET)
    assert reserved == 0
    assert spent == sum(r["settled_tokens"] for r in reports)
    assert spent <= CAP
    assert sum(r["refused"] for r in reports) > 0  # the cap was actually contended
    assert spent > CAP // 2
    for r in reports:  # each run scope holds exactly its own process's usage
        assert _token_counters(redis_client, f"run:p{r['proc']}") == (r["settled_tokens"], 0)
    state = ledger.get(FLEET)
    assert state.open_reservations == 0
    assert state.spent.calls == sum(r["settled"] for r in reports)


def _reserve_and_hang(url: str, lease_s: float, ready) -> None:
    """A worker that reserves, then hangs mid-call until it is killed."""
    import redis

    ledger = BudgetLedger(redis.Redis.from_url(url))
    assert ledger.reserve("doomed", ["run:dead", FLEET], Amount(output_tokens=CAP), lease_s) is None
    ready.set()
    threading.Event().wait(60)


def test_a_dead_workers_reservation_is_charged_after_its_lease(redis_client, redis_url):
    """A worker killed mid-call: its call's outcome is unknown (the vendor may have billed
    it), so when its hold's lease runs out the hold is charged, not released."""
    ledger = BudgetLedger(redis_client)
    ledger.set_limits(FLEET, Budget(max_tokens=CAP))
    ctx = _spawn()
    ready = ctx.Event()
    worker = ctx.Process(target=_reserve_and_hang, args=(redis_url, 2.0, ready))
    worker.start()
    try:
        assert ready.wait(30), "worker did not reserve"
        expiry_ms = int(redis_client.zscore(keys.budget_reservations(FLEET), "doomed"))
        worker.kill()
        worker.join(10)

        refusal = ledger.reserve("next", [FLEET], Amount(output_tokens=1), lease_s=30)
        sec, usec = redis_client.time()
        if int(sec) * 1000 + int(usec) // 1000 < expiry_ms:  # (a slow machine may be past it)
            assert refusal is not None and not refusal.exhausted  # held, not spent yet

        deadline = time.monotonic() + 10
        while not (
            refusal := ledger.reserve("next", [FLEET], Amount(output_tokens=1), 30)
        ).exhausted:
            assert time.monotonic() < deadline, "the dead worker's hold was never charged"
            time.sleep(0.01)
        sec, usec = redis_client.time()
        assert (
            int(sec) * 1000 + int(usec) // 1000 >= expiry_ms
        )  # not early: it goes at its expiry ms
        assert ledger.get(FLEET).spent == Amount(output_tokens=CAP)
        assert ledger.get(FLEET).reserved == Amount()
        dead = ledger.get("run:dead")
        assert (dead.spent, dead.reserved) == (Amount(output_tokens=CAP), Amount())
    finally:
        if worker.is_alive():
            worker.kill()
        worker.join(10)


RPM, TPM, WINDOW_S, RUN_FOR_S = 60, 3000, 1.0, 2.0
BURST_S = 0.2


def _hammer_rate_limit(url: str, proc: int) -> list[tuple[int, int]]:
    """4 threads booking slots of the same limit, each going at its slot and giving back
    every fifth permit (as after a 429); returns (slot in server us, tokens) of the
    permits used."""
    import redis

    client = redis.Redis.from_url(url)
    limiter = RateLimiter(client)
    used: list[tuple[int, int]] = []
    lock = threading.Lock()

    def thread(t: int) -> None:
        rng = random.Random(proc * 10 + t)
        end = time.monotonic() + RUN_FOR_S
        while time.monotonic() < end:
            tokens = rng.randint(5, 100)
            decision = limiter.try_acquire(
                "sim:m",
                rpm=RPM,
                tpm=TPM,
                tokens=tokens,
                window_s=WINDOW_S,
                burst_s=BURST_S,
                horizon_s=0.3,
            )
            time.sleep(decision.wait_s)
            if not decision.booked:
                continue
            if rng.random() < 0.2:
                assert limiter.give_back("sim:m", decision.permit)
                continue
            with lock:
                used.append((decision.server_time_us + round(decision.wait_s * 1e6), tokens))
            done, _ = limiter.settle("sim:m", decision.permit, tokens=tokens)
            assert done

    threads = [threading.Thread(target=thread, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    client.close()
    return used


def test_the_fleet_never_goes_faster_than_the_rate_and_leaks_no_permit(redis_client, redis_url):
    """16 threads in 4 processes: the slots used conform to the rate with its burst (GCRA:
    any k + 1 slots in a row span at least (k - burst) intervals, for requests and
    tokens alike), permits given back are used again, and none is left held."""
    per_process = _run_processes(_hammer_rate_limit, redis_url)
    used = sorted(g for process in per_process for g in process)
    interval_us = WINDOW_S / RPM * 1e6
    burst = BURST_S * 1e6 / interval_us
    for i in range(len(used)):
        for j in range(i + 1, len(used)):
            k = j - i
            assert used[j][0] - used[i][0] >= (k - burst) * interval_us - 1, (i, j)
    token_us = WINDOW_S / TPM * 1e6
    for i in range(len(used)):
        tokens = 0
        for j in range(i, len(used)):
            tokens += used[j][1]
            span = used[j][0] - used[i][0]
            assert tokens * token_us <= span + BURST_S * 1e6 + 100 * token_us + 1, (i, j)
    # ...and the limiter was the bottleneck, not idle: most of the rate was used
    assert len(used) >= 0.6 * min(RPM, TPM / 52.5) * RUN_FOR_S / WINDOW_S
    assert RateLimiter(redis_client).permits("sim:m") == 0
