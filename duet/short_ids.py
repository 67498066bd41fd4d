"""Short ids, as git shortens hashes: the shortest prefix that names one id and no other.

Pure: the CLI prints what :func:`shortest_unique` returns and resolves what people type
with :func:`resolve`, given the ids that start with it (``orchestration.state.lookup``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

#: The fewest characters a short id has, however few ids there are.
MIN_LENGTH = 8


def shortest_unique(ids: Iterable[str], min_length: int = MIN_LENGTH) -> dict[str, str]:
    """Each id -> its shortest prefix of at least ``min_length`` characters that no other
    id shares (the whole id when it is a prefix of another)."""
    ordered = sorted(set(ids))
    short: dict[str, str] = {}
    for n, ident in enumerate(ordered):
        need = min_length
        for other in (ordered[n - 1] if n else "", ordered[n + 1] if n + 1 < len(ordered) else ""):
            need = max(need, _common(ident, other) + 1)
        short[ident] = ident[:need]
    return short


def resolve(typed: str, exact: bool, matches: Sequence[str], what: str) -> str:
    """The one id ``typed`` names: itself when it is an id (``exact``), else the single
    id it is a prefix of.

    Raises:
        LookupError: no id starts with it, or several do (the message lists a few).
    """
    if exact:
        return typed
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise LookupError(f"{what} {typed} not found (expired or never submitted)")
    shown = ", ".join(matches[:5]) + (", …" if len(matches) > 5 else "")
    raise LookupError(f"{typed} is the start of several {what} ids ({shown}): type more of it")


def _common(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
