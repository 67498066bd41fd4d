"""Every Redis key and queue name Duet uses, in one place.

All keys share the ``duet:`` prefix, and the broker's (queues, kombu's unacknowledged
and binding keys) ``duet.`` (kombu's ``global_keyprefix``): both follow ``DUET_KEY_PREFIX``,
so a database shared with other apps, or with another Duet, holds no key of theirs. Keys of one run share the ``{run_id}`` hash tag so a
Redis Cluster keeps them on one slot and the Lua scripts may touch them together.
"""

from __future__ import annotations

import os

PREFIX = os.environ.get("DUET_KEY_PREFIX", "duet")

# --- queues ---------------------------------------------------------------
QUEUE_ACTOR = "actor"
QUEUE_CRITIC = "critic"
QUEUE_COORDINATOR = "coordinator"
#: Tool calls an agent's turn asked for, each a task of its own.
QUEUE_TOOLS = "tools"
ALL_QUEUES = (QUEUE_ACTOR, QUEUE_CRITIC, QUEUE_COORDINATOR, QUEUE_TOOLS)
#: kombu's ``global_keyprefix``: the broker's keys are this + kombu's name (queue
#: ``actor`` is the list ``duet.actor``, kombu's ``unacked`` hash is ``duet.unacked``).
BROKER_PREFIX = f"{PREFIX}."


def queue_key(queue: str, priority: int = 0) -> str:
    """List: the messages waiting in broker queue ``queue`` (kombu pushes on the left);
    a non-zero kombu ``priority`` has its own list, ``queue\\x06\\x16<priority>``, popped
    after the plain one (on Redis, lower is sooner)."""
    return f"{BROKER_PREFIX}{queue}\x06\x16{priority}" if priority else f"{BROKER_PREFIX}{queue}"


#: kombu's priority of a run's first actor step under depth-first scheduling: its list is
#: popped after the later steps of runs already started (kombu's last ``priority_steps``).
DRAFT_PRIORITY = 9
#: Every list a queue's messages can wait in: the plain one and the drafts'.
QUEUE_PRIORITIES = (0, DRAFT_PRIORITY)


def dead_letters() -> str:
    """Stream, capped: broker messages no worker could take (not JSON, or without Celery's
    envelope), each with its queue, the reason and the text as popped (``duet dead``)."""
    return f"{PREFIX}:dead"


# --- task names (clients enqueue by name, never by import) -----------------
TASK_GENERATE = "duet.generate"
TASK_REFINE = "duet.refine"
TASK_CRITIQUE = "duet.critique"
TASK_COORDINATE = "duet.coordinate"
#: Vendor batch execution: submit a group's parked requests; check a submitted batch.
TASK_VB_COLLECT = "duet.vendor_batch_collect"
TASK_VB_POLL = "duet.vendor_batch_poll"
#: One tool call of an agent's turn: ``(run_id, call_ref)``.
TASK_TOOL = "duet.tool"

#: Which queue each task is sent to (workers and clients route by this).
TASK_QUEUES = {
    TASK_GENERATE: QUEUE_ACTOR,
    TASK_REFINE: QUEUE_ACTOR,
    TASK_CRITIQUE: QUEUE_CRITIC,
    TASK_COORDINATE: QUEUE_COORDINATOR,
    # short bookkeeping tasks, like the coordinator's
    TASK_VB_COLLECT: QUEUE_COORDINATOR,
    TASK_VB_POLL: QUEUE_COORDINATOR,
    TASK_TOOL: QUEUE_TOOLS,
}

#: The step task for each phase of the loop.
TASK_BY_PHASE = {"generate": TASK_GENERATE, "critique": TASK_CRITIQUE, "refine": TASK_REFINE}


def call_cache(part: str) -> str:
    """The model-call cache (:mod:`orchestration.state.callcache`), one hash tag for all:
    ``entries`` (hash key -> answer), ``used`` / ``stored`` (sorted sets key -> last use /
    written), ``stats`` (hash: hits, misses, bytes)."""
    return f"{PREFIX}:{{cache}}:{part}"


def spec(spec_id: str) -> str:
    """JSON of an immutable, content-addressed loop spec (agents, rounds, templates)."""
    return f"{PREFIX}:spec:{spec_id}"


def run(run_id: str) -> str:
    """Hash: the run record (status, prompt, user, counters, final result fields)."""
    return f"{PREFIX}:run:{{{run_id}}}"


def run_steps(run_id: str) -> str:
    """Hash: step key -> JSON of the stored step result (text, usage, stop reason)."""
    return f"{PREFIX}:run:{{{run_id}}}:steps"


def run_inputs(run_id: str) -> str:
    """Hash: step key -> JSON of the step's rendered input (role, prompt), as runs recorded
    before inputs moved into the record (``in:<step key>`` fields) keep them; read by the
    begin script when the record has none, given the finished TTL with the run."""
    return f"{PREFIX}:run:{{{run_id}}}:inputs"


