"""What a batch's submitter keeps of it, to find what an evicting Redis lost.

A ``maxmemory-policy`` changed to an evicting one after start (a parameter-group change,
a failover to a node with the service's defaults) lets Redis drop any key: run records,
the batch's record, its queued messages, budget limits. Nothing left in Redis can rebuild
a run whose record went, so the process that submitted the batch keeps its inputs, and
when Redis reports evictions (``INFO stats evicted_keys``) it looks for the runs that
went (:meth:`KeptBatch.sweep`); :class:`~orchestration.client.handles.BatchHandle` then
submits those inputs again and re-sends the survivors' messages.

A record read as gone is not enough: mid-failover a client may read a server that is
resyncing, empty for a moment. A run is sent again only when that same server has
evicted keys since it was first seen (or refuses ``INFO``), and two looks at least
:data:`CHECK_EVERY_S` apart both found it gone there.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from orchestration.core.results import FINISHED_STATUSES
from orchestration.settings import get_settings
from orchestration.state import keys
from orchestration.state.preflight import NO_EVICTION

if TYPE_CHECKING:
    from orchestration.core.architecture import LoopSpec
    from orchestration.core.budget import Budget
    from orchestration.state.runs import RunRecord

#: How often, at most, Redis's eviction count is read while a batch is followed.
CHECK_EVERY_S = 2.0
#: How often every open run is looked at when the server refuses ``INFO``.
BLIND_EVERY_S = 30.0
#: Budget scope kinds named after one run: a run sent again gets its own.
RUN_SCOPE_KINDS = ("run", "actor", "critic")
#: How often, at most, the open runs of a damaged batch are sent their messages again.
RESEND_EVERY_S = 10.0
#: Runs read per pipeline by a sweep.
PAGE = 500


@dataclass
class Sweep:
    """What one look at the batch's runs found."""

    #: Runs whose record went (id), and the runs that replace them (not yet written).
    lost: dict[str, RunRecord] = field(default_factory=dict)
    #: Run ids of open runs that are still there (their messages may have gone).
    open: list[str] = field(default_factory=list)
    #: Run ids found finished (also kept for :meth:`KeptBatch.take_found`).
    finished: list[str] = field(default_factory=list)
    #: The batch's record as it must be written again, when it went; None: it is there.
    batch: dict[str, Any] | None = None
    #: The budget limits the replacements need (the batch's shared ones and their own).
    limits: dict[str, Budget] = field(default_factory=dict)
    #: Whether to send the ``open`` runs their messages again (at most every
    #: :data:`RESEND_EVERY_S`, while any key of the batch went since the last time).
    resend: bool = False

    @property
    def damaged(self) -> bool:
        """Whether any of the batch's keys went (so its survivors are sent again too)."""
        return bool(self.lost) or self.batch is not None


@dataclass(frozen=True)
class Server:
    """What one ``INFO`` says of the server a client reads: its ``run_id`` (a new one
    after a restart or a failover), keys evicted since it started, whether its
    ``maxmemory-policy`` evicts, and whether it is a primary; ``id`` and ``evicted`` None
    where ``INFO`` is refused (an ACL)."""

    id: str | None
    evicted: int | None
    evicting: bool
    primary: bool = True


#: A server that could not say (mid-failover, say): nothing read from it is trusted.
UNSURE = Server("", 0, False, primary=False)


def server_state(r: Any) -> Server:
    """:class:`Server` of the server behind ``r``, in one round trip."""
    try:
        info = r.info()
    except redis.exceptions.NoPermissionError:
        return Server(None, None, False)
    except redis.exceptions.ResponseError:
        return UNSURE
    policy = info.get("maxmemory_policy")
    return Server(
        str(info.get("run_id") or "") or None,
        int(info.get("evicted_keys", 0)),
        policy is not None and policy != NO_EVICTION,
        primary=info.get("role", "master") == "master",
    )


