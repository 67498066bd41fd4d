"""Batch inputs read from files as a stream: JSONL, CSV, or a directory of files.

Every input either becomes an :class:`InputRecord` or is reported as an
:class:`InputProblem` naming its file, line and what is wrong; one bad line never stops
the others. Files are read one line (or row, or file) at a time and only the ids seen so
far are remembered, so a file of millions of inputs reads in flat memory. No line is held
past its size limit (``max_line_bytes``: an over-long one is skipped unread and reported),
and a line nesting deeper than :data:`~orchestration.core.jsonlimits.MAX_DEPTH` is
reported before it is parsed.

Formats:

- **JSONL** (``.jsonl``, ``.ndjson``, anything else): one object a line,
  ``{"id", "prompt", "user_id", "metadata"}``; ``custom_id`` is accepted as the id
  (OpenAI batch files), the line number is the id when there is none.
- **CSV** (``.csv``): a header row, a prompt column (``prompt`` unless configured), an
  optional id column (the row number when absent or empty) and an optional ``user_id``
  column; any other non-empty cells become the input's metadata.
- **Directory**: one input per file, the id being its path relative to the directory.
  Hidden files and directories, :data:`SKIPPED_DIRS` (``__pycache__``...), binary files
  (whatever their size), empty files and whatever a ``.gitignore`` in the tree ignores are
  skipped, as are files left out by ``include`` / ``exclude`` globs, and lock, minified
  and key files (:mod:`duet.intake.skips`: counted, and a key never reaches a prompt). Only regular files inside the directory are read, their size checked before
  reading: a symlink leading out of the directory, a FIFO, a device or a socket is
  reported as a problem and never opened for reading. The prompt names the file
  (:data:`DIRECTORY_PROMPT_TEMPLATE`).

Any format may set a prompt template: ``{input_id}`` and ``{prompt}`` are replaced (and
nothing else, so code full of braces is safe).
"""

from __future__ import annotations

import codecs
import csv
import fnmatch
import json
import os
import re
import stat
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from duet.intake.skips import SkipRules
from orchestration.core.errors import InputError
from orchestration.core.jsonlimits import depth_reason, too_deep

FORMATS = ("jsonl", "csv", "dir")
#: The prompt of a directory's file unless a template is given: the model sees its path.
DIRECTORY_PROMPT_TEMPLATE = "File: {input_id}\n\n{prompt}"
_PLACEHOLDERS = re.compile(r"\{(input_id|prompt)\}")
#: What a directory entry that is not a regular file is, in words.
_FILE_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)
#: Folders of generated files no one reviews, skipped like hidden ones.
SKIPPED_DIRS = frozenset({"__pycache__", "node_modules"})
#: Bytes read from the start of a file to tell text from binary.
_SNIFF_BYTES = 8192
#: Room on a line for what is not the prompt (id, user_id, metadata), in bytes.
METADATA_BYTES = 1 << 20
#: Bytes read at a time when skipping the rest of an over-long line.
_SKIP_CHUNK = 1 << 16
_JSON_TYPES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


@dataclass(frozen=True, slots=True)
class InputRecord:
    """One valid input.

    Attributes:
        id: unique within the input file.
        prompt: the task given to the actor.
        user_id: whose persistent conversation the run continues, if any.
        metadata: carried through to the result untouched.
        source: the file it came from.
        line: its line in that file (``None`` for a whole file of a directory).
    """

    id: str
    prompt: str
    user_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    line: int | None = None

    def as_item(self) -> dict[str, Any]:
        """The mapping :meth:`Team.submit_batch <orchestration.Team.submit_batch>` takes."""
        return {
            "id": self.id,
            "prompt": self.prompt,
            "user_id": self.user_id,
            "metadata": self.metadata or None,
        }


@dataclass(frozen=True, slots=True)
class InputProblem:
    """One input that cannot be run, and why.

    Attributes:
        source: the file.
        line: the line in it (``None`` when the problem is the whole file).
        reason: what is wrong, in words.
        id: the input's id when it could be read.
    """

    source: str
    line: int | None
    reason: str
    id: str | None = None

    @property
    def where(self) -> str:
        """``file:line``, or just the file."""
        return f"{self.source}:{self.line}" if self.line is not None else self.source

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


