"""What both benchmarks share: a stand-in LLM in a subprocess, an embedded Duet, counters.

Nothing here is timed against a fixed number: the benchmarks compare figures measured in
the same run on the same machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from duet.embedded.server import EmbeddedRedis, free_port


@contextlib.contextmanager
def fake_llm_process(latency_ms: float = 0, rpm: int | None = None) -> Iterator[str]:
    """``python -m duet.standin.server`` as a child process (its CPU is not ours), with
    ``rpm`` enforced as vendors do when given; yields the OpenAI ``base_url``."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "duet.standin.server",
            "--port",
            str(port),
            "--latency-ms",
            str(latency_ms),
            *(["--rpm", str(rpm)] if rpm else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
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


#: One command ``MONITOR`` saw: the client type (``lua`` inside a script), command, first key.
Seen = tuple[str, str, str]


@contextlib.contextmanager
def monitored(client: Any) -> Iterator[list[Seen]]:
    """Every command the server runs on ``client``'s database while the block runs
    (``MONITOR`` on ``client``; other databases' clients, e.g. another test's worker on
    the same server, are left out)."""
    db = int(client.connection_pool.connection_kwargs.get("db") or 0)
    seen: list[Seen] = []
    stop = threading.Event()
    ready = threading.Event()

    marker = f"duet-monitor-end-{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}"

    def watch() -> None:
        with client.monitor() as m:  # entered: the server has answered MONITOR
            ready.set()
            while True:
                c = m.next_command()
                if stop.is_set() and marker in c["command"]:
                    return  # every command before the block ended has been read
                if int(c.get("db", db)) != db:
                    continue
                parts = c["command"].split(" ", 2)
                key = parts[1].strip('"') if len(parts) > 1 else ""
                seen.append((c["client_type"], parts[0].lower(), key))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    if not ready.wait(10):
        raise RuntimeError("MONITOR did not start within 10 s")
    try:
        yield seen
    finally:
        stop.set()
        client.echo(marker)  # the monitor reads up to this, then stops
        watcher.join(10)


def key_shape(key: str) -> str:
    """A key with its ids replaced, so keys of one kind count together."""
    key = re.sub(r"\{[^}]*\}", "{id}", key)
    key = re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}", "<uuid>", key)
    key = re.sub(r"[0-9a-f]{12,}", "<id>", key)
    return re.sub(r":r\d\.(generate|critique|refine)", ":<step>", key)[:48]


#: Commands the measuring itself sends, left out of a tally.
_OWN = {"monitor", "info"}


def tally(seen: list[Seen], calls: int) -> dict[str, Any]:
    """Commands per model call: sent by clients (a script call is one) and run inside Lua
    scripts, in all and by command and key kind, most first."""
    top: dict[str, int] = {}
    inner: dict[str, int] = {}
    for kind, cmd, key in seen:
        if cmd in _OWN or (cmd == "ping" and kind != "lua"):
            continue
        bucket = inner if kind == "lua" else top
        label = f"{cmd} {key_shape(key)}".strip()
        bucket[label] = bucket.get(label, 0) + 1

    def ordered(d: dict[str, int]) -> dict[str, float]:
        return {k: round(v / calls, 2) for k, v in sorted(d.items(), key=lambda kv: -kv[1])}

    return {
        "sent_per_call": sum(top.values()) / calls,
        "in_scripts_per_call": sum(inner.values()) / calls,
        "sent": ordered(top),
        "in_scripts": ordered(inner),
    }
