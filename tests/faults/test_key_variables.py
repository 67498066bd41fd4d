"""A key-shaped variable (``*_API_KEY``, ``*_TOKEN``, ``*_SECRET``) that no spec names is
a secret in a real worker from its first task: a model answer quoting its value is
stored with the value replaced (the input that holds it is the user's own)."""

from __future__ import annotations

import pytest

from duet.embedded.server import EmbeddedRedis
from orchestration import Agent, Team
from tests.reliability import CLIENTS, Reliability
from tests.support import celery_worker, client_pointed_at

pytestmark = pytest.mark.system

VALUE = "acme-live-5e0c2d9b7f31"


def test_a_key_shaped_variable_is_secret_from_the_first_task(
    private_redis: EmbeddedRedis, reliability: Reliability
) -> None:
    env = {"DUET_TEST_ACME_API_KEY": VALUE}
    with (
        celery_worker(private_redis.url, env=env, name="keyvars"),
        client_pointed_at(private_redis.url),
    ):
        team = Team.actor_critic(
            actor=Agent("Fix.", model="sim"), critic=Agent("Review.", model="sim?scores=0.95")
        )
        # The simulated actor quotes the task's first line in its answer.
        result = team.run_sync(f"Use the key {VALUE} to call the API.", timeout=60)
    leaked = ["the stored answer"] if VALUE in (result.output or "") else []
    reliability.record(
        section=CLIENTS,
        fault="a key-shaped variable (`*_API_KEY`) no spec names, its value quoted by a model",
        load="1 run on a real worker, its first task",
        lost="; ".join(f"leaked into {w}" for w in leaked)
        or "nothing: `[REDACTED]` in the stored answer",
        before="only `OPENAI_API_KEY`, `ANTHROPIC_API_KEY` and variables of specs the worker "
        "had run were scrubbed",
    )
    assert result.status == "approved", result
    assert "[REDACTED]" in (result.output or "")
    assert not leaked
