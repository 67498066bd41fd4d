"""Duet's tunables that are not settings: each a named constant with its unit and why.

The ``DUET_*`` environment variables (:mod:`orchestration.settings`) take their defaults
from the ``DEFAULT_*`` names here; the others are fixed, kept in one place so anyone can
see what a worker waits for, batches or trusts, and for how long. Backoff policies (first
wait, cap, jitter) are in :mod:`orchestration.backoff`.
"""

from __future__ import annotations

# --- settings' defaults -----------------------------------------------------
#: Seconds a finished run (record, steps, events) is kept; DUET_FINISHED_TTL_S overrides.
DEFAULT_FINISHED_TTL_S = 7 * 24 * 3600
#: Seconds a step claim lives unless renewed: a worker renews the claims of its calls in
#: flight (every third of this), so a worker that dies mid-call frees its step after this.
DEFAULT_STEP_LEASE_S = 60
#: Seconds a worker process's liveness key lives unless renewed (every third of this):
#: a claim whose process has no such key is dead and taken over at once.
DEFAULT_PROCESS_TTL_S = 10

# --- the broker ----------------------------------------------------------------
#: Messages one pop takes at most (``BLMPOP ... COUNT``), bounded by the consumer's credit.
POP_MAX = 16
#: Acks (a count) removed from the unacked set in one command once this many are pending,
#: or with the next note of popped messages, the pop after an empty one, or the close.
ACK_BATCH = 32
#: Seconds between two warnings while Redis refuses the broker's writes (an outage).
OOM_WARN_EVERY_S = 30.0

# --- patience while Redis or the broker is away --------------------------------
#: Seconds a step keeps trying to store a model's answer while Redis is away.
STORE_PATIENCE_S = 120.0
#: Seconds a retry's message is kept trying while the broker is away (this thread waits)
#: before the message is given back to the broker (which the sweep backs up).
PUBLISH_PATIENCE_S = 120.0

# --- copies a process trusts -------------------------------------------------------
#: Seconds a process trusts its copy of the fleet's rate-limit table.
RATE_TABLE_TTL_S = 5.0
#: Seconds a process trusts that the fleet holds the limits a vendor's headers said,
#: before it writes them again (a change is written at once).
LEARNED_REFRESH_S = 10.0
#: Seconds a process trusts its copy of a model's token ratio.
TOKEN_RATIO_CACHE_S = 5.0

# --- the sweep -------------------------------------------------------------------
#: Seconds between two checks of which Redis server this is (at most the sweep interval).
RESTART_CHECK_S = 2.0
#: Seconds after Redis came back before the runs that have not moved since are swept:
#: the tasks that met it down retry with backoff meanwhile, and move their runs.
RESTART_GRACE_S = 8.0

# --- vendor batches ----------------------------------------------------------------
#: Seconds a parked step's budget hold lasts: the vendors' 24-hour window and an hour.
VENDOR_BATCH_HOLD_S = 25 * 3600
#: Seconds after which a request a collector took but never recorded as submitted is
#: pending again.
VENDOR_BATCH_RECLAIM_S = 120.0
