"""A vendor error that echoes the API key, then a retry: the key is nowhere.

Fault: the stand-in server answers 500 (transient: the step is retried and succeeds) and
401 (permanent: the run ends interrupted) with error messages that end with the request's
credential. The keys are not ``sk-``-shaped, so only scrubbing by value catches them: the
actor's in ``OPENAI_API_KEY`` (the OpenAI SDK), the critic's in a variable its spec names
with ``api_key_env`` (the Anthropic SDK). Looked for in
every command Redis received (``MONITOR``: run state, events, broker messages, Celery's
task events), the worker's log at INFO, the results, and Flower's ``/api/tasks``.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import io
import json
import math
import os
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from duet.embedded.server import EmbeddedRedis
from duet.report.html import render_report
from duet.report.records import csv_row, result_record
from duet.standin.server import OPENAI_PATH, FakeLLM
from orchestration import Agent, Team
from orchestration.core import events as ev
from tests.faults.conftest import Monitor
from tests.reliability import SECRETS, Reliability
from tests.support import celery_worker, client_pointed_at, start_flower, wait_for

pytestmark = pytest.mark.system

OPENAI_KEY = "duet-openai-key-4f9c1e7a2b5d"
CRITIC_KEY = "tok.critic.91d3e5a7c2f8"
CRITIC_KEY_ENV = "DUET_TEST_CRITIC_TOKEN"


def forms(secret: str) -> list[str]:
    """``secret`` as written, and the base64 text any base64 encoding of bytes containing
    it must contain (kombu base64-encodes message bodies, Celery events included)."""
    raw = secret.encode()
    found = [secret]
    for k in range(3):  # the secret's offset in its 3-byte group
        encoded = base64.b64encode(b"\0" * k + raw).decode()
        found.append(encoded[math.ceil(8 * k / 6) : (8 * (k + len(raw))) // 6])
    return found


def _get(port: int, path: str) -> Any:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return json.loads(resp.read()) if path.startswith("/api") else resp.status
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def flower_on(redis_url: str) -> Iterator[int]:
    """Flower on ``redis_url`` (API open, as in the other Flower test), receiving events."""
    env = {**os.environ, "DUET_REDIS_URL": redis_url, "FLOWER_UNAUTHENTICATED_API": "1"}
    proc, port = start_flower(env)
    try:
        wait_for(lambda: proc.poll() is not None or _get(port, "/healthcheck") == 200, 30, "Flower")
        assert proc.poll() is None, "Flower exited"
        # Its event receiver connects a moment after the web server answers: probe until a
        # run shows up (events sent before that are not replayed).
        probe = Team.actor_critic(actor=Agent("p", model="sim"), critic=Agent("p", model="sim"))

        def seen() -> bool:
            run_id = probe.run_sync("probe", timeout=30).run_id
            with contextlib.suppress(AssertionError):
                return wait_for(lambda: run_id in json.dumps(_get(port, "/api/tasks")), 2, "probe")
            return False

        wait_for(seen, 60, "Flower to receive task events", interval=0)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def test_an_echoed_key_reaches_no_redis_command_log_result_or_flower(
    private_redis: EmbeddedRedis, reliability: Reliability
) -> None:
    url = private_redis.url
    monitor = Monitor(private_redis.port)
    env = {
        "OPENAI_API_KEY": OPENAI_KEY,
        CRITIC_KEY_ENV: CRITIC_KEY,
        "DUET_RETRY_BASE_S": "0.05",
        "DUET_RETRY_MAX_S": "0.2",
    }
    with (
        FakeLLM() as llm,
        celery_worker(url, env=env, loglevel="INFO", name="secrets") as worker,
        client_pointed_at(url),
        flower_on(url) as flower_port,
    ):
        team = _team(llm)
        # Every second request fails with the key echoed; its retry succeeds. One run:
        # generate ok, critique 500 + ok, refine 500 + ok, critique 500 + ok (approved).
        llm.set_faults(status=500, every=2, echo_key=True)
        retried = team.run_sync("Write a parser.", timeout=60)
        assert retried.status == "approved", (retried.status, retried.error)
        faulted = llm.stats()["faulted"]
        assert faulted == 3
        # A permanent error echoing the critic's key: the run ends with the message.
        llm.set_faults(status=401, echo_key=True, model="sim:critic?scores=0.2,0.95")
        failed = team.run_sync("Write a lexer.", timeout=60)
        assert failed.status == "interrupted"
        assert failed.interruption_reason == "critic:round_1:provider_error:auth"
        assert failed.error is not None and "[REDACTED]" in failed.error

        def flower_saw_both() -> str | None:
            dump = json.dumps(_get(flower_port, "/api/tasks"))
            runs_seen = retried.run_id in dump and failed.run_id in dump
            return dump if runs_seen else None

        flower = wait_for(flower_saw_both, 30, "Flower to see both runs and a retry")
        log = Path(worker.log_path).read_text(errors="replace")
    captured = monitor.stop().decode("utf-8", errors="replace")
    # What a results file holds, and the whole result objects (events included).
    results = json.dumps([result_record(retried), result_record(failed)])
    results += retried.model_dump_json() + failed.model_dump_json()

    places = {
        "MONITOR capture": captured,
        "worker log": log,
        "results": results,
        "Flower /api/tasks": flower,
    }
    leaks = [
        f"{key} (as {form}) in the {name}"
        for name, text in places.items()
        for key in (OPENAI_KEY, CRITIC_KEY)
        for form in forms(key)
        if form in text
    ]
    reliability.record(
        section=SECRETS,
        fault="The vendor answers 500 with an error message ending in the request's API key, "
        "then the retry succeeds; later a 401 with the key (permanent). Keys not shaped like "
        "keys (`duet-openai-key-…`, `tok.critic.…`): the actor's from `OPENAI_API_KEY` through "
        "the OpenAI SDK, the critic's from a spec's `api_key_env` through the Anthropic SDK",
        load=f"2 runs, 1 worker process at `--loglevel INFO`, {faulted} retried calls and 1 "
        f"{failed.status} run, Flower watching; {len(captured):,} bytes of `MONITOR` capture, "
        f"{len(log):,} bytes of worker log",
        lost=f"{len(leaks)} leaks: {'; '.join(leaks)}"
        if leaks
        else "nothing: neither key "
        f"(as written or in any of its {len(forms(OPENAI_KEY)) - 1} base64 forms, as kombu "
        f"encodes message bodies) in the {', the '.join(places)}; `[REDACTED]` "
        f"{'shows' if '[REDACTED]' in captured else 'does NOT show'} where each was",
        before="the key was in Flower and in the task events published through Redis (the "
        "retry's traceback chained the SDK's error)",
    )
    # The echoed messages did pass through each place, scrubbed.
    assert "[REDACTED]" in captured  # the step's error, events, Celery's task events
    assert "retry" in log.lower()
    assert leaks == []


def test_a_model_repeating_its_key_stores_no_key(
    private_redis: EmbeddedRedis, reliability: Reliability
) -> None:
    """Model output is scrubbed of every configured key value before anything of it is
    stored: the stand-in ends every answer (actor and critic) with the request's key."""
    url = private_redis.url
    monitor = Monitor(private_redis.port)
    env = {"OPENAI_API_KEY": OPENAI_KEY, CRITIC_KEY_ENV: CRITIC_KEY}
    with (
        FakeLLM() as llm,
        celery_worker(url, env=env, loglevel="INFO", name="output") as worker,
        client_pointed_at(url),
    ):
        team = _team(llm)
        llm.set_faults(echo_key_in_reply=True)
        runs = [team.run_sync(f"Write a parser for format {n}.", timeout=60) for n in range(2)]
        served = llm.stats()["requests"]
        log = Path(worker.log_path).read_text(errors="replace")
    captured = monitor.stop().decode("utf-8", errors="replace")
    results = json.dumps([result_record(r) for r in runs])
    results += "".join(r.model_dump_json() for r in runs)
    places = {"MONITOR capture": captured, "worker log": log, "results": results}
    leaks = [
        f"{key} (as {form}) in the {name}"
        for name, text in places.items()
        for key in (OPENAI_KEY, CRITIC_KEY)
        for form in forms(key)
        if form in text
    ]
    redacted = sum(r.output.count("The key I was given: [REDACTED]") for r in runs)
    reliability.record(
        section=SECRETS,
        fault="A model repeats the API key it was called with in every answer (actor through "
        "the OpenAI SDK, critic through the Anthropic SDK with a spec's `api_key_env`; keys "
        "not shaped like keys)",
        load=f"{len(runs)} runs, {served} answers each ending with its key; persistent "
        f"conversations; {len(captured):,} bytes of `MONITOR` capture",
        lost=f"{len(leaks)} leaks: {'; '.join(leaks)}"
        if leaks
        else f"nothing: neither key in the {', the '.join(places)} (stored results, events, "
        "conversation turns); the final outputs read `The key I was given: [REDACTED]`",
        before="model output was stored as the model wrote it: the key in the results, "
        "events and conversations",
    )
    assert [r.status for r in runs] == ["approved"] * 2
    assert redacted == 2
    assert not leaks, leaks


