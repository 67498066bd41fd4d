"""Run state in Redis, messages through RabbitMQ (DUET_BROKER_URL)."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest

from orchestration import Agent, Team
from orchestration.state.keys import queue_key
from tests.support import celery_worker, client_pointed_at

pytestmark = pytest.mark.system

RABBIT = os.environ.get("DUET_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def _rabbit_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.mark.skipif(not _rabbit_up(), reason="no RabbitMQ on 127.0.0.1:5672")
def test_runs_through_a_rabbitmq_broker(redis_url: str, redis_client: Any) -> None:
    with client_pointed_at(redis_url, broker_url=RABBIT):
        with celery_worker(redis_url, broker_url=RABBIT, name="amqp"):
            team = Team.actor_critic(
                actor=Agent("Fix.", model="sim"),
                critic=Agent("Review.", model="sim?scores=0.2,0.95"),
            )
            results = [h.result(timeout=60) for h in [team.submit(f"x{i}") for i in range(5)]]
        assert [(r.status, len(r.rounds)) for r in results] == [("approved", 2)] * 5
        assert not redis_client.llen(queue_key("coordinator")), (
            "messages went to Redis, not RabbitMQ"
        )
