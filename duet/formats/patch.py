"""The approved revisions as one git diff against the reviewed files. Pure.

Rule: a record is a fix when it was approved and its output holds a fenced code block,
whose content replaces what the model was shown: the whole file for an input of a whole
file, the lines of the hunk (``metadata.line`` to ``end_line``) for a hunk. A patch touches
only the files the review read, by their repository paths, with names quoted as git
quotes them, so no name can forge a header. Anything else (a run not approved, a prose
review, a file seen only as a diff, a symlink, a path into ``.git``, a file changed since
its review) is left out and counted. The output is the record's: the revision the loop
kept (``keep``).
"""

from __future__ import annotations

import difflib
import errno
import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from duet.formats.findings import record_path

_FENCE = re.compile(
    r"^(?P<ticks>`{3,}|~{3,})(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=ticks)[ \t]*$", re.S | re.M
)
#: A fenced block that is a diff (by its info string or its lines), not new code.
_DIFF_INFO = frozenset({"diff", "patch", "udiff"})
_DIFF_LINE = re.compile(r"^(@@ -\d+(,\d+)? \+\d+(,\d+)? @@|diff --git |--- a/|\+\+\+ b/)", re.M)
_HUNK = re.compile(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@")
#: Why a reviewed file could not be read, by ``errno``.
_UNREAD = {
    errno.ELOOP: "a symlink: patched only as a link, never through its target",
    errno.ENOENT: "reviewed file not found",
    errno.ENOTDIR: "reviewed file not found",
    errno.ENXIO: "not a regular file",
}
#: The escapes of git's C-style quoting of a path (``quote_c_style``).
_ESCAPES = {7: "\\a", 8: "\\b", 9: "\\t", 10: "\\n", 11: "\\v", 12: "\\f", 13: "\\r"}
_ESCAPES |= {ord('"'): '\\"', ord("\\"): "\\\\"}

SEEN_DIFF = (
    "only the diff was shown (a file over the whole-file limit): review it with --unit hunk "
    "to patch it"
)


def fenced_file(output: str) -> str | None:
    """The content of the first fenced code block of ``output``; None when it has none."""
    found = _FENCE.search(output)
    return found["body"] if found else None


def fenced_diff(output: str) -> bool:
    """Whether the first fenced block of ``output`` is a diff (``diff`` info string, or
    hunk and file headers in it): a model shown a diff may answer with one, and its
    lines are not the file's."""
    found = _FENCE.search(output)
    if found is None:
        return False
    info = found["info"].strip().split(" ")[0].lower()
    return info in _DIFF_INFO or _DIFF_LINE.search(found["body"]) is not None


def git_quoted(name: str) -> str:
    """``name`` as git writes it in a diff header: as is, or in double quotes with C
    escapes and octal bytes when it holds a control character, ``"``, ``\\`` or non-ASCII
    (so a newline in a name can never start a header line of its own)."""
    data = name.encode("utf-8", "surrogateescape")
    if all(0x20 <= b < 0x7F and b not in (0x22, 0x5C) for b in data):
        return name
    return '"' + "".join(_ESCAPES.get(b) or _byte(b) for b in data) + '"'


def _byte(b: int) -> str:
    return chr(b) if 0x20 <= b < 0x7F else f"\\{b:03o}"


def repository_path(path: str) -> bool:
    """Whether ``path`` names a file inside a repository's work tree: relative, no ``.``,
    ``..`` or empty segment, no NUL, and nothing in a ``.git`` folder (in any case, or
    with the trailing dots and spaces some file systems drop)."""
    parts = path.split("/")
    if not path or "\0" in path or any(p in ("", ".", "..") for p in parts):
        return False
    return not any(p.rstrip(". ").lower() == ".git" for p in parts)


def lines_of(text: str) -> list[str]:
    """``text`` split after each newline only (``str.splitlines`` also splits at form
    feeds and other separators a diff keeps inside a line)."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


@dataclass(frozen=True, slots=True)
class _Edit:
    """Lines ``start``..``start + len(old) - 1`` of a file (1-based) become ``new``."""

    start: int
    old: list[str]
    new: list[str]


@dataclass
class Patch:
    """The diff text and why the records left out were."""

    text: str = ""
    files: int = 0
    #: Approved records left out, by why.
    left_out: dict[str, int] = field(default_factory=dict)
    #: Runs whose output the critic did not approve (rejected inputs never ran).
    not_approved: int = 0

    def _skip(self, why: str) -> None:
        self.left_out[why] = self.left_out.get(why, 0) + 1


def build_patch(records: Iterable[dict[str, Any]], read: Callable[[str], str | None]) -> Patch:
    """The diff of each fix against ``read(path)``: the reviewed file's text, None when it
    is absent; an OSError (``ELOOP`` for a symlink on the way) when it cannot be read."""
    patch = Patch()
    edits: dict[str, list[_Edit]] = {}
    texts: dict[str, str] = {}
    for record in records:
        if record.get("status") != "approved":
            patch.not_approved += record.get("status") != "rejected"
            continue
        why, path, edit = _fix(record, read, texts)
        if why is not None or path is None or edit is None:
            patch._skip(why or "reviewed file not found")
            continue
        mine = edits.setdefault(path, [])
        if any(_overlap(e, edit) for e in mine):
            patch._skip("another fix of the same lines is in the patch")
            continue
        mine.append(edit)
    parts = [
        _file_diff(path, sorted(found, key=lambda e: e.start)) for path, found in edits.items()
    ]
    patch.text = "".join(p for p in parts if p)
    patch.files = sum(1 for p in parts if p)
    return patch


def _fix(
    record: dict[str, Any], read: Callable[[str], str | None], texts: dict[str, str]
) -> tuple[str | None, str | None, _Edit | None]:
    """Why ``record`` is no fix (None when it is one), its path, and its edit."""
    meta = record.get("metadata") or {}
    meta = meta if isinstance(meta, dict) else {}
    path = record_path(record)
    output = str(record.get("output") or "")
    new = fenced_file(output)
    if new is None or path is None:
        return "not a fix (no fenced code block)", None, None
    if fenced_diff(output):
        return "a diff, not the new code (patched only from the code itself)", None, None
    if not repository_path(path):
        return "not a path inside the repository (or inside .git)", None, None
    if meta.get("symlink"):
        return _UNREAD[errno.ELOOP], None, None
    if meta.get("seen") == "diff":
        return SEEN_DIFF, None, None
    if path not in texts:
        try:
            old = read(path)
        except OSError as exc:
            return (
                _UNREAD.get(exc.errno or 0, f"reviewed file not read: {exc.strerror}"),
                None,
                None,
            )
        if old is None:
            return _UNREAD[errno.ENOENT], None, None
        texts[path] = old
    lines = lines_of(texts[path])
    hunk = meta.get("unit") == "hunk" or "#hunk" in str(record.get("id"))
    start, end = (meta.get("line"), meta.get("end_line")) if hunk else (1, len(lines))
    if not (isinstance(start, int) and isinstance(end, int) and 1 <= start <= end + 1):
        return "a hunk without its lines", None, None
    if end > len(lines):
        return "the file changed since it was reviewed", None, None
    seen = "".join(lines[start - 1 : end])
    digest = meta.get("sha256")
    if digest is not None and digest != hashlib.sha256(_bytes(seen)).hexdigest():
        return "the file changed since it was reviewed", None, None
    return None, path, _Edit(start, lines[start - 1 : end], lines_of(new))


def _overlap(one: _Edit, other: _Edit) -> bool:
    """Whether two edits touch a line in common (or insert at the same place)."""
    if one.start == other.start:
        return True
    return one.start < other.start + len(other.old) and other.start < one.start + len(one.old)


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _file_diff(path: str, edits: list[_Edit]) -> str:
    """One file's git diff: the hunks of each edit, numbered against the file before any
    (old side) and after the edits above it (new side)."""
    hunks: list[str] = []
    shift = 0
    for edit in edits:
        body = list(difflib.unified_diff(edit.old, edit.new, n=3))[2:]  # no ---/+++ lines
        for line in body:
            if line.startswith("@@"):
                line = _moved(line, edit.start - 1, edit.start - 1 + shift)
            hunks.append(line)
        shift += len(edit.new) - len(edit.old)
    if not hunks:
        return ""
    a, b = git_quoted(f"a/{path}"), git_quoted(f"b/{path}")
    return f"diff --git {a} {b}\n--- {a}\n+++ {b}\n" + "".join(_terminated(hunks))


def _moved(header: str, old_by: int, new_by: int) -> str:
    """A ``@@ -s,n +s,n @@`` header with its starts moved down by a region's offset."""
    found = _HUNK.match(header)
    assert found is not None
    old_start, new_start = int(found[1]), int(found[3])
    # difflib writes an empty side's start as the line before it (0 at the top).
    return f"@@ -{old_start + old_by}{found[2] or ''} +{new_start + new_by}{found[4] or ''} @@\n"


def _terminated(lines: list[str]) -> list[str]:
    """Diff lines each ending in a newline, with git's marker for a last line without one."""
    out = []
    for line in lines:
        if line.endswith("\n"):
            out.append(line)
        else:
            out += [line + "\n", "\\ No newline at end of file\n"]
    return out
