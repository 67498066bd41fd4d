"""The fleet's model-call cache in Redis: TTL, LRU over its own keys only, stats, clear."""

from __future__ import annotations

from typing import Any

import pytest

from orchestration.state import keys
from orchestration.state.callcache import RedisCallStore


@pytest.fixture
def client(redis_url: str) -> Any:
    import redis

    r = redis.Redis.from_url(redis_url)
    r.delete(*(keys.call_cache(p) for p in ("entries", "used", "stored", "stats")))
    yield r
    r.close()


def test_lru_evicts_only_the_caches_own_entries(client: Any) -> None:
    client.set("duet:run:{other}", "run state")  # never touched by the cache's eviction
    store = RedisCallStore(client)
    for k in ("a", "b", "c"):
        store.put(k, "x" * 10, max_entries=3, max_bytes=1000)
    assert store.get("a", 60) == "x" * 10
    store.put("d", "y" * 10, max_entries=3, max_bytes=1000)
    assert store.get("b", 60) is None, "the least recently used went"
    store.put("e", "z" * 15, max_entries=10, max_bytes=40)  # over the bytes cap: c, a go
    stats = store.stats()
    assert stats.bytes <= 40 and stats.entries == 3
    assert client.get("duet:run:{other}") == b"run state"
    assert store.get("a", 0.0) is None
    assert store.stats().misses == 2


def test_clear_older_than_and_all(client: Any) -> None:
    store = RedisCallStore(client)
    store.put("a", "1", max_entries=10, max_bytes=100)
    assert store.clear(older_than_s=3600) == 0
    assert store.clear() == 1
    assert store.stats().entries == 0


@pytest.mark.parametrize("backend", ["redis", "disk"])
def test_many_at_once_as_one_by_one(client: Any, tmp_path: Any, backend: str) -> None:
    """``get_many`` / ``put_many`` (the run cache's lookups): the same TTL, caps and
    counts as ``get`` / ``put``, in one round trip or transaction."""
    from orchestration.state.callcache import DiskCallStore

    store = RedisCallStore(client) if backend == "redis" else DiskCallStore(tmp_path / "c.sqlite")
    store.put_many([("run:a", "1"), ("run:b", "2"), ("run:c", "3")], max_entries=2, max_bytes=100)
    assert store.get_many(["run:a", "run:b", "run:c", "run:d"], 60) == [None, "2", "3", None]
    assert store.get_many(["run:b"], 1e-9) == [None]  # older than the TTL: a miss
    stats = store.stats()
    assert (stats.entries, stats.hits, stats.misses) == (2, 2, 3)
    assert store.clear() == 2
