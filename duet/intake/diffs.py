"""A git range's changes read as text, with no process run: ``--raw -z`` output parsed,
a file's diff split into hunks, what is third-party code, and the prompt of each change
(:mod:`duet.intake.gitproc` runs git; :mod:`duet.intake.git` puts the two together).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestration.core.errors import ConfigError

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

#: Modes of a submodule (a commit of another repository) and a symlink in a git tree.
SUBMODULE, SYMLINK = "160000", "120000"
#: Bytes looked at for a NUL byte, as git itself does to call a file binary.
SNIFF_BYTES = 8192


class GitError(ConfigError):
    """A git command failed, or the range is not in the repository."""


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


def utf8_path(path: str) -> bool:
    """Whether a path read with ``surrogateescape`` is UTF-8 (ids and prompts must be)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def folders_of(path: str) -> list[str]:
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
    return b"\0" in data[:SNIFF_BYTES]


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
