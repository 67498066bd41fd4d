"""Run state in Redis that someone else rewrote, and key variables nobody allowed (issue 33).

Runs are submitted while no worker runs; what an attacker with the Redis URL would write
is written then (a spec rewritten under its id, a run pointed at a forged spec); then a
real worker starts. Each run must end ``failed`` with a clear, scrubbed reason, calling
nobody. Key variables a worker's operator did not allow are refused at submit (the client
reads the policies live workers publish) and again at the worker, naming the variable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from duet.standin.server import FakeLLM
from orchestration import Agent, Team
from orchestration.client import handles
from orchestration.core.architecture import spec_digest
from orchestration.core.errors import ConfigError
from orchestration.core.key_policy import KeyPolicy
from orchestration.core.results import RunResult
from orchestration.settings import get_settings
from orchestration.state import keys
from tests.reliability import ENGINE, SECRETS, Reliability
from tests.support import celery_worker, client_pointed_at

pytestmark = pytest.mark.system

DB_SECRET = "db-password-value-7f3e91"
TEAM_B_SECRET = "team-b-key-value-52ac04"
VICTIM_KEY = "victim-openai-key-c1d2e3"
PASSWORD = "s3cret/PW"
TEAM_B_HOST = "https://gw.team-b.example"


@dataclass
class Forged:
    """The runs submitted, what was forged, and how each ended."""

    results: dict[str, RunResult]
    victim: FakeLLM
    attacker: FakeLLM
    worker_env: dict[str, str]


def _team(url: str, name: str) -> Team:
    return Team.actor_critic(
        actor=Agent("Fix the code.", model="openai:sim", base_url=url),
        critic=Agent("Review it.", model="openai:sim:critic?scores=0.95", base_url=url),
        max_rounds=1,
        name=name,
    )


def _forge_spec(client: Any, run_id: str, change: dict[str, Any]) -> str:
    """Point ``run_id`` at a spec like its own with the actor's fields ``change``d, stored
    under its own content hash (what anyone holding the Redis URL can write)."""
    spec_id = client.hget(keys.run(run_id), "spec_id")
    spec = json.loads(client.get(keys.spec(spec_id)))
    spec["actor"].update(change)
    raw = json.dumps(spec)
    forged = spec_digest(raw)
    client.set(keys.spec(forged), raw)
    client.hset(keys.run(run_id), "spec_id", forged)
    return forged


def _worker_policy() -> str:
    own = json.loads(os.environ["DUET_KEY_HOSTS"])
    return json.dumps({**own, "TEAM_B_API_KEY": [TEAM_B_HOST]})


@pytest.fixture(scope="module")
def forged(redis_url: str) -> Iterator[Forged]:
    flush = redis.Redis.from_url(redis_url)
    flush.flushdb()
    flush.close()
    with FakeLLM() as victim, FakeLLM() as attacker, client_pointed_at(redis_url):
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        handle = {
            "swapped": _team(victim.url, "swapped").submit("def f(): pass"),
            "password": _team(victim.url, "password").submit("def g(): pass"),
            "db_password": _team(victim.url, "db").submit("def h(): pass"),
            "team_b": _team(victim.url, "team-b").submit("def i(): pass"),
        }
        # Row 7: the spec rewritten under its id, to call the attacker with the victim's key.
        sid = client.hget(keys.run(handle["swapped"].run_id), "spec_id")
        spec = json.loads(client.get(keys.spec(sid)))
        spec["actor"].update(base_url=attacker.url, api_key_env="OPENAI_API_KEY")
        spec["critic"].update(base_url=attacker.url, api_key_env="OPENAI_API_KEY")
        client.set(keys.spec(sid), json.dumps(spec))
        # Row 12: a password in the URL, past the check at submit.
        host = victim.url.removeprefix("http://")
        _forge_spec(
            client, handle["password"].run_id, {"base_url": f"http://alice:{PASSWORD}@{host}"}
        )
        # Row 6: variables the worker's operator did not allow (or not for this host).
        _forge_spec(client, handle["db_password"].run_id, {"api_key_env": "DB_PASSWORD"})
        _forge_spec(client, handle["team_b"].run_id, {"api_key_env": "TEAM_B_API_KEY"})
        env = {
            "OPENAI_API_KEY": VICTIM_KEY,
            "DB_PASSWORD": DB_SECRET,
            "TEAM_B_API_KEY": TEAM_B_SECRET,
            "DUET_KEY_HOSTS": _worker_policy(),
        }
        with celery_worker(redis_url, env=env, concurrency=4, name="forged"):
            results = {name: h.result(timeout=90) for name, h in handle.items()}
            yield Forged(results, victim, attacker, env)
        client.close()


def _secrets_sent(llm: FakeLLM) -> list[str]:
    seen = json.dumps(llm.last_requests)
    return [s for s in (DB_SECRET, TEAM_B_SECRET, VICTIM_KEY, PASSWORD) if s in seen]


def test_a_spec_rewritten_after_submit_fails_the_run_calling_nobody(
    forged: Forged, reliability: Reliability
) -> None:
    result = forged.results["swapped"]
    calls = forged.attacker.stats()["requests"]
    reliability.record(
        section=ENGINE,
        fault="`duet:spec:<id>` rewritten between submit and the first step (the attacker's "
        "server, the victim's key)",
        load="1 run, a real worker",
        lost=f"{calls} calls to the attacker; run {result.status}",
        before="the run called the attacker's server with the victim's key and ended approved",
    )
    assert result.status == "failed", (result.status, result.error)
    assert result.error is not None and "does not match its content hash" in result.error
    assert calls == 0
    assert _secrets_sent(forged.attacker) == []


def test_a_password_in_a_forged_url_fails_the_run_scrubbed(
    forged: Forged, reliability: Reliability
) -> None:
    result = forged.results["password"]
    reliability.record(
        section=ENGINE,
        fault="A forged spec with `http://alice:s3cret/PW@host` as `base_url` (past submit)",
        load="1 run, a real worker",
        lost=f"run {result.status}",
        before="the run stayed `running` for good; the password's prefix was logged",
    )
    assert result.status == "failed", (result.status, result.error)
    assert result.error is not None and "credentials in the URL" in result.error
    assert "s3cret" not in result.error
    assert forged.victim.stats()["requests"] == 0


@pytest.mark.parametrize(
    ("run", "variable"), [("db_password", "DB_PASSWORD"), ("team_b", "TEAM_B_API_KEY")]
)
def test_the_worker_refuses_a_variable_its_operator_did_not_allow(
    forged: Forged, reliability: Reliability, run: str, variable: str
) -> None:
    result = forged.results[run]
    with reliability.case(
        section=SECRETS,
        fault="A forged spec names `api_key_env = DB_PASSWORD` (not allowed), or "
        "`TEAM_B_API_KEY` sent to a host not allowed for it: refused at the worker",
        before="the worker sent that variable's value to the spec's host",
    ):
        assert result.status == "failed", (result.status, result.error)
        assert result.error is not None and f"key variable {variable}" in result.error
        assert _secrets_sent(forged.victim) == []
        assert forged.victim.stats()["requests"] == 0


def test_submit_refuses_what_the_fleet_would_not_send(
    forged: Forged, redis_url: str, reliability: Reliability
) -> None:
    url = forged.victim.url
    with client_pointed_at(redis_url):
        client = redis.Redis.from_url(redis_url, decode_responses=True)
        runs_before = len(list(client.scan_iter(match=keys.run("*"))))
        refusals = 0
        for variable in ("DB_PASSWORD", "TEAM_B_API_KEY"):
            team = Team.actor_critic(
                actor=Agent("Fix.", model="openai:sim", base_url=url, api_key_env=variable),
                critic=Agent("Review.", model="openai:sim:critic", base_url=url),
                name=f"submit-{variable.lower()}",
            )
            with pytest.raises(ConfigError, match=f"actor: key variable {variable}") as err:
                team.submit("def f(): pass")
            refusals += 1
            if variable == "TEAM_B_API_KEY":
                assert "may not be sent to http://127.0.0.1" in str(err.value)
        # The client asked the fleet: the worker allows TEAM_B_API_KEY for its gateway,
        # which this process's own settings do not know.
        gateway = Team.actor_critic(
            actor=Agent("F.", model="openai:m", base_url=TEAM_B_HOST, api_key_env="TEAM_B_API_KEY"),
            critic=Agent("R.", model="sim"),
        ).spec
        handles.check_key_policies(gateway, client)
        assert get_settings().key_policy().agent_problem(gateway.actor) is not None
        assert KeyPolicy.with_extra().agent_problem(gateway.actor) is not None
        runs_after = len(list(client.scan_iter(match=keys.run("*"))))
        client.close()
    reliability.record(
        section=SECRETS,
        fault="`api_key_env = DB_PASSWORD`, or `TEAM_B_API_KEY` to a host not allowed for it, "
        "submitted: the client checks the policies the live workers publish",
        load="2 submits",
        lost=f"{runs_after - runs_before} runs stored, {2 - refusals} submits accepted",
        before="accepted; the worker sent the variable's value to the spec's host",
    )
    assert runs_after == runs_before
