"""A read-only tree of a repository at one commit, cached on the worker by commit.

``checkout(source, commit, cache_dir)`` is what a worker calls before a tool reads the
reviewed code. ``source`` is a repository path every worker sees, or a git URL fetched
into ``cache_dir/git/``; the tree is written from the object store (``ls-tree`` and
``cat-file``, byte for byte: no filters, no attributes, no ``.git``) into
``cache_dir/trees/<commit>/tree``, beside a ``checkout.json`` naming the object store the
git tools read history from. A tree is built in a scratch folder and renamed into place,
under a lock file per commit, so concurrent callers on one machine build it once and
never see half of it.

Layout of ``cache_dir``::

    git/<key>.git          a bare repository per fetched URL (key: a hash of the URL)
    locks/<name>.lock      flock files: one per commit, one per fetched URL
    trees/<commit>/tree    the tree; trees/<commit>/checkout.json its origin
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets as token
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from workers.tools import git as gitcli
from workers.tools.errors import ToolError

#: The file beside a finished tree that names its object store and commit.
ORIGIN = "checkout.json"
#: A source is a URL when it has a scheme, names a remote helper (``ext::``, refused by
#: :data:`~workers.tools.git.PROTOCOLS`) or is scp-like (``user@host:path``).
URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*(?:://|::)|^[^/:]+@[^/:]+:")
#: A full commit id (SHA-1 or SHA-256).
FULL_ID = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
#: Seconds a fetch may take.
FETCH_TIMEOUT_S = 600.0
#: Tree entry modes: regular file, executable, symlink, submodule.
FILE, EXECUTABLE, SYMLINK, SUBMODULE = "100644", "100755", "120000", "160000"


@dataclass(frozen=True)
class Origin:
    """Where a checked-out tree came from: the object store and the full commit id."""

    git_dir: Path
    commit: str


def checkout(source: str, commit: str, cache_dir: Path) -> Path:
    """The tree of ``source`` at ``commit``, built once per commit in ``cache_dir``.

    Raises:
        ToolError: the source is no repository, cannot be fetched, or has no such commit,
            or the tree holds a path that would leave it.
    """
    if not commit or commit.startswith("-"):
        raise ToolError(f"checkout: {commit!r} is not a commit")
    cache_dir = Path(cache_dir).resolve()
    git_dir = _object_store(source, commit, cache_dir)
    sha = _resolve(git_dir, commit)
    home = cache_dir / "trees" / sha
    if (home / ORIGIN).is_file():
        return home / "tree"
    with _locked(cache_dir / "locks" / f"{sha}.lock"):
        if (home / ORIGIN).is_file():
            return home / "tree"
        # Only the lock holder builds: a scratch folder left here was a killed builder's.
        for stale in home.parent.glob(f".{sha}.*"):
            _remove(stale)
        scratch = home.parent / f".{sha}.{os.getpid()}.{token.token_hex(4)}"
        scratch.mkdir(parents=True)
        _write_tree(git_dir, sha, scratch / "tree")
        origin = {"git_dir": str(git_dir), "commit": sha}
        (scratch / ORIGIN).write_text(json.dumps(origin))
        if home.exists():  # a folder with no checkout.json: never finished
            _remove(home)
        os.rename(scratch, home)
    return home / "tree"


def origin(root: Path) -> Origin:
    """The object store and commit a tree made by :func:`checkout` came from."""
    try:
        data = json.loads((Path(root).parent / ORIGIN).read_text())
        return Origin(Path(data["git_dir"]), str(data["commit"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ToolError("this tree has no repository history (not made by a checkout)") from e


def _object_store(source: str, commit: str, cache_dir: Path) -> Path:
    """The git directory holding ``commit``: the source's own, or a fetched copy."""
    if source.startswith("-"):
        raise ToolError(f"checkout: {source!r} is not a repository path or URL")
    if not URL.match(source):
        path = Path(source).expanduser().resolve()
        if not path.is_dir():
            raise ToolError(f"checkout: {source} is not a directory")
        found = gitcli.git(
            ["rev-parse", "--absolute-git-dir"], cwd=path, what=f"checkout: {source}"
        )
        return Path(found.output.decode().strip())
    key = hashlib.sha256(source.encode()).hexdigest()[:16]
    repo = cache_dir / "git" / f"{key}.git"
    with _locked(cache_dir / "locks" / f"git-{key}.lock"):
        if not (repo / "HEAD").is_file():
            _remove(repo)
            repo.parent.mkdir(parents=True, exist_ok=True)
            gitcli.git(["init", "--quiet", "--bare", str(repo)], what="checkout")
        if not _has_commit(repo, commit):
            _fetch(repo, source, commit)
    return repo


