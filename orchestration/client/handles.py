"""The client side: create runs in Redis and hand them to the coordinator queue.

Clients enqueue by task *name* (``send_task``), so they need no worker code: any
process that can reach Redis (and the broker) can submit work.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import redis
from celery import Celery

from orchestration.client.keeper import RUN_SCOPE_KINDS, KeptBatch, Sweep
from orchestration.core.architecture import LoopSpec
from orchestration.core.errors import ConfigError, RunTimeout, StoreFull
from orchestration.core.events import Event
from orchestration.core.key_policy import KeyPolicy
from orchestration.core.loop import parse_step_key
from orchestration.core.results import FINISHED_STATUSES, RunResult
from orchestration.core.tools import unknown_tools
from orchestration.settings import get_settings
from orchestration.state import batches, connection, keypolicies, keys, replicas
from orchestration.state.broker import broker_config
from orchestration.state.callcache import RedisCallStore
from orchestration.state.gates import BatchGate, limit_of
from orchestration.state.runs import RunRecord, RunStore
from orchestration.state.turns import Turn, TurnStore, published_tools

if TYPE_CHECKING:
    from orchestration.core.budget import Budget
    from orchestration.state.budgets import BudgetLedger, ScopeState

#: Runs written and messages sent per pipeline when submitting a batch.
SUBMIT_CHUNK = 500
#: How long a result wait blocks before it looks for evicted runs (a kept batch).
LOOK_EVERY_S = 2.0
#: How long a kept batch's run may read as gone, with no eviction seen, before its
#: result is given up as not found (a read mid-failover comes back within seconds).
GONE_GRACE_S = 30.0

log = logging.getLogger(__name__)

_producer: Celery | None = None
_producer_lock = threading.Lock()


def producer() -> Celery:
    """A Celery app used only to send messages, pointed at this process's broker."""
    global _producer
    with _producer_lock:
        settings = get_settings()
        broker = settings.broker_url or connection.redis_url()
        if _producer is None or _producer.conf.broker_url != broker:
            app = Celery("duet-client", set_as_current=False)
            app.conf.update(broker_config(broker, settings))
            _producer = app
        return _producer


def new_id() -> str:
    return uuid.uuid4().hex


def store() -> RunStore:
    return RunStore(connection.get_redis(), finished_ttl_s=get_settings().finished_ttl_s)


def send_coordinate(run_ids: Iterable[str], seq: int = 0) -> None:
    app = producer()
    with app.producer_or_acquire() as prod:
        for run_id in run_ids:
            app.send_task(keys.TASK_COORDINATE, args=(run_id, seq), producer=prod)


@contextlib.contextmanager
def room_for_runs() -> Iterator[None]:
    """Turn Redis's ``OOM`` during a submission into :class:`StoreFull`, after the
    model-call cache gave its room back (so the next submission may fit)."""
    try:
        yield
    except redis.exceptions.OutOfMemoryError as exc:
        evicted = 0
        with contextlib.suppress(redis.exceptions.RedisError):
            evicted = RedisCallStore(store().r).make_room()
        raise StoreFull(
            "Redis is at its maxmemory (OOM) and refused the submission"
            + (
                f"; the model-call cache gave back {evicted} entries: submit again"
                if evicted
                else ": raise maxmemory, or clear old results, then submit again"
            )
        ) from exc


def enqueue(
    spec: LoopSpec, records: Sequence[RunRecord], *, batch: dict[str, Any] | None = None
) -> None:
    """Write ``records`` (and the batch record) and send each run to the coordinator.

    A batch with ``max_in_flight`` N sends only its first N runs; the others are queued
    at its gate (:mod:`orchestration.state.gates`) and sent as places free. A record
    ``served`` from the cache is written finished instead, and neither sent nor gated.

    Raises:
        StoreFull: Redis refused the writes at its ``maxmemory``.
    """
    with room_for_runs():
        _enqueue(spec, records, batch)


