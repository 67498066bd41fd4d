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


def test_rerun_of_an_interrupted_run_drops_the_step_that_stopped_it_once(
    redis_client: Any, redis_url: str
) -> None:
    """``resume --interrupted``: the run re-opens at the transition that made the step that
    stopped it, that step is dropped, what it spent stays the run's; a second try, or a
    run that is not interrupted, changes nothing."""
    from orchestration.state.runs import stored_result

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    store = RunStore(client)
    pipe = client.pipeline()
    store.create_runs([RunRecord("cut", "spec", "p"), RunRecord("fine", "spec", "p")], pipe)
    pipe.execute()
    for run_id, status in (("cut", "interrupted"), ("fine", "approved")):
        run = client.hgetall(keys.run(run_id))
        assert store.record_step(run, 0, "r0.generate", {"prompt": "p"}, []) == 1
        stopped = {"interrupted": "budget:run:usd", "calls": 1, "usd": 0.25, "output_tokens": 9}
        client.hset(keys.run_steps(run_id), "r0.generate", stored_result(stopped))
        run = client.hgetall(keys.run(run_id))
        usage = {"calls": 1, "usd": 0.25}
        assert (
            store.record_finish(run, 1, status, reason="r", error=None, usage=usage, events=[]) == 1
        )

    assert store.rerun_point("cut") == ("running", 0)
    record = client.hgetall(keys.run("cut"))
    assert (record["status"], record["seq"], record["reason"]) == ("queued", "0", "")
    assert not client.hexists(keys.run_steps("cut"), "r0.generate")
    assert client.zscore(keys.open_runs(), "cut") is not None
    assert store.result("cut").usage.total.usd == 0.25  # the dropped attempt was paid
    assert store.rerun_point("cut") == ("finished", 0)  # not interrupted any more
    assert store.rerun_point("fine") == ("finished", 0)
    assert client.hget(keys.run("fine"), "status") == "approved"
    assert store.rerun_point("gone") == ("gone", 0)
    client.close()
