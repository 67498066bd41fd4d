"""Vendor batch execution in Redis: parked requests, collectors' takes, submitted batches.

A step of an agent with ``execution="vendor_batch"`` *parks* its request
(:meth:`VendorBatchStore.park`): the request is kept under its own key and its id
(``run_id|step_key``) joins its group's *pending* set. A collector *takes* a group's
pending requests (:meth:`VendorBatchStore.take`) when enough have gathered or the oldest
has waited long enough, submits them as one vendor batch and records it
(:meth:`VendorBatchStore.record`); a request taken by a collector that died is pending
again after ``reclaim_s``. A poller reads the batch (:meth:`VendorBatchStore.batch`), and
once every result is stored, forgets it (:meth:`VendorBatchStore.finish`).

Every change that must be atomic is one Lua script; clocks are the Redis server's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from orchestration.defaults import DEFAULT_FINISHED_TTL_S
from orchestration.state import keys, scripts


def member(run_id: str, step_key: str) -> str:
    """The id of a parked request in the sets: ``run_id|step_key``."""
    return f"{run_id}|{step_key}"


def split_member(value: str) -> tuple[str, str]:
    run_id, _, step_key = value.partition("|")
    return run_id, step_key


@dataclass(frozen=True, slots=True)
class Take:
    """What a collector got: requests to submit, or how long to wait (0: nothing left)."""

    members: list[str]
    wait_s: float = 0.0


@dataclass(frozen=True, slots=True)
class VendorBatch:
    """A submitted vendor batch as recorded."""

    id: str
    group: str
    #: ``spec_id|role`` of a request in it: whose adapter (provider, endpoint, key) to use.
    seat: str
    submitted_at: float
    polls: int
    cancel_requested: bool
    #: custom id -> ``run_id|step_key``.
    requests: dict[str, str]


class VendorBatchStore:
    """Parked requests and vendor batches, on one Redis client (decoding)."""

    def __init__(self, redis_client: Any, *, ttl_s: int = DEFAULT_FINISHED_TTL_S) -> None:
        self.r = redis_client
        self.ttl_s = ttl_s
        self._park = scripts.register(redis_client, "vendor_park")
        self._take = scripts.register(redis_client, "vendor_take")

    # --- steps ----------------------------------------------------------------------
    def park(
        self, group: str, run_id: str, step_key: str, request: dict[str, Any], gather_s: float
    ) -> tuple[bool, bool]:
        """Park one step's request in its group.

        Returns ``(new, schedule)``: whether it was parked now (False: an earlier delivery
        of the step did), and whether the group's collector needs scheduling.
        """
        new, schedule = self._park(
            keys=[
                keys.vb_request(run_id, step_key),
                keys.vb_pending(group),
                keys.vb_collect(group),
            ],
            args=[
                member(run_id, step_key),
                json.dumps(request),
                self.ttl_s,
                max(1, int(gather_s * 1000)),
            ],
        )
        return bool(int(new)), bool(int(schedule))

    def request(self, run_id: str, step_key: str) -> dict[str, Any] | None:
        raw = self.r.get(keys.vb_request(run_id, step_key))
        return json.loads(raw) if raw else None

    def requests(self, members: list[str]) -> dict[str, dict[str, Any] | None]:
        """The parked requests of ``members`` (None where one is gone)."""
        if not members:
            return {}
        raws = self.r.mget([keys.vb_request(*split_member(m)) for m in members])
        return {m: (json.loads(raw) if raw else None) for m, raw in zip(members, raws, strict=True)}

    def repark(self, group: str, run_id: str, step_key: str, request: dict[str, Any]) -> None:
        """Park a request again (its vendor batch let it expire): overwrite and re-queue."""
        pipe = self.r.pipeline()
        pipe.set(keys.vb_request(run_id, step_key), json.dumps(request), ex=self.ttl_s)
        pipe.zadd(keys.vb_pending(group), {member(run_id, step_key): 0})
        pipe.execute()

    def forget(self, group: str, run_id: str, step_key: str) -> None:
        """Drop a request whose step is over (result stored, or its run cancelled)."""
        m = member(run_id, step_key)
        pipe = self.r.pipeline()
        pipe.delete(keys.vb_request(run_id, step_key))
        pipe.zrem(keys.vb_pending(group), m)
        pipe.zrem(keys.vb_taking(group), m)
        pipe.execute()

    # --- collectors -----------------------------------------------------------------
    def take(self, group: str, *, max_requests: int, gather_s: float, reclaim_s: float) -> Take:
        """Take up to ``max_requests`` of the group's pending requests when due."""
        reply = self._take(
            keys=[keys.vb_pending(group), keys.vb_taking(group), keys.vb_collect(group)],
            args=[max_requests, max(1, int(gather_s * 1000)), max(1, int(reclaim_s * 1000))],
        )
        if reply[0] == "take":
            return Take([str(m) for m in reply[1:]])
        if reply[0] == "wait":
            return Take([], float(reply[1]) / 1000)
        return Take([])

    def put_back(self, group: str, members: list[str]) -> None:
        """Requests a collector took but could not submit are pending again."""
        if members:
            pipe = self.r.pipeline()
            pipe.zrem(keys.vb_taking(group), *members)
            pipe.zadd(keys.vb_pending(group), dict.fromkeys(members, 0))
            pipe.execute()

    def pending(self, group: str) -> int:
        return int(self.r.zcard(keys.vb_pending(group)))

    def record(
        self,
        batch_id: str,
        group: str,
        seat: str,
        requests: dict[str, str],
        batches: set[str],
        submitted_at: float,
    ) -> None:
        """Note a submitted vendor batch (custom id -> member) and the Duet batches it serves."""
        pipe = self.r.pipeline()
        pipe.hset(
            keys.vb_batch(batch_id),
            mapping={
                "group": group,
                "seat": seat,
                "submitted_at": submitted_at,
                "polls": 0,
                "requests": len(requests),
                "cancel_requested": 0,
                "batches": ",".join(sorted(batches)),
            },
        )
        pipe.hset(keys.vb_batch_requests(batch_id), mapping=requests)
        pipe.zrem(keys.vb_taking(group), *requests.values())
        pipe.sadd(keys.vb_active(), batch_id)
        for duet_batch in batches:
            pipe.sadd(keys.vb_of_batch(duet_batch), batch_id)
        pipe.execute()

    # --- pollers ----------------------------------------------------------------------
    def batch(self, batch_id: str) -> VendorBatch | None:
        pipe = self.r.pipeline()
        pipe.hgetall(keys.vb_batch(batch_id))
        pipe.hgetall(keys.vb_batch_requests(batch_id))
        record, requests = pipe.execute()
        if not record:
            return None
        return VendorBatch(
            id=batch_id,
            group=record["group"],
            seat=record["seat"],
            submitted_at=float(record["submitted_at"]),
            polls=int(record.get("polls") or 0),
            cancel_requested=record.get("cancel_requested") == "1",
            requests=requests,
        )

    def polled(self, batch_id: str) -> int:
        """Count one more check of the batch; how many so far."""
        return int(self.r.hincrby(keys.vb_batch(batch_id), "polls", 1))

    def cancel_requested(self, batch_id: str) -> None:
        self.r.hset(keys.vb_batch(batch_id), "cancel_requested", 1)

    def finish(self, batch_id: str) -> None:
        """Forget a vendor batch whose every result is stored."""
        record = self.r.hgetall(keys.vb_batch(batch_id))
        pipe = self.r.pipeline()
        for duet_batch in filter(None, (record.get("batches") or "").split(",")):
            pipe.srem(keys.vb_of_batch(duet_batch), batch_id)
        pipe.delete(keys.vb_batch(batch_id), keys.vb_batch_requests(batch_id))
        pipe.srem(keys.vb_active(), batch_id)
        pipe.execute()

    def of_batch(self, duet_batch_id: str) -> list[dict[str, Any]]:
        """The vendor batches serving a Duet batch now: id, requests, submitted_at."""
        found = []
        for batch_id in sorted(self.r.smembers(keys.vb_of_batch(duet_batch_id))):
            record = self.r.hgetall(keys.vb_batch(batch_id))
            if record:
                found.append(
                    {
                        "id": batch_id,
                        "requests": int(record.get("requests") or 0),
                        "submitted_at": float(record["submitted_at"]),
                    }
                )
        return found

    def parked_of(self, group: str) -> int:
        """Requests of a group parked and not yet submitted."""
        return int(self.r.zcard(keys.vb_pending(group))) + int(self.r.zcard(keys.vb_taking(group)))
