"""Inputs from a git range (``duet review --git BASE..HEAD``): one per changed file or hunk.

Git is run as plain plumbing through :func:`git` with hooks, external diff drivers and
textconv filters off and no system config, so a repository under review runs none of its
own code. The branch under review steers nothing: ignore rules and vendored folders are
the base commit's, ``--text`` makes its ``.gitattributes`` unable to hide a diff, and the
diff is streamed a file at a time, held only up to a cap. Everything else is pure:
parsing ``--raw -z`` output, the hunks, what is skipped and the prompt of each change.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from duet.intake.context import RULES_FILE, PathRules, context_sections
from duet.intake.files import InputProblem, InputRecord
from duet.intake.skips import GENERATED, SkipRules, generated
from orchestration.core.errors import ConfigError

UNITS = ("file", "hunk")
#: Folders of code a change's author did not write, skipped like deleted files.
VENDORED_DIRS = frozenset(
    {
        "vendor",
        "vendors",
        "node_modules",
        "third_party",
        "third-party",
        "external",
        "bower_components",
    }
)
#: Files whose change is reviewed wherever they are: they steer git itself.
GIT_FILES = frozenset({".gitignore", ".gitattributes", ".gitmodules"})
#: The whole file after the change is shown under the diff when it is at most this long.
MAX_FILE_CHARS = 20_000
#: The most of one file's diff held in memory when no prompt limit is given, bytes.
MAX_DIFF_BYTES = 4_000_000
#: A changed file over this many bytes (or over the diff cap, when that is larger) is not
#: diffed: git holds both sides and several times their size to diff them.
MAX_FILE_BYTES = 8_000_000
#: A base commit's ``.gitignore`` longer than this, bytes, is not read.
MAX_IGNORE_BYTES = 1_000_000
#: Modes of a submodule (a commit of another repository) and a symlink in a git tree.
SUBMODULE, SYMLINK = "160000", "120000"
_SNIFF = 8192
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


class GitError(ConfigError):
    """A git command failed, or the range is not in the repository."""


def _command(
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
    argv, env = _command(repo, *args, index=index, literal=literal)
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
        argv, env = _command(repo, "cat-file", "--batch")
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
        argv, env = _command(repo, *args)
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


@dataclass(frozen=True, slots=True)
class Change:
    """One entry of ``git diff --raw``: status letter, path, path before a rename, the
    new side's mode and object id, and the old side's object id."""

    status: str
    path: str
    old_path: str | None = None
    mode: str = "100644"
    object_id: str = ""
    old_id: str = ""


def split_range(spec: str) -> tuple[str, str, bool]:
    """``BASE..HEAD`` (or ``BASE...HEAD``: from their merge base) as (base, head, merge_base)."""
    for sep in ("...", ".."):
        if sep in spec:
            base, _, head = spec.partition(sep)
            if base and head:
                return base, head, sep == "..."
    raise ConfigError(
        f"--git {spec!r}: expected BASE..HEAD, e.g. main..feature or origin/main..HEAD"
    )


def parse_raw(raw: bytes) -> list[Change]:
    """Parse ``git diff --raw -z --no-abbrev``: ``:OLDMODE NEWMODE OLDID NEWID STATUS``,
    then the path (two paths for a rename or copy), each NUL-ended and unquoted."""
    fields = raw.decode("utf-8", "surrogateescape").split("\0")
    changes: list[Change] = []
    at = 0
    while at < len(fields) and fields[at].startswith(":"):
        _, mode, old_id, object_id, status = fields[at][1:].split(" ")
        if status[0] in "RC":
            changes.append(
                Change(status[0], fields[at + 2], fields[at + 1], mode, object_id, old_id)
            )
            at += 3
        else:
            changes.append(Change(status[0], fields[at + 1], None, mode, object_id, old_id))
            at += 2
    return changes


def vendored_folder(path: str) -> str | None:
    """The first folder of third-party code (:data:`VENDORED_DIRS`) ``path`` lies in."""
    parts = path.split("/")
    for n, part in enumerate(parts[:-1]):
        if part in VENDORED_DIRS:
            return "/".join(parts[: n + 1])
    return None


def vendored(path: str) -> bool:
    """Whether ``path`` lies in a folder of third-party code (:data:`VENDORED_DIRS`)."""
    return vendored_folder(path) is not None


def always_reviewed(path: str) -> bool:
    """Whether a change to ``path`` is reviewed whatever the ignore rules and vendored
    folders say: a ``.gitignore`` or ``.gitattributes`` changes what git does."""
    return path.rsplit("/", 1)[-1] in GIT_FILES


def _utf8(path: str) -> bool:
    """Whether a path read with ``surrogateescape`` is UTF-8 (ids and prompts must be)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _folders(path: str) -> list[str]:
    """Each folder ``path`` lies in, from the top, as a prefix (``""``, ``"a/"``, ...)."""
    parts = path.split("/")[:-1]
    return ["/".join(parts[:n]) + "/" if n else "" for n in range(len(parts) + 1)]