def _json_escaped(text: str) -> str:
    return "".join(f"\\u{ord(c):04x}" for c in text)


_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})|\\x([0-9a-fA-F]{2})")


def _decoded(text: str) -> str:
    """``text`` with its percent-escapes and ``\\u`` / ``\\x`` escapes decoded (one layer;
    written apart from ``workers.secrets`` so the test does not check it with itself)."""
    text = urllib.parse.unquote(text)
    return _ESCAPE.sub(lambda m: chr(int(m[1] or m[2], 16)), text)


def leaks_in(places: dict[str, str], keys: tuple[str, ...]) -> list[str]:
    """Each key found in a place: as written, JSON-escaped or percent-encoded (and the
    base64 text of each of those), or once the place is decoded up to three times."""
    found = []
    for name, text in places.items():
        for key in keys:
            variants = (key, _json_escaped(key), urllib.parse.quote(key, safe=""))
            found += [
                f"{key} (as {form}) in the {name}"
                for variant in variants
                for form in forms(variant)
                if form in text
            ]
            probe = text
            for depth in range(4):
                if key in probe:
                    found.append(f"{key} in the {name} decoded {depth} times")
                    break
                probe = _decoded(probe)
    return found


def duet_show(url: str, run_ids: list[str], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    """``duet show RUN --full`` of each run in the Redis at ``url``, as a user runs it."""
    return [
        subprocess.run(
            [sys.executable, "-m", "duet", "show", run_id, "--full"],
            env={**os.environ, "DUET_REDIS_URL": url},
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
        )
        for run_id in run_ids
    ]


def redis_values(url: str) -> str:
    """Every key and value in the Redis at ``url``, whatever its type, as text."""
    client = redis.Redis.from_url(url)
    readers = {
        b"string": client.get,
        b"list": lambda k: client.lrange(k, 0, -1),
        b"hash": client.hgetall,
        b"set": client.smembers,
        b"zset": lambda k: client.zrange(k, 0, -1, withscores=True),
        b"stream": lambda k: client.xrange(k),
    }
    dump = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        read = readers.get(kind if isinstance(kind, bytes) else kind.encode())
        dump.append(repr((key, read(key) if read else kind)))
    client.close()
    # Values as Python bytes reprs: undo the repr's own escaping of a backslash.
    return "\n".join(dump).replace("\\\\", "\\")


def test_a_key_decoded_from_a_critique_or_an_error_is_stored_nowhere(
    private_redis: EmbeddedRedis, reliability: Reliability, tmp_path: Path
) -> None:
    """A critic quotes the key as JSON ``\\u`` escapes inside its issues (a parser decodes
    them); a vendor error echoes the key percent-encoded in a URL and JSON-escaped: the key
    is in no form in Redis, the results, the report, the CSV, ``duet show`` or the log."""
    url = private_redis.url
    monitor = Monitor(private_redis.port)
    env = {"OPENAI_API_KEY": OPENAI_KEY, CRITIC_KEY_ENV: CRITIC_KEY}
    with (
        FakeLLM() as llm,
        celery_worker(url, env=env, loglevel="INFO", name="decoded") as worker,
        client_pointed_at(url),
    ):
        team = _team(llm, structured_output=False)
        llm.set_faults(echo_key_in_issues=True)
        quoted = team.run_sync("Write a parser.", timeout=60)
        raw = [e for e in quoted.events if e.type == ev.CRITIQUE]
        upstream = (
            f"upstream https://gw.example/v1?key={urllib.parse.quote(CRITIC_KEY, safe='')}"
            f"&sig={_json_escaped(OPENAI_KEY)} refused"
        )
        llm.set_faults(status=401, message=upstream, model="sim:critic?scores=0.2,0.95")
        failed = team.run_sync("Write a lexer.", timeout=60)
        log = Path(worker.log_path).read_text(errors="replace")
        stored = redis_values(url)
        shown = duet_show(url, [quoted.run_id, failed.run_id], tmp_path)
    captured = monitor.stop().decode("utf-8", errors="replace")
    assert quoted.status == "approved", (quoted.status, quoted.error)
    assert failed.status == "interrupted" and failed.error is not None
    assert [s.returncode for s in shown] == [0, 0], [s.stderr for s in shown]
    records = [result_record(quoted), result_record(failed)]
    table = io.StringIO()
    csv.writer(table).writerows(csv_row(r) for r in records)
    places = {
        "MONITOR capture": captured,
        "Redis keys and values": stored,
        "worker log": log,
        "results": json.dumps(records) + quoted.model_dump_json() + failed.model_dump_json(),
        "HTML report": render_report(records),
        "CSV": table.getvalue(),
        "duet show": "".join(s.stdout + s.stderr for s in shown),
        "run error": failed.error,
    }
    leaks = leaks_in(places, (OPENAI_KEY, CRITIC_KEY))
    redacted_issues = [i for r in quoted.rounds for i in r.issues if "[REDACTED]" in i]
    reliability.record(
        section=SECRETS,
        fault="Decoded secrets: a critic quotes its API key inside its JSON issues as `\\u` "
        "escapes (the parser decodes them); a vendor's 401 echoes the keys percent-encoded "
        "in a URL and JSON-escaped",
        load=f"2 runs ({len(raw)} critiques each with the escaped key, 1 run ended by the "
        f"401), 1 worker at `--loglevel INFO`; {len(stored):,} bytes of Redis keys and values",
        lost=f"{len(leaks)} leaks: {'; '.join(leaks)}"
        if leaks
        else f"nothing: neither key, as written, JSON-escaped, percent-encoded or in base64, "
        f"nor once decoded, in the {', the '.join(places)}; the issues read "
        f"`{redacted_issues[0] if redacted_issues else '?'}`",
        before="the escaped key was scrubbed in the critique's raw text only: stored "
        "decoded in its issues (Redis, results, report, CSV, `duet show`); the "
        "percent-encoded key reached the run error and the log",
    )
    assert leaks == []
    assert len(raw) == 2 and len(redacted_issues) == 2, quoted.rounds
    assert "[REDACTED]" in failed.error


def _team(llm: FakeLLM, **critic: Any) -> Team:
    """The actor through the OpenAI SDK (``OPENAI_API_KEY``), the critic through the
    Anthropic SDK with a key of a spec's own variable; approved in round 2."""
    return Team.actor_critic(
        # The stand-in is not OpenAI's host: it gets the key only because it is named.
        actor=Agent(
            "Fix the code.", model="openai:sim", base_url=llm.url, api_key_env="OPENAI_API_KEY"
        ),
        critic=Agent(
            "Review.",
            model="anthropic:sim:critic?scores=0.2,0.95",
            base_url=llm.anthropic_url,
            api_key_env=CRITIC_KEY_ENV,
            **critic,
        ),
        max_rounds=3,
    )


#: Variables two critics' specs name, and their values: a fresh worker reads them only
#: when a spec names them (not key-shaped names, so no scan of the environment finds them).
LATE_KEYS = {
    "DUET_TEST_LATE_CRITIC_A": "cred.late.a.83f1d0c4e9",
    "DUET_TEST_LATE_CRITIC_B": "cred.late.b.27c6a4e1b8",
}


def test_a_critics_key_echoed_in_the_actors_step_reaches_nothing(
    private_redis: EmbeddedRedis, reliability: Reliability
) -> None:
    """A run's key variables are secrets from its first step: the vendor's error for the
    actor's call echoes the key of the run's critic (whose adapter this worker has not made
    yet, and whose spec it had not seen when it started), transient (retried) in one run
    and permanent in another. Looked for in every command Redis received, every key and
    value left in it, the worker's log, the results and Flower's task pages."""
    url = private_redis.url
    monitor = Monitor(private_redis.port)
    env = {"OPENAI_API_KEY": OPENAI_KEY, **LATE_KEYS, "DUET_RETRY_BASE_S": "0.05"}
    (var_a, key_a), (var_b, key_b) = LATE_KEYS.items()
    with (
        FakeLLM() as llm,
        celery_worker(url, env=env, loglevel="INFO", name="latekeys") as worker,
        client_pointed_at(url),
        flower_on(url) as flower_port,
    ):

        def team(variable: str) -> Team:
            return Team.actor_critic(
                actor=Agent(
                    "Fix.", model="openai:sim", base_url=llm.url, api_key_env="OPENAI_API_KEY"
                ),
                critic=Agent(
                    "Review.",
                    model="anthropic:sim:critic?scores=0.95",
                    base_url=llm.anthropic_url,
                    api_key_env=variable,
                ),
                max_rounds=1,
            )

        # The actor's first call fails with the critic's key in the message; its retry
        # succeeds.
        llm.set_faults(status=500, times=1, path=OPENAI_PATH, message=f"upstream: {key_a}")
        retried = team(var_a).run_sync("Write a parser.", timeout=60)
        assert retried.status == "approved", (retried.status, retried.error)
        # Permanent, in a run of another spec (another critic's key): the run ends there.
        llm.set_faults(status=401, path=OPENAI_PATH, message=f"upstream: {key_b}")
        failed = team(var_b).run_sync("Write a lexer.", timeout=60)
        assert failed.status == "interrupted", (failed.status, failed.error)
        faulted = llm.stats()["faulted"]

        def flower_saw_both() -> str | None:
            dump = json.dumps(_get(flower_port, "/api/tasks"))
            return dump if retried.run_id in dump and failed.run_id in dump else None

        flower = wait_for(flower_saw_both, 30, "Flower to see both runs")
        pages = "".join(
            json.dumps(_get(flower_port, f"/api/task/info/{task_id}"))
            for task_id in json.loads(flower)
        )
        log = Path(worker.log_path).read_text(errors="replace")
    captured = monitor.stop().decode("utf-8", errors="replace")
    results = json.dumps([result_record(retried), result_record(failed)])
    results += retried.model_dump_json() + failed.model_dump_json()
    places = {
        "MONITOR capture": captured,
        "Redis keys and values": redis_values(url),
        "worker log": log,
        "results": results,
        "Flower /api/tasks": flower,
        "Flower task pages": pages,
    }
    leaks = leaks_in(places, (key_a, key_b))
    reliability.record(
        section=SECRETS,
        fault="The vendor's error for the actor's call echoes the key of the run's critic "
        "(a variable only the critic's spec names, its adapter not yet made): a 500 then a "
        "successful retry in one run, a 401 in a run of another spec",
        load=f"2 runs on 1 fresh worker at `--loglevel INFO`, {faulted} faulted calls, Flower "
        "watching",
        lost=f"{len(leaks)} leaks: {'; '.join(leaks)}"
        if leaks
        else "nothing: neither critic's key (as written, escaped, encoded or in base64) in "
        f"the {', the '.join(places)}",
        before="the worker learned the critic's variable only when it made the critic's "
        "adapter: the actor's retry event carried the key to Flower and through Redis",
    )
    assert faulted == 2
    assert failed.error is not None and "[REDACTED]" in failed.error
    assert leaks == []
