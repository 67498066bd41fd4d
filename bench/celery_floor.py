"""The floor under Duet's CPU per model call: two chained no-op Celery tasks.

    python -m bench.celery_floor [--pairs 400] [--concurrency 4] [--repeat 3]
                                 [--events {0,1,both}] [--transport {duet,kombu,both}]
                                 [--json]

Duet runs two tasks per model call (a step, then the coordinator). This measures what
Celery, kombu and redis-py alone cost for such a pair, with Duet's delivery settings
(acks_late, prefetch 1, threads pool, JSON, no result backend) and nothing else: task
``a`` sends task ``b``, ``b`` counts. ``--pairs`` pairs are queued at once and the
process CPU until the last ``b`` ran is divided by the pairs.

Compare the figure with ``bench.overhead``'s *Duet total* minus its SDK reference: the
difference is Duet's own logic and Redis state. Variants:

- ``--events 1``: worker task events on (what Flower needs; Duet's default), ``0`` off;
- ``--transport duet``: :mod:`orchestration.state.broker` (one Redis client per channel,
  batched pops and acks); ``kombu``: kombu's stock transport.

Sends from inside task ``a`` are pushed by :mod:`workers.publish` when the transport is
``duet``, like the real tasks' sends.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from duet.embedded.server import EmbeddedRedis
from orchestration.state.broker import TRANSPORT


def floor(
    redis_url: str, *, events: bool, transport: str, pairs: int, concurrency: int, repeat: int
) -> list[float]:
    """CPU ms per pair of chained no-op tasks, once per repeat, on a fresh worker."""
    from celery import Celery
    from celery.worker import WorkController

    app = Celery(f"floor-{transport}-{int(events)}", set_as_current=True)
    app.conf.update(
        broker_url=redis_url,
        broker_transport=TRANSPORT if transport == "duet" else None,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_send_task_events=events,
        task_send_sent_event=False,
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
    )
    direct = transport == "duet"  # sends pushed by workers.publish, as the tasks do
    if direct:
        from workers import publish

        publish.use_broker(redis_url)
    done = threading.Event()
    count = [0]
    target = [pairs]
    lock = threading.Lock()

    @app.task(name="floor.a", shared=False)
    def a(i: int) -> None:
        if direct:
            publish.push(app, "floor.b", (i,), queue="celery")
        else:
            app.send_task("floor.b", args=(i,))

    @app.task(name="floor.b", shared=False)
    def b(i: int) -> None:
        with lock:
            count[0] += 1
            if count[0] >= target[0]:
                done.set()

    # Pool threads have no current app of their own: they use the default one.
    app.set_current()
    app.set_default()
    ready = threading.Event()

    class Worker(WorkController):  # type: ignore[misc]
        def on_consumer_ready(self, consumer: Any) -> None:
            ready.set()

    worker = Worker(
        app=app,
        pool_cls="threads",
        concurrency=concurrency,
        loglevel="WARNING",
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
    )
    thread = threading.Thread(target=worker.start, daemon=True)
    thread.start()
    if not ready.wait(30):
        raise RuntimeError("the floor worker did not start within 30 s")
    samples = []
    try:
        for rep in range(repeat + 1):  # the first batch warms up (imports, pools, caches)
            done.clear()
            count[0] = 0
            cpu0 = time.process_time()
            with app.producer_or_acquire() as producer:
                for i in range(pairs):
                    app.send_task("floor.a", args=(i,), producer=producer)
            if not done.wait(120):
                raise RuntimeError(f"only {count[0]} of {pairs} pairs ran within 120 s")
            if rep:
                samples.append((time.process_time() - cpu0) * 1000 / pairs)
    finally:
        worker.stop(in_sighandler=False)
        thread.join(10)
    return samples


def measured(pairs: int = 400) -> float | None:
    """The floor with Duet's transport and task events on (median of 3), measured in a
    child process (a stopped worker leaves process-wide state); None if it failed."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.celery_floor",
            "--json",
            "--repeat",
            "3",
            "--events",
            "1",
            "--transport",
            "duet",
            "--pairs",
            str(pairs),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parent.parent,
    )
    if out.returncode != 0:
        return None
    return float(json.loads(out.stdout)[0]["cpu_ms_per_pair"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.celery_floor", description=__doc__)
    parser.add_argument("--pairs", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=4, help="worker threads")
    parser.add_argument("--repeat", type=int, default=3, help="batches; the median is shown")
    parser.add_argument("--events", choices=["0", "1", "both"], default="both")
    parser.add_argument("--transport", choices=["duet", "kombu", "both"], default="both")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)

    events = [False, True] if args.events == "both" else [args.events == "1"]
    transports = ["duet", "kombu"] if args.transport == "both" else [args.transport]
    rows = []
    if len(events) * len(transports) > 1:
        # One child process per variant: a stopped Celery worker leaves process-wide
        # state behind (and the two transports must not share kombu's caches).
        for transport in transports:
            for ev in events:
                out = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "bench.celery_floor",
                        "--json",
                        "--events",
                        "1" if ev else "0",
                        "--transport",
                        transport,
                        "--pairs",
                        str(args.pairs),
                        "--concurrency",
                        str(args.concurrency),
                        "--repeat",
                        str(args.repeat),
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                rows += json.loads(out.stdout)
    else:
        with EmbeddedRedis() as server:
            samples = floor(
                server.url,
                events=events[0],
                transport=transports[0],
                pairs=args.pairs,
                concurrency=args.concurrency,
                repeat=max(1, args.repeat),
            )
        rows.append(
            {
                "transport": transports[0],
                "events": events[0],
                "cpu_ms_per_pair": statistics.median(samples),
                "samples": [round(x, 3) for x in samples],
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"Celery floor: {args.pairs} pairs of chained no-op tasks (acks_late, threads pool, "
        f"{args.concurrency} threads), CPU ms per pair = per Duet model call; "
        f"median of {max(1, args.repeat)}"
    )
    for row in rows:
        label = f"transport={row['transport']:<5} task events={'on ' if row['events'] else 'off'}"
        print(f"  {label}  {row['cpu_ms_per_pair']:6.2f}   (samples {row['samples']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
