"""How an event is written: one JSON object per entry of a run's Redis stream.

The vocabulary (event names, :class:`~orchestration.core.events.Event`) is in the core;
this module leaves out of a stored event what the stream already says: the run's id is
the stream's (its key), and the time is the entry's id (milliseconds of the Redis server's
clock when the event was added, which also orders the events), so an entry repeats
neither, nor an empty round or data. :func:`stored_event` puts them back. (Entries
written before 2026-12 carry a ``ts`` of their own, which is kept.)
"""

from __future__ import annotations

import json
from typing import Any

from orchestration.core.events import Event


def event_json(type_: str, run_id: str, round_: int | None = None, **data: Any) -> str:
    """One event of run ``run_id``, serialised the way it is stored (without the run's id
    or a time: see :func:`stored_event`)."""
    event: dict[str, Any] = {"type": type_}
    if round_ is not None:
        event["round"] = round_
    if data:
        event["data"] = data
    return json.dumps(event, separators=(",", ":"))


def stored_event(raw: str, run_id: str, entry_id: str) -> Event:
    """The :class:`Event` entry ``entry_id`` of run ``run_id``'s stream holds (``raw``)."""
    fields = json.loads(raw)
    fields.setdefault("run_id", run_id)
    if "ts" not in fields:
        fields["ts"] = int(entry_id.split("-", 1)[0]) / 1000
    return Event.model_validate(fields)
