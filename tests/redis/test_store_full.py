"""A submission Redis refuses for memory (``OOM``) raises Duet's own error, naming the
cause, and writes nothing."""

from __future__ import annotations

import contextlib

import pytest
import redis

from duet.embedded.server import EmbeddedRedis
from orchestration import Agent, Team
from orchestration.core.errors import DuetError, StoreFull
from tests.support import client_pointed_at


def test_a_submission_redis_refuses_for_memory_raises_dueterror() -> None:
    with EmbeddedRedis() as server, contextlib.ExitStack() as stack:
        r = stack.enter_context(redis.Redis(port=server.port, decode_responses=True))
        stack.enter_context(client_pointed_at(server.url))
        r.config_set("maxmemory", 1)  # every write refused with OOM
        team = Team.actor_critic(
            actor=Agent("Fix.", model="sim"), critic=Agent("Review.", model="sim")
        )
        with pytest.raises(StoreFull, match="maxmemory") as err:
            team.submit_batch(["a", "b"])
        r.config_set("maxmemory", 0)
        assert isinstance(err.value, DuetError)
        assert r.dbsize() == 0
