"""What both benchmarks share: a stand-in LLM in a subprocess, an embedded Duet, counters.

Nothing here is timed against a fixed number: the benchmarks compare figures measured in
the same run on the same machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from duet.embedded import EmbeddedRedis, free_port


@contextlib.contextmanager
def fake_llm_process(latency_ms: float = 0) -> Iterator[str]:
    """``python -m duet.fake_llm`` as a child process (its CPU is not ours); yields
    the OpenAI ``base_url``."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "duet.fake_llm", "--port", str(port),
         "--latency-ms", str(latency_ms)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise RuntimeError(f"fake LLM exited with code {proc.returncode}: {err[-800:]}")
            try:
                with urllib.request.urlopen(f"{base}/_admin/stats", timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("fake LLM did not answer within 30s") from None
                time.sleep(0.05)
        yield f"{base}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


def fake_llm_stats(base_url: str) -> dict[str, Any]:
    """``GET /_admin/stats`` of the stand-in at OpenAI ``base_url``."""
    root = base_url.removesuffix("/v1")
    with urllib.request.urlopen(f"{root}/_admin/stats", timeout=5) as resp:
        stats: dict[str, Any] = json.loads(resp.read())
    return stats


def fake_llm_reset(base_url: str) -> None:
    root = base_url.removesuffix("/v1")
    req = urllib.request.Request(f"{root}/_admin/reset", data=b"{}", method="POST")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=5):
        pass


@contextlib.contextmanager
def embedded_duet(concurrency: int) -> Iterator[str]:
    """An embedded Redis (child process) and an in-process worker pool; yields the URL.

    The client API of this process is pointed at the same Redis, the way ``Team.run``
    does it on the embedded default.
    """
    os.environ.pop("DUET_BROKER_URL", None)
    with EmbeddedRedis() as server:
        os.environ["DUET_REDIS_URL"] = server.url
        os.environ["DUET_WORKER_CONCURRENCY"] = str(concurrency)
        from orchestration.settings import get_settings
        from orchestration.state import connection

        get_settings.cache_clear()
        connection.use_redis(server.url)
        from workers.inprocess import InProcessWorker

        worker = InProcessWorker(server.url, concurrency=concurrency).start()
        try:
            yield server.url
        finally:
            worker.stop()
            connection.reset()
            get_settings.cache_clear()


@dataclass(frozen=True)
class RedisCounters:
    """Server-side counters read with ``INFO``: CPU seconds, commands, bytes in."""

    cpu_s: float
    commands: int
    net_in: int
    calls_by_command: dict[str, int]

    @classmethod
    def read(cls, client: Any) -> RedisCounters:
        cpu = client.info("cpu")
        stats = client.info("stats")
        cmd = client.info("commandstats")
        return cls(
            cpu_s=float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
            commands=int(stats["total_commands_processed"]),
            net_in=int(stats["total_net_input_bytes"]),
            calls_by_command={
                name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in cmd.items()
            },
        )

    def delta(self, later: RedisCounters) -> RedisCounters:
        names = set(self.calls_by_command) | set(later.calls_by_command)
        return RedisCounters(
            cpu_s=later.cpu_s - self.cpu_s,
            commands=later.commands - self.commands,
            net_in=later.net_in - self.net_in,
            calls_by_command={
                n: later.calls_by_command.get(n, 0) - self.calls_by_command.get(n, 0) for n in names
            },
        )


def wait_batch(batch: Any, timeout_s: float, poll_s: float = 0.05) -> None:
    """Wait for a batch with a cheap poll of its counters (one HMGET per poll), so the
    client's waiting costs next to nothing in the measured window (``progress()`` also
    reads the spec, the rate limits and the rejected inputs: ~8 commands a poll)."""
    from orchestration.client.handles import store
    from orchestration.state import keys

    client = store().r
    key = keys.batch(batch.batch_id)
    deadline = time.monotonic() + timeout_s
    while True:
        done, total = client.hmget(key, "done", "total")
        if total is not None and int(done or 0) >= int(total):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch not done within {timeout_s}s: {batch.progress()}")
        time.sleep(poll_s)


def today() -> str:
    return time.strftime("%Y-%m-%d")