class KeptBatch:
    """A batch's loop, inputs, record and budget limits, as submitted by this process.

    Positions are the runs' places in the batch; each has one current run (a new one
    once its first went). Thread-safe: a CLI reads results and progress in two threads.
    """

    def __init__(
        self,
        spec: LoopSpec,
        records: Sequence[RunRecord],
        batch: Mapping[str, Any],
        limits: Mapping[str, Budget],
        server: Server,
    ) -> None:
        self.spec = spec
        self.batch = dict(batch)
        self._records = list(records)
        self._limits = dict(limits)
        self._position = {r.run_id: n for n, r in enumerate(records)}
        self._finished: dict[int, str] = {}
        self._lock = threading.Lock()
        #: Keys each server (by ``run_id``) had evicted when last read.
        self._evicted: dict[str | None, int] = {}
        #: Whether a server seen had evicted keys since it was first seen (cleared once a
        #: look finds nothing gone).
        self._evidence = False
        self._server = server
        self._note(server)
        #: Position (-1: the batch's record) -> (run id, server, since): found gone once.
        self._suspects: dict[int, tuple[str, str | None, float]] = {}
        self._next = 0.0
        self._blind_next = time.monotonic() + BLIND_EVERY_S
        self._found: list[str] = []  # finished runs sweeps found, not yet taken
        self._owed = False  # open runs to be sent their messages again
        self._retry = False  # the last sweep's writes failed
        self._resend_next = 0.0
        #: How many runs were submitted again, over the batch's life.
        self.resent = 0

    def __len__(self) -> int:
        return len(self._records)

    def run_ids(self) -> list[str]:
        """The current run of each position, in order."""
        with self._lock:
            return [r.run_id for r in self._records]

    def current(self, position: int) -> str:
        with self._lock:
            return self._records[position].run_id

    def position_of(self, run_id: str) -> int | None:
        """The position a run holds now; None for a run replaced since (or not the batch's)."""
        with self._lock:
            n = self._position.get(run_id)
            return n if n is not None and self._records[n].run_id == run_id else None

    def saw_finished(self, run_id: str, status: str) -> None:
        """Note a run seen finished, so sweeps stop looking at it."""
        n = self.position_of(run_id)
        if n is not None:
            with self._lock:
                self._finished[n] = status

    def look_again(self) -> None:
        """Make the next :meth:`due` true (a sweep whose writes failed: its replacements,
        never written, are found gone and replaced again)."""
        with self._lock:
            self._next = 0.0
            self._retry = True

    def take_found(self) -> list[str]:
        """The runs sweeps found finished since the last call (whichever thread swept:
        their entries in the batch's finished stream may have gone)."""
        with self._lock:
            found, self._found = self._found, []
            return found

    def due(self, r: Any, *, force: bool = False) -> bool:
        """Whether to look now: a server evicted keys since the last look (read at most
        every :data:`CHECK_EVERY_S`), runs found gone once wait for their second look, or
        the server refuses ``INFO`` and :data:`BLIND_EVERY_S` passed. Never while its policy
        still evicts (what is sent again would go too, and workers hold new work meanwhile)
        unless ``DUET_ALLOW_EVICTION`` accepts the risk."""
        now = time.monotonic()
        with self._lock:
            owed = self._retry or (self._owed and now >= self._resend_next)
            if not (force or owed) and now < self._next:
                return False
            self._next = now + CHECK_EVERY_S
        server = server_state(r)
        if not server.primary or (server.evicting and not get_settings().allow_eviction):
            return False
        with self._lock:
            self._server = server
            blind = server.evicted is None and now >= self._blind_next
            if blind:
                self._blind_next = now + BLIND_EVERY_S
            grew = self._note(server)
            go = force or owed or blind or grew or self._evidence or bool(self._suspects)
            if go:
                self._retry = False
            return go

    def evictions_seen(self) -> bool:
        """Whether a run read as gone may have been evicted (and is sent again once read
        so twice): a server evicted keys, or it refuses ``INFO``."""
        with self._lock:
            return self._evidence or self._server.evicted is None

    def _note(self, server: Server) -> bool:
        """Take ``server``'s eviction count; whether it grew since that server was last
        read (a server first seen, after a failover say, sets its baseline)."""
        if server.evicted is None:
            return False
        before = self._evicted.get(server.id)
        self._evicted[server.id] = server.evicted
        grew = before is not None and server.evicted > before
        self._evidence = self._evidence or grew
        return grew

    def _confirmed(self, position: int, run_id: str, now: float) -> bool:
        """Whether ``run_id`` at ``position``, read gone now, was read gone on this same
        server at least :data:`CHECK_EVERY_S` ago, and that server's reads are trusted to
        mean evicted; else it is noted, for the next look. Caller holds the lock."""
        server = self._server
        trusted = self._evidence or server.evicted is None
        seen = self._suspects.get(position)
        if seen is None or seen[0] != run_id or seen[1] != server.id:
            self._suspects[position] = (run_id, server.id, now)
            return False
        return trusted and now - seen[2] >= CHECK_EVERY_S

    def record(self) -> dict[str, Any]:
        """The batch's record as submitted, its counters those of the finished runs seen."""
        with self._lock:
            record = {**self.batch, "total": len(self._records), "done": len(self._finished)}
            for status in self._finished.values():
                record[f"status:{status}"] = record.get(f"status:{status}", 0) + 1
            return record

    def sweep(self, r: Any) -> Sweep:
        """Look at every open run: one whose record went (read so twice, see the module's
        docstring) gets a replacement, to be written and sent by the caller; the others are
        listed. :meth:`due` reads the server first, so an eviction during a sweep brings
        another."""
        with self._lock:
            todo = [n for n in range(len(self._records)) if n not in self._finished]
            ids = [self._records[n].run_id for n in todo]
        found = Sweep()
        gone: list[tuple[int, str]] = []
        for start in range(0, len(todo), PAGE):
            pipe = r.pipeline(transaction=False)
            for run_id in ids[start : start + PAGE]:
                pipe.hmget(keys.run(run_id), "status", "spec_id")
            for n, run_id, (status, spec_id) in zip(
                todo[start : start + PAGE], ids[start : start + PAGE], pipe.execute(), strict=True
            ):
                if status is None or spec_id is None:  # gone, or re-made by a late write
                    gone.append((n, run_id))
                elif status in FINISHED_STATUSES:
                    found.finished.append(run_id)
                    with self._lock:
                        self._finished[n] = status
                        self._found.append(run_id)
                else:
                    found.open.append(run_id)
        batch_gone = not r.hexists(keys.batch(self.batch["batch_id"]), "total")
        # The reads came from the server the look began with, still a primary: else (a
        # failover meanwhile) what read as gone is not even noted.
        if (gone or batch_gone) and server_state(r) != self._server:
            return found
        now = time.monotonic()
        with self._lock:
            confirmed = [(n, i) for n, i in gone if self._confirmed(n, i, now)]
            batch_lost = batch_gone and self._confirmed(-1, "", now)
            still = {n for n, _ in gone} | ({-1} if batch_gone else set())
            self._suspects = {n: v for n, v in self._suspects.items() if n in still}
            if not still:
                self._evidence = False  # whatever was evicted is sent again
        for n, run_id in confirmed:
            found.lost[run_id] = self._replacement(n)
            with self._lock:
                self._suspects.pop(n, None)
        if batch_lost:
            found.batch = self.record()
            with self._lock:
                self._suspects.pop(-1, None)
        if found.damaged:
            found.limits = self._limits_for(list(found.lost.values()))
        with self._lock:
            self._owed = self._owed or found.damaged
            if self._owed and now >= self._resend_next:
                found.resend, self._owed = True, False
                self._resend_next = now + RESEND_EVERY_S
        return found

    def _replacement(self, n: int) -> RunRecord:
        """A new run for position ``n`` (its input, a new id, its own budget scopes)."""
        with self._lock:
            old = self._records[n]
            new_id = uuid.uuid4().hex
            scopes = tuple(_renamed(s, old.run_id, new_id) for s in old.budget_scopes)
            for s in old.budget_scopes:
                if s in self._limits and _renamed(s, old.run_id, new_id) != s:
                    self._limits[_renamed(s, old.run_id, new_id)] = self._limits.pop(s)
            new = dataclasses.replace(old, run_id=new_id, budget_scopes=scopes)
            self._records[n] = new
            self._position[new_id] = n
            del self._position[old.run_id]
            self.resent += 1
            return new

    def _limits_for(self, records: list[RunRecord]) -> dict[str, Budget]:
        """The limits to set again: the batch's shared scopes and ``records``' own."""
        with self._lock:
            own = {s for rec in records for s in rec.budget_scopes}
            return {
                s: b
                for s, b in self._limits.items()
                if s in own or not s.startswith(tuple(f"{k}:" for k in RUN_SCOPE_KINDS))
            }


def _renamed(scope: str, old: str, new: str) -> str:
    kind, _, name = scope.partition(":")
    return f"{kind}:{new}" if kind in RUN_SCOPE_KINDS and name == old else scope


__all__ = ["UNSURE", "KeptBatch", "Server", "Sweep", "server_state"]