def _enqueue(spec: LoopSpec, records: Sequence[RunRecord], batch: dict[str, Any] | None) -> None:
    st = store()
    check_key_policies(spec, st.r)
    limit = limit_of(batch) if batch is not None else 0
    placed = 0  # runs given a place under the gate so far
    for start in range(0, max(len(records), 1), SUBMIT_CHUNK):
        chunk = records[start : start + SUBMIT_CHUNK]
        pipe = st.r.pipeline(transaction=False)
        if start == 0:
            st.save_spec(spec, pipe)
            if batch is not None:
                pipe.hset(keys.batch(batch["batch_id"]), mapping=batch)
                pipe.zadd(keys.batches_index(), {batch["batch_id"]: float(batch["created_at"])})
                # The index forgets batches long past their records' TTL (2x: a batch's
                # records expire only after its last run).
                old = float(batch["created_at"]) - 2 * get_settings().finished_ttl_s
                pipe.zremrangebyscore(keys.batches_index(), "-inf", old)
        st.create_runs(chunk, pipe)
        if batch is not None and chunk:
            pipe.rpush(keys.batch_runs(batch["batch_id"]), *(r.run_id for r in chunk))
        live = [(start + n, r) for n, r in enumerate(chunk) if r.served is None]
        served = [r for r in chunk if r.served is not None]
        sent = [r for _, r in live] if not limit else [r for _, r in live[: max(0, limit - placed)]]
        placed += len(sent)
        if batch is not None and limit:
            later = {r.run_id: at for at, r in live[len(sent) :]}
            BatchGate.admit(pipe, batch["batch_id"], [r.run_id for r in sent], later)
        replicas.execute(pipe)  # on a replica too, when one is asked for
        st.finish_served(served)
        send_coordinate(r.run_id for r in sent)


def freeze_tools(spec: LoopSpec) -> LoopSpec:
    """``spec`` with the schemas of the tools its agents name, as the workers published
    them, frozen in (every turn of every run then sees the same tools).

    Raises:
        ConfigError: a tool no worker publishes, naming it and the agent.
    """
    agents = {"actor": spec.actor, "critic": spec.critic}
    if not any(agent.tools for agent in agents.values()):
        return spec
    client = connection.get_redis()
    known = published_tools(client, [n for a in agents.values() for n in a.tools])
    for role, agent in agents.items():
        missing = unknown_tools(agent.tools, set(known))
        if missing:
            offered = ", ".join(sorted(published_tools(client))) or "none"
            raise ConfigError(
                f"{role} ({agent.model}) names tool(s) no worker knows: {', '.join(missing)}. "
                "Workers register tools in workers.tools.review and the modules "
                f"DUET_TOOL_MODULES names (started workers publish theirs: {offered})"
            )
    frozen = {
        role: agent.model_copy(update={"tool_specs": tuple(known[n] for n in agent.tools)})
        for role, agent in agents.items()
    }
    return spec.model_copy(update=frozen)


def agent_turns(run_id: str) -> dict[str, list[Turn]]:
    """The stored turns of a run's agents with tools, by step key (``duet show``)."""
    return TurnStore(connection.get_redis()).all_turns(run_id)


def result_turns(result: RunResult) -> dict[str, list[Turn]]:
    """:func:`agent_turns` of a finished run, for its result record; not read for a run that
    finished well without a tool call (most runs): a batch without tools pays no read."""
    if not result.usage.total.tool_calls and result.status in ("approved", "max_rounds_reached"):
        return {}
    return agent_turns(result.run_id)


def check_key_policies(spec: LoopSpec, client: Any) -> None:
    """Refuse a spec whose keys the fleet's workers would not send where it sends them:
    every policy live workers publish must allow it (this process's own settings when none
    is published yet: a fleet not started).

    Raises:
        ConfigError: naming the role and the variable (:mod:`orchestration.core.key_policy`).
    """
    published = [KeyPolicy.from_json(text) for text in keypolicies.published(client)]
    for policy in published or [get_settings().key_policy()]:
        for role, agent in (("actor", spec.actor), ("critic", spec.critic)):
            problem = policy.agent_problem(agent)
            if problem is not None:
                raise ConfigError(f"{role}: {problem}")


def ledger() -> BudgetLedger:
    """The fleet's budget ledger on this process's Redis."""
    from orchestration.state.budgets import BudgetLedger

    return BudgetLedger(connection.get_redis())


