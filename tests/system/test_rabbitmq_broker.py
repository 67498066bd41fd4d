"""Run state in Redis, messages through RabbitMQ (DUET_BROKER_URL)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from orchestration import Agent, Team
from orchestration.state.keys import queue_key
from tests.support import celery_worker, client_pointed_at

pytestmark = pytest.mark.system

#: A broker the caller owns; otherwise the test makes a vhost of its own on the local one.
EXPLICIT = os.environ.get("DUET_TEST_AMQP_URL")


def _rabbit_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=0.5):
            return True
    except OSError:
        return False


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture
def rabbit_url() -> Iterator[str]:
    """An AMQP URL on a vhost of this test's own (deleted afterwards), so two test
    sessions on one machine never consume each other's queues."""
    if EXPLICIT:
        yield EXPLICIT
        return
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("no rabbitmqctl to make a vhost with (set DUET_TEST_AMQP_URL)")
    vhost = f"duet-test-{uuid.uuid4().hex[:12]}"
    _rabbitmqctl("add_vhost", vhost)
    try:
        _rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield f"amqp://guest:guest@127.0.0.1:5672/{vhost}"
    finally:
        _rabbitmqctl("delete_vhost", vhost)


@pytest.mark.skipif(not EXPLICIT and not _rabbit_up(), reason="no RabbitMQ on 127.0.0.1:5672")
def test_runs_through_a_rabbitmq_broker(redis_url: str, redis_client: Any, rabbit_url: str) -> None:
    with client_pointed_at(redis_url, broker_url=rabbit_url):
        with celery_worker(redis_url, broker_url=rabbit_url, name="amqp"):
            team = Team.actor_critic(
                actor=Agent("Fix.", model="sim"),
                critic=Agent("Review.", model="sim?scores=0.2,0.95"),
            )
            results = [h.result(timeout=60) for h in [team.submit(f"x{i}") for i in range(5)]]
        assert [(r.status, len(r.rounds)) for r in results] == [("approved", 2)] * 5
        assert not redis_client.llen(queue_key("coordinator")), (
            "messages went to Redis, not RabbitMQ"
        )
