"""Run a configured command on a throwaway copy of the reviewed tree, in a sandbox.

With ``sandbox="bwrap"`` (the default) the command runs under bubblewrap: its own mount,
network, process and IPC namespaces (a loopback of its own, nothing of the worker's), no
capabilities, a read-only view of the system (``/usr``, a few files of ``/etc``) and of
the worker's Python (its prefix and base prefix, so the tests find their packages), a
private ``/tmp``, and a writable copy of the tree at ``/repo`` that is deleted afterwards.
Everywhere the environment is rebuilt from nothing (``PATH``, ``HOME``, ``LANG``,
``TMPDIR``): no variable of the worker, hence no key, reaches the command. ``prlimit``
caps CPU seconds, address space and file size; a wall-clock limit kills the whole
sandbox; output past the cap is cut from the middle.

Where bubblewrap is missing or cannot make namespaces, commands are refused, unless the
agent's options say ``sandbox = "none"``: then the command runs on the copy with the clean
environment and the limits, but with the worker's network and file system.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from workers.tools import process
from workers.tools.errors import ToolError

#: Sandbox kinds an agent's options may name.
KINDS = ("bwrap", "none")
#: Where the copy of the tree is mounted inside the sandbox.
MOUNT = "/repo"
#: Files of /etc a program needs to start and name its user; never the whole of /etc.
ETC_FILES = (
    "/etc/alternatives",
    "/etc/group",
    "/etc/hosts",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/ssl/certs",
)
#: Top-level links or folders of a merged-/usr system, mirrored as they are on the host.
ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


@dataclass(frozen=True)
class Limits:
    """What one command may use; each from the agent's ``limits`` option or its default."""

    #: Wall-clock seconds before the sandbox and everything in it is killed.
    timeout_s: float = 300.0
    #: CPU seconds (RLIMIT_CPU), summed per process.
    cpu_s: int = 300
    #: Address space per process, in MiB (RLIMIT_AS).
    memory_mb: int = 4096
    #: Largest file a process may write, in MiB (RLIMIT_FSIZE).
    file_mb: int = 256
    #: Size of the sandbox's private /tmp, in MiB (bubblewrap 0.8 and later; memory-backed).
    tmp_mb: int = 512
    #: Output (stdout and stderr together) kept, in bytes; the middle is cut past it.
    output_bytes: int = 64_000

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None) -> Limits:
        """Limits from an agent's ``limits`` option; an unknown key or a bad value is refused."""
        options = dict(options or {})
        known = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ToolError(f"run_command: unknown limits {unknown}; known: {sorted(known)}")
        values: dict[str, Any] = {}
        for name, value in options.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ToolError(f"run_command: limits.{name} must be a positive number")
            values[name] = float(value) if name == "timeout_s" else int(value)
        return cls(**values)


@dataclass(frozen=True)
class Outcome:
    """How a command ended and what it printed (stdout and stderr merged, maybe cut)."""

    exit_code: int
    output: str
    timed_out: bool
    #: Bytes of output cut from the middle (0: all of it is here).
    cut: int


@functools.cache
def unavailable() -> str | None:
    """Why bubblewrap cannot sandbox a command on this host, or None when it can."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    probe = subprocess.run(
        ["bwrap", "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if probe.returncode != 0:
        why = probe.stderr.strip().splitlines()
        return f"bubblewrap cannot make a sandbox here ({why[-1] if why else probe.returncode})"
    return None


@functools.cache
def _sizes_tmpfs() -> bool:
    """Whether this bubblewrap takes ``--size`` for a tmpfs (0.8 and later)."""
    shown = subprocess.run(["bwrap", "--help"], capture_output=True, text=True, timeout=30)
    return "--size" in shown.stdout + shown.stderr


def run(tree: Path, argv: Sequence[str], *, sandbox: str = "bwrap", limits: Limits) -> Outcome:
    """Run ``argv`` on a fresh writable copy of ``tree``; the copy is deleted afterwards.

    Raises:
        ToolError: an unknown sandbox kind, or ``bwrap`` asked for where it cannot run.
    """
    if sandbox not in KINDS:
        raise ToolError(f"run_command: sandbox must be one of {list(KINDS)}, not {sandbox!r}")
    if sandbox == "bwrap" and (why := unavailable()) is not None:
        raise ToolError(
            f'run_command: no sandbox: {why}; install bubblewrap, or set sandbox = "none"'
            " in the agent's tool options to run commands without one"
        )
    scratch = Path(tempfile.mkdtemp(prefix="duet-sandbox-"))
    try:
        copy = scratch / "repo"
        shutil.copytree(tree, copy, symlinks=True)
        _writable(copy)
        if sandbox == "bwrap":
            env = _environment(home="/tmp", tmp="/tmp")
            full = [*_prlimit(limits), *_bwrap(copy, limits), *argv]
            cwd = None
        else:
            for name in ("home", "tmp"):
                (scratch / name).mkdir()
            env = _environment(home=str(scratch / "home"), tmp=str(scratch / "tmp"))
            full = [*_prlimit(limits), *argv]
            cwd = copy
        try:
            done = process.run(
                full,
                cwd=cwd,
                env=env,
                timeout_s=limits.timeout_s,
                max_bytes=limits.output_bytes,
                merge_stderr=True,
            )
        except ToolError as e:
            raise ToolError(f"run_command: {e}") from e
    finally:
        _remove(scratch)
    return Outcome(
        done.returncode, done.output.decode("utf-8", "replace"), done.timed_out, done.cut
    )


def _environment(*, home: str, tmp: str) -> dict[str, str]:
    """The whole environment a command gets: nothing is inherited from the worker."""
    python_bin = str(Path(sys.executable).parent)
    return {
        "PATH": f"{python_bin}:/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": tmp,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }


def _prlimit(limits: Limits) -> list[str]:
    if shutil.which("prlimit") is None:
        raise ToolError("run_command: prlimit (util-linux) is needed to limit a command")
    return [
        "prlimit",
        f"--cpu={limits.cpu_s}",
        f"--as={limits.memory_mb << 20}",
        f"--fsize={limits.file_mb << 20}",
        "--",
    ]


def _bwrap(copy: Path, limits: Limits) -> list[str]:
    """bubblewrap's arguments: namespaces, read-only system, the copy at :data:`MOUNT`."""
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    # /tmp first: a Python installed under /tmp is bound over it below, not hidden by it.
    args += ["--proc", "/proc", "--dev", "/dev"]
    if _sizes_tmpfs():
        args += ["--size", str(limits.tmp_mb << 20)]
    args += ["--tmpfs", "/tmp"]
    args += ["--ro-bind", "/usr", "/usr"]
    for top in ROOT_LINKS:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for path in ETC_FILES:
        args += ["--ro-bind-try", path, path]
    # The worker's Python, where it lives (a venv names its base by absolute path).
    for prefix in sorted({sys.prefix, sys.base_prefix, os.path.realpath(sys.base_prefix)}):
        if not prefix.startswith("/usr/"):
            args += ["--ro-bind-try", prefix, prefix]
    args += ["--bind", str(copy), MOUNT, "--chdir", MOUNT, "--"]
    return args


def _writable(tree: Path) -> None:
    """Give the copy's owner write access (the checkout is read-only)."""
    for folder, _dirs, files in os.walk(tree):
        os.chmod(folder, 0o755)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode | 0o200)


def _remove(path: Path) -> None:
    for folder, _dirs, _files in os.walk(path):
        os.chmod(folder, 0o755)
    shutil.rmtree(path, ignore_errors=True)