def set_budgets(limits: Mapping[str, Budget]) -> None:
    """Store limits for budget scopes (``{"global:team-a": Budget(max_usd=50)}``).

    Scopes are ``run:<id>``, ``batch:<id>``, ``user:<id>`` and ``global:<name>``; a run is
    charged to its own, its batch's, its user's and the team's named global scopes (and
    each role's calls to ``actor:<run id>`` / ``critic:<run id>``, an agent's ``budget=``).
    """
    if limits:
        book = ledger()
        with room_for_runs():
            for scope_name, budget in limits.items():
                book.set_limits(scope_name, budget)


def get_budget(scope: str) -> ScopeState:
    """Limits, spent, reserved and remaining of one scope (e.g. ``"user:alice"``)."""
    return ledger().get(scope)


def reset_budget(scope: str) -> None:
    """Zero a scope's spending (e.g. a monthly budget at the start of the month)."""
    ledger().reset(scope)


def list_budgets(prefix: str = "") -> list[str]:
    """Scopes with budget data whose name starts with ``prefix``."""
    return ledger().list_scopes(prefix)


#: Seconds ahead the next rate slot must be for a limit to be shown as a wait.
RATE_WAIT_SHOWN_S = 1.0


def rate_limit_waits(spec: LoopSpec) -> list[str]:
    """The spec's models that wait on their fleet-wide rate limit or are paused now, in
    words, each naming who set the limit (a limit outlives the batch that set it)."""
    from orchestration.core.ratelimit import limit_name
    from orchestration.state.ratelimits import limit_state, stored_rate_limits

    r = connection.get_redis()
    table = stored_rate_limits(r)
    waits = []
    for agent in dict.fromkeys((spec.actor, spec.critic)):
        name = limit_name(agent.provider, agent.model_name, agent.base_url)
        limit = table.get(name)
        state = limit_state(r, name)
        origin = f"set by {limit.source or 'an earlier config'}" if limit else "learned"
        if state.paused_s > 0:
            waits.append(f"{name} paused by the vendor (429): {state.paused_s:.0f}s left")
        elif state.next_slot_s >= RATE_WAIT_SHOWN_S:
            waits.append(
                f"rate limit {name}: next slot in {state.next_slot_s:.0f}s, "
                f"{state.permits:,} booked ({origin}; duet limits show)"
            )
    return waits


def vendor_batch_waits(batch_id: str) -> list[str]:
    """The vendor batches runs of a Duet batch wait on now, in words."""
    from orchestration.state.vendorbatches import VendorBatchStore

    now = time.time()
    found = []
    for vb in VendorBatchStore(store().r).of_batch(batch_id):
        ago = max(0.0, now - vb["submitted_at"])
        when = f"{ago:.0f} s" if ago < 90 else f"{ago / 60:.0f} min"
        found.append(f"vendor batch {vb['id']} ({vb['requests']} requests, submitted {when} ago)")
    return found


def queues_without_workers(timeout: float = 1.0) -> list[str]:
    """Duet's queues that no live worker consumes (asked over the broker; takes ``timeout``)."""
    replies = producer().control.inspect(timeout=timeout).active_queues() or {}
    consumed = {q.get("name") for queues in replies.values() for q in queues or ()}
    return [q for q in keys.ALL_QUEUES if q not in consumed]