_HUNK_HEADER = re.compile(rb"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True, slots=True)
class Hunk:
    """One hunk of a file's diff: its text, and the lines it covers after the change."""

    text: bytes
    target_start: int
    target_length: int

    def target_side(self) -> bytes:
        """The hunk's lines as they are after the change (context and added lines)."""
        out: list[bytes] = []
        last = b""
        for line in _lines(self.text)[1:]:
            if line.startswith((b" ", b"+")):
                out.append(line[1:])
            elif line.startswith(b"\\") and last.startswith((b" ", b"+")) and out:
                out[-1] = out[-1].removesuffix(b"\n")  # "\ No newline at end of file"
            last = line
        return b"".join(out)


_INDEX = re.compile(rb"^index ([0-9a-f]+)\.\.([0-9a-f]+)", re.M)


def check_in_step(header: bytes, change: Change) -> None:
    """Check that a file's part of the streamed diff is the change ``--raw`` listed in
    its place (its ``index OLD..NEW`` line names the same objects)."""
    found = _INDEX.search(header)
    if found is not None and found[2].decode() != change.object_id:
        raise GitError(f"git diff: its output is out of step with its file list at {change.path!r}")


def _lines(data: bytes) -> list[bytes]:
    """``data`` split after each newline only."""
    return re.findall(rb"[^\n]*\n|[^\n]+$", data)


def split_hunks(part: bytes) -> tuple[bytes, list[Hunk]]:
    """One file's part of a ``git diff --text``: its header lines and its hunks. Every
    line of a hunk starts with `` ``, ``+``, ``-`` or ``\\``, so a line starting with
    ``@@`` always opens the next one."""
    header: list[bytes] = []
    hunks: list[list[bytes]] = []
    for line in _lines(part):
        if line.startswith(b"@@") and _HUNK_HEADER.match(line):
            hunks.append([line])
        elif hunks:
            hunks[-1].append(line)
        else:
            header.append(line)
    found = []
    for lines in hunks:
        match = _HUNK_HEADER.match(lines[0])
        assert match is not None
        length = int(match[2]) if match[2] is not None else 1
        found.append(Hunk(b"".join(lines), int(match[1]), length))
    return b"".join(header), found


def binary(data: bytes) -> bool:
    """Git's own test: a NUL byte in the first 8 KiB."""
    return b"\0" in data[:_SNIFF]


def fence(text: str, info: str = "") -> str:
    """``text`` in a Markdown code fence longer than any backtick run inside it."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    body = text if text.endswith("\n") or not text else text + "\n"
    return f"{ticks}{info}\n{body}{ticks}"


def file_prompt(
    change: Change, spec: str, diff: str, content: str | None, context: str = ""
) -> str:
    """What the reviewer sees of one changed file: the repository's rules and an analyser's
    findings for it (``context``), the diff, then the whole new file."""
    renamed = f" (renamed from {change.old_path})" if change.old_path else ""
    if change.mode == SYMLINK:
        renamed += " (a symbolic link: its content is the path it points to)"
    parts = [
        f"Review the change to {change.path}{renamed} in {spec}.",
        "",
        *([context] if context else []),
        "## Diff",
        fence(diff, "diff"),
    ]
    if content is not None:
        parts += ["", f"## {change.path} after the change", fence(content)]
    else:
        parts += [
            "",
            f"({change.path} is over {MAX_FILE_CHARS:,} characters: only the diff is shown.)",
        ]
    return "\n".join(parts) + "\n"


def hunk_prompt(change: Change, spec: str, header: str, hunk: str, context: str = "") -> str:
    """What the reviewer sees of one hunk: the file's rules and findings, the file's diff
    header and the hunk."""
    return (
        f"Review this hunk of {change.path} in {spec}.\n\n{context + chr(10) if context else ''}"
        f"## Diff\n{fence(header + hunk, 'diff')}\n"
    )


class GitChanges:
    """The changed files of ``spec`` in ``repo`` as inputs, counting what is skipped.

    Shaped like :class:`~duet.intake.files.InputReader` (iterate, ``skipped``, ``skipped_by``)
    so ``duet run`` reads it the same way.
    """

    def __init__(
        self,
        repo: Path,
        spec: str,
        *,
        unit: str = "file",
        context: int = 10,
        max_prompt_chars: int | None = None,
        on_problem: Callable[[InputProblem], None] | None = None,
        skips: SkipRules | None = None,
        since: str | None = None,
        analysed: dict[str, list[str]] | None = None,
    ) -> None:
        if unit not in UNITS:
            raise ConfigError(f"--unit {unit!r}: expected one of {', '.join(UNITS)}")
        if context < 0:
            raise ConfigError(f"--context {context}: must be 0 or more lines")
        self.repo, self.spec, self.unit, self.context = repo, spec, unit, context
        self.source = f"git {spec}"
        self.max_prompt_chars = max_prompt_chars
        self.on_problem = on_problem
        self.skips = skips or SkipRules()
        #: A static analyser's findings by file (``--with-sarif``), shown with that file.
        self.analysed = analysed or {}
        #: The base commit's review rules by path (read when the change is).
        self.rules = PathRules()
        self.skipped_by: Counter[str] = Counter()
        #: Things to tell the user (an ignored ``--since``), printed by the command.
        self.notes: list[str] = []
        self.base, self.head, self.merge_base = split_range(spec)
        if not _is_repo(repo):
            raise ConfigError(f"--repo {repo}: not a git repository")
        self._check_commit(self.base, "BASE")
        self.head_sha = self._check_commit(self.head, "HEAD")
        #: Where the rules come from (ignores, attributes, vendored folders, review rules):
        #: the range as given, never a commit of the branch that ``--since`` starts at.
        self._trusted = (self.base, self.merge_base)
        if since:
            self._start_at(since)

    def _start_at(self, since: str) -> None:
        """``--since SHA``: review only what changed from SHA (the last reviewed commit) to
        HEAD, when SHA is an ancestor of HEAD; else (a force-push) the whole range."""
        try:
            sha = git(self.repo, "rev-parse", "--verify", "--quiet", f"{since}^{{commit}}")
            git(self.repo, "merge-base", "--is-ancestor", sha.decode().strip(), self.head_sha)
        except GitError:
            self.notes.append(
                f"--since {since}: not an ancestor of {self.head} here (a force-push?): "
                f"the whole range {self.spec} is reviewed"
            )
            return
        self.base, self.merge_base = sha.decode().strip(), False
        self.spec = f"{self.base}..{self.head}"

    @property
    def skipped(self) -> int:
        return sum(self.skipped_by.values())

    def _check_commit(self, ref: str, which: str) -> str:
        """The commit ``ref`` names (its hash), or a ConfigError saying how to fetch it."""
        try:
            return (
                git(self.repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
                .decode("ascii")
                .strip()
            )
        except GitError:
            shallow = git(self.repo, "rev-parse", "--is-shallow-repository").strip() == b"true"
            hint = (
                "this is a shallow clone: check out with `fetch-depth: 0` "
                "(actions/checkout) or run `git fetch --unshallow`"
                if shallow
                else "fetch it first (in CI: actions/checkout with `fetch-depth: 0`)"
            )
            raise ConfigError(
                f"--git {self.spec}: {which} {ref!r} is not in {self.repo}: {hint}"
            ) from None

    def _diff_cap(self) -> int:
        """The most of one file's diff held in memory: what the longest prompt can take (a
        character is at most 4 bytes of UTF-8); a longer diff cannot be reviewed anyway."""
        limit = self.max_prompt_chars
        return 4 * limit if limit is not None else MAX_DIFF_BYTES

    def __iter__(self) -> Iterator[InputRecord]:
        # --text: the branch's .gitattributes (`-diff`, `binary`) cannot hide a change;
        # whether a file is binary is Duet's own test, on the file.
        opts = ["diff", "--no-ext-diff", "--no-textconv", "--no-color", "--text", "-M"]
        listed = parse_raw(git(self.repo, *opts, "--raw", "-z", "--no-abbrev", *self._range()))
        cap = self._diff_cap()
        # A file over the cap is never diffed: git holds both sides and more to diff it.
        limit = max(MAX_FILE_BYTES, cap)
        big = self._over(listed, limit)
        paths = ["--", ".", *(f":(exclude,literal){c.path}" for c in big)] if big else []
        changes = listed
        if big:
            raw = git(self.repo, *opts, "--raw", "-z", "--no-abbrev", *self._range(), *paths)
            changes = parse_raw(raw)
        base = self._base_commit()
        steered = [c.path for c in changes if not always_reviewed(c.path)]
        ignored = self._ignored(base, steered)
        vendored_at_base = self._vendored(base, steered)
        made = self._generated(base, [c.path for c in changes if c.status != "D"])
        self.rules = self._rules(base)
        keep = 4 * MAX_FILE_CHARS if self.unit == "file" else _SNIFF
        for change, size in big.items():
            reason = self._skip_reason(change, ignored, vendored_at_base, made)
            if reason is not None:
                self.skipped_by[reason] += 1
            else:
                why = f"file over {limit:,} bytes ({size:,}): not diffed"
                self._problem(change.path, why, "file over the size cap")
        diff = [*opts, "--full-index", f"-U{self.context}", *self._range(), *paths]
        stream = DiffStream(self.repo, *diff)
        blobs = Blobs(self.repo)
        try:
            for change in changes:
                reason = self._skip_reason(change, ignored, vendored_at_base, made)
                part, size = stream.part(cap if reason is None else 0)
                if reason is None:
                    data, blob_size = blobs.read(change.object_id, keep)
                    reason = "binary" if binary(data) else None
                if reason is not None:
                    self.skipped_by[reason] += 1
                    continue
                if part is None:
                    why = f"diff over {cap:,} bytes ({size:,}): more than a prompt can hold"
                    self._problem(change.path, why, "diff over the size cap")
                    continue
                header, hunks = split_hunks(part)
                check_in_step(header, change)
                if not hunks:
                    self.skipped_by["unchanged text"] += 1
                    continue
                whole = data if blob_size == len(data) else None
                # What the model would be shown: the diff, and the file when it fits.
                shown = part if whole is None else part + whole
                reason = self.skips.by_content(change.path, shown.decode("utf-8", "replace"))
                if reason is not None:
                    self.skipped_by[reason] += 1
                    continue
                yield from self._records(change, header, hunks, whole)
        finally:
            blobs.close()
            stream.close()

    def _over(self, changes: list[Change], limit: int) -> dict[Change, int]:
        """The changes (not deletions) with a side over ``limit`` bytes, and that size."""
        ids = {i for c in changes if c.status != "D" for i in (c.object_id, c.old_id)}
        ids = {i for i in ids if i.strip("0")}  # no side: the all-zero id
        if not ids:
            return {}
        raw = git(self.repo, "cat-file", "--batch-check", stdin="\n".join(sorted(ids)).encode())
        sizes: dict[str, int] = {}
        for line in raw.decode().splitlines():
            object_id, _, rest = line.partition(" ")
            kind, _, size = rest.partition(" ")
            if kind == "blob" and size.isdigit():
                sizes[object_id] = int(size)
        found: dict[Change, int] = {}
        for c in changes:
            biggest = max(sizes.get(c.object_id, 0), sizes.get(c.old_id, 0))
            if c.status != "D" and c.mode != SUBMODULE and biggest > limit:
                found[c] = biggest
        return found

    def _range(self) -> list[str]:
        return [f"{self.base}...{self.head}"] if self.merge_base else [self.base, self.head]

    def _base_commit(self) -> str:
        """The commit whose rules apply (ignores, attributes, vendored folders, review
        rules): BASE as given, or with ``BASE...HEAD`` the merge base; never the branch's
        own commit that ``--since`` starts the diff at."""
        base, merge_base = self._trusted
        if merge_base:
            return git(self.repo, "merge-base", base, self.head).decode().strip()
        return git(self.repo, "rev-parse", "--verify", f"{base}^{{commit}}").decode().strip()

    def _rules(self, base: str) -> PathRules:
        """The base commit's ``.duet/review.toml``: a change cannot rewrite its own rules."""
        try:
            text = git(self.repo, "show", f"{base}:{RULES_FILE}")
        except GitError:
            return PathRules()
        return PathRules.parse(text.decode("utf-8", "replace"), f"{RULES_FILE} at {self.base}")

    def _context(self, path: str) -> str:
        return context_sections(self.rules.for_path(path), self.analysed.get(path, []))

    def _generated(self, base: str, paths: list[str]) -> set[str]:
        """Paths the base commit's ``.gitattributes`` mark generated (``linguist-generated``,
        ``-diff``): read from the base, so a change cannot mark itself unreviewed. Git 2.39
        has no ``check-attr --source``, so the base's tree is read into an index of our own."""
        if not paths:
            return set()
        with tempfile.TemporaryDirectory(prefix="duet-attr-") as folder:
            index = str(Path(folder, "index"))
            git(self.repo, "read-tree", f"{base}^{{tree}}", index=index)
            raw = git(
                self.repo,
                "check-attr",
                "--cached",
                "-z",
                "--stdin",
                "linguist-generated",
                "diff",
                index=index,
                stdin="\0".join(paths).encode("utf-8", "surrogateescape") + b"\0",
            )
        fields = raw.decode("utf-8", "surrogateescape").split("\0")
        values: dict[str, dict[str, str]] = {}
        for at in range(0, len(fields) - 2, 3):
            values.setdefault(fields[at], {})[fields[at + 1]] = fields[at + 2]
        return {path for path, attrs in values.items() if generated(attrs)}

    def _skip_reason(
        self, change: Change, ignored: set[str], vendored_at_base: set[str], made: set[str]
    ) -> str | None:
        if change.status == "D":
            return "deleted"
        if change.mode == SUBMODULE:
            return "submodule"
        if not all(_utf8(p) for p in (change.path, change.old_path) if p is not None):
            return "name not UTF-8"
        if change.path in vendored_at_base:
            return "vendored"
        if change.path in ignored:
            return "gitignored"
        if change.path in made and not always_reviewed(change.path):
            return GENERATED
        return self.skips.by_name(change.path)

    def _at_base(self, base: str, paths: set[str]) -> Iterator[tuple[str, str, str]]:
        """``(type, object id, path)`` of each of ``paths`` the base commit holds."""
        todo = sorted(paths)
        for at in range(0, len(todo), 500):
            chunk = todo[at : at + 500]
            raw = git(self.repo, "ls-tree", "-z", "--full-tree", base, "--", *chunk, literal=True)
            for entry in raw.decode("utf-8", "surrogateescape").split("\0"):
                if entry:
                    info, _, path = entry.partition("\t")
                    _, kind, object_id = info.split(" ")
                    yield kind, object_id, path

    def _vendored(self, base: str, paths: list[str]) -> set[str]:
        """The paths in a vendored folder (:data:`VENDORED_DIRS`) the base commit already
        has: a branch cannot make its own code third-party by adding ``vendor/``."""
        folder_of = {p: f for p in paths if (f := vendored_folder(p)) is not None}
        there = {path for kind, _, path in self._at_base(base, set(folder_of.values()))}
        return {p for p, f in folder_of.items() if f in there}

    def _ignored(self, base: str, paths: list[str]) -> set[str]:
        """The paths the base commit's ``.gitignore`` files (with the repository's
        ``info/exclude`` and configured excludes file) ignore: the branch's own
        ``.gitignore`` is a change under review, never a rule."""
        if not paths:
            return set()
        wanted = {f"{folder}.gitignore" for p in paths for folder in _folders(p)}
        where = git_dir(self.repo)
        blobs = Blobs(self.repo)
        try:
            with tempfile.TemporaryDirectory(prefix="duet-ignores-") as tree:
                for kind, object_id, path in self._at_base(base, wanted):
                    data, size = blobs.read(object_id, MAX_IGNORE_BYTES)
                    if kind == "blob" and size == len(data):
                        file = Path(tree, path)
                        file.parent.mkdir(parents=True, exist_ok=True)
                        file.write_bytes(data)
                argv, env = _command(
                    Path(tree),
                    f"--git-dir={where}",
                    f"--work-tree={tree}",
                    "check-ignore",
                    "--no-index",
                    "-z",
                    "--stdin",
                )
                done = subprocess.run(
                    argv,
                    input="\0".join(paths).encode("utf-8", "surrogateescape") + b"\0",
                    capture_output=True,
                    env=env,
                    check=False,
                    timeout=120,
                )
        finally:
            blobs.close()
        return {p for p in done.stdout.decode("utf-8", "surrogateescape").split("\0") if p}

    def _problem(self, input_id: str, reason: str, kind: str) -> None:
        """A change not read, told to ``on_problem`` (else counted as skipped by ``kind``)."""
        if self.on_problem is None:
            self.skipped_by[kind] += 1
        else:
            self.on_problem(InputProblem(self.source, None, reason, input_id))

    def _records(
        self, change: Change, header: bytes, hunks: list[Hunk], whole: bytes | None
    ) -> Iterator[InputRecord]:
        meta: dict[str, Any] = {
            "path": change.path,
            "git_range": self.spec,
            "head_sha": self.head_sha,
            "unit": self.unit,
        }
        if change.old_path:
            meta["old_path"] = change.old_path
        if change.mode == SYMLINK:
            meta["symlink"] = True
        head = header.decode("utf-8", "replace")
        if self.unit == "file":
            text = whole.decode("utf-8", "replace") if whole is not None else None
            content = text if text is not None and len(text) <= MAX_FILE_CHARS else None
            diff = head + "".join(h.text.decode("utf-8", "replace") for h in hunks)
            if content is None:
                meta["seen"] = "diff"
            else:
                meta |= {"seen": "file", "sha256": hashlib.sha256(whole or b"").hexdigest()}
            prompt = file_prompt(change, self.spec, diff, content, self._context(change.path))
            yield from self._record(change.path, prompt, meta)
            return
        for n, hunk in enumerate(hunks, 1):
            lines = {
                "line": hunk.target_start,
                "end_line": hunk.target_start + max(hunk.target_length - 1, 0),
                "sha256": hashlib.sha256(hunk.target_side()).hexdigest(),
            }
            text = hunk.text.decode("utf-8", "replace")
            prompt = hunk_prompt(change, self.spec, head, text, self._context(change.path))
            yield from self._record(f"{change.path}#hunk{n}", prompt, {**meta, **lines})

    def _record(self, input_id: str, prompt: str, meta: dict[str, Any]) -> Iterator[InputRecord]:
        """The input, or (a prompt over the limit) a problem passed to ``on_problem``."""
        if self.max_prompt_chars is not None and len(prompt) > self.max_prompt_chars:
            reason = f"prompt over {self.max_prompt_chars:,} characters"
            if self.on_problem is not None:
                self.on_problem(InputProblem(self.source, None, reason, input_id))
            return
        yield InputRecord(id=input_id, prompt=prompt, metadata=meta, source=self.source)


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
    argv, env = _command(repo, "commit-tree", tree, *(["-p", parent] if parent else []))
    done = subprocess.run(
        argv, input=message.encode(), capture_output=True, env=env | who, check=False, timeout=120
    )
    if done.returncode != 0:
        raise GitError(f"git commit-tree failed in {repo}: {done.stderr.decode().strip()}")
    return done.stdout.decode().strip()


def _is_repo(repo: Path) -> bool:
    try:
        return git(repo, "rev-parse", "--is-inside-work-tree").strip() == b"true"
    except GitError:
        return False