def run_events(run_id: str) -> str:
    """Stream: the run's ordered events."""
    return f"{PREFIX}:run:{{{run_id}}}:events"


def step_claim(run_id: str, step_key: str) -> str:
    """String with a lease: which worker is calling the model for this step now."""
    return f"{PREFIX}:run:{{{run_id}}}:claim:{step_key}"


def process(process_id: str) -> str:
    """String with a short TTL: worker process ``process_id`` is alive (it renews the key
    every few seconds; see orchestration/state/processes.py)."""
    return f"{PREFIX}:proc:{process_id}"


def key_policy(digest: str) -> str:
    """String with a short TTL: a key policy live workers hold (JSON of variable -> hosts,
    :mod:`orchestration.core.key_policy`), under its digest; renewed with their liveness."""
    return f"{PREFIX}:keypolicy:{digest}"


def key_policies() -> str:
    """Set: the digests of the key policies workers published (a gone key is dropped)."""
    return f"{PREFIX}:keypolicies"


def processes_since() -> str:
    """String with a short TTL: since when (epoch ms) worker processes have been renewing
    their liveness keys without a break. Gone after a Redis outage (every liveness key
    lapses at once then): no claim is presumed dead until the fleet has had a whole TTL
    to say it is alive again."""
    return f"{PREFIX}:procs:since"


def process_held(process_id: str) -> str:
    """Hash: the broker messages worker process ``process_id`` holds (delivered, not yet
    acknowledged), delivery tag -> run id, as of its last sign of life: put back on their
    queues as soon as it is found dead (it outlives the liveness key a while)."""
    return f"{PREFIX}:proc:{process_id}:held"


def processes() -> str:
    """Sorted set: worker process id -> its last sign of life (epoch ms), so that one whose
    liveness key lapsed is noticed (and its claims sent on) at once, not by the sweep."""
    return f"{PREFIX}:procs"


def runs_moved() -> str:
    """Sorted set: ids of runs not finished, scored by when they were last seen to move
    (created, resumed, sent on by the sweep); a transition notes its time in the record
    (``moved_at``) instead, and the sweep moves a run it finds moved since up to that time
    before it reads the ones that stopped (see ``RunStore.stale_runs``)."""
    return f"{PREFIX}:runs:moved"


def sweeper_lock() -> str:
    """String with a TTL: which worker runs the periodic sweep now (one at a time)."""
    return f"{PREFIX}:sweeper"


def run_turns(run_id: str) -> str:
    """Hash: the turns of the run's agent runs that call tools (``orchestration.state.turns``):
    ``<step>|t<n>`` a stored turn (the model's answer and the calls it asked for),
    ``<step>|t<n>|<i>`` a call's stored result, ``<step>|t<n>|<i>|run`` who runs it,
    ``<step>|t<n>|left`` the calls without a result."""
    return f"{PREFIX}:run:{{{run_id}}}:turns"


def tools() -> str:
    """Hash: tool name -> JSON of its spec, as the workers that know it publish it at start
    (a submit naming a tool not here is refused)."""
    return f"{PREFIX}:tools"


def run_keys(run_id: str) -> tuple[str, ...]:
    """Every long-lived key of one run (for TTLs and deletion)."""
    return (
        run(run_id),
        run_steps(run_id),
        run_inputs(run_id),
        run_events(run_id),
        run_turns(run_id),
        run_settled(run_id),
    )


def batch(batch_id: str) -> str:
    """Hash: batch record and its outcome counters."""
    return f"{PREFIX}:batch:{{{batch_id}}}"


def batch_runs(batch_id: str) -> str:
    """List: the batch's run ids in input order."""
    return f"{PREFIX}:batch:{{{batch_id}}}:runs"


def batch_events(batch_id: str) -> str:
    """Stream: one entry per finished run of the batch (for live progress)."""
    return f"{PREFIX}:batch:{{{batch_id}}}:finished"


def open_runs() -> str:
    """Sorted set: ids of runs not finished, scored by submit time (runs in flight).

    Added when runs are created (and when resume re-opens a cancelled one), removed by
    the transition that finishes a run.
    """
    return f"{PREFIX}:runs:open"


def batches_index() -> str:
    """Sorted set: batch ids by submit time."""
    return f"{PREFIX}:batches"


def batch_rejected(batch_id: str) -> str:
    """List: JSON of each input of the batch that was rejected (never run), in input order."""
    return f"{PREFIX}:batch:{{{batch_id}}}:rejected"


def conversation(team: str, worker: str, scope: str) -> str:
    """List: one persistent subagent conversation (team x worker x user, or x run)."""
    return f"{PREFIX}:conv:{team}:{worker}:{scope}"


def budget(scope: str) -> str:
    """Hash: one budget scope's limits, spent and reserved counters."""
    return f"{PREFIX}:budget:{scope}"