def resend_lost(kept: KeptBatch, found: Sweep) -> None:
    """Write again what :meth:`KeptBatch.sweep` found gone (the loop, budget limits, the
    batch's record and run list, each lost run under a new id), send the new runs, and,
    when ``found.resend``, the open runs their messages (a no-op for one that has it)."""
    batch_id = kept.batch["batch_id"]
    st = store()
    gate = BatchGate(st.r)
    with room_for_runs():
        # A new run's own scopes are new; a shared one keeps any limit it still has (one
        # set since the submit stays).
        book = ledger()
        set_budgets(
            {
                name: budget
                for name, budget in found.limits.items()
                if name.partition(":")[0] in RUN_SCOPE_KINDS or not book.get(name).limits
            }
        )
        pipe = st.r.pipeline(transaction=False)
        st.save_spec(kept.spec, pipe)
        if found.batch is not None:
            pipe.hset(keys.batch(batch_id), mapping=found.batch)
            pipe.zadd(keys.batches_index(), {batch_id: float(found.batch["created_at"])})
        new = list(found.lost.values())
        st.create_runs(new, pipe)
        if new or found.batch is not None:  # the run list in input order, current ids
            pipe.delete(keys.batch_runs(batch_id))
            ids = kept.run_ids()
            for start in range(0, len(ids), SUBMIT_CHUNK):
                pipe.rpush(keys.batch_runs(batch_id), *ids[start : start + SUBMIT_CHUNK])
        BatchGate.forget(pipe, batch_id, list(found.lost))
        replicas.execute(pipe)
        st.finish_served([r for r in new if r.served is not None])
    send_coordinate(r.run_id for r in new if r.served is None and gate.reenter(r.run_id))
    limit = limit_of(kept.batch)
    if limit and found.lost:  # the places the lost runs held are free now
        handed = gate.pass_on(batch_id, limit)
        for run_id, seq in zip(handed, st.seqs(handed), strict=True):
            send_coordinate([run_id], seq)
    resent = resume_runs(found.open) if found.resend else 0
    if found.damaged:
        log.warning(
            "batch %s: Redis evicted %s%s of its runs (maxmemory-policy must be noeviction): "
            "submitted again under new ids; %s open run(s) sent their next step again",
            batch_id,
            "its record and " if found.batch is not None else "",
            len(found.lost),
            resent,
        )


def resume_runs(run_ids: Iterable[str], *, interrupted: bool = False) -> int:
    """Send each unfinished run the message it is waiting for; how many were sent (or
    put in line for a place under their batch's ``max_in_flight``).

    With ``interrupted``, the ``interrupted`` runs among them instead, re-opened where they
    stopped (``RunStore.rerun_point``): for after the cause is fixed (a budget raised, a
    key set).
    """
    st = store()
    gate = BatchGate(st.r)
    app = producer()
    sent = 0
    with app.producer_or_acquire() as prod:
        for run_id in run_ids:
            if interrupted:
                what, seq = st.rerun_point(run_id)
                step = None
                what = "coordinate" if what == "running" else what
            else:
                what, seq, step = st.resume_point(run_id)
            if what in ("coordinate", "step") and not gate.reenter(run_id):
                sent += 1  # waits for a place under max_in_flight: the gate sends it
                continue
            if what == "coordinate":
                app.send_task(keys.TASK_COORDINATE, args=(run_id, seq), producer=prod)
            elif what == "step" and step is not None:
                task = keys.TASK_BY_PHASE[parse_step_key(step)[0]]
                app.send_task(task, args=(run_id, step), producer=prod)
            else:
                continue
            sent += 1
    return sent


class RunHandle:
    """A submitted run: ask its status, follow its events, wait for its result, cancel it."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def __repr__(self) -> str:
        return f"RunHandle({self.run_id!r})"

    def status(self) -> str:
        """``queued``, ``running`` or a finished status."""
        found = store().status(self.run_id)
        if found is None:
            raise LookupError(f"run {self.run_id} not found (expired or never submitted)")
        return found

    def done(self) -> bool:
        return self.status() in FINISHED_STATUSES

    def events(self, *, follow: bool = True, timeout: float | None = None) -> Iterator[Event]:
        """The run's events in order; with ``follow`` keep yielding until it finishes."""
        if follow:
            yield from store().follow_events(self.run_id, timeout_s=timeout)
        else:
            for _, event in store().events(self.run_id):
                yield event

    def result(self, timeout: float | None = None) -> RunResult:
        """Block until the run finishes (``RunTimeout`` after ``timeout`` seconds)."""
        st = store()
        if st.status(self.run_id) not in FINISHED_STATUSES:
            for _ in st.follow_events(self.run_id, timeout_s=timeout):
                pass
        return st.result(self.run_id)

    def cancel(self) -> bool:
        """Stop the run after its current step; False if it had already finished."""
        return store().cancel_run(self.run_id)

    def resume(self) -> bool:
        """Re-enqueue the run if it is not finished (a cancelled run is re-opened)."""
        return resume_runs([self.run_id]) == 1


