"""What the periodic sweep does, apart from Celery: find unfinished runs that stopped
moving and say what to send to move them again.

A run moves when a transition is recorded (the index of unfinished runs notes the time).
One that has not moved for ``after_s`` seconds, and whose current step is not claimed by
a live call (claims in flight are renewed), lost a message: a step or coordinator task
failed past its retries, a broker lost a message it had delivered (Redis restarted), or
a worker died with its message acked. The sweep sends what the run waits for: the
coordinator's transition (queued runs, or a step whose result is stored), or the step
again. Sending either twice is harmless: the coordinator's compare-and-set and the step
claim make a second copy a no-op. A run sent on is noted as moved, so it is sent again
at most once per ``after_s``. Runs waiting for a place under their batch's
``max_in_flight`` are not in the index: the sweep hands each such batch's free places on
(a hand-on lost in a crash) and sends the runs given one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from orchestration.core.loop import parse_step_key
from orchestration.core.results import FINISHED_STATUSES
from orchestration.services.coordinator import Dispatch
from orchestration.state.gates import BatchGate
from orchestration.state.keys import TASK_BY_PHASE
from orchestration.state.processes import held_since, lapsed, redis_ms, take_held
from orchestration.state.runs import RunStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Transition:
    """Send ``coordinate(run_id, seq)``."""

    run_id: str
    seq: int
    batch_id: str | None = None


class Sweeper:
    """Finds runs to send on. Holds only the store."""

    def __init__(self, store: RunStore, *, after_s: float, limit: int = 1000) -> None:
        self.store = store
        self.after_s = after_s
        self.limit = limit
        self.gate = BatchGate(store.r)

    def sweep(self, now: float | None = None) -> list[Dispatch | Transition]:
        """What to send, for the runs that have not moved for ``after_s`` seconds."""
        now = time.time() if now is None else now
        sends: list[Dispatch | Transition] = []
        for run in self.store.stale_runs(now - self.after_s, self.limit):
            if run.status is None or run.status in FINISHED_STATUSES:
                self.store.forget(run.run_id)
                continue
            self.store.touch(run.run_id, now)
            if run.status == "queued" or not run.current_step or run.stored:
                sends.append(Transition(run.run_id, run.seq, run.batch_id))
            elif not run.claimed:
                phase, _ = parse_step_key(run.current_step)
                sends.append(
                    Dispatch(
                        TASK_BY_PHASE[phase], run.run_id, run.current_step, run.seq, run.batch_id
                    )
                )
        if sends:
            log.warning(
                "sweep: %s runs had stopped moving; sent on: %s",
                len(sends),
                ", ".join(s.run_id for s in sends[:10]),
            )
        handed = self.gate.hand_on_all()
        seqs = self.store.seqs([run_id for _, run_id in handed])
        placed = [
            Transition(run_id, seq, batch_id)
            for (batch_id, run_id), seq in zip(handed, seqs, strict=True)
        ]
        if placed:
            log.warning(
                "sweep: %s waiting runs given a free place (max_in_flight): %s",
                len(placed),
                ", ".join(s.run_id for s in placed[:10]),
            )
        return sends + placed


@dataclass(frozen=True, slots=True)
class Healing:
    """What to do for the processes found dead: put ``held`` back on their queues (broker
    delivery tag -> run id), then send the ``steps`` of the runs none of them was for;
    ``at_ms``: when they were found dead (Redis time; 0: none found)."""

    dead: list[str]
    held: dict[str, str]
    steps: list[Dispatch]
    at_ms: int = 0

    def rest(self, restored: set[str]) -> list[Dispatch]:
        """The steps to send once the messages ``restored`` (tags) are back on their queues."""
        back = {self.held[tag] for tag in restored if tag in self.held}
        return [s for s in self.steps if s.run_id not in back]


class Healer:
    """Sends on, at once, the steps a dead worker process had claimed (its liveness key
    lapsed): each is taken over by its next delivery (the claim names a dead process), so
    its run moves again seconds after the death, not ``after_s`` later. Holds only the
    store."""

    def __init__(self, store: RunStore, *, process_ttl_s: int) -> None:
        self.store = store
        self.process_ttl_s = process_ttl_s

    def heal(self) -> Healing:
        """The processes found dead now (each by one caller only), the broker messages they
        held and the steps they had claimed."""
        dead = lapsed(self.store.r, self.process_ttl_s)
        if not dead:
            return Healing([], {}, [])
        at_ms = redis_ms(self.store.r)
        held = take_held(self.store.r, dead)
        sends = [
            Dispatch(
                TASK_BY_PHASE[parse_step_key(run.current_step)[0]],
                run.run_id,
                run.current_step,
                run.seq,
                run.batch_id,
            )
            for run in self.store.claimed_by(dead)
            if run.current_step
        ]
        for send in sends:
            self.store.touch(send.run_id)
        log.warning(
            "worker process(es) %s stopped saying they are alive: %s message(s) they held "
            "to put back, %s step(s) they had claimed%s",
            ", ".join(dead[:5]),
            len(held),
            len(sends),
            (": " + ", ".join(s.run_id for s in sends[:10])) if sends else "",
        )
        return Healing(dead, held, sends, at_ms)

    def orphans(self, found_ms: int) -> tuple[set[str], float] | None:
        """For deaths found at ``found_ms``: the tags live processes hold and the time
        before which a message delivered and not among them is an orphan (a dead process
        took it after its last note of what it held), once every live process has
        noted what it holds since; None until then.

        A dead process's last note is at most a third of the TTL older than its death,
        found a whole TTL after its last sign of life: it took nothing in the last
        two thirds of a TTL before ``found_ms``, and a third is left for clocks."""
        held = held_since(self.store.r, found_ms)
        if held is None:
            return None
        return held, found_ms / 1000 - self.process_ttl_s / 3


class RestartWatch:
    """Tells when the Redis server became a new process (a new ``run_id`` in ``INFO
    server``: restarted, failed over): the time it came back, so the runs that have not
    moved since can be swept at once instead of after ``after_s``. Pure: the caller reads
    ``INFO``."""

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.seen_at = 0.0

    def seen(self, run_id: str, uptime_s: float, now: float) -> float | None:
        """Note the server's ``run_id`` and ``uptime_in_seconds`` read at ``now``: when it
        came back (epoch seconds), if it is not the server seen last; else None (also
        the first time: nothing to compare with). A promoted replica has been up for long:
        for it, the change is dated when the old server was last seen."""
        previous, self.run_id = self.run_id, run_id
        last_seen, self.seen_at = self.seen_at, now
        if previous is None or previous == run_id:
            return None
        return max(now - uptime_s, last_seen)


__all__ = ["Healer", "Healing", "RestartWatch", "Sweeper", "Transition"]
