"""Vendor batch execution on a worker: park a step's request, collect, submit, poll.

A step of an agent with ``execution="vendor_batch"`` makes no model call (see
:meth:`orchestration.services.step.StepService.run`): after its budget reservation it parks its request here,
and the first park of a group schedules the group's collector. The collector task takes
the group's parked requests when enough have gathered or the oldest has waited
``DUET_VENDOR_BATCH_GATHER_S``, submits them as one vendor batch and schedules the
poller. The poller task checks the batch with backoff (up to
``DUET_VENDOR_BATCH_POLL_MAX_S`` between checks); when it has ended it stores each step's
result (:meth:`orchestration.services.step.StepService.store_batch_outcome`: priced at the batch rate, settled once,
the run handed back to its coordinator) and forgets the batch. A request the vendor let
expire is parked again while attempts remain; any other failure interrupts its own run
only. When every request of a batch belongs to a cancelled run, the vendor batch is
cancelled.

Both tasks are idempotent: a redelivered collector finds nothing to take or takes what a
dead collector left; a redelivered poller stores nothing twice (results are stored once,
settlements are made once).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from orchestration.core.agents import AgentSpec
from orchestration.core.errors import ProviderError
from orchestration.core.loop import parse_step_key
from orchestration.core.vendor_batch import custom_id, group_of, poll_delay
from orchestration.defaults import VENDOR_BATCH_HOLD_S, VENDOR_BATCH_RECLAIM_S
from orchestration.services.step import FanOut, Handover, Park
from orchestration.settings import get_settings
from orchestration.state import keys
from orchestration.state.vendorbatches import VendorBatchStore, split_member
from workers import metrics
from workers.providers import provider_for
from workers.providers.batch import BatchRequest
from workers.runtime import (
    coordinator_send,
    failures_of,
    follow,
    get_steps,
    get_store,
    send,
    send_later,
)

log = logging.getLogger(__name__)


_store: VendorBatchStore | None = None


def batches() -> VendorBatchStore:
    """The process's vendor batch store, on the run store's client."""
    global _store
    runs = get_store()
    if _store is None or _store.r is not runs.r:
        _store = VendorBatchStore(runs.r, ttl_s=runs.finished_ttl_s)
    return _store


def park_step(task: Any, parking: Park) -> None:
    """Body of a step task for a ``vendor_batch`` agent: reserve its budget, park it."""
    request = get_steps().reserve_parked(parking, VENDOR_BATCH_HOLD_S, failures_of(task))
    if isinstance(request, dict):
        park(parking.seat.agent, parking.run_id, parking.key, request)
    else:
        follow(task, request)


def _hand(handover: Handover) -> None:
    """Send the run to its coordinator (outside a step task: nothing to retry)."""
    coordinator_send(handover.run_id, handover.seq)


def _hand_on(store: VendorBatchStore, group: str, step_key: str, next_: Handover | FanOut) -> None:
    """A parked step's outcome is stored: hand the run on, and forget the request. A turn
    that asked for tools is forgotten *first*: its last tool call sends the step again,
    whose next turn parks under the same step (a lost send is the sweep's to redo)."""
    run_id = next_.run_id
    if isinstance(next_, FanOut):
        store.forget(group, run_id, step_key)
        for ref in next_.refs:
            send(keys.TASK_TOOL, (run_id, ref))
        return
    _hand(next_)
    store.forget(group, run_id, step_key)


def park(agent: AgentSpec, run_id: str, step_key: str, request: dict[str, Any]) -> bool:
    """Park one step's request; schedule its group's collector when none is. True when
    parked now (False: an earlier delivery of the step parked it)."""
    settings = get_settings()
    group = group_of(agent)
    new, schedule = batches().park(
        group, run_id, step_key, {**request, "group": group}, settings.vendor_batch_gather_s
    )
    if schedule:
        send_later(keys.TASK_VB_COLLECT, (group,), settings.vendor_batch_gather_s)
    return new


def collect(group: str) -> None:
    """Body of the collector task: submit the group's parked requests when due."""
    settings = get_settings()
    store, runs = batches(), get_store()
    take = store.take(
        group,
        max_requests=settings.vendor_batch_max_requests,
        gather_s=settings.vendor_batch_gather_s,
        reclaim_s=VENDOR_BATCH_RECLAIM_S,
    )
    if not take.members:
        if take.wait_s > 0:
            send_later(keys.TASK_VB_COLLECT, (group,), take.wait_s)
        return
    parked = store.requests(take.members)
    live: dict[str, dict[str, Any]] = {}
    for m, request in parked.items():
        run_id, step_key = split_member(m)
        if request is None:  # its step is over already
            store.forget(group, run_id, step_key)
        elif runs.r.hget(keys.run(run_id), "cancelled") == "1":
            _drop_cancelled(store, group, run_id, step_key, request)
        else:
            live[m] = request
    if live:
        _submit(store, group, live)
    if store.pending(group):
        send_later(keys.TASK_VB_COLLECT, (group,), 0)


def _drop_cancelled(
    store: VendorBatchStore, group: str, run_id: str, step_key: str, request: dict[str, Any]
) -> None:
    """A parked request of a cancelled run is never sent: release its hold, end its step."""
    _hand(get_steps().release_parked(run_id, step_key, request))
    store.forget(group, run_id, step_key)


def _submit(store: VendorBatchStore, group: str, live: dict[str, dict[str, Any]]) -> None:
    first = next(iter(live.values()))
    agent = get_steps().agent_of(first)
    requests, by_custom_id = [], {}
    for m, request in live.items():
        run_id, step_key = split_member(m)
        cid = custom_id(run_id, step_key)
        by_custom_id[cid] = m
        requests.append(
            BatchRequest(
                cid,
                get_steps().agent_of(request),
                request["messages"],
                bool(request.get("structured")),
            )
        )
    adapter: Any = provider_for(agent)
    try:
        batch_id = adapter.submit_batch(requests)
    except ProviderError as exc:
        if exc.transient:  # try again soon; the requests stay parked
            log.info("vendor batch of %d requests not accepted (%s); retrying", len(live), exc.kind)
            store.put_back(group, list(live))
            send_later(keys.TASK_VB_COLLECT, (group,), get_settings().vendor_batch_gather_s)
            return
        for m, request in live.items():  # refused for good: each step ends with the error
            run_id, step_key = split_member(m)
            _hand_on(
                store,
                group,
                step_key,
                get_steps().store_batch_outcome(run_id, step_key, request, exc, vendor_batch=None),
            )
        return
    duet_batches = {r["batch_id"] for r in live.values() if r.get("batch_id")}
    store.record(
        batch_id,
        group,
        f"{first['spec_id']}|{first['role']}",
        by_custom_id,
        duet_batches,
        time.time(),
    )
    log.info("submitted vendor batch %s: %d requests", batch_id, len(requests))
    send_later(keys.TASK_VB_POLL, (batch_id,), poll_delay(0, **_poll_bounds()))


def _poll_bounds() -> dict[str, float]:
    settings = get_settings()
    return {
        "first_s": min(1.0, settings.vendor_batch_poll_max_s),
        "max_s": settings.vendor_batch_poll_max_s,
    }


def poll(batch_id: str) -> None:
    """Body of the poller task: check the vendor batch; store its results once it ended."""
    store, runs = batches(), get_store()
    batch = store.batch(batch_id)
    if batch is None:  # finished by an earlier delivery
        return
    spec_id, _, role = batch.seat.partition("|")
    adapter_agent = get_steps().agent_of({"spec_id": spec_id, "role": role})
    adapter: Any = provider_for(adapter_agent)
    members = list(batch.requests.values())
    if not batch.cancel_requested and members:
        pipe = runs.r.pipeline()
        for m in members:
            pipe.hget(keys.run(split_member(m)[0]), "cancelled")
        if all(flag == "1" for flag in pipe.execute()):
            log.info("every run of vendor batch %s is cancelled: cancelling it", batch_id)
            try:
                adapter.cancel_batch(batch_id)
                store.cancel_requested(batch_id)
            except ProviderError as exc:
                log.warning("cancelling vendor batch %s failed: %s", batch_id, exc.kind)
    try:
        status = adapter.poll_batch(batch_id)
    except ProviderError as exc:
        if not exc.transient:
            log.error("vendor batch %s cannot be read: %s", batch_id, exc)
        status = None
    if status is None or not status.ended:
        polls = store.polled(batch_id)
        send_later(keys.TASK_VB_POLL, (batch_id,), poll_delay(polls, **_poll_bounds()))
        return
    parked = store.requests(members)
    expected = {
        cid: bool((parked.get(m) or {}).get("structured")) for cid, m in batch.requests.items()
    }
    outcomes = adapter.batch_results(batch_id, expected)
    max_attempts = get_settings().max_attempts
    for cid, m in batch.requests.items():
        run_id, step_key = split_member(m)
        request = parked.get(m)
        if request is None:  # stored by an earlier delivery of this poll
            continue
        outcome = outcomes[cid]
        attempts = int(request.get("attempts") or 0) + 1
        if isinstance(outcome, ProviderError) and outcome.transient and attempts < max_attempts:
            if metrics.ENABLED:
                metrics.call_failed(
                    adapter_agent, parse_step_key(step_key)[0], outcome.kind, retried=True
                )
            store.repark(batch.group, run_id, step_key, {**request, "attempts": attempts})
            send_later(keys.TASK_VB_COLLECT, (batch.group,), 0)
            continue
        _hand_on(
            store,
            batch.group,
            step_key,
            get_steps().store_batch_outcome(
                run_id, step_key, request, outcome, vendor_batch=batch_id
            ),
        )
    store.finish(batch_id)