def detect_format(path: str | Path) -> str:
    """``dir`` for a directory, ``csv`` for ``*.csv``, else ``jsonl``."""
    path = Path(path)
    if path.is_dir():
        return "dir"
    return "csv" if path.suffix.lower() == ".csv" else "jsonl"


class InputReader:
    """Iterate over the valid inputs of a file or directory, collecting the problems.

    Args:
        path: a JSONL or CSV file, or a directory.
        format: ``jsonl``, ``csv`` or ``dir``; from the path when ``None``.
        prompt_column: CSV column holding the prompt.
        id_column: CSV column holding the id.
        max_prompt_chars: longest prompt accepted; ``None`` for no limit.
        max_line_bytes: longest JSONL line (bytes) or CSV row (characters) read; a longer
            one is skipped unread past the limit and reported, so memory stays bounded by
            the limit, not the line. Default: room for the longest prompt JSON-escaped
            plus :data:`METADATA_BYTES`; no limit when neither is set.
        include: globs on a directory's relative paths (``*.py``, ``src/**/*.py``); when
            given, only matching files are read.
        exclude: globs of files or directories of a directory to leave out.
        gitignore: honour the ``.gitignore`` files in a directory.
        prompt_template: the prompt sent, with ``{input_id}`` and ``{prompt}`` (the text
            read) replaced; directories default to :data:`DIRECTORY_PROMPT_TEMPLATE`.
        strict: after the last input, raise :class:`InputError` listing every problem.
        on_problem: called with each problem as it is found. When given, problems are
            passed on instead of kept (only their count is), so memory stays flat even
            for a file of nothing but bad lines.

    Raises:
        InputError: the path does not exist, the format is unknown, or (when iterating)
            the whole file is unusable: a CSV without the prompt column, or not UTF-8.

    Example::

        reader = InputReader("inputs.jsonl", max_prompt_chars=100_000)
        for record in reader:
            ...
        for problem in reader.problems:
            print(problem)  # inputs.jsonl:7: malformed JSON: ...
    """

    def __init__(
        self,
        path: str | Path,
        *,
        format: str | None = None,
        prompt_column: str = "prompt",
        id_column: str = "id",
        max_prompt_chars: int | None = None,
        max_line_bytes: int | None = None,
        strict: bool = False,
        on_problem: Callable[[InputProblem], None] | None = None,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        gitignore: bool = True,
        prompt_template: str | None = None,
        skips: SkipRules | None = None,
    ) -> None:
        self.path = Path(path)
        self.source = str(path)
        if not self.path.exists():
            raise InputError(f"{self.source}: no such file or directory")
        self.format = format or detect_format(self.path)
        if self.format not in FORMATS:
            raise InputError(f"unknown input format {self.format!r}; expected one of {FORMATS}")
        if self.format == "dir" and not self.path.is_dir():
            raise InputError(f"{self.source}: not a directory")
        if self.format != "dir" and self.path.is_dir():
            raise InputError(f"{self.source}: is a directory, not a {self.format} file")
        self.prompt_column = prompt_column
        self.id_column = id_column
        self.max_prompt_chars = max_prompt_chars
        if max_line_bytes is None and max_prompt_chars is not None:
            # A character JSON-escaped is at most 12 bytes (a surrogate pair of \uXXXX).
            max_line_bytes = 12 * max_prompt_chars + METADATA_BYTES
        self.max_line_bytes = max_line_bytes
        self.strict = strict
        self.on_problem = on_problem
        #: Problems found so far (empty when ``on_problem`` takes them, unless strict).
        self.problems: list[InputProblem] = []
        self.problem_count = 0
        #: Valid inputs yielded so far.
        self.count = 0
        #: Files of a directory skipped, by why: ``binary``, ``empty``, a lock file, a key
        #: (:mod:`duet.intake.skips`).
        self.skipped_by: Counter[str] = Counter()
        self.skips = skips or SkipRules()
        self.include = tuple(include)
        self.exclude = tuple(exclude)
        self.gitignore = gitignore
        if prompt_template is None and self.format == "dir":
            prompt_template = DIRECTORY_PROMPT_TEMPLATE
        self.prompt_template = prompt_template
        self._seen: dict[str, int | None] = {}

    @property
    def skipped(self) -> int:
        """Files of a directory skipped as binary or empty."""
        return sum(self.skipped_by.values())

    def __iter__(self) -> Iterator[InputRecord]:
        read = {"jsonl": self._jsonl, "csv": self._csv, "dir": self._dir}[self.format]
        for record in read():
            self.count += 1
            yield record
        if self.strict and self.problems:
            listed = "\n".join(f"  {p}" for p in self.problems)
            raise InputError(f"{self.problem_count} bad input(s) in {self.source}:\n{listed}")

    # --- formats ------------------------------------------------------------
    def _jsonl(self) -> Iterator[InputRecord]:
        with self.path.open("rb") as lines:
            for n, raw, size in bounded_lines(lines, self.max_line_bytes):
                if raw is None:
                    self._problem(n, _too_long("line", size, self.max_line_bytes, "bytes"))
                    continue
                try:
                    text = raw.decode("utf-8-sig" if n == 1 else "utf-8")
                except UnicodeDecodeError as exc:
                    self._problem(
                        n, f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at column {exc.start + 1}"
                    )
                    continue
                if not text.strip():
                    continue
                if too_deep(text):
                    self._problem(n, depth_reason())
                    continue
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as exc:
                    self._problem(n, f"malformed JSON: {exc.msg} (column {exc.colno})")
                    continue
                if not isinstance(obj, dict):
                    self._problem(n, f"expected a JSON object, got {_json_type(obj)}")
                    continue
                raw_id = obj.get("id", obj.get("custom_id"))
                record = self._check(obj, raw_id, default_id=str(n), line=n)
                if record is not None:
                    yield record

    def _csv(self) -> Iterator[InputRecord]:
        long_csv_fields()
        with self.path.open(encoding="utf-8-sig", newline="") as handle:
            lines = BoundedRows(handle, self.max_line_bytes)
            rows = csv.reader(lines)
            try:
                try:
                    header = next(rows, None)
                except RowTooLong as exc:
                    raise InputError(
                        f"{self.source}:1: header "
                        + _too_long("row", exc.size, self.max_line_bytes, "characters")
                    ) from None
                if header is None:
                    return
                if self.prompt_column not in header:
                    raise InputError(
                        f"{self.source}:1: no {self.prompt_column!r} column in the header "
                        f"(columns: {', '.join(header)}); set [inputs] prompt_column"
                    )
                row_number = 0
                while True:
                    line = lines.count + 1
                    lines.start_row()
                    try:
                        row = next(rows, None)
                    except RowTooLong as exc:
                        self._problem(
                            line, _too_long("row", exc.size, self.max_line_bytes, "characters")
                        )
                        continue
                    except csv.Error as exc:
                        self._problem(line, f"unreadable CSV row: {exc}")
                        if lines.count < line:
                            return  # the reader cannot move past it
                        continue
                    if row is None:
                        return
                    if not row:
                        continue  # a blank line
                    row_number += 1
                    if len(row) > len(header):
                        self._problem(
                            line, f"row has {len(row)} fields, the header has {len(header)}"
                        )
                        continue
                    cells = dict(zip(header, row, strict=False))
                    record = self._csv_record(cells, row_number, line)
                    if record is not None:
                        yield record
            except UnicodeDecodeError as exc:
                raise InputError(f"{self.source}:{lines.count + 1}: not UTF-8 text") from exc

    def _csv_record(self, cells: dict[str, str], row_number: int, line: int) -> InputRecord | None:
        own = {self.prompt_column, self.id_column, "user_id"}
        obj = {
            "prompt": cells.get(self.prompt_column),
            "user_id": cells.get("user_id") or None,
            "metadata": {k: v for k, v in cells.items() if k not in own and v != ""},
        }
        return self._check(
            obj, cells.get(self.id_column) or None, default_id=str(row_number), line=line
        )

    def _dir(self) -> Iterator[InputRecord]:
        root = self.path.resolve()
        ignores: list[tuple[str, Any]] = []  # (folder prefix, its .gitignore spec)
        for folder, dirs, files in os.walk(self.path):  # never descends into a symlink
            here = Path(folder).relative_to(self.path).as_posix()
            prefix = "" if here == "." else here + "/"
            if self.gitignore and ".gitignore" in files:
                spec = self._gitignore_spec(Path(folder, ".gitignore"), prefix)
                if spec is not None:
                    ignores.append((prefix, spec))
            kept = []
            # Sorted, so ids come in the same order on every machine; hidden ones skipped.
            for name in sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS):
                rel, full = prefix + name, Path(folder, name)
                if full.is_symlink():
                    if not _within(Path(os.path.realpath(full)), root):
                        self._problem(
                            None,
                            "symlink to a directory outside the input directory: not followed",
                            rel,
                            str(full),
                        )
                    continue  # inside: its files are read where they really are
                if _matches(rel, self.exclude, folder=True) or _ignored(rel + "/", ignores):
                    continue
                kept.append(name)
            dirs[:] = kept
            for name in sorted(f for f in files if not f.startswith(".")):
                rel = prefix + name
                if self.include and not _matches(rel, self.include):
                    continue
                if _matches(rel, self.exclude) or _ignored(rel, ignores):
                    continue
                reason = self.skips.by_name(rel)
                if reason is not None:
                    self.skipped_by[reason] += 1
                    continue
                record = self._file_record(Path(folder, name), rel, root)
                if record is not None:
                    yield record

    def _gitignore_spec(self, path: Path, prefix: str) -> Any:
        import pathspec

        try:
            lines = _read_regular(path, 1 << 20).decode("utf-8", "replace").splitlines()
        except (OSError, _Unreadable):
            self._problem(None, "cannot read this .gitignore; it is not applied", None, str(path))
            return None
        return pathspec.GitIgnoreSpec.from_lines(lines)

    def _file_record(self, file: Path, rel: str, root: Path) -> InputRecord | None:
        source = str(file)
        limit = self.max_prompt_chars
        try:
            target = file
            if file.is_symlink():
                target = Path(os.path.realpath(file))
                if not _within(target, root):
                    self._problem(
                        None, "symlink to a file outside the input directory: not read", rel, source
                    )
                    return None
            # A UTF-8 character is at most 4 bytes: a larger file is over the limit unread.
            data = _read_regular(target, None if limit is None else 4 * limit)
        except _TooLarge as exc:
            if _binary(exc.head):  # a large .pyc or image is skipped like a small one
                self.skipped_by["binary"] += 1
            else:
                self._problem(None, str(exc), rel, source)
            return None
        except _Unreadable as exc:
            self._problem(None, str(exc), rel, source)
            return None
        except OSError as exc:
            self._problem(None, f"cannot read: {exc.strerror or exc}", rel, source)
            return None
        try:
            if _binary(data[:_SNIFF_BYTES]):
                raise UnicodeDecodeError("utf-8", data, 0, 1, "NUL byte")
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            self.skipped_by["binary"] += 1
            return None
        if not text.strip():
            self.skipped_by["empty"] += 1  # an empty __init__.py is nothing to review
            return None
        reason = self.skips.by_content(rel, text)
        if reason is not None:
            self.skipped_by[reason] += 1  # a key is never put in a prompt
            return None
        return self._check({"prompt": text}, rel, default_id=rel, line=None, source=source)

    # --- checks -------------------------------------------------------------
    def _check(
        self,
        obj: Mapping[str, Any],
        raw_id: Any,
        *,
        default_id: str,
        line: int | None,
        source: str | None = None,
    ) -> InputRecord | None:
        """The record for one parsed input, or None after reporting what is wrong."""
        if raw_id is None:
            input_id = default_id
        elif isinstance(raw_id, str) and raw_id.strip():
            input_id = raw_id
        elif isinstance(raw_id, int) and not isinstance(raw_id, bool):
            input_id = str(raw_id)
        else:
            self._problem(
                line,
                f"id must be a non-empty string or an integer, got {_json_type(raw_id)}",
                None,
                source,
            )
            return None
        reason = self._prompt_problem(obj.get("prompt"))
        user_id = obj.get("user_id")
        if reason is None and user_id is not None and not isinstance(user_id, str):
            reason = f"user_id must be a string, got {_json_type(user_id)}"
        metadata = obj.get("metadata")
        if reason is None and metadata is not None and not isinstance(metadata, dict):
            reason = f"metadata must be an object, got {_json_type(metadata)}"
        if reason is None and input_id in self._seen:
            first = self._seen[input_id]
            reason = f"duplicate id {input_id!r}" + (f" (first on line {first})" if first else "")
        if reason is not None:
            self._problem(line, reason, input_id, source)
            return None
        self._seen[input_id] = line
        prompt = obj["prompt"]
        if self.prompt_template is not None:
            prompt = _fill(self.prompt_template, input_id, prompt)
        return InputRecord(
            id=input_id,
            prompt=prompt,
            user_id=user_id,
            metadata=metadata or {},
            source=source or self.source,
            line=line,
        )

    def _prompt_problem(self, prompt: Any) -> str | None:
        if prompt is None:
            return "missing prompt"
        if not isinstance(prompt, str):
            return f"prompt must be a string, got {_json_type(prompt)}"
        if not prompt.strip():
            return "empty prompt"
        if self.max_prompt_chars is not None and len(prompt) > self.max_prompt_chars:
            return (
                f"prompt is {len(prompt):,} characters, over the limit of {self.max_prompt_chars:,}"
            )
        return None

    def _problem(
        self, line: int | None, reason: str, input_id: str | None = None, source: str | None = None
    ) -> None:
        problem = InputProblem(source or self.source, line, reason, input_id)
        self.problem_count += 1
        if self.on_problem is None or self.strict:
            self.problems.append(problem)
        if self.on_problem is not None:
            self.on_problem(problem)


