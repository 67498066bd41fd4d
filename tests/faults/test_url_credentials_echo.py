"""A gateway's basic-auth password reaches it from the worker's environment, and nowhere else.

The actor (OpenAI SDK) and the critic (Anthropic SDK) name the stand-in server as
``http://duet-bot:${DUET_TEST_GW_PASSWORD}@127.0.0.1:PORT``: the worker, which alone has
the variable, sends ``Authorization: Basic`` with it. Then the server's errors echo the
URL with the user and password written back in (and the credential header, and the
password as it is): the
password is in no form in Redis (every key's value, and every command it received), the
results, ``duet show`` or the worker's log. A spec naming a variable the worker lacks ends
its run with an error naming the variable.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from duet.embedded.server import EmbeddedRedis
from duet.report.records import result_record
from duet.standin.server import FakeLLM
from orchestration import Agent, Team
from tests.faults.conftest import Monitor
from tests.faults.test_secret_echo import duet_show, leaks_in, redis_values
from tests.reliability import SECRETS, Reliability
from tests.support import celery_worker, client_pointed_at

pytestmark = pytest.mark.system

VARIABLE = "DUET_TEST_GW_PASSWORD"
UNSET = "DUET_TEST_GW_UNSET_PASSWORD"
USER = "duet-bot"
#: Not shaped like a key, with characters a URL must percent-encode.
PASSWORD = "gw-pass/9c2e@5b71:d0"
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


def _with_credentials(url: str, variable: str = VARIABLE) -> str:
    return url.replace("://", f"://{USER}:${{{variable}}}@", 1)


def _team(llm: FakeLLM, variable: str = VARIABLE) -> Team:
    return Team.actor_critic(
        actor=Agent(
            "Fix the code.", model="openai:sim", base_url=_with_credentials(llm.url, variable)
        ),
        critic=Agent(
            "Review.",
            model="anthropic:sim:critic?scores=0.2,0.95",
            base_url=_with_credentials(llm.anthropic_url, variable),
        ),
        max_rounds=3,
    )


def test_a_url_password_comes_from_the_worker_and_is_stored_nowhere(
    private_redis: EmbeddedRedis, reliability: Reliability, tmp_path: Path
) -> None:
    url = private_redis.url
    monitor = Monitor(private_redis.port)
    env = {VARIABLE: PASSWORD, "DUET_RETRY_BASE_S": "0.05", "DUET_RETRY_MAX_S": "0.2"}
    assert VARIABLE not in os.environ and UNSET not in os.environ
    with (
        FakeLLM() as llm,
        celery_worker(url, env=env, loglevel="INFO", name="urlcreds") as worker,
        client_pointed_at(url),
    ):
        team = _team(llm)
        served = team.run_sync("Write a parser.", timeout=60)
        sent = [(r["path"], r["authorization"]) for r in llm.last_requests]
        # Every second call fails, its message quoting the password and ending with the
        # URL (user and password written back in) and the credential header; the retry
        # succeeds.
        llm.set_faults(
            status=500,
            every=2,
            echo_url=True,
            echo_key=True,
            message=f"gateway: bad password {PASSWORD}",
        )
        retried = team.run_sync("Write a lexer.", timeout=60)
        faulted = llm.stats()["faulted"]
        # A permanent error with the same echo ends the run with the message.
        llm.set_faults(status=403, echo_url=True, echo_key=True, model="sim:critic?scores=0.2,0.95")
        refused = team.run_sync("Write a printer.", timeout=60)
        llm.clear_faults()
        missing = _team(llm, UNSET).run_sync("Write a checker.", timeout=60)
        log = Path(worker.log_path).read_text(errors="replace")
        stored = redis_values(url)
        runs = (served, retried, refused, missing)
        shown = duet_show(url, [refused.run_id, missing.run_id], tmp_path)
    captured = monitor.stop().decode("utf-8", errors="replace")
    records = [result_record(run) for run in runs]
    places = {
        "Redis keys and values": stored,
        "MONITOR capture": captured,
        "worker log": log,
        "results": json.dumps(records) + "".join(run.model_dump_json() for run in runs),
        "duet show": "".join(s.stdout + s.stderr for s in shown),
    }
    # The password, and what the Basic header holds: base64 of user:password.
    leaks = leaks_in(places, (PASSWORD, f"{USER}:{PASSWORD}", BASIC.removeprefix("Basic ")))
    reliability.record(
        section=SECRETS,
        fault="A gateway's basic-auth password in `base_url` as `USER:${VARIABLE}@` (OpenAI "
        "and Anthropic SDKs): its errors (500 then retried, 403 permanent) echo the URL with "
        "the password written back in and the `Authorization: Basic` header (the 500s the "
        "password as it is, too); a spec names a variable the worker lacks",
        load=f"4 runs on 1 worker at `--loglevel INFO`, {faulted} retried calls; "
        f"{len(stored):,} bytes of Redis keys and values, {len(captured):,} of `MONITOR`",
        lost=f"{len(leaks)} leaks: {'; '.join(leaks)}"
        if leaks
        else "nothing: the password (as written, percent-encoded, JSON-escaped, in base64, "
        f"or inside the Basic header's base64) in none of the {', the '.join(places)}; "
        f"the unset variable's run: `{missing.interruption_reason}`",
        before="a password in a `base_url` was refused: such a gateway could not be used",
    )
    assert served.status == "approved", (served.status, served.error)
    assert {path for path, _ in sent} == {"/v1/chat/completions", "/v1/messages"}
    assert all(auth == BASIC for _, auth in sent), sent
    assert retried.status == "approved", (retried.status, retried.error)
    assert faulted >= 3
    assert refused.status == "interrupted"
    assert refused.interruption_reason == "critic:round_1:provider_error:permission"
    assert refused.error is not None and "[REDACTED]" in refused.error
    assert f"{USER}:[REDACTED]@127.0.0.1" in refused.error  # the URL shows, its password not
    assert missing.status == "interrupted"
    assert missing.interruption_reason == "actor:round_0:provider_error:missing_key"
    assert f"environment variable {UNSET} is not set on this worker" in (missing.error or "")
    assert f"${{{VARIABLE}}}" in stored  # the spec keeps the reference
    assert [s.returncode for s in shown] == [0, 0], [s.stderr for s in shown]
    assert leaks == []
