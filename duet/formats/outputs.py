"""Approved outputs written as files under one folder (``duet run --output-dir DIR``), and
reviewed files read from one (``duet results --patch --root DIR``).

Each record's id is its path inside DIR (a directory input's relative path, so the
reviewed tree is mirrored). The path is walked one folder at a time from DIR's own open
descriptor, never following a symlink, so nothing is written outside DIR whatever the
tree holds; an id that cannot be written there is given back with the reason, and the
others are written.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

#: Why a write failed, by ``errno``, in words (else the system's own words).
_REASONS = {
    errno.ELOOP: "a symlink is in its way: not followed",
    errno.ENOTDIR: "a file is in the way of its folder",
    errno.EISDIR: "a folder of that name is there",
    errno.ENAMETOOLONG: "a name in it is longer than the file system allows",
    errno.ENXIO: "not a regular file there",
}
_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_FOLDER = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)


@dataclass(frozen=True, slots=True)
class NotWritten:
    """An approved output left unwritten, and why."""

    id: str
    reason: str


def safe_relative(input_id: str) -> PurePosixPath | None:
    """``input_id`` as a relative path naming a file inside a folder, or None (absolute,
    ``..``, empty or ``.``, a backslash or a NUL)."""
    if not input_id or "\0" in input_id or "\\" in input_id:
        return None
    path = PurePosixPath(input_id)
    if path.is_absolute() or not path.parts or any(p in ("..", "") for p in path.parts):
        return None
    return path


def write_outputs(records: Iterable[dict[str, Any]], folder: Path) -> tuple[int, list[NotWritten]]:
    """Write each approved record's output to ``folder/<id>``. Returns how many were
    written and those that were not, with the reason."""
    written, missed = 0, []
    folder.mkdir(parents=True, exist_ok=True)
    root = os.open(folder, _FOLDER | getattr(os, "O_CLOEXEC", 0))  # DIR itself may be a link
    try:
        for record in records:
            if record.get("status") != "approved" or record.get("output") is None:
                continue
            input_id = str(record.get("id") or "")
            rel = safe_relative(input_id)
            if rel is None:
                missed.append(NotWritten(input_id, "not a path inside the folder"))
                continue
            try:
                _write_at(root, rel.parts, record["output"])
            except OSError as exc:
                reason = _REASONS.get(exc.errno or 0, exc.strerror or str(exc))
                missed.append(NotWritten(input_id, reason))
                continue
            except UnicodeEncodeError:
                missed.append(
                    NotWritten(input_id, "the output is not Unicode text (a lone surrogate)")
                )
                continue
            written += 1
    finally:
        os.close(root)
    return written, missed


def read_inside(folder: Path, path: str) -> str:
    """The text of ``path`` under ``folder``, walked one folder at a time from ``folder``'s
    own descriptor following no symlink (OSError ``ELOOP``) and reading nothing but a
    regular file (``ENXIO``): what a link points to is never read through it.

    Raises:
        ValueError: ``path`` is not a relative path inside a folder.
        FileNotFoundError: nothing is there.
    """
    parts = path.split("/")
    if "\0" in path or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{path!r}: not a path inside {folder}")
    opened = [os.open(folder, _FOLDER | getattr(os, "O_CLOEXEC", 0))]
    try:
        for part in parts[:-1]:
            opened.append(_open_folder(part, opened[-1]))
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | _NO_FOLLOW
        fd = os.open(parts[-1], flags, dir_fd=opened[-1])
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.ENXIO, "not a regular file")
            return file.read().decode("utf-8", "surrogateescape")
    finally:
        for fd in opened:
            os.close(fd)


def _open_folder(part: str, at: int) -> int:
    """The folder ``part`` under the folder open as ``at``, never through a symlink."""
    try:
        return os.open(part, _FOLDER | _NO_FOLLOW, dir_fd=at)
    except NotADirectoryError:  # Linux says so for a symlink too: which is it?
        if stat.S_ISLNK(os.stat(part, dir_fd=at, follow_symlinks=False).st_mode):
            raise OSError(errno.ELOOP, "a symlink") from None
        raise


def _write_at(root: int, parts: tuple[str, ...], text: str) -> None:
    """Write ``text`` to ``parts`` under the folder open as ``root``, making its folders,
    following no symlink (O_NOFOLLOW at every step) and opening nothing but a regular file."""
    opened: list[int] = []
    at = root
    try:
        for part in parts[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, dir_fd=at)
            at = _open_folder(part, at)
            opened.append(at)
        flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NONBLOCK", 0) | _NO_FOLLOW
        data = text.encode("utf-8")  # before the file is touched
        fd = os.open(parts[-1], flags, 0o666, dir_fd=at)
        with os.fdopen(fd, "wb") as out:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.ENXIO, "not a regular file")
            out.truncate()
            out.write(data)
    finally:
        for fd in opened:
            os.close(fd)