def _json_type(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _fill(template: str, input_id: str, prompt: str) -> str:
    """``template`` with ``{input_id}`` and ``{prompt}`` replaced, in one pass."""
    values = {"input_id": input_id, "prompt": prompt}
    return _PLACEHOLDERS.sub(lambda m: values[m.group(1)], template)


def _too_long(what: str, size: int, limit: int | None, unit: str) -> str:
    return f"{what} is {size:,} {unit}, over the limit of {limit:,} {unit}: not read"


def bounded_lines(handle: IO[bytes], limit: int | None) -> Iterator[tuple[int, bytes | None, int]]:
    """``(number, line, size)`` for each line of a binary file. A line over ``limit``
    bytes (its newline included) is skipped in chunks and given as ``None`` with its size,
    so no more than ``limit + 1`` bytes of a line are ever held."""
    n = 0
    while True:
        raw = handle.readline() if limit is None else handle.readline(limit + 1)
        if not raw:
            return
        n += 1
        if limit is None or len(raw) <= limit:
            yield n, raw, len(raw)
            continue
        size = len(raw)
        while not raw.endswith(b"\n"):
            raw = handle.readline(_SKIP_CHUNK)
            if not raw:
                break
            size += len(raw)
        yield n, None, size


def long_csv_fields() -> None:
    """Let the csv module read fields of any length. Its default 128 KiB cap fails a long
    prompt or output with an obscure error; a row size limit says it plainly instead."""
    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))


