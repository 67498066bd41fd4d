"""Paths a model passes, held inside the tree it may read.

A path is relative to the top of the tree. Absolute and home paths, ``..`` parts and
``.git`` parts are refused as written; what is left is resolved (symlinks followed) and
refused when it lands outside the tree, so a symlink in the repository pointing out of it
is refused too. Every refusal is a short :class:`ToolError` the model reads.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from workers.tools.errors import ToolError

#: The longest path accepted, in characters.
MAX_PATH_CHARS = 1000


def relative(path: str, *, what: str) -> PurePosixPath:
    """``path`` checked as written: relative, no ``..``, no ``.git``; ``.`` for the top."""
    text = (path or ".").strip() or "."
    shown = text if len(text) <= 200 else text[:200] + "..."
    if len(text) > MAX_PATH_CHARS or "\0" in text:
        raise ToolError(f"{what}: {shown!r} is not a usable path")
    if text.startswith(("/", "~", "\\")):
        raise ToolError(
            f"{what}: {shown!r} is outside the repository; give a path relative to its top"
        )
    parts = PurePosixPath(text).parts
    if ".." in parts:
        raise ToolError(f"{what}: {shown!r} leaves the repository ('..' is not allowed)")
    if any(part.casefold() == ".git" for part in parts):
        raise ToolError(f"{what}: {shown!r}: git internals are not readable")
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


def confine(root: Path | None, path: str, *, what: str) -> Path:
    """``path`` resolved inside ``root``, or a :class:`ToolError` saying why not."""
    if root is None:
        raise ToolError(f"{what}: no repository is open for this run")
    rel = relative(path, what=what)
    top = root.resolve()
    target = (top / rel).resolve()
    if target != top and top not in target.parents:
        raise ToolError(f"{what}: {str(rel)!r} leads out of the repository through a symlink")
    if any(part.casefold() == ".git" for part in target.relative_to(top).parts):
        raise ToolError(f"{what}: {str(rel)!r}: git internals are not readable")
    return target


def shown(root: Path, target: Path) -> str:
    """``target`` as the model names it: relative to the top of the tree."""
    return target.relative_to(root.resolve()).as_posix()