class BatchHandle:
    """A submitted batch: progress, results in input order, cancel, resume.

    The handle :meth:`Team.submit_batch` returns keeps the batch's inputs (``kept``):
    while it is followed (results, progress), runs an evicting Redis lost are submitted
    again (:mod:`orchestration.client.keeper`). A handle made from an id alone cannot.
    """

    def __init__(self, batch_id: str, kept: KeptBatch | None = None) -> None:
        self.batch_id = batch_id
        self.kept = kept
        self._repairing = threading.Lock()  # one sweep at a time: its writes then land

    def __repr__(self) -> str:
        return f"BatchHandle({self.batch_id!r})"

    def run_ids(self, start: int = 0, end: int = -1) -> list[str]:
        if self.kept is not None:
            ids = self.kept.run_ids()
            return ids[start:] if end == -1 else ids[start : end + 1]
        return list(store().r.lrange(keys.batch_runs(self.batch_id), start, end))

    def repair(self, *, force: bool = False) -> Sweep | None:
        """When Redis evicted keys since the last look (or ``force``), submit again the
        batch's runs that went and re-send the others' messages; what was found (None:
        nothing looked at, or the handle keeps no inputs)."""
        if self.kept is None:
            return None
        with self._repairing:
            if not self.kept.due(store().r, force=force):
                return None
            found = self.kept.sweep(store().r)
            if found.damaged or found.resend:
                try:
                    resend_lost(self.kept, found)
                except (StoreFull, redis.exceptions.RedisError) as exc:
                    # Following the batch goes on; the next look tries again.
                    log.warning("batch %s: sending lost runs again failed: %s", self.batch_id, exc)
                    self.kept.look_again()
            return found

    def progress(self, *, check_workers: bool = False) -> dict[str, Any]:
        """Counts by outcome, total, spend so far, and what unfinished runs wait on.

        Args:
            check_workers: also ask the broker whether any worker consumes each of
                Duet's queues (waits up to a second for the answers); a queue nobody
                consumes is listed in ``waits``.
        """
        self.repair()
        raw = store().r.hgetall(keys.batch(self.batch_id))
        if not raw and self.kept is not None:  # evicted: written again, or as kept here
            self.repair(force=True)
            raw = store().r.hgetall(keys.batch(self.batch_id)) or {
                k: str(v) for k, v in self.kept.record().items()
            }
        if not raw:
            raise LookupError(f"batch {self.batch_id} not found (expired or never submitted)")
        counts = {
            k.split(":", 1)[1]: int(v) for k, v in raw.items() if k.startswith("status:") and int(v)
        }
        budget = None
        if raw.get("budgeted") == "1":
            state = get_budget(f"batch:{self.batch_id}")
            budget = {
                unit: {"limit": limit, "spent": state.spent.value(unit)}
                for unit, limit in state.limits.items()
            }
        done, total = int(raw.get("done", 0)), int(raw.get("total", 0))
        return {
            "batch_id": self.batch_id,
            "total": total,
            #: Per limited unit of the batch's budget: its limit and what is spent.
            "budget": budget,
            "done": done,
            "counts": counts,
            #: Inputs refused before running (stored by the CLI with the batch).
            "rejected": batches.rejected_count(store().r, self.batch_id),
            "usd": float(raw.get("usd", 0.0)),
            "tokens": int(raw.get("tokens", 0)),
            "calls": int(raw.get("calls", 0)),
            "created_at": float(raw.get("created_at", 0.0)),
            #: The batch's cap on runs in flight (None: none).
            "max_in_flight": limit_of(raw) or None,
            #: What unfinished runs wait on now, in words (rate limits, a spent budget).
            "waits": self._waits(raw, budget, check_workers) if done < total else [],
        }

    def rejected(self) -> list[dict[str, Any]]:
        """Inputs of the batch refused before running (``index``, ``id``, ``source``,
        ``line``, ``reason``), in input order; the CLI stores them when it submits."""
        return batches.rejected(store().r, self.batch_id)

    def _waits(
        self, raw: dict[str, str], budget: dict[str, Any] | None, check_workers: bool = False
    ) -> list[str]:
        waits = []
        spec_id = raw.get("spec_id")
        limit = limit_of(raw)
        if limit:
            waiting = BatchGate(store().r).waiting(self.batch_id)
            if waiting:
                waits.append(f"max_in_flight {limit}: {waiting} run(s) waiting for a place")
        if check_workers:
            idle = queues_without_workers()
            if idle:
                waits.append(f"no worker is consuming queue {', '.join(idle)}")
        for unit, b in (budget or {}).items():
            if b["limit"] is not None and b["spent"] >= b["limit"]:
                waits.append(
                    f"batch budget spent ({unit} {b['spent']:g} of {b['limit']:g}): "
                    "each run stops at its next round"
                )
        if self.kept is not None:
            waits += rate_limit_waits(self.kept.spec)
        elif spec_id:
            with contextlib.suppress(LookupError):  # expired before the batch's record
                waits += rate_limit_waits(store().load_spec(spec_id))
        waits += vendor_batch_waits(self.batch_id)
        return waits

    def done(self) -> bool:
        p = self.progress()
        return p["done"] >= p["total"]

    def results(self, timeout: float | None = None) -> Iterator[RunResult]:
        """Every run's result in input order, each yielded as soon as it (and those
        before it) finished. Reads run ids in pages, so memory stays flat."""
        if self.kept is not None:
            yield from self._kept_results(self.kept, timeout)
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        start = 0
        page = 500
        while True:
            ids = self.run_ids(start, start + page - 1)
            if not ids:
                return
            for run_id in ids:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    if left == 0.0:
                        raise RunTimeout(run_id)
                    result = RunHandle(run_id).result(timeout=left)
                except RunTimeout:
                    # The batch's timeout, as given: not what was left of it for this run.
                    raise RunTimeout(
                        f"batch {self.batch_id} did not finish within {timeout:g}s"
                    ) from None
                yield result
            start += page

    def _kept_results(self, kept: KeptBatch, timeout: float | None) -> Iterator[RunResult]:
        """:meth:`results` of a kept batch: each wait looks for evicted runs every
        :data:`LOOK_EVERY_S`, and a run found gone is waited on under its new id."""
        deadline = None if timeout is None else time.monotonic() + timeout
        st = store()
        gone_since: float | None = None
        for position in range(len(kept)):
            while True:
                run_id = kept.current(position)
                status = st.status(run_id)
                if status in FINISHED_STATUSES:
                    with contextlib.suppress(LookupError):  # gone since: looked at again
                        result = st.result(run_id)
                        kept.saw_finished(run_id, result.status)
                        yield result
                        break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RunTimeout(f"batch {self.batch_id} did not finish within {timeout:g}s")
                if status is None:  # gone: sent again once its eviction is sure
                    self.repair(force=True)
                    if kept.current(position) != run_id:
                        continue
                    gone_since = gone_since or time.monotonic()
                    if time.monotonic() - gone_since > GONE_GRACE_S and not kept.evictions_seen():
                        raise LookupError(f"run {run_id} not found (expired or deleted)")
                    time.sleep(LOOK_EVERY_S)
                    continue
                gone_since = None
                with contextlib.suppress(RunTimeout, LookupError):
                    for _ in st.follow_events(
                        run_id, timeout_s=min(left or LOOK_EVERY_S, LOOK_EVERY_S)
                    ):
                        pass
                self.repair()

    def wait(self, timeout: float | None = None) -> None:
        """Block until every run of the batch finished."""
        for _ in self.results(timeout=timeout):
            pass

    def cancel(self) -> int:
        """Cancel every unfinished run; returns how many were flagged."""
        st = store()
        return sum(st.cancel_run(run_id) for run_id in self.run_ids())

    def resume(self, *, interrupted: bool = False) -> int:
        """Re-enqueue every run that is not finished (cancelled runs are re-opened).

        Safe to call any time: a step whose result is stored is never run again, a step
        another worker holds is left to it, and a transition already made is a no-op.
        With ``interrupted``, re-run the batch's ``interrupted`` runs instead, from where
        each stopped (the step that stopped it runs again; the others are kept).
        Returns how many runs were re-enqueued.
        """
        count = 0
        start = 0
        while ids := self.run_ids(start, start + SUBMIT_CHUNK - 1):
            count += resume_runs(ids, interrupted=interrupted)
            start += SUBMIT_CHUNK
        return count
