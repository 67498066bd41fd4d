"""A batch's submitter keeps its inputs, and finds what an evicting Redis lost: a run whose
record went is submitted again under a new id (its budget scopes and limits its own, its
place in the batch's list and gate), the batch's record is written again with the counts
of what finished, and a finished run whose stream entry went is still given. A record
read as gone with no eviction seen (a read mid-failover) is never sent again.

A Redis server of the tests' own: each eviction is a real one (a key of the test's,
squeezed out under ``volatile-ttl``, so Redis counts it), and the keys the test deletes
are those Redis would have evicted. No worker runs (the test finishes runs itself)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from duet.embedded.server import EmbeddedRedis
from orchestration import Agent, Team
from orchestration.client import handles, keeper
from orchestration.client.handles import BatchHandle, get_budget, set_budgets, store
from orchestration.client.keeper import Sweep
from orchestration.core.budget import Budget
from orchestration.state import keys
from tests.support import client_pointed_at, collecting, finish_run, wait_for

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def own_url() -> Iterator[str]:
    with EmbeddedRedis() as server:
        yield server.url


@pytest.fixture
def redis_client(own_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A client on the tests' own server, emptied first; the keeper's second look at a run
    read as gone may come at once."""
    monkeypatch.setattr(keeper, "CHECK_EVERY_S", 0.0)
    client = redis.Redis.from_url(own_url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def batch(redis_client: Any, own_url: str) -> Iterator[BatchHandle]:
    """Three runs, two places (``max_in_flight``), a budget per run and per actor."""
    with client_pointed_at(own_url):
        team = Team.actor_critic(
            actor=Agent("Fix.", model="sim", budget=Budget(max_calls=7)),
            critic=Agent("Judge.", model="sim"),
            budget=Budget(max_calls=9),
        )
        yield team.submit_batch(
            [{"id": f"i{n}", "prompt": f"p{n}"} for n in range(3)], max_in_flight=2
        )


def _evict(r: Any, *names: str) -> None:
    """Delete ``names`` as Redis would evict them, and make Redis evict a key for real
    (one of the test's own), so that its ``evicted_keys`` grows."""
    assert r.delete(*names) == len(names)
    before = int(r.info("stats")["evicted_keys"])
    r.set("sacrifice", "x" * 200_000, ex=60)
    r.config_set("maxmemory-policy", "volatile-ttl")
    r.config_set("maxmemory", int(r.info("memory")["used_memory"]) - 100_000)
    try:
        r.set("poke", "1")  # a write: Redis evicts first
    finally:
        r.config_set("maxmemory", 0)
        r.config_set("maxmemory-policy", "noeviction")
    assert int(r.info("stats")["evicted_keys"]) > before


def _look(batch: BatchHandle) -> Sweep:
    """Two looks, as the keeper needs to send a run again: what the second found."""
    batch.repair(force=True)
    found = batch.repair(force=True)
    assert found is not None
    return found


def test_a_run_whose_record_went_is_submitted_again(batch: BatchHandle, redis_client: Any) -> None:
    r = redis_client
    first = batch.run_ids()
    finish_run(first[0])
    assert batch.repair() is None, "Redis evicted nothing: nothing is looked at"
    _evict(r, keys.run(first[1]), keys.batch(batch.batch_id), keys.batch_runs(batch.batch_id))

    found = _look(batch)

    assert list(found.lost) == [first[1]]
    new = found.lost[first[1]].run_id
    assert batch.run_ids() == [first[0], new, first[2]]
    assert [x.decode() for x in r.lrange(keys.batch_runs(batch.batch_id), 0, -1)] == [
        first[0],
        new,
        first[2],
    ]
    run = {k.decode(): v.decode() for k, v in r.hgetall(keys.run(new)).items()}
    assert (run["status"], run["prompt"], run["input_id"]) == ("queued", "p1", "i1")
    assert sorted(run["budget_scopes"].split(",")) == [f"actor:{new}", f"run:{new}"]
    assert get_budget(f"run:{new}").limits == {"calls": 9}
    assert get_budget(f"actor:{new}").limits == {"calls": 7}
    # The batch's record, with what had finished; the lost run's place is given on.
    record = {k.decode(): v.decode() for k, v in r.hgetall(keys.batch(batch.batch_id)).items()}
    assert (record["total"], record["done"], record["status:approved"]) == ("3", "1", "1")
    places = {x.decode() for x in r.smembers(keys.batch_gate(batch.batch_id))}
    assert first[1] not in places and new in places
    progress = batch.progress()
    assert (progress["total"], progress["done"]) == (3, 1)


def test_results_wait_on_the_run_sent_again(batch: BatchHandle, redis_client: Any) -> None:
    first = batch.run_ids()
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.extend(batch.results(timeout=60)))
    reader.start()
    try:
        finish_run(first[0])
        _evict(redis_client, keys.run(first[1]))
        wait_for(lambda: batch.run_ids()[1] != first[1], 20, "the lost run to be replaced")
        finish_run(batch.run_ids()[1])
        finish_run(first[2])
        reader.join(timeout=30)
        assert not reader.is_alive()
    finally:
        for run_id in batch.run_ids():  # none left open for the reader to wait on
            if store().status(run_id) == "queued":
                finish_run(run_id)
        reader.join(timeout=10)
    assert [(r.input_id, r.status) for r in got] == [(f"i{n}", "approved") for n in range(3)]
    assert got[1].run_id == batch.run_ids()[1] != first[1]


