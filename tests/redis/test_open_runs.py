"""Runs in flight: the open-runs index gains a run when it is created, loses it when its
finishing transition is made (once, however often it is tried), and gains it back when
resume re-opens a cancelled run. Real Redis (the Lua scripts)."""

from __future__ import annotations

from typing import Any

import redis

from orchestration.state import keys
from orchestration.state.fleet import open_runs
from orchestration.state.runs import RunRecord, RunStore


def test_open_runs_follow_create_finish_and_resume(redis_client: Any, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)  # as the workers use it
    store = RunStore(client)
    pipe = client.pipeline()
    store.create_runs([RunRecord(f"run{i}", "spec", "p") for i in range(3)], pipe)
    pipe.execute()
    count, oldest = open_runs(redis_client)
    assert count == 3 and oldest is not None and oldest > 0

    run = client.hgetall(keys.run("run1"))
    finish = {"reason": "user", "error": None, "usage": {}, "events": []}
    assert store.record_finish(run, 0, "cancelled", **finish) == 1
    assert store.record_finish(run, 0, "cancelled", **finish) != 1  # once
    assert open_runs(redis_client)[0] == 2
    assert redis_client.zscore(keys.open_runs(), "run1") is None

    what, _, _ = store.resume_point("run1")
    assert what == "coordinate"  # re-opened: send its transition again
    assert open_runs(redis_client)[0] == 3
    assert redis_client.zscore(keys.open_runs(), "run1") == float(run["created_at"])
    # The run's keys lost their TTL again, and the index did not get one.
    assert redis_client.ttl(keys.run("run1")) == -1
    assert redis_client.ttl(keys.open_runs()) == -1
    client.close()
