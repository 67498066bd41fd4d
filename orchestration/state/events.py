"""How an event is written: one JSON object per entry of a run's Redis stream.

The vocabulary (event names, :class:`~orchestration.core.events.Event`) is in the core;
this module adds the server-side facts a stored event carries: its time stamp.
"""

from __future__ import annotations

import json
import time
from typing import Any


def event_json(type_: str, run_id: str, round_: int | None = None, **data: Any) -> str:
    """One event, serialised the way it is stored."""
    return json.dumps(
        {"type": type_, "run_id": run_id, "ts": time.time(), "round": round_, "data": data},
        separators=(",", ":"),
    )
