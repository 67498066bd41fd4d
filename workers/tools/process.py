"""Run a child process with a wall-clock limit and a cap on the output kept.

The child gets a session (process group) of its own, so a timeout kills it and everything
it started. Output past the cap is cut from the middle: the head says what ran, the tail
holds the summary a test runner or a linter prints last.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from workers.tools.errors import ToolError

#: How long the pipes may stay open after the child is gone (a grandchild still holding
#: them) before the readers are abandoned, in seconds.
DRAIN_S = 2.0
#: Bytes read from a pipe at a time.
CHUNK = 65536


@dataclass(frozen=True)
class Finished:
    """What a child process left: its exit status, its output (cut to the cap) and why."""

    returncode: int
    output: bytes
    #: Bytes of output dropped from the middle to stay under the cap (0: nothing cut).
    cut: int
    timed_out: bool
    #: Standard error, kept apart when it was not merged into ``output`` (capped alike).
    errors: bytes = b""


class _Capped:
    """The first ``head`` and the last ``tail`` bytes of a stream, and how many were dropped."""

    def __init__(self, limit: int) -> None:
        self.head_limit = limit // 4
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.tail_limit:
                del self.tail[: len(self.tail) - self.tail_limit]

    def drain(self, pipe: IO[bytes]) -> None:
        with pipe:
            while chunk := pipe.read(CHUNK):
                self.feed(chunk)

    @property
    def cut(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def value(self) -> bytes:
        if not self.cut:
            return bytes(self.head + self.tail)
        marker = f"\n[... {self.cut} bytes of output cut ...]\n".encode()
        return bytes(self.head) + marker + bytes(self.tail)


def run(
    argv: Sequence[str],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float,
    max_bytes: int,
    merge_stderr: bool = False,
    stdin: bytes | None = None,
) -> Finished:
    """Run ``argv`` to its end or to ``timeout_s`` (then kill its process group).

    Raises:
        ToolError: the program cannot be started (not installed, not executable).
    """
    try:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as e:
        raise ToolError(f"{argv[0]} cannot be started on this worker: {e.strerror}") from e
    out, err = _Capped(max_bytes), _Capped(max_bytes)
    assert proc.stdout is not None
    readers = [threading.Thread(target=out.drain, args=(proc.stdout,), daemon=True)]
    if proc.stderr is not None:
        readers.append(threading.Thread(target=err.drain, args=(proc.stderr,), daemon=True))
    for reader in readers:
        reader.start()
    if stdin is not None and proc.stdin is not None:
        try:
            with proc.stdin:
                proc.stdin.write(stdin)
        except BrokenPipeError:
            pass
    timed_out = False
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        proc.wait()
    for reader in readers:
        reader.join(DRAIN_S)
    if any(reader.is_alive() for reader in readers):
        # A grandchild that left the group still holds the pipes: the group is gone.
        _kill_group(proc)
    return Finished(proc.returncode, out.value(), out.cut, timed_out, err.value())


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
