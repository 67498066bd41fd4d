"""What people type for an id: the whole id or a unique prefix of it, resolved on Redis."""

from __future__ import annotations

from duet.short_ids import resolve
from orchestration.state import keys, lookup


def _redis():  # type: ignore[no-untyped-def]
    from orchestration.client.handles import store

    return store().r


def batch_id(typed: str) -> str:
    """The batch ``typed`` names (LookupError when none or several)."""
    r = _redis()
    exact = bool(r.exists(keys.batch(typed)))
    return resolve(typed, exact, [] if exact else lookup.batches_starting(r, typed), "batch")


def run_id(typed: str) -> str:
    """The run ``typed`` names (LookupError when none or several)."""
    r = _redis()
    exact = bool(r.exists(keys.run(typed)))
    return resolve(typed, exact, [] if exact else lookup.runs_starting(r, typed), "run")


def batch_or_run(typed: str) -> tuple[str, str]:
    """``("batch", id)`` or ``("run", id)`` for what ``typed`` names; a batch wins an exact
    tie (LookupError when nothing or several things start with it)."""
    r = _redis()
    if r.exists(keys.batch(typed)):
        return "batch", typed
    if r.exists(keys.run(typed)):
        return "run", typed
    found = [("batch", b) for b in lookup.batches_starting(r, typed)]
    found += [("run", x) for x in lookup.runs_starting(r, typed)]
    kind = found[0][0] if len(found) == 1 else "batch or run"
    ident = resolve(typed, False, [f for _, f in found], kind)
    return found[0][0], ident
