"""The approved revisions as one unified diff against the reviewed files. Pure.

Rule: a record is a fix when it was approved, its input was a whole file (not a hunk)
and its output holds a fenced code block, whose content is the new file. Anything else
(a run not approved, a prose review, a hunk, a file no longer there) is left out and
counted. The output is the record's: the revision the loop kept (``keep``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from duet.formats.findings import record_path

_FENCE = re.compile(r"^(?P<ticks>`{3,}|~{3,})[^\n`]*\n(?P<body>.*?)^(?P=ticks)[ \t]*$", re.S | re.M)


def fenced_file(output: str) -> str | None:
    """The content of the first fenced code block of ``output``; None when it has none."""
    found = _FENCE.search(output)
    return found["body"] if found else None


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
    """The diff of each fix against ``read(path)`` (the reviewed file's text, None when absent)."""
    patch = Patch()
    parts = []
    for record in records:
        if record.get("status") != "approved":
            patch.not_approved += record.get("status") != "rejected"
            continue
        meta = record.get("metadata") or {}
        if (isinstance(meta, dict) and meta.get("unit") == "hunk") or "#hunk" in str(
            record.get("id")
        ):
            patch._skip("hunk inputs")
            continue
        new = fenced_file(str(record.get("output") or ""))
        path = record_path(record)
        if new is None or path is None:
            patch._skip("not a whole file (no fenced code block)")
            continue
        old = read(path)
        if old is None:
            patch._skip("reviewed file not found")
            continue
        diff = list(
            difflib.unified_diff(
                old.splitlines(keepends=True),
                new.splitlines(keepends=True),
                f"a/{path}",
                f"b/{path}",
            )
        )
        if not diff:
            continue
        parts.append("".join(_terminated(diff)))
        patch.files += 1
    patch.text = "".join(parts)
    return patch


def _terminated(lines: list[str]) -> list[str]:
    """Diff lines each ending in a newline, with git's marker for a last line without one."""
    out = []
    for line in lines:
        if line.endswith("\n"):
            out.append(line)
        else:
            out += [line + "\n", "\\ No newline at end of file\n"]
    return out
