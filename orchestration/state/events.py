"""How an event is written: one JSON object per entry of a run's Redis stream.

The vocabulary (event names, :class:`~orchestration.core.events.Event`) is in the core;
this module adds the server-side facts a stored event carries — its time stamp — and
leaves out what the stream already says: the run's id is the stream's (its key), so an
entry does not repeat it, nor an empty round or data. :func:`stored_event` puts them back.
"""

from __future__ import annotations

import json
import time
from typing import Any

from orchestration.core.events import Event


def event_json(type_: str, run_id: str, round_: int | None = None, **data: Any) -> str:
    """One event of run ``run_id``, serialised the way it is stored (without the run's id:
    see :func:`stored_event`)."""
    event: dict[str, Any] = {"type": type_, "ts": time.time()}
    if round_ is not None:
        event["round"] = round_
    if data:
        event["data"] = data
    return json.dumps(event, separators=(",", ":"))


def stored_event(raw: str, run_id: str) -> Event:
    """The :class:`Event` an entry of run ``run_id``'s stream holds."""
    fields = json.loads(raw)
    fields.setdefault("run_id", run_id)
    return Event.model_validate(fields)
