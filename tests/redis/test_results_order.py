"""A results file on a real Redis: each run's record is written the moment it finishes,
in the order runs finish (an input that takes long never holds back the others), and the
file ends in input order; a cancelled run that is resumed is not counted twice in the
batch's spend."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from duet.cli_results import ResultsFile, collect
from orchestration import Agent, Team
from orchestration.client.handles import BatchHandle, store
from orchestration.state.runs import event_json
from tests.support import client_pointed_at, wait_for

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


def _finish(run_id: str, status: str = "approved") -> None:
    st = store()
    record, _ = st.load_run(run_id)
    made = st.record_finish(
        record, int(record.get("seq", 0)), status, reason=None, error=None, usage=USAGE,
        events=[event_json("run.finished", run_id, status=status)],
    )  # fmt: skip
    assert made == 1


def _indexes(path: Path) -> list[int]:
    return [json.loads(line)["index"] for line in path.read_text().splitlines()]


def test_records_are_written_as_runs_finish_and_end_in_input_order(
    batch: BatchHandle, tmp_path: Path
) -> None:
    run_ids = batch.run_ids()
    out = tmp_path / "out.jsonl"
    sink = ResultsFile(out)
    stop = threading.Event()
    # Input 1 was rejected: the runs are inputs 0, 2 and 3 of the file.
    worker = threading.Thread(target=collect, args=(batch, sink, [0, 2, 3], None, stop))
    worker.start()
    try:
        _finish(run_ids[2])
        _finish(run_ids[1], "interrupted")
        wait_for(lambda: len(out.read_text().splitlines()) == 2, 10, "two records written")
        assert _indexes(out) == [3, 2], "finish order, while input 0 still runs"
        _finish(run_ids[0])
        worker.join(timeout=10)
        assert not worker.is_alive(), "every run written: collect returns"
    finally:
        stop.set()
        worker.join(timeout=10)
    sink.finish()
    assert _indexes(out) == [0, 2, 3]
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["i0", "i1", "i2"]
    assert (sink.summary.counts["approved"], sink.summary.counts["interrupted"]) == (2, 1)


def test_a_resumed_cancelled_run_is_counted_once_in_the_batch_spend(batch: BatchHandle) -> None:
    first, *_ = batch.run_ids()
    st = store()
    st.cancel_run(first)
    _finish(first, "cancelled")
    assert batch.progress()["usd"] == pytest.approx(0.5)
    what, _, _ = st.resume_point(first)  # re-opens it, as `duet resume` does
    assert what == "coordinate"
    p = batch.progress()
    assert (p["done"], p["usd"], p["tokens"], p["calls"]) == (0, 0.0, 0, 0)
    _finish(first, "approved")
    p = batch.progress()
    assert (p["done"], p["usd"], p["tokens"], p["calls"]) == (1, 0.5, 120, 2)