def _fetch(repo: Path, url: str, commit: str) -> None:
    """Fetch ``commit`` (by id where the server allows it, else every branch and tag)."""
    run = ["fetch", "--quiet", "--no-write-fetch-head", "--end-of-options", url]
    if FULL_ID.match(commit):
        with contextlib.suppress(ToolError):
            gitcli.git(
                [*run, commit],
                git_dir=repo,
                env=gitcli.fetch_env(),
                timeout_s=FETCH_TIMEOUT_S,
                what="fetch",
            )
            # A commit fetched by id has no ref: keep it from garbage collection.
            gitcli.git(["update-ref", f"refs/duet/{commit}", commit], git_dir=repo)
            return
    refs = ["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"]
    gitcli.git(
        [*run, *refs], git_dir=repo, env=gitcli.fetch_env(), timeout_s=FETCH_TIMEOUT_S, what="fetch"
    )


def _has_commit(git_dir: Path, commit: str) -> bool:
    try:
        _resolve(git_dir, commit)
    except ToolError:
        return False
    return True


def _resolve(git_dir: Path, commit: str) -> str:
    """The full id of ``commit`` in ``git_dir``."""
    try:
        done = gitcli.git(
            ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{commit}^{{commit}}"],
            git_dir=git_dir,
        )
    except ToolError as e:
        raise ToolError(f"checkout: the source has no commit {commit!r}") from e
    return done.output.decode().strip()


def _write_tree(git_dir: Path, sha: str, dest: Path) -> None:
    """Write the tree of ``sha`` into ``dest`` from the object store, read-only.

    Symlinks are made last, so no file is ever written through one; a path with ``..``,
    an empty part or a ``.git`` part is refused (git itself never makes one).
    """
    listing = gitcli.git(
        ["ls-tree", "-r", "-z", "--full-tree", sha],
        git_dir=git_dir,
        max_bytes=1 << 30,
        what="checkout",
    )
    entries: list[tuple[str, str, Path]] = []
    for record in listing.output.split(b"\0"):
        if not record:
            continue
        meta, _, raw = record.partition(b"\t")
        mode, _kind, oid = meta.decode().split()
        rel = raw.decode("utf-8", "surrogateescape")
        parts = rel.split("/")
        if any(p in ("", ".", "..") or p.casefold() == ".git" for p in parts):
            raise ToolError(f"checkout: the tree holds an unsafe path {rel!r}")
        entries.append((mode, oid, dest.joinpath(*parts)))
    dest.mkdir(parents=True)
    blobs = [(mode, oid, path) for mode, oid, path in entries if mode != SUBMODULE]
    contents = _cat_blobs(git_dir, [oid for _, oid, _ in blobs])
    links: list[tuple[Path, bytes]] = []
    for (mode, _oid, path), data in zip(blobs, contents, strict=True):
        path.parent.mkdir(parents=True, exist_ok=True)
        if mode == SYMLINK:
            links.append((path, data))
            continue
        path.write_bytes(data)
        path.chmod(0o555 if mode == EXECUTABLE else 0o444)
    for mode, _oid, path in entries:
        if mode == SUBMODULE:
            path.mkdir(parents=True, exist_ok=True)
    for path, target in links:
        os.symlink(os.fsdecode(target), path)
    for folder, _dirs, _files in os.walk(dest, topdown=False):
        os.chmod(folder, 0o555)


def _cat_blobs(git_dir: Path, oids: list[str]) -> Iterator[bytes]:
    """The contents of ``oids`` in order, through one ``git cat-file --batch``."""
    if not oids:
        return iter(())
    proc = subprocess.Popen(
        ["git", *gitcli.SAFE_OPTIONS, f"--git-dir={git_dir}", "cat-file", "--batch"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=gitcli.read_env(),
    )
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout

    def feed() -> None:
        # A reader that gave up (a missing object) killed git: its pipe is closed.
        with contextlib.suppress(BrokenPipeError), stdin:
            for oid in oids:
                stdin.write(f"{oid}\n".encode())

    threading.Thread(target=feed, daemon=True).start()

    def read() -> Iterator[bytes]:
        try:
            with stdout:
                for oid in oids:
                    header = stdout.readline().split()
                    if len(header) != 3:
                        raise ToolError(f"checkout: object {oid} is missing from the source")
                    yield stdout.read(int(header[2]))
                    stdout.read(1)
        finally:
            # Stopped early (a missing object, a failed write): git is not left behind.
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    return read()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (made if missing) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _remove(path: Path) -> None:
    """Delete a folder this module made (its read-only parts made writable first)."""
    if not path.exists():
        return
    for folder, _dirs, _files in os.walk(path):
        os.chmod(folder, 0o755)
    shutil.rmtree(path)
