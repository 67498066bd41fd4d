"""The Redis pool in which each thread keeps a connection (``orchestration.state.pinned``),
on a real Redis: which connection each command goes out on (``CLIENT ID``)."""

from __future__ import annotations

import gc
import multiprocessing
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from orchestration.state.pinned import PinnedPool

pytestmark = pytest.mark.redis


@pytest.fixture
def pool(redis_url: str) -> Iterator[Callable[..., redis.Redis]]:
    made: list[redis.Redis] = []

    def make(max_connections: int = 40, spare: int = 16) -> redis.Redis:
        p = PinnedPool.from_url(redis_url, max_connections=max_connections, timeout=5, spare=spare)
        client = redis.Redis(connection_pool=p)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()
        client.connection_pool.disconnect()  # a client given a pool leaves it open


def threads_at_once(n: int, fn: Callable[[], Any]) -> list[Any]:
    """``fn``'s result in each of ``n`` threads started together (all alive until each
    has its result, so none's connection is given back before the others run)."""
    out: list[Any] = []
    started, done = threading.Barrier(n), threading.Barrier(n)

    def run() -> None:
        started.wait(timeout=10)
        out.append(fn())
        done.wait(timeout=10)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert len(out) == n
    return out


def test_a_thread_keeps_one_connection_and_threads_have_their_own(
    pool: Callable[..., redis.Redis],
) -> None:
    client = pool()
    mine = {client.client_id() for _ in range(5)}

    def commands() -> set[int]:
        seen = {client.client_id() for _ in range(5)}
        pipe = client.pipeline()
        pipe.client_id()
        pipe.client_id()
        return seen | set(pipe.execute())

    theirs = threads_at_once(3, commands)
    assert len(mine) == 1 and all(len(s) == 1 for s in theirs), (mine, theirs)
    assert len(mine.union(*theirs)) == 4
    assert client.connection_pool.kept >= 1  # type: ignore[attr-defined]


def test_a_command_while_the_threads_own_is_held_takes_another(
    pool: Callable[..., redis.Redis],
) -> None:
    client = pool()
    mine = client.client_id()
    sub = client.pubsub()
    sub.subscribe("duet:test:pinned")  # holds this thread's connection
    try:
        other = client.client_id()
        assert other != mine
    finally:
        sub.close()  # disconnects the connection it held, then releases it
    # This thread's own again (connected anew), not the one the queue lent meanwhile.
    assert client.client_id() not in (mine, other)
    assert client.client_id() == client.client_id()


def test_a_kept_connection_the_server_closed_is_connected_anew(
    pool: Callable[..., redis.Redis], redis_url: str
) -> None:
    client = pool()
    mine = client.client_id()
    admin = redis.Redis.from_url(redis_url)
    try:
        assert admin.client_kill_filter(_id=mine) == 1
    finally:
        admin.close()
    assert client.client_id() != mine  # the command went out on a new connection
    assert client.connection_pool.kept == 1  # type: ignore[attr-defined]


def test_at_most_max_minus_spare_are_kept_and_the_rest_share(
    pool: Callable[..., redis.Redis],
) -> None:
    client = pool(max_connections=6, spare=4)  # 2 kept
    p: Any = client.connection_pool
    ids = threads_at_once(5, lambda: ([client.client_id() for _ in range(3)], p.kept))
    assert all(len(x) == 3 for x, _ in ids)  # every command ran
    assert max(kept for _, kept in ids) == 2


def test_a_ended_threads_connection_goes_back_to_the_queue(
    pool: Callable[..., redis.Redis],
) -> None:
    client = pool(max_connections=3, spare=1)  # 2 kept: one thread at a time below
    p: Any = client.connection_pool
    first = threads_at_once(1, client.client_id)[0]
    gc.collect()
    assert p.kept == 0
    for _ in range(5):  # more threads than connections: each ended one's is reused
        assert threads_at_once(1, client.client_id)[0] == first
        gc.collect()
    assert p.kept == 0


def _child_id(client: redis.Redis, out: Any) -> None:
    out.send(client.client_id())


def test_a_forked_child_uses_none_of_the_parents_connections(
    pool: Callable[..., redis.Redis],
) -> None:
    client = pool()
    mine = client.client_id()
    recv, send = multiprocessing.get_context("fork").Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(target=_child_id, args=(client, send))
    child.start()
    assert recv.poll(10)
    theirs = recv.recv()
    child.join(10)
    assert theirs != mine
    assert client.client_id() == mine  # the parent's kept one is still its own


def _child_keeps(client: redis.Redis, out: Any) -> None:
    out.send(client.client_id())  # keeps a connection: takes the pool's lock


def test_a_child_forked_while_a_thread_holds_the_pools_lock_goes_on(
    pool: Callable[..., redis.Redis],
) -> None:
    """The lock was held by a parent's thread at the fork: in the child, which has no such
    thread, it would never be released (a command hung for good)."""
    client = pool()
    p = client.connection_pool
    with p._kept_lock:  # as another thread of the parent holds it at the fork
        recv, send = multiprocessing.get_context("fork").Pipe(duplex=False)
        child = multiprocessing.get_context("fork").Process(
            target=_child_keeps, args=(client, send)
        )
        child.start()
    answered = recv.poll(10)
    child.join(10)
    if child.is_alive():
        child.kill()
    assert answered, "the child hung on the lock it inherited held"
    assert recv.recv() != client.client_id()
