"""Inputs from a git range (``duet review --git BASE..HEAD``): one per changed file or hunk.

Git is run as plain plumbing through :func:`git` with hooks, external diff drivers and
textconv filters off and no system config, so a repository under review runs none of its
own code. Everything else is pure: parsing ``--name-status -z`` output, the hunks
(``unidiff``), what is skipped (deleted, binary, vendored, ``.gitignore``\\ d) and the
prompt each change is reviewed with.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unidiff import PatchSet

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
#: The whole file after the change is shown under the diff when it is at most this long.
MAX_FILE_CHARS = 20_000
_SNIFF = 8192
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


def _command(repo: Path, *args: str, index: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of ``git ARGS`` in ``repo``, hooks, external diffs and
    system config off, no ``GIT_*`` variable of the caller's (``index``: an index file of
    our own, ``GIT_INDEX_FILE``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | _SAFE_ENV
    if index is not None:
        env["GIT_INDEX_FILE"] = index
    return ["git", *_SAFE_CONFIG, "-C", str(repo), *args], env


def git(repo: Path, *args: str, index: str | None = None, stdin: bytes | None = None) -> bytes:
    """Run ``git ARGS`` in ``repo`` with hooks, external diffs and system config off."""
    argv, env = _command(repo, *args, index=index)
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
    """Files as they are at ``rev``, read through one ``git cat-file --batch`` process: a
    process per file cost ten times as much (``python -m bench.git_intake``). One file is
    asked for and read at a time, so memory holds one file."""

    def __init__(self, repo: Path, rev: str) -> None:
        self.repo, self.rev = repo, rev
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

    def read(self, path: str) -> bytes:
        """The content of ``path`` at the revision (GitError when it has none)."""
        if "\n" in path:  # the batch protocol is line-based: such a name gets its own process
            return git(self.repo, "show", f"{self.rev}:{path}")
        stdin, stdout = self._proc.stdin, self._proc.stdout
        assert stdin is not None and stdout is not None
        stdin.write(f"{self.rev}:{path}\n".encode("utf-8", "surrogateescape"))
        stdin.flush()
        header = stdout.readline().split()
        if len(header) != 3 or not header[2].isdigit():
            raise GitError(f"git cat-file: no file {path!r} at {self.rev} in {self.repo}")
        data = stdout.read(int(header[2]))
        stdout.read(1)  # the newline after each object
        return data

    def close(self) -> None:
        """End the git process."""
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                pipe.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


@dataclass(frozen=True, slots=True)
class Change:
    """One entry of ``git diff --name-status``: status letter, path, path before a rename."""

    status: str
    path: str
    old_path: str | None = None


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


def parse_name_status(raw: bytes) -> list[Change]:
    """Parse ``git diff --name-status -z``: renames and copies carry two paths."""
    fields = raw.decode("utf-8", "surrogateescape").split("\0")
    changes: list[Change] = []
    at = 0
    while at < len(fields) and fields[at]:
        status = fields[at]
        if status[0] in "RC":
            changes.append(Change(status[0], fields[at + 2], fields[at + 1]))
            at += 3
        else:
            changes.append(Change(status[0], fields[at + 1]))
            at += 2
    return changes


#: The escapes of git's C-style quoting of a path, as bytes.
_C_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}
_OCTAL = re.compile(r"[0-3][0-7]{2}")


def unquoted_path(path: str) -> str:
    """A path as a diff header writes it, without git's quoting: a name holding a control
    character, ``"`` or ``\\`` is written ``"new\\nline.py"`` (octal escapes for bytes)."""
    if len(path) < 2 or path[0] != '"' or path[-1] != '"':
        return path
    body, out, at = path[1:-1], bytearray(), 0
    while at < len(body):
        char = body[at]
        if char == "\\" and body[at + 1 : at + 2] in _C_ESCAPES:
            out.append(_C_ESCAPES[body[at + 1]])
            at += 2
        elif char == "\\" and _OCTAL.fullmatch(body[at + 1 : at + 4]):
            out.append(int(body[at + 1 : at + 4], 8))
            at += 4
        else:
            out += char.encode("utf-8", "surrogateescape")
            at += 1
    return out.decode("utf-8", "surrogateescape")


