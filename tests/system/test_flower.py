"""Flower watches the fleet and sees ids only: no prompt, output, instruction or key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from typing import Any

import pytest

from duet.embedded import free_port
from orchestration import Agent, Team
from tests.support import ROOT, wait_for

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
    port = free_port()
    env = {**os.environ, "DUET_REDIS_URL": system_redis_url, "FLOWER_UNAUTHENTICATED_API": "1"}
    flower = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "workers", "flower", f"--port={port}",
         "--address=127.0.0.1"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: flower.poll() is not None or _ping(port), 30, "Flower to answer")
        assert flower.poll() is None, "Flower exited"
        # Flower's event receiver connects a moment after its web server answers, and
        # events sent before that are not replayed: probe until a run shows up.
        probe_team = Team.actor_critic(
            actor=Agent("p", model="sim"), critic=Agent("p", model="sim")
        )

        def probe_seen() -> bool:
            probe = probe_team.run_sync("probe", timeout=30)
            try:
                wait_for(lambda: probe.run_id in json.dumps(_tasks(port)), 2, "the probe")
            except AssertionError:
                return False
            return True

        wait_for(probe_seen, 60, "Flower to receive task events", interval=0)
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


def _ping(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthcheck", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False