def budget_keys(scope: str) -> tuple[str, str, str]:
    """Every key of one budget scope: limits and counters, lease expiries, holds."""
    return (budget(scope), budget_reservations(scope), budget_holds(scope))


def budget_index() -> str:
    """Set: the ``global:`` and ``user:`` scopes that were given limits (for monitoring)."""
    return f"{PREFIX}:budgets"


def budget_reservations(scope: str) -> str:
    """Sorted set: open reservations of one scope, scored by lease expiry."""
    return f"{PREFIX}:budget:{scope}:leases"


def budget_holds(scope: str) -> str:
    """Hash: step id -> amount held by that step's open reservation in one scope; and
    ``!limit`` while the scope has a limit set (``lua/budget_common.lua``: a limit lost
    from the budget hash is then an error, not "unlimited")."""
    return f"{PREFIX}:budget:{scope}:holds"


def budget_settled(step_id: str) -> str:
    """Hash: the model calls (hold ids, ``<run id>:<step key>:<claim>``) of one run whose
    usage was settled, so a store tried again charges once. Without a TTL while the run
    is open (a ``volatile-*`` policy cannot evict it); given the finished TTL with it."""
    return run_settled(step_id.partition(":")[0])


def run_settled(run_id: str) -> str:
    """See :func:`budget_settled`."""
    return f"{PREFIX}:run:{{{run_id}}}:settled"


def rate_limit(name: str) -> str:
    """Hash: one rate limit's GCRA state (``lua/rate_acquire.lua``): each dimension's
    theoretical arrival time, what the vendor's headers taught and when, a bucket pause.
    ``name`` is :func:`orchestration.core.ratelimit.limit_name`'s."""
    return f"{PREFIX}:rate:{name}"


def rate_permits(name: str) -> str:
    """Sorted set: one rate limit's permits not yet settled or given back, scored by
    expiry (server microseconds); a worker that died leaves its permit to lapse."""
    return f"{PREFIX}:rate:{name}:permits"


def rate_limits() -> str:
    """Hash: ``provider:model[@endpoint]`` -> JSON of its configured fleet-wide rate limits."""
    return f"{PREFIX}:ratelimits"


def rate_pause(name: str) -> str:
    """Fleet-wide pause after a vendor 429 with Retry-After, for a rate limit ``name``."""
    return f"{PREFIX}:pause:{name}"


# --- vendor batches (see orchestration/state/vendorbatches.py) ----------------------
def vb_request(run_id: str, step_key: str) -> str:
    """String: one parked step's request (JSON), until its result is stored."""
    return f"{PREFIX}:vb:req:{run_id}:{step_key}"


def vb_pending(group: str) -> str:
    """Sorted set: parked requests of one group not yet submitted, scored by park time."""
    return f"{PREFIX}:vb:pending:{group}"


def vb_taking(group: str) -> str:
    """Sorted set: requests a collector took to submit, scored by when (a dead collector's
    are put back)."""
    return f"{PREFIX}:vb:taking:{group}"


def vb_collect(group: str) -> str:
    """Marker that a collector for the group is scheduled."""
    return f"{PREFIX}:vb:collect:{group}"


def vb_batch(vendor_batch_id: str) -> str:
    """Hash: one submitted vendor batch (group, provider, submitted_at, requests, polls)."""
    return f"{PREFIX}:vb:batch:{vendor_batch_id}"


def vb_batch_requests(vendor_batch_id: str) -> str:
    """Hash: custom id -> parked request (``run_id|step_key``) of one vendor batch."""
    return f"{PREFIX}:vb:batch:{vendor_batch_id}:requests"


def vb_active() -> str:
    """Set: vendor batches submitted and not yet finished."""
    return f"{PREFIX}:vb:active"


def vb_of_batch(batch_id: str) -> str:
    """Set: vendor batches holding requests of one Duet batch (for ``duet watch``)."""
    return f"{PREFIX}:vb:of:{batch_id}"


def token_ratio(provider: str, model: str) -> str:
    """Hash: what one model's reported usage says of its tokenizer (samples, smallest
    bytes-per-token ratio seen); see orchestration/state/tokenratio.py."""
    return f"{PREFIX}:tokratio:{provider}:{model}"


def batch_gate(batch_id: str) -> str:
    """Set: the ids of the batch's runs holding a place under its ``max_in_flight``
    (started, or handed a place, and not finished)."""
    return f"{PREFIX}:batch:{{{batch_id}}}:gate"


def batch_waiting(batch_id: str) -> str:
    """Sorted set: the ids of the batch's runs waiting for a place, by input position."""
    return f"{PREFIX}:batch:{{{batch_id}}}:waiting"


def gated_batches() -> str:
    """Set: ids of the batches with runs waiting for a place (the sweep hands theirs on)."""
    return f"{PREFIX}:batches:gated"
