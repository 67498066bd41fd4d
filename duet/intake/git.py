"""Inputs from a git range (``duet review --git BASE..HEAD``): one per changed file or hunk.

The branch under review steers nothing: ignore rules and vendored folders are the base
commit's, ``--text`` makes its ``.gitattributes`` unable to hide a diff, and the diff is
streamed a file at a time, held only up to a cap. Git runs through
:mod:`duet.intake.gitproc`; the parsing and the prompts are :mod:`duet.intake.diffs`.
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from duet.intake.context import RULES_FILE, PathRules, context_sections
from duet.intake.diffs import (
    MAX_FILE_CHARS,
    SNIFF_BYTES,
    SUBMODULE,
    SYMLINK,
    Change,
    GitError,
    Hunk,
    always_reviewed,
    binary,
    check_in_step,
    file_prompt,
    folders_of,
    hunk_prompt,
    parse_raw,
    split_hunks,
    split_range,
    utf8_path,
    vendored_folder,
)
from duet.intake.files import InputProblem, InputRecord
from duet.intake.gitproc import Blobs, DiffStream, command, git, git_dir, is_repo
from duet.intake.skips import GENERATED, SkipRules, generated
from orchestration.core.errors import ConfigError

UNITS = ("file", "hunk")
#: The most of one file's diff held in memory when no prompt limit is given, bytes.
MAX_DIFF_BYTES = 4_000_000
#: A changed file over this many bytes (or over the diff cap, when that is larger) is not
#: diffed: git holds both sides and several times their size to diff them.
MAX_FILE_BYTES = 8_000_000
#: A base commit's ``.gitignore`` longer than this, bytes, is not read.
MAX_IGNORE_BYTES = 1_000_000


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
        if not is_repo(repo):
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

    @property
    def workspace(self) -> tuple[str, str]:
        """The repository and the reviewed commit (the range's head, resolved): the tree
        the agents' tools read."""
        sha = git(self.repo, "rev-parse", "--verify", f"{self.head}^{{commit}}").decode().strip()
        return str(self.repo.resolve()), sha

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
        keep = 4 * MAX_FILE_CHARS if self.unit == "file" else SNIFF_BYTES
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
        if not all(utf8_path(p) for p in (change.path, change.old_path) if p is not None):
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
        wanted = {f"{folder}.gitignore" for p in paths for folder in folders_of(p)}
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
                argv, env = command(
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
