"""The loop on a real Redis and a real `celery -A workers worker` process."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from orchestration import Agent, RunResult, Team
from orchestration.client.handles import RunHandle, producer, store
from orchestration.core import events as ev
from orchestration.state import fastpaths
from orchestration.state.broker import UNACKED_SUFFIX
from orchestration.state.keys import (
    ALL_QUEUES,
    BROKER_PREFIX,
    QUEUE_PRIORITIES,
    TASK_COORDINATE,
    TASK_CRITIQUE,
    TASK_GENERATE,
    queue_key,
)
from tests.support import celery_worker, client_pointed_at, wait_for

pytestmark = pytest.mark.system

# (critic model, expected status, rounds critiqued, model calls)
GROUPS = {
    "approve_r1": ("sim?scores=0.95", "approved", 1, 2),
    "approve_r2_fraction": ("sim?scores=0.3,0.95&format=fraction", "approved", 2, 4),
    "approve_r3_fenced": ("sim?scores=0.2,0.5,0.92&format=fenced", "approved", 3, 6),
    "never_prose": ("sim?scores=0.1,0.2,0.3,0.4&format=prose", "max_rounds_reached", 3, 7),
    "never_garbage": ("sim?format=garbage", "max_rounds_reached", 3, 7),
}


def expected_events(status: str, rounds: int) -> list[tuple[str, int | None]]:
    seq: list[tuple[str, int | None]] = [
        (ev.RUN_QUEUED, None),
        (ev.RUN_STARTED, None),
        (ev.ACTOR_STARTED, 0),
        (ev.ACTOR_COMPLETED, 0),
    ]
    for n in range(1, rounds + 1):
        seq += [(ev.CRITIC_STARTED, n), (ev.CRITIQUE, n)]
        if status == "approved" and n == rounds:
            seq.append((ev.APPROVED, n))
        else:
            seq += [(ev.ACTOR_STARTED, n), (ev.ACTOR_COMPLETED, n)]
    if status == "max_rounds_reached":
        seq.append((ev.MAX_ROUNDS_REACHED, rounds))
    seq.append((ev.RUN_FINISHED, rounds))
    return seq


def stand_in_team(fake_llm: Any, *, scores: str, max_rounds: int) -> Team:
    """Actor and critic on the real OpenAI SDK, talking to the stand-in server."""
    return Team.actor_critic(
        actor=Agent("Fix the code.", model="openai:sim", base_url=fake_llm.url),
        critic=Agent("Review.", model=f"openai:sim:critic?scores={scores}", base_url=fake_llm.url),
        max_rounds=max_rounds,
    )


def check_run(result: RunResult, status: str, rounds: int, calls: int) -> None:
    assert result.status == status, (result.status, result.interruption_reason, result.error)
    assert len(result.rounds) == rounds
    assert result.usage.total.calls == calls
    assert result.usage.by_role["actor"].calls == 1 + (
        rounds if status != "approved" else rounds - 1
    )
    assert [(e.type, e.round) for e in result.events] == expected_events(status, rounds)
    assert result.output and result.output.startswith(
        f"[revision {calls // 2 if status != 'approved' else rounds - 1}]"
    )
    if status == "approved":
        assert result.final_score is not None and result.final_score >= 0.9
        assert result.rounds[-1].revision is None
    else:
        assert all(r.revision for r in result.rounds)


def test_fifty_runs_end_right(worker: Any, client_on: str) -> None:
    handles: list[tuple[str, RunHandle]] = []
    for name, (critic_model, *_rest) in GROUPS.items():
        team = Team.actor_critic(
            actor=Agent("Fix the code.", model="sim"),
            critic=Agent("Review for security bugs.", model=critic_model),
            max_rounds=3,
            approval_threshold=0.9,
        )
        for i in range(10):
            handles.append(
                (name, team.submit(f"Review snippet {name}-{i}:\nimport os", user_id=f"u{i % 3}"))
            )
    assert len(handles) == 50
    for name, handle in handles:
        _, status, rounds, calls = GROUPS[name]
        check_run(handle.result(timeout=60), status, rounds, calls)


@pytest.fixture(params=["auto", "off"])
def fast_paths(request: pytest.FixtureRequest, redis_url: str) -> Iterator[str]:
    """The session's worker (``DUET_FAST_PATHS`` as the suite runs it), or a worker of its
    own with ``DUET_FAST_PATHS=off`` on a db of its own; the client pointed at its Redis
    with the same switch. Yields the switch."""
    if request.param == "auto":
        request.getfixturevalue("worker")
        request.getfixturevalue("client_on")
        yield "auto"
        return
    url = f"{redis_url.rpartition('/')[0]}/11"
    redis.Redis.from_url(url).flushdb()
    monkeypatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setenv(fastpaths.SWITCH, "off")
    fastpaths.reset()
    try:
        env = {"OPENAI_API_KEY": "sk-test-not-a-secret", fastpaths.SWITCH: "off"}
        with celery_worker(url, env=env, name="stock"), client_pointed_at(url):
            yield "off"
    finally:
        monkeypatch.undo()
        fastpaths.reset()


def test_submit_batch_counts_outcomes(fast_paths: str) -> None:
    team = Team.actor_critic(
        actor=Agent("Fix the code.", model="sim"),
        critic=Agent("Review.", model="sim?scores=0.2,0.95"),
        max_rounds=2,
    )
    batch = team.submit_batch([{"id": f"in-{i}", "prompt": f"code {i}"} for i in range(12)])
    results = list(batch.results(timeout=60))
    assert [r.input_id for r in results] == [f"in-{i}" for i in range(12)]
    assert {r.status for r in results} == {"approved"}
    progress = batch.progress()
    assert progress["total"] == progress["done"] == 12
    assert progress["counts"] == {"approved": 12}
    assert progress["calls"] == 12 * 4


def test_workers_send_each_message_in_the_script_that_calls_for_it(
    worker: Any, client_on: str
) -> None:
    """With the broker on the run-state Redis, a step's store pushes the coordinator's
    message and a transition its step's, inside their scripts: a worker sends no message
    of its own (a crash between a change and its message cannot strand the run). The
    ``publish`` fast path writes those messages: without it, they follow the change."""
    from bench.harness import monitored

    if not fastpaths.enabled("publish"):
        pytest.skip("the publish fast path is off here (DUET_FAST_PATHS, or its Celery)")

    team = Team.actor_critic(
        actor=Agent("Fix the code.", model="sim"),
        critic=Agent("Review.", model="sim?scores=0.2,0.95"),
        max_rounds=2,
    )
    with redis.Redis.from_url(client_on) as client, monitored(client) as seen:
        batch = team.submit_batch([f"code {i}" for i in range(6)])
        results = list(batch.results(timeout=60))
    assert {r.status for r in results} == {"approved"}
    # every list of each queue, as MONITOR writes it (\x06 escaped): drafts have their own
    queue_keys = {
        queue_key(q, p).encode("unicode_escape").decode(): q
        for q in ALL_QUEUES
        for p in QUEUE_PRIORITIES
    }
    pushes = [
        (kind, queue_keys[key]) for kind, cmd, key in seen if cmd == "lpush" and key in queue_keys
    ]
    # Each run: 4 steps (generate, critique, refine, critique), each made by a transition
    # and each stored; the first coordinator message is the client's submission.
    in_scripts = [key for kind, key in pushes if kind == "lua"]
    assert sorted(in_scripts) == sorted(["actor"] * 12 + ["critic"] * 12 + ["coordinator"] * 24)
    sent = [key for kind, key in pushes if kind != "lua"]
    assert sent == ["coordinator"] * 6, sent  # the submissions


def _queues_drained(client: Any) -> bool:
    unacked = client.hlen(f"{BROKER_PREFIX}unacked") + client.zcard(
        f"{BROKER_PREFIX}unacked_index{UNACKED_SUFFIX}"
    )
    return all(client.llen(queue_key(q)) == 0 for q in ALL_QUEUES) and not unacked


def test_step_delivered_twice_calls_the_model_once(
    worker: Any, client_on: str, fake_llm: Any
) -> None:
    fake_llm.set_faults(latency_ms=400)
    try:
        team = stand_in_team(fake_llm, scores="0.95", max_rounds=3)
        before = fake_llm.stats()["requests"]
        handle = team.submit("def f(x): return eval(x)")
        for event in handle.events(timeout=30):
            if event.type == ev.ACTOR_STARTED:
                break
        # The actor is mid-call: deliver the same step message again.
        producer().send_task(TASK_GENERATE, args=(handle.run_id, "r0.generate"))
        result = handle.result(timeout=30)
        assert result.status == "approved"
        assert fake_llm.stats()["requests"] - before == 2
        starts = [e for e in result.events if e.type == ev.ACTOR_STARTED]
        assert len(starts) == 1

        # After the run: every step and every transition delivered again changes nothing.
        app = producer()
        app.send_task(TASK_GENERATE, args=(handle.run_id, "r0.generate"))
        app.send_task(TASK_CRITIQUE, args=(handle.run_id, "r1.critique"))
        for seq in range(3):
            app.send_task(TASK_COORDINATE, args=(handle.run_id, seq))
        client = store().r
        wait_for(lambda: _queues_drained(client), 30, "the duplicate messages to be consumed")
        assert fake_llm.stats()["requests"] - before == 2
        again = handle.result(timeout=5)
        assert [e.type for e in again.events] == [e.type for e in result.events]
        assert again.status == "approved"
    finally:
        fake_llm.set_faults(latency_ms=0)


def test_redelivered_coordinate_mid_run_is_a_no_op(worker: Any, client_on: str) -> None:
    team = Team.actor_critic(
        actor=Agent("Fix.", model="sim?latency_ms=300"),
        critic=Agent("Review.", model="sim?scores=0.2,0.95&latency_ms=300"),
        max_rounds=3,
    )
    handle = team.submit("x = input()")
    for event in handle.events(timeout=30):
        if event.type == ev.CRITIC_STARTED:
            break
    # Transitions 0 and 1 were made; their messages arrive again while round 1 runs.
    producer().send_task(TASK_COORDINATE, args=(handle.run_id, 0))
    producer().send_task(TASK_COORDINATE, args=(handle.run_id, 1))
    result = handle.result(timeout=30)
    check_run(result, "approved", 2, 4)


def test_cancel_stops_after_the_current_step(worker: Any, client_on: str) -> None:
    team = Team.actor_critic(
        actor=Agent("Fix.", model="sim?latency_ms=300"),
        critic=Agent("Review.", model="sim?scores=0.1&latency_ms=300"),
        max_rounds=3,
    )
    handle = team.submit("rm -rf /")
    for event in handle.events(timeout=30):
        if event.type == ev.ACTOR_STARTED:
            break
    assert handle.cancel() is True
    result = handle.result(timeout=30)
    assert result.status == "cancelled"
    assert result.usage.total.calls == 1  # the call in flight finished and was kept
    assert result.output is not None
    assert handle.cancel() is False


def test_interruption_keeps_the_last_output(worker: Any, client_on: str) -> None:
    team = Team.actor_critic(
        actor=Agent("Fix.", model="sim?truncate_at=1"),
        critic=Agent("Review.", model="sim?scores=0.1"),
        max_rounds=3,
    )
    result = team.run_sync("def handler(req): pass", timeout=30)
    assert result.status == "interrupted"
    assert result.interruption_reason == "actor:round_1:max_tokens"
    assert result.output is not None and result.output.startswith("[revision 0]")
    assert result.usage.total.calls == 3


#: The stand-in critic's prose reply of revision 0 at 0.95 is 33 tokens; its JSON object
#: ends in token 28. At 30 the cut falls after the object, at 26 inside it.
@pytest.mark.parametrize(
    ("max_tokens", "status", "reason"),
    [(30, "approved", None), (26, "interrupted", "critic:round_1:max_tokens")],
)
def test_a_critique_cut_at_max_tokens_counts_when_its_json_is_whole(
    worker: Any, client_on: str, fake_llm: Any, max_tokens: int, status: str, reason: str | None
) -> None:
    team = Team.actor_critic(
        actor=Agent("Fix the code.", model="openai:sim", base_url=fake_llm.url),
        critic=Agent(
            "Review.",
            model="openai:sim:critic?scores=0.95&format=prose",
            base_url=fake_llm.url,
            max_tokens=max_tokens,
        ),
        max_rounds=2,
    )
    result = team.run_sync("def f(x): return eval(x)", timeout=30)
    assert (result.status, result.interruption_reason) == (status, reason), result.error
    [critique] = [e for e in result.events if e.type == ev.CRITIQUE]
    assert critique.data["interrupted"] == (None if reason is None else "max_tokens")
    assert critique.data["output_tokens"] == max_tokens  # the reply was cut in both cases
    if status == "approved":
        assert result.final_score == 0.95 and result.final_score_judges_output
        reply = result.rounds[0].critic_reply or ""
        assert '0.95."} Hope' in reply and not reply.endswith("helps.")  # cut after the JSON


def test_events_follow_live(worker: Any, client_on: str) -> None:
    team = Team.actor_critic(
        actor=Agent("Fix.", model="sim?latency_ms=50"),
        critic=Agent("Review.", model="sim?scores=0.95&latency_ms=50"),
    )
    handle = team.submit("print(1)")
    started = time.monotonic()
    seen = [e.type for e in handle.events(timeout=30)]
    assert seen[-1] == ev.RUN_FINISHED
    assert ev.APPROVED in seen
    assert time.monotonic() - started < 30


def test_cancel_then_resume_a_batch_repeats_no_step(
    worker: Any, client_on: str, fake_llm: Any
) -> None:
    fake_llm.set_faults(latency_ms=150)
    try:
        team = stand_in_team(fake_llm, scores="0.1", max_rounds=2)
        before = fake_llm.stats()["requests"]
        batch = team.submit_batch([f"snippet {i}: os.system(x)" for i in range(10)])
        first = RunHandle(batch.run_ids(0, 0)[0])
        for event in first.events(timeout=30):
            if event.type == ev.CRITIC_STARTED:
                break
        assert batch.cancel() > 0
        cancelled = list(batch.results(timeout=60))
        assert any(r.status == "cancelled" for r in cancelled)
        assert batch.progress()["done"] == 10

        assert batch.resume() == sum(r.status == "cancelled" for r in cancelled)
        results = list(batch.results(timeout=60))
        assert [r.status for r in results] == ["max_rounds_reached"] * 10
        assert batch.progress()["counts"] == {"max_rounds_reached": 10}
        # Every step ran exactly once across cancel and resume: 1 + 2 x 2 calls a run.
        assert fake_llm.stats()["requests"] - before == 10 * 5
        for r in results:
            starts = [e.type for e in r.events if e.type in (ev.ACTOR_STARTED, ev.CRITIC_STARTED)]
            assert len(starts) == 5
            assert r.usage.total.calls == 5
    finally:
        fake_llm.set_faults(latency_ms=0)


def test_messages_carry_ids_only(redis_client: Any, redis_url: str) -> None:
    """With no worker on this db the messages stay queued, so we can read them raw."""
    with client_pointed_at(redis_url):
        team = Team.actor_critic(
            actor=Agent("SECRET-INSTRUCTIONS", model="sim"), critic=Agent("Review.", model="sim")
        )
        handle = team.submit("TOP-SECRET-PROMPT sk-live-123", user_id="alice")
        raw = redis_client.lrange(queue_key("coordinator"), 0, -1)
        assert len(raw) == 1
        import base64
        import json

        message = json.loads(raw[0])
        body = json.loads(base64.b64decode(message["body"]))
        assert body[0] == [handle.run_id, 0]
        everything = raw[0].decode() + base64.b64decode(message["body"]).decode()
        for secret in ("TOP-SECRET", "sk-live", "SECRET-INSTRUCTIONS", "alice"):
            assert secret not in everything


def test_async_run_and_the_nested_form_run_the_same_loop(worker: Any, client_on: str) -> None:
    import asyncio

    from orchestration import ActorCritic

    actor = Agent("Generate the code.", model="sim")
    critic = Agent("Find bugs. Return strict JSON.", model="sim?scores=0.4,0.95")
    team = Team.actor_critic(actor=actor, critic=critic, max_rounds=3, model="claude-opus-4-7")
    nested = Agent(
        "Manage actor + critic.",
        model="claude-opus-4-7",
        architecture=ActorCritic(actor=actor, critic=critic, max_rounds=3, approval_threshold=0.9),
    )

    async def both() -> list[RunResult]:
        return await asyncio.gather(
            team.run("Write a function that sanitizes user input.", user_id="alice", timeout=30),
            nested.run("Write a function that sanitizes user input.", timeout=30),
        )

    from_team, from_agent = asyncio.run(both())
    for result in (from_team, from_agent):
        check_run(result, "approved", 2, 4)
    assert from_team.user_id == "alice"
    assert from_team.output == from_agent.output  # the same deterministic loop


def test_embedded_default_runs_without_any_redis_configured() -> None:
    """What a newcomer's laptop does: no DUET_REDIS_URL, so Redis and a worker start here."""
    import subprocess
    import sys

    from tests.support import ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith("DUET_")}
    code = (
        "from orchestration import Agent, Team\n"
        "t = Team.actor_critic(actor=Agent('w', model='sim'), "
        "critic=Agent('r', model='sim?scores=0.5,0.95'))\n"
        "r = t.run_sync('hello', timeout=60)\n"
        "print(r.status, len(r.rounds), r.usage.total.calls)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["approved", "2", "4"]


def test_a_killed_workers_step_is_redelivered_and_the_run_finishes(
    fake_llm: Any, redis_url: str
) -> None:
    """SIGKILL mid-call: the unacknowledged message returns after the visibility timeout,
    another worker takes the step over once the dead worker's claim runs out (its lease,
    no longer renewed), finishes the run, and no stored step is run again."""
    url = f"{redis_url.rpartition('/')[0]}/{int(os.environ.get('DUET_KILL_REDIS_DB', '12'))}"
    redis.Redis.from_url(url).flushdb()
    # A short visibility timeout on purpose (so the message comes back soon): the start
    # check that refuses it is off.
    env = {
        "OPENAI_API_KEY": "sk-test-not-a-secret",
        "DUET_VISIBILITY_TIMEOUT_S": "5",
        "DUET_CHECK_TIMEOUTS": "false",
        "DUET_STEP_LEASE_S": "5",
    }
    fake_llm.set_faults(latency_ms=0, delays_ms=[3000])  # the first call hangs 3 s
    try:
        with client_pointed_at(url):
            team = stand_in_team(fake_llm, scores="0.95", max_rounds=3)
            before = fake_llm.stats()["requests"]
            with celery_worker(url, env=env, name="doomed") as doomed:
                handle = team.submit("def f(x): return eval(x)")
                wait_for(lambda: fake_llm.stats()["requests"] - before >= 1, 30, "the first call")
                doomed.send_signal(signal.SIGKILL)
                doomed.wait(10)
            with celery_worker(url, env=env, name="heir"):
                result = handle.result(timeout=60)
        assert result.status == "approved"
        assert result.usage.total.calls == 2
        # The dead worker's call reached the server but its reply was lost: 2 + 1.
        assert fake_llm.stats()["requests"] - before == 3
        assert [e.type for e in result.events].count(ev.ACTOR_STARTED) == 1
    finally:
        fake_llm.set_faults(latency_ms=0)
        redis.Redis.from_url(url).flushdb()
