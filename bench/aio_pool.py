"""An asyncio pool against Celery's threads pool: tasks that wait, many slots.

    python -m bench.aio_pool [--aio-python PATH] [--tasks 200] [--concurrency 50]
                             [--wait-ms 100] [--json]

Issue 13 asked to measure an asyncio execution of model calls inside a worker
(``celery-aio-pool`` or an equivalent) against threads. This runs ``--tasks`` tasks that
each wait ``--wait-ms`` (``asyncio.sleep`` in an ``async def`` task on
``celery_aio_pool.pool:AsyncIOPool``; ``time.sleep`` on the threads pool) on a worker of
``--concurrency`` slots, with Duet's delivery settings (acks_late, prefetch 1), and prints
per pool: wall time against the ideal (tasks / slots x wait), the most tasks started
within one wait (how many ran at once) and the worker process's CPU per task.

Each pool runs in a child process of ``--aio-python`` (a Python with ``celery`` and
``celery-aio-pool``; ``make bench-aio`` makes one in ``bench/.venv-aio``: the package is
not a Duet dependency) against a throw-away Redis this process starts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

#: The child: a worker of one pool in this process, the tasks sent, figures as JSON.
CHILD = r"""
import asyncio, json, os, sys, threading, time
from celery import Celery
from celery.worker import WorkController

pool, slots, tasks, wait = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
app = Celery("aio-bench", broker=sys.argv[5], set_as_current=True)
app.conf.update(task_ignore_result=True, task_acks_late=True, worker_prefetch_multiplier=1,
                broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)
lock, done, starts, count = threading.Lock(), threading.Event(), [], [0]

def finished():
    with lock:
        count[0] += 1
        if count[0] >= tasks:
            done.set()

if pool == "aio":
    @app.task(name="bench.wait")
    async def wait_task(i):
        starts.append(time.monotonic())
        await asyncio.sleep(wait)
        finished()
    pool_cls = "celery_aio_pool.pool:AsyncIOPool"
else:
    @app.task(name="bench.wait")
    def wait_task(i):
        starts.append(time.monotonic())
        time.sleep(wait)
        finished()
    pool_cls = "threads"

ready = threading.Event()

class Worker(WorkController):
    def on_consumer_ready(self, consumer):
        ready.set()

worker = Worker(app=app, pool_cls=pool_cls, concurrency=slots, loglevel="WARNING",
                without_heartbeat=True, without_mingle=True, without_gossip=True)
threading.Thread(target=worker.start, daemon=True).start()
if not ready.wait(60):
    sys.exit("the worker did not start within 60 s")
cpu0, t0 = time.process_time(), time.monotonic()
with app.producer_or_acquire() as producer:
    for i in range(tasks):
        app.send_task("bench.wait", args=(i,), producer=producer)
if not done.wait(tasks * wait + 120):
    sys.exit(f"only {count[0]} of {tasks} tasks ran")
wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
starts.sort()
at_once = max(sum(1 for s in starts if t <= s < t + wait) for t in starts)
print(json.dumps({"pool": pool, "wall_s": wall, "ideal_s": tasks / slots * wait,
                  "at_once": at_once, "cpu_ms_per_task": cpu * 1000 / tasks}))
sys.stdout.flush()
os._exit(0)
"""


def measure(python: str, pool: str, redis_url: str, args: argparse.Namespace) -> dict:
    out = subprocess.run(
        [
            python,
            "-c",
            CHILD,
            pool,
            str(args.concurrency),
            str(args.tasks),
            str(args.wait_ms / 1000),
            redis_url,
        ],
        capture_output=True,
        text=True,
        timeout=args.tasks * args.wait_ms / 1000 + 300,
    )
    if out.returncode != 0:
        raise SystemExit(f"the {pool} pool's run failed: {out.stderr[-1500:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.aio_pool", description=__doc__)
    default = Path(__file__).resolve().parent / ".venv-aio" / "bin" / "python"
    parser.add_argument(
        "--aio-python", default=os.environ.get("DUET_BENCH_AIO_PYTHON", str(default))
    )
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--wait-ms", type=float, default=100.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not Path(args.aio_python).exists():
        parser.error(f"--aio-python {args.aio_python}: not found (make bench-aio makes it)")

    from duet.embedded.server import EmbeddedRedis

    with EmbeddedRedis() as server:
        rows = [measure(args.aio_python, pool, server.url, args) for pool in ("threads", "aio")]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"{args.tasks} tasks of {args.wait_ms:g} ms on {args.concurrency} slots "
        f"(acks_late, prefetch 1):"
    )
    for row in rows:
        print(
            f"  {row['pool']:8s} wall {row['wall_s']:6.2f} s (ideal {row['ideal_s']:.2f}), "
            f"at once {row['at_once']:3d}, CPU {row['cpu_ms_per_task']:.2f} ms per task"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
