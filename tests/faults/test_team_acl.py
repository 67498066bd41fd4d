"""Two trust domains on one Redis: a key prefix and a Redis ACL user per team, each team
its own workers (issue 33). Real redis-server, real worker processes, real clients.

Each team's user may touch only its own prefix (``~team-a:*`` for run state, ``~team-a.*``
for the broker's keys, ``&team-a.*`` for its channels) and run no dangerous command but
the few Duet needs; both teams' runs finish, and team A's credentials cannot read, write or
delete one key of team B's, flush the server or widen their own ACL.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from duet.embedded.server import EmbeddedRedis
from tests.reliability import CLIENTS, Reliability
from tests.support import ROOT, celery_worker

pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]

TEAMS = {"team-a": "acl-pw-a-5c2e", "team-b": "acl-pw-b-81f0"}

CLIENT = """
import json, sys
from orchestration import Agent, Team
from orchestration.state import keys
team = Team.actor_critic(
    actor=Agent("Fix.", model="sim"),
    critic=Agent("Review.", model="sim?scores=0.95"),
    max_rounds=1,
)
result = team.run_sync(sys.argv[1], timeout=90)
print(json.dumps({"status": result.status, "run": keys.run(result.run_id),
                  "spec": keys.spec(team.spec.spec_id)}))
"""


def acl_rule(team: str, password: str, db: int = 0) -> list[str]:
    """The ACL of one team's user: its own keys and channels, every command Duet needs and
    none of the dangerous ones (``FLUSHALL``, ``ACL``, ``CONFIG SET``...) but ``INFO`` and
    ``CONFIG GET`` (the start-up checks) and ``RESTORE`` (on its own keys: a transition
    script restores a run's events).
    Celery's remote control subscribes with the pattern ``<prefix>./<db>.celery.pidbox``
    (``PSUBSCRIBE``: Redis allows a pattern only when the ACL names it as written). ``~``
    alone allows the empty key name, which Duet's scripts are given for "no such key"."""
    return [
        "on",
        f">{password}",
        "resetkeys",
        f"~{team}:*",
        f"~{team}.*",
        "~",
        "resetchannels",
        f"&{team}.*",
        f"&{team}./{db}.celery.pidbox",
        "+@all",
        "-@dangerous",
        "+info",
        "+config|get",
        "+restore",
    ]


def team_url(server: EmbeddedRedis, team: str) -> str:
    return f"redis://{team}:{TEAMS[team]}@127.0.0.1:{server.port}/0"


def team_env(server: EmbeddedRedis, team: str) -> dict[str, str]:
    return {"DUET_KEY_PREFIX": team, "DUET_REDIS_URL": team_url(server, team)}


def run_as(server: EmbeddedRedis, team: str, prompt: str) -> dict[str, Any]:
    import os

    env = {**os.environ, **team_env(server, team)}
    env.pop("DUET_BROKER_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, prompt],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.fixture
def shared_redis() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as server:
        admin = redis.Redis.from_url(server.url)
        for team, password in TEAMS.items():
            admin.acl_setuser(team, reset=True)
            admin.execute_command("ACL", "SETUSER", team, *acl_rule(team, password))
        admin.close()
        yield server


def _denied(attempt: Any) -> bool:
    try:
        attempt()
    except redis.exceptions.NoPermissionError:
        return True
    return False


def test_a_team_cannot_read_another_teams_keys(
    shared_redis: EmbeddedRedis, reliability: Reliability
) -> None:
    server = shared_redis
    with contextlib.ExitStack() as stack:
        for team in TEAMS:
            stack.enter_context(
                celery_worker(
                    team_url(server, team), env=team_env(server, team), concurrency=4, name=team
                )
            )
        a = run_as(server, "team-a", "def a(): pass")
        b = run_as(server, "team-b", "def b(): pass")
    assert a["run"].startswith("team-a:") and b["run"].startswith("team-b:")
    as_a = redis.Redis.from_url(team_url(server, "team-a"), decode_responses=True)
    admin = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        attempts = {
            "GET team B's spec": lambda: as_a.get(b["spec"]),
            "HGETALL team B's run": lambda: as_a.hgetall(b["run"]),
            "SET over team B's spec": lambda: as_a.set(b["spec"], "{}"),
            "DEL team B's run": lambda: as_a.delete(b["run"]),
            "LPUSH onto team B's queue": lambda: as_a.lpush("team-b.coordinator", "x"),
            "EVAL reading team B's run": lambda: as_a.eval(
                "return redis.call('HGETALL', KEYS[1])", 1, b["run"]
            ),
            "FLUSHALL": lambda: as_a.flushall(),
            "ACL SETUSER to widen itself": lambda: as_a.acl_setuser("team-a", keys=["*"]),
            "CONFIG SET": lambda: as_a.config_set("maxmemory-policy", "allkeys-lru"),
        }
        allowed = [name for name, attempt in attempts.items() if not _denied(attempt)]
        own = as_a.hgetall(a["run"])
        b_intact = admin.hget(b["run"], "status")
        denials = [e for e in admin.acl_log() if e.get("username") == "team-a"]
    finally:
        as_a.close()
        admin.close()
    reliability.record(
        section=CLIENTS,
        fault="Two teams on one Redis, each a key prefix (`DUET_KEY_PREFIX`) and an ACL user "
        "limited to it (`~team:* ~team.* &team.*`) with its own workers: team A's "
        "credentials try to read, overwrite, delete and enqueue into team B's keys, to flush "
        "the server and to widen their own ACL",
        load=f"1 run per team on its own worker; {len(attempts)} attempts by team A",
        lost=f"{len(allowed)} of {len(attempts)} attempts allowed"
        + (f" ({', '.join(allowed)})" if allowed else ""),
    )
    assert (a["status"], b["status"]) == ("approved", "approved")
    assert allowed == []
    assert own.get("status") == "approved", "a team still reads its own keys"
    assert b_intact == "approved"
    assert denials, "Redis logged the denials"
