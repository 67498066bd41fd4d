"""The start check on what ``DUET_REDIS_MIN_REPLICAS`` and ``DUET_REDIS_WAIT_AOF`` need: too
few replicas is a warning, a server without ``WAITAOF`` or without its append-only file a
refusal (pure: :func:`orchestration.state.preflight.judge`)."""

from __future__ import annotations

from orchestration.state.preflight import ServerFacts, judge

WHERE = "the Redis at DUET_REDIS_URL=redis://r:6379/0"


def facts(**kwargs: object) -> ServerFacts:
    base: dict[str, object] = {
        "maxmemory_policy": "noeviction",
        "cluster_enabled": False,
        "replicas": 1,
        "version": (7, 2),
        "aof_enabled": True,
    }
    return ServerFacts(**{**base, **kwargs})  # type: ignore[arg-type]


def test_enough_replicas_says_nothing() -> None:
    assert judge(facts(replicas=1), WHERE, False, min_replicas=1) == (None, [])


def test_too_few_replicas_is_a_warning() -> None:
    refusal, warnings = judge(facts(replicas=0), WHERE, False, min_replicas=1)
    assert refusal is None
    assert warnings == [
        f"{WHERE} has 0 replica(s) connected and DUET_REDIS_MIN_REPLICAS=1: the "
        "writes that wait for replicas are retried until that many are connected"
    ]


def test_waitaof_on_a_server_before_7_2_is_refused() -> None:
    refusal, _ = judge(facts(version=(7, 0)), WHERE, False, wait_aof=True)
    assert refusal is not None and "is Redis 7.0" in refusal and "WAITAOF" in refusal
    assert judge(facts(version=(7, 0)), WHERE, False) == (None, [])  # not asked: fine


def test_waitaof_without_an_append_only_file_is_refused() -> None:
    refusal, _ = judge(facts(aof_enabled=False), WHERE, False, wait_aof=True)
    assert refusal is not None and "appendonly no" in refusal
