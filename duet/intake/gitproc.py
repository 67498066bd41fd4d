"""Git run as plain plumbing: hooks, external diff drivers, textconv filters and system
config off, no ``GIT_*`` variable of the caller's, so a repository under review runs
none of its own code; objects and diffs read a piece at a time, held only up to a cap.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from duet.intake.diffs import GitError

#: Bytes read from a git pipe at a time.
_PIECE = 65_536

_SAFE_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_EXTERNAL_DIFF": "",
    "GIT_PAGER": "cat",
    "LC_ALL": "C",
}
_SAFE_CONFIG = (
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "diff.external=",
    "-c",
    "core.quotePath=false",
)


def command(
    repo: Path, *args: str, index: str | None = None, literal: bool = False
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of ``git ARGS`` in ``repo``, hooks, external diffs and
    system config off, no ``GIT_*`` variable of the caller's (``index``: an index file of
    our own, ``GIT_INDEX_FILE``; ``literal``: paths given are names, never patterns)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | _SAFE_ENV
    if index is not None:
        env["GIT_INDEX_FILE"] = index
    if literal:
        env["GIT_LITERAL_PATHSPECS"] = "1"
    return ["git", *_SAFE_CONFIG, "-C", str(repo), *args], env


def git(
    repo: Path,
    *args: str,
    index: str | None = None,
    stdin: bytes | None = None,
    literal: bool = False,
) -> bytes:
    """Run ``git ARGS`` in ``repo`` with hooks, external diffs and system config off
    (``literal``: paths given are names, never patterns)."""
    argv, env = command(repo, *args, index=index, literal=literal)
    try:
        done = subprocess.run(
            argv, input=stdin, capture_output=True, env=env, check=False, timeout=120
        )
    except FileNotFoundError:
        raise GitError("git is not installed (needed for --git)") from None
    if done.returncode != 0:
        reason = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise GitError(
            f"git {' '.join(args[:3])} failed in {repo}: {reason[-1] if reason else done.returncode}"
        )
    return done.stdout


class Blobs:
    """Objects read by id through one ``git cat-file --batch`` process: a process per file
    cost ten times as much (``python -m bench.git_intake``). One object is asked for at a
    time and only its first ``keep`` bytes are held, so memory holds no more than that."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        argv, env = command(repo, "cat-file", "--batch")
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
            )
        except FileNotFoundError:
            raise GitError("git is not installed (needed for --git)") from None

    def read(self, name: str, keep: int) -> tuple[bytes, int]:
        """The first ``keep`` bytes of object ``name`` (an id, or ``REV:PATH`` for a path
        without a newline) and its whole size; the rest is read past, never held."""
        stdin, stdout = self._proc.stdin, self._proc.stdout
        assert stdin is not None and stdout is not None
        stdin.write(name.encode("utf-8", "surrogateescape") + b"\n")
        stdin.flush()
        header = stdout.readline().split()
        if len(header) != 3 or not header[2].isdigit():
            raise GitError(f"git cat-file: no object {name!r} in {self.repo}")
        size = int(header[2])
        data = stdout.read(min(size, keep))
        left = size - len(data)
        while left > 0:
            left -= len(stdout.read(min(left, _PIECE)))
        stdout.read(1)  # the newline after each object
        return data, size

    def close(self) -> None:
        """End the git process."""
        _end(self._proc)


def _end(proc: subprocess.Popen[bytes]) -> None:
    """Close a git process's pipes and wait for it (killing it when it does not end)."""
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class DiffStream:
    """The per-file parts of one streamed ``git diff``, in the order ``--raw`` lists the
    files: each part is read past in pieces and held only up to a cap, so a 20 MB change
    costs no more memory than the cap."""

    def __init__(self, repo: Path, *args: str) -> None:
        argv, env = command(repo, *args)
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        self._proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=self._errors, env=env, bufsize=_PIECE
        )
        assert self._proc.stdout is not None
        self._out = self._proc.stdout
        self._next = self._out.readline(_PIECE)

    def part(self, cap: int) -> tuple[bytes | None, int]:
        """The next file's part of the diff (None when it is over ``cap`` bytes: read past,
        not held) and its size in bytes."""
        if not self._next.startswith(b"diff --git "):
            raise GitError("git diff: its output is out of step with its file list")
        held: bytearray | None = bytearray(self._next)
        size, at_start = len(self._next), self._next.endswith(b"\n")
        while True:
            piece = self._out.readline(_PIECE)
            if not piece or (at_start and piece.startswith(b"diff --git ")):
                self._next = piece
                break
            size += len(piece)
            at_start = piece.endswith(b"\n")
            if held is not None and size <= cap:
                held += piece
            else:
                held = None
        return (bytes(held) if held is not None else None), size

    def close(self) -> None:
        """End git (early, when the reader stopped) and raise its error if it failed."""
        finished = not self._next
        _end(self._proc)
        self._errors.seek(0)
        reason = self._errors.read().decode("utf-8", "replace").strip().splitlines()
        self._errors.close()
        if finished and self._proc.returncode != 0:
            raise GitError(f"git diff failed: {reason[-1] if reason else self._proc.returncode}")


def git_dir(repo: Path) -> Path:
    """The repository's git directory, wherever it is (a worktree's or a submodule's own,
    not ``.git/``)."""
    return Path(
        git(repo, "rev-parse", "--absolute-git-dir").decode("utf-8", "surrogateescape").strip()
    )


def staged_range(repo: Path) -> str:
    """``BASE..STAGED`` for the staged changes: the index written as a commit object no
    branch points to, against HEAD, or against an empty commit before the first one. The
    index is the caller's ``GIT_INDEX_FILE`` when set (``git commit -a`` runs its hooks so)."""
    index = os.environ.get("GIT_INDEX_FILE")
    index = os.path.abspath(index) if index else None
    tree = git(repo, "write-tree", index=index).decode().strip()
    try:
        head = git(repo, "rev-parse", "--verify", "--quiet", "HEAD^{commit}").decode().strip()
    except GitError:  # the first commit: nothing before it
        empty = git(repo, "hash-object", "-t", "tree", "--stdin", stdin=b"").decode().strip()
        head = _commit(repo, empty, "duet: before the first commit")
    return f"{head}..{_commit(repo, tree, 'duet: staged changes', head)}"


def _commit(repo: Path, tree: str, message: str, parent: str | None = None) -> str:
    """A commit object of ``tree`` that no ref points to (git's gc removes it later)."""
    who = {
        "GIT_AUTHOR_NAME": "duet",
        "GIT_AUTHOR_EMAIL": "duet@localhost",
        "GIT_COMMITTER_NAME": "duet",
        "GIT_COMMITTER_EMAIL": "duet@localhost",
        "GIT_AUTHOR_DATE": "1970-01-01T00:00:00Z",
        "GIT_COMMITTER_DATE": "1970-01-01T00:00:00Z",
    }
    argv, env = command(repo, "commit-tree", tree, *(["-p", parent] if parent else []))
    done = subprocess.run(
        argv, input=message.encode(), capture_output=True, env=env | who, check=False, timeout=120
    )
    if done.returncode != 0:
        raise GitError(f"git commit-tree failed in {repo}: {done.stderr.decode().strip()}")
    return done.stdout.decode().strip()


def is_repo(repo: Path) -> bool:
    try:
        return git(repo, "rev-parse", "--is-inside-work-tree").strip() == b"true"
    except GitError:
        return False
