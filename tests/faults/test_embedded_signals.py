"""``duet run`` on the embedded default, stopped by a signal or killed mid-batch: no Redis
is left.

A real ``duet run`` process (no ``DUET_REDIS_URL``) starts its embedded redis-server /
valkey-server as a child; the test waits until results are being written, signals the
process, and checks that it exits and that the server process is gone, with every line
written to the results file whole. Killed (SIGKILL), ``duet run`` cleans up nothing: on
Linux the kernel ends the server (its parent-death signal).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability import EMBEDDED, Reliability
from tests.support import ROOT, wait_for

pytestmark = pytest.mark.system

CONFIG = """
[actor]
instructions = "Fix the code."
model = "sim?latency_ms=150"
[critic]
instructions = "Review the code."
model = "sim?latency_ms=150&scores=0.2,0.3,0.4,0.95"
[loop]
max_rounds = 3
"""
RUNS, THREADS = 40, 4
#: How long a killed run's server may take to end (it is signalled at once; it shuts down).
GONE_S = 10.0


def server_children(pid: int) -> list[int]:
    """Redis-compatible server processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if ppid == pid and name in ("redis-server", "valkey-server"):
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
@pytest.mark.parametrize(
    ("signals", "exit_code"),
    [
        ([signal.SIGTERM], 128 + signal.SIGTERM),
        ([signal.SIGHUP], 128 + signal.SIGHUP),
        # Ctrl-C cancels the batch and keeps writing; a second one quits at once.
        ([signal.SIGINT, signal.SIGINT], 130),
    ],
    ids=["SIGTERM", "SIGHUP", "SIGINT-twice"],
)
def test_a_signalled_run_leaves_no_redis(
    signals: list[signal.Signals], exit_code: int, tmp_path: Path, reliability: Reliability
) -> None:
    proc, out, err = _duet_run(tmp_path)
    try:
        servers = wait_for(lambda: server_children(proc.pid), 60, "the embedded Redis to start")
        assert len(servers) == 1
        wait_for(lambda: out.exists() and out.read_text().count("\n") >= 2, 60, "two results")
        for signum in signals:
            proc.send_signal(signum)
            if signum == signal.SIGINT:  # let the first Ctrl-C be handled before the next
                wait_for(lambda: "cancelling" in err.read_text(), 30, "the cancel notice")
        code = proc.wait(60)
        orphaned = alive(servers[0])
        lines = out.read_text().splitlines()
        broken = sum(not _whole(line) for line in lines)
        wrong = [
            what
            for what, bad in [
                (f"exit {code}, not {exit_code}", code != exit_code),
                ("the embedded Redis outlived `duet run`", orphaned),
                (f"{broken} of {len(lines)} result lines cut", broken),
            ]
            if bad
        ]
        reliability.record(
            section=EMBEDDED,
            fault="`duet run` (no `DUET_REDIS_URL`) gets SIGTERM, SIGHUP, or Ctrl-C twice, once "
            "results are being written",
            load=f"{RUNS} runs, {THREADS} in-process threads, 150 ms simulated calls",
            lost="; ".join(wrong)
            if wrong
            else f"nothing left running: the embedded "
            f"`redis-server` gone when `duet run` exited ({code}); {len(lines)} lines in the "
            f"results file, every one whole; the {RUNS - len(lines)} unfinished runs are not in "
            "it (they ended with the embedded Redis)",
            before="SIGTERM orphaned the embedded Redis",
        )
        assert code == exit_code, err.read_text()[-2000:]
        assert not orphaned, "the embedded Redis outlived duet run"
        assert 2 <= len(lines) < RUNS
        assert broken == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_run_leaves_no_redis(tmp_path: Path, reliability: Reliability) -> None:
    """SIGKILL gives ``duet run`` no chance to stop its embedded Redis: the kernel does it
    (the server was started with PR_SET_PDEATHSIG), within a few seconds."""
    proc, out, _err = _duet_run(tmp_path)
    servers: list[int] = []
    try:
        servers = wait_for(lambda: server_children(proc.pid), 60, "the embedded Redis to start")
        assert len(servers) == 1
        wait_for(lambda: out.exists() and out.read_text().count("\n") >= 2, 60, "two results")
        proc.kill()
        code = proc.wait(60)
        started = time.monotonic()
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not any(alive(pid) for pid in servers), GONE_S, "the server to end")
        took = time.monotonic() - started
        orphans = sum(alive(pid) for pid in servers)
        reliability.record(
            section=EMBEDDED,
            fault="`duet run` (no `DUET_REDIS_URL`) killed with SIGKILL (no handler runs) once "
            "results are being written",
            load=f"{RUNS} runs, {THREADS} in-process threads, 150 ms simulated calls",
            lost=f"{orphans} of {len(servers)} embedded `redis-server` orphaned (waited "
            f"{GONE_S:g} s)"
            if orphans
            else f"nothing left running: the embedded `redis-server` ended {took:.1f} s after "
            f"`duet run` was killed ({code}), on the kernel's parent-death signal",
            before="SIGKILL orphaned the embedded Redis",
        )
        assert code == -signal.SIGKILL
        assert orphans == 0, "the embedded Redis outlived a killed duet run"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in servers:  # an orphan the test made is the test's to end
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def _duet_run(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """A real ``duet run`` of :data:`RUNS` slow runs on the embedded default; with its
    results file and its stderr file."""
    config = tmp_path / "review.toml"
    config.write_text(CONFIG)
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text(
        "".join(json.dumps({"id": f"i{n}", "prompt": f"task {n}"}) + "\n" for n in range(RUNS))
    )
    out = tmp_path / "out.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUET_")}
    env["DUET_WORKER_CONCURRENCY"] = str(THREADS)  # slow enough to be mid-batch for seconds
    err = tmp_path / "stderr.txt"
    with err.open("wb") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "duet.commands.main",
                "run",
                str(config),
                "-i",
                str(inputs),
                "-o",
                str(out),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=sink,
            preexec_fn=_default_signals,
        )
    return proc, out, err


def _default_signals() -> None:
    """In the child: the signals at their defaults, as a terminal gives them. A test
    runner started under ``nohup`` ignores SIGHUP, children inherit that, and ``duet run``
    (rightly) keeps an ignored SIGHUP ignored."""
    for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


def _whole(line: str) -> bool:
    try:
        return bool(json.loads(line)["id"])
    except (ValueError, KeyError, TypeError):
        return False
