"""Duet's task messages written here and pushed with one ``LPUSH`` (the ``publish`` fast
path): byte for byte what Celery's ``send_task`` would put on a Redis broker's list
(``tests/redis/test_publish.py``), without its general machinery; else ``send_task``.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from typing import Any

from celery import Celery
from celery.utils.nodenames import anon_nodename

from orchestration.core.errors import ConfigError
from orchestration.state import connection, keys
from orchestration.state.ids import uuid4_text

#: The third element of every message body (JSON): no callbacks, errbacks, chain or chord.
_EMBED = json.dumps({"callbacks": None, "errbacks": None, "chain": None, "chord": None})
#: The headers Celery writes in a message (:func:`message` adds others after them).
_CELERY_HEADERS = frozenset(
    {
        "lang",
        "task",
        "id",
        "shadow",
        "eta",
        "expires",
        "group",
        "group_index",
        "retries",
        "timelimit",
        "root_id",
        "parent_id",
        "argsrepr",
        "kwargsrepr",
        "origin",
        "ignore_result",
        "replaced_task_nesting",
        "stamped_headers",
        "stamps",
    }
)
#: A string's JSON text as ``json.dumps`` writes it (ASCII, escaped): the C encoder.
_encode_string = json.encoder.encode_basestring_ascii

_lock = threading.Lock()
_broker: str | None = None
_own: Any = None
_origin: tuple[int, str] | None = None


def priority(name: str) -> int:
    """kombu's priority of task ``name``'s messages: drafts after every later step under
    depth-first scheduling (the default), all alike (FIFO) with ``DUET_SCHEDULING=breadth``."""
    if name != keys.TASK_GENERATE:
        return 0
    mode = os.environ.get("DUET_SCHEDULING", "depth")
    if mode not in ("depth", "breadth"):
        raise ConfigError(f"DUET_SCHEDULING={mode!r}: use 'depth' or 'breadth'")
    return keys.DRAFT_PRIORITY if mode == "depth" else 0


def list_key(name: str, queue: str) -> str:
    """The Redis list task ``name``'s message for ``queue`` is pushed on (its priority's)."""
    return keys.queue_key(queue, priority(name))


def message(
    app: Celery,
    name: str,
    args: tuple[Any, ...],
    headers: dict[str, Any] | None = None,
    queue: str | None = None,
) -> tuple[str, str]:
    """The queue and the JSON text of task ``name``'s message with ``args``, as Celery's
    ``send_task`` and kombu's Redis channel would write it, sent from the task running in
    this thread (its id is the message's parent, its root the message's root). The queue
    is the task's route (:data:`keys.TASK_QUEUES`) unless given. ``headers`` are added
    to Celery's (naming one of Celery's is a ``ValueError``). Only the variable parts are
    encoded; the text is what ``json.dumps`` of the whole dict would write.
    """
    task_id, tag = uuid4_text(), uuid4_text()
    parent = app.current_worker_task
    if parent is not None:
        request = parent.request
        parent_id, root_id = request.id, request.root_id or request.id
    else:
        parent_id, root_id = None, task_id
    argsrepr = _json(repr(args))
    queue = queue or keys.TASK_QUEUES[name]
    extra = ""
    if headers:
        if not _CELERY_HEADERS.isdisjoint(headers):
            raise ValueError(f"headers {sorted(_CELERY_HEADERS & headers.keys())} are Celery's")
        extra = "".join(f", {_json(k)}: {json.dumps(v)}" for k, v in headers.items())
    body = base64.b64encode(f"[{json.dumps(list(args))}, {{}}, {_EMBED}]".encode()).decode()
    text = (
        f'{{"body": "{body}", "content-encoding": "utf-8", "content-type": "application/json", '
        f'"headers": {{"lang": "py", "task": {_json(name)}, "id": "{task_id}", "shadow": null, '
        '"eta": null, "expires": null, "group": null, "group_index": null, "retries": 0, '
        f'"timelimit": [null, null], "root_id": {_json(root_id)}, '
        f'"parent_id": {_json(parent_id)}, "argsrepr": {argsrepr}, "kwargsrepr": "{{}}", '
        f'"origin": {_json(origin())}, "ignore_result": null, "replaced_task_nesting": 0, '
        f'"stamped_headers": null, "stamps": {{}}{extra}}}, '
        f'"properties": {{"correlation_id": "{task_id}", "reply_to": {_json(app.thread_oid)}, '
        f'"argsrepr": {argsrepr}, "kwargsrepr": "{{}}", "delivery_mode": 2, '
        f'"delivery_info": {{"exchange": "", "routing_key": {_json(queue)}}}, '
        f'"priority": {priority(name)}, '
        f'"body_encoding": "base64", "delivery_tag": "{tag}"}}}}'
    )
    return queue, text


def _json(text: str | None) -> str:
    """``text`` as JSON (``null`` for None), as ``json.dumps`` writes a string."""
    return "null" if text is None else _encode_string(text)


def push(
    app: Celery,
    name: str,
    args: tuple[Any, ...],
    headers: dict[str, Any] | None = None,
    queue: str | None = None,
) -> None:
    """Send task ``name`` with ``args`` (and extra message ``headers``): one ``LPUSH``."""
    queue, text = message(app, name, args, headers, queue)
    client().lpush(list_key(name, queue), text)


def use_broker(url: str | None) -> None:
    """Push to the broker at ``url`` from now on (``workers.app.configure`` calls this)."""
    global _broker, _own
    with _lock:
        if _own is not None:
            _own.close()
        _broker, _own = url, None


def shares_state_redis() -> bool:
    """Whether the broker is the run-state Redis (the same URL): a state script can then
    push a message itself (see ``orchestration.state.runs.Outgoing``)."""
    return _broker is not None and _broker == _state_url()


def client() -> Any:
    """The Redis client for the broker: the run-state client when the broker is the same
    Redis (its URL), else one of this module's own, with the same timeouts."""
    global _own
    if shares_state_redis():
        return connection.get_redis()
    own = _own
    if own is not None:
        return own
    with _lock:
        if _own is None:
            if _broker is None:
                raise ConfigError("no broker configured")
            _own = connection.client_for(_broker, **connection.socket_options())
        return _own


def _state_url() -> str | None:
    try:
        return connection.redis_url()
    except ConfigError:  # a process with a broker and no run-state Redis
        return None


def origin() -> str:
    """Celery's ``origin`` header of a message sent by this process (``gen<pid>@host``)."""
    global _origin
    known = _origin
    pid = os.getpid()
    if known is None or known[0] != pid:
        known = _origin = (pid, anon_nodename())
    return known[1]


__all__ = [
    "client",
    "list_key",
    "message",
    "origin",
    "priority",
    "push",
    "shares_state_redis",
    "use_broker",
]
