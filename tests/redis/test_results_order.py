"""A results file on a real Redis: each run's record is written the moment it finishes,
in the order runs finish (an input that takes long never holds back the others), and the
file ends in input order; a cancelled run that is resumed is not counted twice in the
batch's spend."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestration import Agent, Team
from orchestration.client.handles import BatchHandle, store
from tests.support import client_pointed_at, collecting, finish_run, wait_for

pytestmark = pytest.mark.redis

USAGE = {"input_tokens": 100, "output_tokens": 20, "calls": 2, "usd": 0.5}


@pytest.fixture
def batch(redis_client: Any, redis_url: str) -> Iterator[BatchHandle]:
    """A submitted batch of three runs and no worker: the test finishes runs itself."""
    with client_pointed_at(redis_url):
        team = Team.actor_critic(
            actor=Agent("Fix.", model="sim"), critic=Agent("Judge.", model="sim")
        )
        yield team.submit_batch([{"id": f"i{n}", "prompt": f"p{n}"} for n in range(3)])


def _indexes(path: Path) -> list[int]:
    return [json.loads(line)["index"] for line in path.read_text().splitlines()]


def test_records_are_written_as_runs_finish_and_end_in_input_order(
    batch: BatchHandle, tmp_path: Path
) -> None:
    run_ids = batch.run_ids()
    out = tmp_path / "out.jsonl"
    # Input 1 was rejected: the runs are inputs 0, 2 and 3 of the file.
    with collecting(batch, out, [0, 2, 3]) as (worker, sink):
        finish_run(run_ids[2], usage=USAGE)
        finish_run(run_ids[1], "interrupted", usage=USAGE)
        wait_for(lambda: len(out.read_text().splitlines()) == 2, 10, "two records written")
        assert _indexes(out) == [3, 2], "finish order, while input 0 still runs"
        finish_run(run_ids[0], usage=USAGE)
        worker.join(timeout=10)
        assert not worker.is_alive(), "every run written: collect returns"
    assert _indexes(out) == [0, 2, 3]
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["i0", "i1", "i2"]
    assert (sink.summary.counts["approved"], sink.summary.counts["interrupted"]) == (2, 1)


def test_a_resumed_cancelled_run_is_counted_once_in_the_batch_spend(batch: BatchHandle) -> None:
    first, *_ = batch.run_ids()
    st = store()
    st.cancel_run(first)
    finish_run(first, "cancelled", usage=USAGE)
    assert batch.progress()["usd"] == pytest.approx(0.5)
    what, _, _ = st.resume_point(first)  # re-opens it, as `duet resume` does
    assert what == "coordinate"
    p = batch.progress()
    # What was spent stays spent: a batch's cost never goes down while it is resumed.
    assert (p["done"], p["usd"], p["tokens"], p["calls"]) == (0, 0.5, 120, 2)
    # The run's usage is its whole spend, before the cancel and after: only the rest is new.
    finish_run(
        first, "approved", {"input_tokens": 300, "output_tokens": 40, "calls": 5, "usd": 1.25}
    )
    p = batch.progress()
    assert (p["done"], p["usd"], p["tokens"], p["calls"]) == (1, 1.25, 340, 5)


def test_resuming_a_run_cancelled_before_it_spent_anything(
    redis_client: Any, redis_url: str
) -> None:
    """A cancelled run with zero usage re-opens: the batch's counters are not given a
    "-0" (which HINCRBY refuses as not an integer)."""
    import json as _json

    import redis as _redis

    from orchestration.state import keys as _keys
    from orchestration.state.runs import RunRecord as _RunRecord
    from orchestration.state.runs import RunStore as _RunStore

    decoded = _redis.Redis.from_url(redis_url, decode_responses=True)
    store = _RunStore(decoded, finished_ttl_s=600)
    redis_client.hset(_keys.batch("b0"), mapping={"batch_id": "b0", "total": 1})
    pipe = redis_client.pipeline(transaction=False)
    store.create_runs([_RunRecord(run_id="r0", spec_id="s", prompt="p", batch_id="b0")], pipe)
    pipe.execute()
    run = decoded.hgetall(_keys.run("r0"))
    zero = {"input_tokens": 0, "output_tokens": 0, "usd": 0.0, "calls": 0}
    assert (
        store.record_finish(
            run, 0, "cancelled", reason="cancelled", error=None, usage=zero, events=[]
        )
        == 1
    )
    assert store.resume_point("r0")[0] == "coordinate"  # re-opened (before: a script error)
    batch = redis_client.hgetall(_keys.batch("b0"))
    assert int(batch[b"done"]) == 0 and _json.loads(redis_client.hget(_keys.run("r0"), "usage"))


def test_results_with_a_status_stream_each_match_as_its_run_finishes(
    batch: BatchHandle, redis_url: str, tmp_path: Path
) -> None:
    import os
    import subprocess
    import sys

    run_ids = batch.run_ids()
    env = {**os.environ, "DUET_REDIS_URL": redis_url, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(
        [sys.executable, "-m", "duet", "results", batch.batch_id, "--status", "interrupted"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            finish_run(run_ids[2], "interrupted", usage=USAGE)
            assert proc.stdout is not None
            first = json.loads(proc.stdout.readline())  # blocks until the line comes
            assert (first["id"], first["status"]) == ("i2", "interrupted")
            assert proc.poll() is None, "inputs 0 and 1 still run: it keeps following"
            finish_run(run_ids[0], "approved", usage=USAGE)
            finish_run(run_ids[1], "interrupted", usage=USAGE)
            rest, errors = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert [json.loads(line)["id"] for line in rest.splitlines()] == ["i1"], errors
    assert proc.returncode == 1, "interrupted runs did not finish well"
