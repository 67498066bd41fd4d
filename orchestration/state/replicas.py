"""Writes that must survive a failover: acknowledged only once a replica has them.

With ``DUET_REDIS_MIN_REPLICAS`` = n > 0, a stored step answer with its budget
settlement, a transition, a budget hold, a step's claim and a submission are sent with
``WAIT n timeout`` right after them, in the same pipeline (one round trip, the same
connection: ``WAIT`` counts the replicas that have every write that connection made; a Lua
script cannot call it). Fewer than n in ``DUET_REDIS_WAIT_TIMEOUT_S``: the write is not
acknowledged, :class:`NotReplicated` (an outage) goes up and the caller tries again
(each of these writes is idempotent or a compare-and-set), so a failover to that replica
loses none of them: no stored answer lost (the model called again), no budget charge lost.
"""

from __future__ import annotations

from typing import Any

import redis

from orchestration.settings import get_settings
from orchestration.state.outages import NoReplicasError
from orchestration.state.scripts import ScriptCall, run_scripts


class NotReplicated(NoReplicasError):
    """A write that fewer replicas than ``DUET_REDIS_MIN_REPLICAS`` acknowledged in time:
    not acknowledged (an outage: the caller tries it again)."""


def required() -> int:
    """Replicas a write that must survive a failover waits for (0: none)."""
    return get_settings().redis_min_replicas


def execute(pipe: Any) -> list[Any]:
    """Execute ``pipe`` (a pipeline of writes), then ``WAIT`` for the required replicas on
    the same connection; its replies (raising the first error, as ``execute`` does).

    Raises:
        NotReplicated: fewer replicas acknowledged the writes in time.
    """
    needed = required()
    if not needed:
        return list(pipe.execute())
    _wait(pipe, needed)
    replies = list(pipe.execute())
    _check(replies.pop(), needed)
    return replies


def run_durable(client: Any, calls: list[ScriptCall]) -> list[Any]:
    """:func:`~orchestration.state.scripts.run_scripts`, acknowledged by the required
    replicas (one round trip: the scripts by SHA, then ``WAIT``).

    A script the server does not know (a new primary after a failover, a restart) is
    loaded and run again, with its own ``WAIT``: the replication stream is in order, so a
    replica that has the later writes has the earlier ones too.

    Raises:
        NotReplicated: fewer replicas acknowledged the writes in time.
    """
    needed = required()
    if not needed:
        return run_scripts(client, calls)
    replies = _send(client, calls, needed)
    missing = [i for i, reply in enumerate(replies) if isinstance(reply, redis.exceptions.NoScriptError)]  # fmt: skip
    if missing:
        for i in missing:
            client.script_load(calls[i].script.script)
        for i, reply in zip(missing, _send(client, [calls[i] for i in missing], needed), strict=True):  # fmt: skip
            replies[i] = reply
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def _send(client: Any, calls: list[ScriptCall], needed: int) -> list[Any]:
    """``calls`` by SHA and ``WAIT``, in one pipeline: each call's reply or error."""
    pipe = client.pipeline(transaction=False)
    for call in calls:
        pipe.evalsha(call.script.sha, len(call.keys), *call.keys, *call.args)
    _wait(pipe, needed)
    replies: list[Any] = pipe.execute(raise_on_error=False)
    acked = replies.pop()
    if isinstance(acked, Exception):
        raise acked
    if not any(isinstance(r, redis.exceptions.NoScriptError) for r in replies):
        _check(acked, needed)
    return replies


def _wait(pipe: Any, needed: int) -> None:
    pipe.execute_command("WAIT", needed, max(1, int(get_settings().redis_wait_timeout_s * 1000)))


def _check(acked: Any, needed: int) -> None:
    if int(acked) < needed:
        raise NotReplicated(
            f"NOREPLICAS {acked} of the {needed} replicas DUET_REDIS_MIN_REPLICAS asks for "
            f"acknowledged a write within DUET_REDIS_WAIT_TIMEOUT_S="
            f"{get_settings().redis_wait_timeout_s:g}: not acknowledged, tried again"
        )
