"""Flower watches the fleet and sees ids only: no prompt, output, instruction or key."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from orchestration import Agent, Team
from orchestration.state.keys import DRAFT_PRIORITY, queue_key
from tests.support import celery_worker, client_pointed_at, start_flower, wait_for

pytestmark = pytest.mark.system


def _tasks(port: int) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/tasks", timeout=2) as resp:
            return json.loads(resp.read())
    except OSError:
        return {}


def test_flower_shows_tasks_without_content(
    worker: Any, client_on: str, system_redis_url: str
) -> None:
    env = {**os.environ, "DUET_REDIS_URL": system_redis_url, "FLOWER_UNAUTHENTICATED_API": "1"}
    flower, port = start_flower(env)
    try:
        wait_for(lambda: flower.poll() is not None or _ping(port), 30, "Flower to answer")
        assert flower.poll() is None, "Flower exited"
        _until_flower_listens(
            port, Team.actor_critic(actor=Agent("p", model="sim"), critic=Agent("p", model="sim"))
        )
        team = Team.actor_critic(
            actor=Agent("INSTRUCTIONS-ACTOR-42", model="sim"),
            critic=Agent("INSTRUCTIONS-CRITIC-42", model="sim?scores=0.2,0.95"),
        )
        result = team.run_sync("PROMPT-CONTENT-42 password=hunter2", user_id="user-42", timeout=30)
        assert result.status == "approved"

        def mine() -> list[dict[str, Any]]:
            tasks = _tasks(port)
            return [t for t in tasks.values() if result.run_id in (t.get("args") or "")]

        seen = wait_for(lambda: len(mine()) >= 8 and mine(), 30, "Flower to see the run's 8 tasks")
        names = {t["name"] for t in seen}
        assert names == {"duet.coordinate", "duet.generate", "duet.critique", "duet.refine"}
        dump = json.dumps(_tasks(port))
        for secret in (
            "PROMPT-CONTENT",
            "hunter2",
            "INSTRUCTIONS-",
            "user-42",
            "revision 0",
            "sk-test",
        ):
            assert secret not in dump
    finally:
        flower.terminate()
        flower.wait(10)


def _until_flower_listens(port: int, team: Team) -> None:
    """Flower's event receiver connects a moment after its web server answers, and events
    sent before that are not replayed: run probes of ``team`` until one shows up."""

    def probe_seen() -> bool:
        probe = team.run_sync("probe", timeout=30)
        try:
            wait_for(lambda: probe.run_id in json.dumps(_tasks(port)), 2, "the probe")
        except AssertionError:
            return False
        return True

    wait_for(probe_seen, 60, "Flower to receive task events", interval=0)


def _ping(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthcheck", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def _flower(redis_url: str, **env: str) -> Iterator[int]:
    """A Flower process on ``redis_url`` (``celery -A workers flower``), its port once it answers."""
    full_env = {**os.environ, "DUET_REDIS_URL": redis_url, **env}
    full_env.pop("DUET_BROKER_URL", None)
    flower, port = start_flower(full_env)
    try:
        wait_for(lambda: flower.poll() is not None or _ping(port), 30, "Flower to answer")
        assert flower.poll() is None, "Flower exited"
        yield port
    finally:
        flower.terminate()
        flower.wait(10)


def _get(port: int, path: str, auth: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_flower_broker_api_counts_each_queue_behind_a_login(
    redis_url: str, redis_client: Any
) -> None:
    """Duet's broker URL names its own kombu transport; Flower still reads the queues.

    The actor/critic pool is scaled to zero after Flower has seen it (as KEDA does): the
    coordinator keeps dispatching, the actor list fills, Flower's Broker page and
    ``/api/queues/length`` count it exactly; the pool comes back and everything drains.
    """
    login = "ops:s3cret-flower"
    n = 7
    team = Team.actor_critic(
        actor=Agent("Fix.", model="sim"), critic=Agent("Review.", model="sim?scores=0.95")
    )

    def lengths() -> dict[str, int]:
        status, body = _get(port, "/api/queues/length", login)
        assert status == 200, body[:300]
        return {q["name"]: q["messages"] for q in json.loads(body)["active_queues"]}

    def workers_seen() -> set[str]:
        status, body = _get(port, "/api/workers?refresh=1", login)
        assert status == 200, body[:300]
        return {q["name"] for w in json.loads(body).values() for q in w.get("active_queues") or []}

    with (
        client_pointed_at(redis_url),
        celery_worker(redis_url, queues="coordinator", name="coord"),
        _flower(redis_url, FLOWER_BASIC_AUTH=login) as port,
    ):
        # Login required: no credentials, or wrong ones, get 401 on pages and API alike.
        for path in ("/broker", "/api/queues/length", "/api/tasks"):
            assert _get(port, path)[0] == 401
            assert _get(port, path, "ops:wrong")[0] == 401
        with celery_worker(redis_url, queues="actor,critic", name="models"):
            wait_for(
                lambda: workers_seen() == {"actor", "critic", "coordinator"},
                30,
                "Flower to see both pools",
            )
        handles = [team.submit(f"x{i}") for i in range(n)]
        drafts = queue_key("actor", DRAFT_PRIORITY)  # Flower counts kombu's priority lists too
        wait_for(lambda: redis_client.llen(drafts) == n, 30, "the actor backlog")
        assert lengths() == {"actor": n, "critic": 0, "coordinator": 0}
        status, page = _get(port, "/broker", login)
        assert status == 200
        assert re.search(rb"<td>actor</td>\s*<td[^>]*>\s*7\s*</td>", page), page[-3000:]
        assert b"s3cret" not in page  # the broker URL is shown without the password

        with celery_worker(redis_url, queues="actor,critic", name="models2"):
            results = [h.result(timeout=60) for h in handles]
            assert [r.status for r in results] == ["approved"] * n
            assert lengths() == {"actor": 0, "critic": 0, "coordinator": 0}


def test_flower_shows_a_rate_limit_wait_as_a_retry_without_traceback(
    worker: Any, client_on: str, system_redis_url: str, fake_llm: Any
) -> None:
    """A step waiting for the fleet's rate limit is re-scheduled (RETRY), not failed: Flower
    shows what it waits for and no traceback."""
    from orchestration.state import connection
    from orchestration.state.ratelimits import RateLimit, clear_rate_limits, set_rate_limits

    model = "openai:flower-waits"  # a model of its own: the limit slows no other test's
    team = Team.actor_critic(
        actor=Agent("Fix.", model=model, base_url=fake_llm.url),
        critic=Agent("Review.", model="openai:sim:critic?scores=0.95", base_url=fake_llm.url),
    )
    with _flower(system_redis_url, FLOWER_UNAUTHENTICATED_API="1") as port:
        _until_flower_listens(port, team)
        redis = connection.get_redis()
        limit = RateLimit(rpm=1, window_s=2.0, source="test")
        set_rate_limits(redis, {model: limit}, base_url=fake_llm.url)
        try:
            ids: set[str] = set()

            def retried() -> list[dict[str, Any]]:
                return [
                    t
                    for t in _tasks(port).values()
                    if any(i in (t.get("args") or "") for i in ids) and t.get("exception")
                ]

            def waited() -> list[dict[str, Any]]:
                # Two drafts at once: one waits (workers read the limit within seconds).
                runs = [team.submit(f"wait for it {len(ids) + i}") for i in range(2)]
                assert [r.result(timeout=60).status for r in runs] == ["approved"] * 2
                ids.update(r.run_id for r in runs)
                try:
                    return wait_for(retried, 2, "Flower to see a wait")
                except AssertionError:
                    return []

            waits = wait_for(waited, 60, "a draft to wait for the rate limit", interval=0)
        finally:
            clear_rate_limits(redis, [model])
    for task in waits:
        assert "waiting for the fleet's rate limit (openai:flower-waits)" in task["exception"]
        assert "StepWait" in task["exception"]
        assert not task.get("traceback"), task["traceback"]