def test_the_cli_gives_every_input_once(
    batch: BatchHandle, redis_client: Any, tmp_path: Path
) -> None:
    """`duet run`'s collector: the lost run's record once, under its input's index, and a
    finished run whose entry in the batch's stream went."""
    first = batch.run_ids()
    out = tmp_path / "out.jsonl"
    with collecting(batch, out, [0, 1, 2]) as (worker, _):
        finish_run(first[0])
        # Run 0's entry in the batch's finished stream goes with the stream.
        _evict(redis_client, keys.batch_events(batch.batch_id), keys.run(first[2]))
        wait_for(lambda: batch.run_ids()[2] != first[2], 20, "the lost run to be replaced")
        finish_run(first[1])
        finish_run(batch.run_ids()[2])
        worker.join(timeout=20)
        assert not worker.is_alive(), "every input written: collect returns"
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(x["index"], x["id"], x["status"]) for x in lines] == [
        (n, f"i{n}", "approved") for n in range(3)
    ]


def test_nothing_is_sent_again_while_redis_still_evicts(
    batch: BatchHandle, redis_client: Any
) -> None:
    """What is sent again under an evicting policy would go too (and workers hold new
    work meanwhile): the submitter waits for ``noeviction``."""
    first = batch.run_ids()
    _evict(redis_client, keys.run(first[0]))
    redis_client.config_set("maxmemory-policy", "allkeys-lru")
    try:
        assert batch.repair(force=True) is None
        assert batch.repair(force=True) is None
        assert batch.run_ids() == first
    finally:
        redis_client.config_set("maxmemory-policy", "noeviction")
    assert list(_look(batch).lost) == [first[0]]


def test_a_limit_set_since_the_submit_is_kept(own_url: str, redis_client: Any) -> None:
    """The batch's budget raised after the submit (``duet budget set``) stays raised when
    runs are sent again; only a limit that went with its hash is set again."""
    with client_pointed_at(own_url):
        team = Team.actor_critic(actor=Agent("Fix.", model="sim"), critic=Agent("J.", model="sim"))
        batch = team.submit_batch(["p0", "p1"], budget=Budget(max_calls=10))
        scope = f"batch:{batch.batch_id}"
        set_budgets({scope: Budget(max_calls=99)})
        _evict(redis_client, keys.run(batch.run_ids()[0]))
        assert len(_look(batch).lost) == 1
        assert get_budget(scope).limits == {"calls": 99}
        _evict(redis_client, keys.budget(scope), keys.run(batch.run_ids()[1]))
        assert len(_look(batch).lost) == 1
        assert get_budget(scope).limits == {"calls": 10}


def test_a_record_read_gone_with_no_eviction_is_never_sent_again(
    batch: BatchHandle, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mid-failover a client may read a server that is resyncing, empty for a moment: with
    no eviction counted, a run read as gone is not sent again, and its result, still gone
    after a grace, is not found (as without the keeper)."""
    first = batch.run_ids()
    redis_client.delete(keys.run(first[0]), keys.batch(batch.batch_id))
    for _ in range(3):
        found = batch.repair(force=True)
        assert found is not None and not found.damaged
    assert batch.run_ids() == first
    assert batch.progress()["total"] == 3  # the batch as kept, while its record is gone
    monkeypatch.setattr(handles, "GONE_GRACE_S", 0.3)
    monkeypatch.setattr(handles, "LOOK_EVERY_S", 0.1)
    with pytest.raises(LookupError, match=first[0]):
        next(batch.results(timeout=30))
