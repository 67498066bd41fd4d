"""Prefix lookup of batch and run ids on a real Redis (SCAN MATCH is the server's)."""

from __future__ import annotations

from typing import Any

from orchestration.state import keys, lookup


def test_batches_and_runs_starting_with_a_prefix(redis_client: Any) -> None:
    r = redis_client
    r.zadd(keys.batches_index(), {"aa11bb22": 1.0, "aa11cc33": 2.0, "ff00": 3.0})
    for run_id in ("0123abcd", "0123abce", "9999"):
        r.hset(keys.run(run_id), "status", "queued")
        r.rpush(keys.run_steps(run_id), "x")  # a run's other keys are not runs
    assert sorted(lookup.batches_starting(r, "aa11")) == ["aa11bb22", "aa11cc33"]
    assert lookup.batches_starting(r, "aa11b") == ["aa11bb22"]
    assert sorted(lookup.runs_starting(r, "0123abc")) == ["0123abcd", "0123abce"]
    assert lookup.runs_starting(r, "0123abcd") == ["0123abcd"]
    assert lookup.runs_starting(r, "77") == []


def test_a_typed_glob_is_not_a_pattern(redis_client: Any) -> None:
    r = redis_client
    r.hset(keys.run("0123abcd"), "status", "queued")
    r.zadd(keys.batches_index(), {"aa11bb22": 1.0})
    for typed in ("*", "0*", "0?23", "[0]", "0123abcd}*"):
        assert lookup.runs_starting(r, typed) == []
        assert lookup.batches_starting(r, typed) == []