def vendored(path: str) -> bool:
    """Whether ``path`` lies in a folder of third-party code (:data:`VENDORED_DIRS`)."""
    return any(part in VENDORED_DIRS for part in path.split("/")[:-1])


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

    def _range_args(self) -> list[str]:
        return [f"{self.base}...{self.head}"] if self.merge_base else [self.base, self.head]

    def __iter__(self) -> Iterator[InputRecord]:
        diff_opts = ["diff", "--no-ext-diff", "--no-textconv", "--no-color", "-M"]
        changes = parse_name_status(
            git(self.repo, *diff_opts, "--name-status", "-z", *self._range_args())
        )
        patch = git(self.repo, *diff_opts, f"-U{self.context}", *self._range_args())
        files = {unquoted_path(f.path): f for f in PatchSet(patch.decode("utf-8", "replace"))}
        ignored = self._ignored([c.path for c in changes])
        made = self._generated([c.path for c in changes if c.status != "D"])
        self.rules = self._rules()
        blobs = Blobs(self.repo, self.head)
        try:
            for change in changes:
                reason = self._skip_reason(change, ignored, made)
                if reason is None:
                    data = blobs.read(change.path)
                    reason = "binary" if binary(data) else None
                if reason is not None:
                    self.skipped_by[reason] += 1
                    continue
                patched = files.get(change.path)
                if patched is None or not len(patched):
                    self.skipped_by["unchanged text"] += 1
                    continue
                text = data.decode("utf-8", "replace")
                reason = self.skips.by_content(change.path, text)
                if reason is not None:
                    self.skipped_by[reason] += 1
                    continue
                yield from self._records(change, patched, text)
        finally:
            blobs.close()

    def _skip_reason(self, change: Change, ignored: set[str], made: set[str]) -> str | None:
        if change.status == "D":
            return "deleted"
        if vendored(change.path):
            return "vendored"
        if change.path in ignored:
            return "gitignored"
        if change.path in made:
            return GENERATED
        return self.skips.by_name(change.path)

    def _base_commit(self) -> str:
        """The commit the change starts from (the merge base for ``BASE...HEAD``)."""
        if self.merge_base:
            return git(self.repo, "merge-base", self.base, self.head).decode().strip()
        return self.base

    def _rules(self) -> PathRules:
        """The base commit's ``.duet/review.toml``: a change cannot rewrite its own rules."""
        try:
            text = git(self.repo, "show", f"{self._base_commit()}:{RULES_FILE}")
        except GitError:
            return PathRules()
        return PathRules.parse(text.decode("utf-8", "replace"), f"{RULES_FILE} at {self.base}")

    def _context(self, path: str) -> str:
        return context_sections(self.rules.for_path(path), self.analysed.get(path, []))

    def _generated(self, paths: list[str]) -> set[str]:
        """Paths the base commit's ``.gitattributes`` mark generated (``linguist-generated``,
        ``-diff``): read from the base, so a change cannot mark itself unreviewed. Git 2.39
        has no ``check-attr --source``, so the base's tree is read into an index of our own."""
        if not paths:
            return set()
        base = self._base_commit()
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

    def _ignored(self, paths: list[str]) -> set[str]:
        if not paths:
            return set()
        argv, env = _command(self.repo, "check-ignore", "--no-index", "-z", "--stdin")
        done = subprocess.run(
            argv,
            input="\0".join(paths).encode() + b"\0",
            capture_output=True,
            env=env,
            check=False,
            timeout=120,
        )
        return {p for p in done.stdout.decode("utf-8", "surrogateescape").split("\0") if p}

    def _records(self, change: Change, patched: Any, text: str) -> Iterator[InputRecord]:
        header = "".join(
            line for line in str(patched).splitlines(keepends=True)[: _header_lines(str(patched))]
        )
        meta = {
            "path": change.path,
            "git_range": self.spec,
            "head_sha": self.head_sha,
            "unit": self.unit,
        }
        if change.old_path:
            meta["old_path"] = change.old_path
        if self.unit == "file":
            content = text if len(text) <= MAX_FILE_CHARS else None
            prompt = file_prompt(
                change, self.spec, str(patched), content, self._context(change.path)
            )
            yield from self._record(change.path, prompt, meta)
            return
        for n, hunk in enumerate(patched, 1):
            lines = {
                "line": hunk.target_start,
                "end_line": hunk.target_start + max(hunk.target_length - 1, 0),
            }
            prompt = hunk_prompt(change, self.spec, header, str(hunk), self._context(change.path))
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


def _header_lines(patch_text: str) -> int:
    """How many lines of a file's diff come before its first hunk."""
    for n, line in enumerate(patch_text.splitlines()):
        if line.startswith("@@"):
            return n
    return 0


def _is_repo(repo: Path) -> bool:
    try:
        return git(repo, "rev-parse", "--is-inside-work-tree").strip() == b"true"
    except GitError:
        return False
