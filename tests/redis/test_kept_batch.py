"""A batch's submitter keeps its inputs, and finds what an evicting Redis lost: a run whose
record went is submitted again under a new id (its budget scopes and limits its own, its
place in the batch's list and gate), the batch's record is written again with the counts
of what finished, and a finished run whose stream entry went is still given. Eviction is
played by deleting the keys Redis would have evicted; no worker runs (the test finishes
runs itself)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestration import Agent, Team
from orchestration.client.handles import BatchHandle, get_budget, set_budgets, store
from orchestration.core.budget import Budget
from orchestration.state import keys
from tests.support import client_pointed_at, collecting, finish_run, wait_for

pytestmark = pytest.mark.redis


@pytest.fixture
def batch(redis_client: Any, redis_url: str) -> Iterator[BatchHandle]:
    """Three runs, two places (``max_in_flight``), a budget per run and per actor."""
    with client_pointed_at(redis_url):
        team = Team.actor_critic(
            actor=Agent("Fix.", model="sim", budget=Budget(max_calls=7)),
            critic=Agent("Judge.", model="sim"),
            budget=Budget(max_calls=9),
        )
        yield team.submit_batch(
            [{"id": f"i{n}", "prompt": f"p{n}"} for n in range(3)], max_in_flight=2
        )


def _evict(r: Any, *names: str) -> None:
    assert r.delete(*names) == len(names)


def test_a_run_whose_record_went_is_submitted_again(batch: BatchHandle, redis_client: Any) -> None:
    r = redis_client
    first = batch.run_ids()
    finish_run(first[0])
    assert batch.repair() is None, "Redis evicted nothing: nothing is looked at"
    _evict(r, keys.run(first[1]), keys.batch(batch.batch_id), keys.batch_runs(batch.batch_id))

    found = batch.repair(force=True)

    assert found is not None and list(found.lost) == [first[1]]
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
        _evict(redis_client, keys.batch_events(batch.batch_id))  # run 0's entry with it
        _evict(redis_client, keys.run(first[2]))
        found = batch.repair(force=True)
        assert found is not None and list(found.lost) == [first[2]]
        finish_run(first[1])
        finish_run(found.lost[first[2]].run_id)
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
        assert batch.run_ids() == first
    finally:
        redis_client.config_set("maxmemory-policy", "noeviction")
    found = batch.repair(force=True)
    assert found is not None and list(found.lost) == [first[0]]


def test_a_limit_set_since_the_submit_is_kept(redis_url: str, redis_client: Any) -> None:
    """The batch's budget raised after the submit (``duet budget set``) stays raised when
    runs are sent again; only a limit that went with its hash is set again."""
    with client_pointed_at(redis_url):
        team = Team.actor_critic(actor=Agent("Fix.", model="sim"), critic=Agent("J.", model="sim"))
        batch = team.submit_batch(["p0", "p1"], budget=Budget(max_calls=10))
        scope = f"batch:{batch.batch_id}"
        set_budgets({scope: Budget(max_calls=99)})
        _evict(redis_client, keys.run(batch.run_ids()[0]))
        assert batch.repair(force=True) is not None
        assert get_budget(scope).limits == {"calls": 99}
        _evict(redis_client, keys.budget(scope), keys.run(batch.run_ids()[1]))
        assert batch.repair(force=True) is not None
        assert get_budget(scope).limits == {"calls": 10}