class RowTooLong(Exception):
    """A CSV row over the size limit, skipped to the end of its line."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class BoundedRows:
    """The lines of a CSV text file for ``csv.reader``, no row held past ``limit``
    characters: an over-long row is skipped to its end (the first line end outside
    quotes) and raises :class:`RowTooLong`; the reader starts afresh on the next line.
    Call :meth:`start_row` before each row; ``count`` is the lines read."""

    def __init__(self, handle: IO[str], limit: int | None) -> None:
        self.handle, self.limit = handle, limit
        self.count = 0
        self.row_chars = 0
        self.quotes = 0  # quote characters in the row so far: odd inside a quoted field

    def start_row(self) -> None:
        self.row_chars = self.quotes = 0

    def __iter__(self) -> BoundedRows:
        return self

    def __next__(self) -> str:
        if self.limit is None:
            line = self.handle.readline()
        else:
            line = self.handle.readline(self.limit - self.row_chars + 1)
        if not line:
            raise StopIteration
        self.row_chars += len(line)
        if self.limit is None or self.row_chars <= self.limit:
            self.count += 1
        if self.limit is None:
            return line
        self.quotes += line.count('"')
        if self.row_chars <= self.limit:
            return line
        size = self.row_chars
        while not line.endswith(("\n", "\r")) or self.quotes % 2:
            line = self.handle.readline(_SKIP_CHUNK)
            if not line:
                break
            size += len(line)
            self.quotes += line.count('"')
            self.count += line.endswith(("\n", "\r"))
        raise RowTooLong(size)


class _Unreadable(Exception):
    """A directory entry that is not read: not a regular file, or over the size limit."""


class _TooLarge(_Unreadable):
    """A regular file over the size limit, left unread but for its first bytes."""

    def __init__(self, message: str, head: bytes) -> None:
        super().__init__(message)
        #: The file's first bytes, to tell a large binary (skipped) from large text.
        self.head = head


def _read_regular(path: Path, max_bytes: int | None) -> bytes:
    """The bytes of a regular file, its size checked before reading.

    Opened without following a final symlink and without blocking (a FIFO opens at
    once), then checked on the open descriptor, so what is checked is what is read.

    Raises:
        _Unreadable: not a regular file, or larger than ``max_bytes``.
        OSError: it cannot be opened or read.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((k for test, k in _FILE_KINDS if test(info.st_mode)), "not a regular file")
            raise _Unreadable(f"not a regular file ({kind}): not read")
        if max_bytes is not None and info.st_size > max_bytes:
            raise _TooLarge(
                f"file is {info.st_size:,} bytes, over the prompt limit of {max_bytes // 4:,} "
                "characters",
                os.read(fd, _SNIFF_BYTES),
            )
        cap = info.st_size + 1 if max_bytes is None else max_bytes + 1
        chunks, got = [], 0
        while got < cap:  # a file that grows while read stops at the cap
            chunk = os.read(fd, min(1 << 20, cap - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        data = b"".join(chunks)
        if max_bytes is not None and len(data) > max_bytes:
            raise _Unreadable(f"file grew past the prompt limit of {max_bytes // 4:,} characters")
        return data
    finally:
        os.close(fd)


def _binary(head: bytes) -> bool:
    """Whether a file's first bytes are not UTF-8 text (a NUL, or bytes no UTF-8 text has;
    a character cut at the end of ``head`` does not count)."""
    if b"\0" in head:
        return True
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return True
    return False


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _matches(rel: str, globs: Sequence[str], *, folder: bool = False) -> bool:
    """Whether a relative path matches one of ``globs`` (``*`` crosses ``/``; ``**/`` may
    match no folder; a glob without ``/`` also matches the last part)."""
    name = rel.rsplit("/", 1)[-1]
    for glob in globs:
        glob = glob.rstrip("/") if folder else glob
        if fnmatch.fnmatchcase(rel, glob) or fnmatch.fnmatchcase(rel, glob.replace("**/", "")):
            return True
        if "/" not in glob and fnmatch.fnmatchcase(name, glob):
            return True
    return False


def _ignored(rel: str, ignores: list[tuple[str, Any]]) -> bool:
    """Whether a ``.gitignore`` of a folder above ``rel`` ignores it (``rel`` ends in ``/``
    for a folder)."""
    return any(rel.startswith(p) and spec.match_file(rel[len(p) :]) for p, spec in ignores)
