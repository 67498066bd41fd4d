"""A write Redis refused for memory (OOM): too big for all the room Redis has left fails
its run (one small write says why); on a full Redis, or with room enough, it is an
outage tried again, never a failed run."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from orchestration.services.storing import store_or_fail
from orchestration.state.room import Room, room_of

MB = 1024 * 1024


class Server:
    """What ``room_of`` reads: ``INFO memory`` and ``CLIENT LIST``."""

    def __init__(self, maxmemory: int, used: int, buffers: list[int] | None = None) -> None:
        self.memory = {"maxmemory": maxmemory, "used_memory": used, "mem_clients_normal": 0}
        self.buffers = buffers

    def info(self, section: str) -> dict[str, Any]:
        assert section == "memory"
        return self.memory

    def client_list(self) -> list[dict[str, str]]:
        if self.buffers is None:
            raise redis.exceptions.ResponseError("unknown command 'CLIENT'")
        return [{"flags": "N", "tot-mem": str(b)} for b in self.buffers] + [
            {"flags": "S", "tot-mem": str(50 * MB)}  # a replica's: counted apart
        ]


def test_the_room_leaves_out_the_clients_buffers_as_they_are_now() -> None:
    """``INFO``'s count of the buffers lags (a refused command's arguments stay in it)."""
    assert room_of(Server(10 * MB, 9 * MB, [4 * MB])) == Room(5 * MB, 10 * MB)
    assert room_of(Server(10 * MB, 9 * MB)) == Room(1 * MB, 10 * MB)  # CLIENT LIST refused
    assert room_of(Server(0, 9 * MB, [])) is None  # no maxmemory: no OOM to judge


def test_a_script_holds_its_arguments_twice_and_a_server_without_room_is_full() -> None:
    assert Room(4 * MB, 10 * MB).fits(2 * MB) and not Room(4 * MB, 10 * MB).fits(3 * MB)
    assert Room(MB // 4, 10 * MB).full and not Room(MB, 10 * MB).full
    assert Room(-MB, 10 * MB).full


def oom() -> object:
    raise redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'")


def test_a_write_bigger_than_the_room_fails_once_the_cache_gave_room_back() -> None:
    failed: list[str] = []
    gave: list[int] = []
    stored = store_or_fail(
        oom,
        failed.append,
        3 * MB,
        "this step's answer",
        "run r step s",
        Server(10 * MB, 5 * MB, [0]),
        lambda: gave.append(1) or 0,
        patience_s=0,
    )
    assert stored == (False, None) and gave == [1]
    assert len(failed) == 1 and "maxmemory" in failed[0] and "3,145,728 bytes" in failed[0]


@pytest.mark.parametrize(
    "server",
    [Server(10 * MB, 9_800_000, [0]), Server(1, MB, [0])],  # full: 2% left, or maxmemory 1
    ids=["nearly-full", "maxmemory-1"],
)
def test_on_a_full_redis_an_oom_is_an_outage(server: Server) -> None:
    failed: list[str] = []
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        store_or_fail(oom, failed.append, 1000, "x", "w", server, None, patience_s=0)
    assert failed == []


def test_a_write_that_fits_is_tried_again_and_stored() -> None:
    tries: list[int] = []

    def write() -> str:
        tries.append(1)
        if len(tries) == 1:
            oom()
        return "stored"

    failed: list[str] = []
    server = Server(10 * MB, 2 * MB, [0])
    assert store_or_fail(write, failed.append, MB, "x", "w", server, None, patience_s=5) == (
        True,
        "stored",
    )
    assert failed == [] and len(tries) == 2
