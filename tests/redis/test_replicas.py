"""Writes that must survive a failover wait for a replica (``DUET_REDIS_MIN_REPLICAS``):
acknowledged only when one has them, an outage (tried again) when none does in time,
also when the primary has lost its scripts (a new primary after a failover)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis

from duet.embedded import EmbeddedRedis
from orchestration.core.budget import Amount, Budget
from orchestration.settings import get_settings
from orchestration.state import outages, replicas
from orchestration.state.budgets import BudgetLedger
from tests.support import wait_for


@pytest.fixture
def wait_for_one() -> Iterator[None]:
    """``DUET_REDIS_MIN_REPLICAS=1`` (2 s to wait: the machine may be busy) for the test."""
    os.environ.update(DUET_REDIS_MIN_REPLICAS="1", DUET_REDIS_WAIT_TIMEOUT_S="2")
    get_settings.cache_clear()
    yield
    for name in ("DUET_REDIS_MIN_REPLICAS", "DUET_REDIS_WAIT_TIMEOUT_S"):
        os.environ.pop(name, None)
    get_settings.cache_clear()


@pytest.fixture
def primary() -> Iterator[redis.Redis]:
    with EmbeddedRedis() as server, redis.Redis(port=server.port, decode_responses=True) as c:
        yield c


def _in_sync(primary: redis.Redis) -> bool:
    info = primary.info("replication")
    return info.get("slave0", {}).get("state") == "online"


@pytest.fixture
def replica(primary: redis.Redis) -> Iterator[redis.Redis]:
    """A replica of ``primary``, in sync."""
    port = primary.connection_pool.connection_kwargs["port"]
    with EmbeddedRedis() as server, redis.Redis(port=server.port, decode_responses=True) as c:
        c.replicaof("127.0.0.1", port)
        wait_for(lambda: _in_sync(primary) and c.info("replication").get("master_link_status")
                 == "up", 20, "the replica to sync")  # fmt: skip
        yield c


def test_without_a_replica_a_hold_is_not_acknowledged(
    primary: redis.Redis, wait_for_one: None
) -> None:
    ledger = BudgetLedger(primary)
    with pytest.raises(replicas.NotReplicated) as err:
        ledger.reserve("step-1", ["global:x"], Amount(calls=1), lease_s=30)
    assert outages.is_outage(err.value)  # retried as Redis being away, never dropped
    assert "0 of the 1 replicas" in str(err.value)


def test_with_a_replica_the_write_is_on_it_when_acknowledged(
    primary: redis.Redis, replica: redis.Redis, wait_for_one: None
) -> None:
    ledger = BudgetLedger(primary)
    ledger.set_limits("global:x", Budget(max_calls=5))
    assert ledger.reserve("step-1", ["global:x"], Amount(calls=1), lease_s=30) is None
    # Acknowledged: the replica has the hold already (no waiting here).
    assert BudgetLedger(replica).get("global:x").reserved.calls == 1


def test_scripts_a_new_primary_lacks_are_loaded_and_still_waited_for(
    primary: redis.Redis, replica: redis.Redis, wait_for_one: None
) -> None:
    ledger = BudgetLedger(primary)
    ledger.set_limits("global:x", Budget(max_calls=5))
    primary.script_flush()
    assert ledger.reserve("step-2", ["global:x"], Amount(calls=1), lease_s=30) is None
    assert BudgetLedger(replica).get("global:x").reserved.calls == 1


def test_a_pipeline_of_writes_waits_too(
    primary: redis.Redis, replica: redis.Redis, wait_for_one: None
) -> None:
    pipe = primary.pipeline(transaction=False)
    pipe.set("a", 1)
    pipe.rpush("b", 2)
    assert replicas.execute(pipe) == [True, 1]
    assert replica.get("a") == "1"
    replica.replicaof("NO", "ONE")  # the replica leaves: the next write is not acknowledged
    pipe = primary.pipeline(transaction=False)
    pipe.set("a", 2)
    with pytest.raises(replicas.NotReplicated):
        replicas.execute(pipe)


def test_with_no_replica_asked_for_nothing_waits(primary: redis.Redis) -> None:
    assert get_settings().redis_min_replicas == 0
    ledger = BudgetLedger(primary)
    assert ledger.reserve("step-1", ["global:x"], Amount(calls=1), lease_s=30) is None
