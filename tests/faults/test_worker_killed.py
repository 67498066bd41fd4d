"""A worker killed (SIGKILL) with calls in flight: the sweep sends its runs on, every run
finishes, and the budget is charged for every request the vendor served.

Two real worker processes, the real ``openai`` SDK against the stand-in (2 s calls), each
run with a budget of its own. One worker is killed while it holds calls; its messages
stay unacknowledged (the broker's visibility timeout is an hour), so the runs move on
only through the sweep, once the dead worker's claims ran out. The dead calls reached the
stand-in (it served them; their answers were lost): their holds are charged when they
lapse, so the runs' budgets cover every request the stand-in counted.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from duet.embedded.server import EmbeddedRedis
from duet.standin.server import FakeLLM
from orchestration import Agent, Team
from orchestration.client.handles import store
from orchestration.core.budget import Budget
from orchestration.state import keys
from orchestration.state.broker import UNACKED_SUFFIX
from orchestration.state.budgets import BudgetLedger
from tests.reliability import ENGINE, Reliability, lost_of
from tests.support import ROOT, celery_worker, client_pointed_at, stored_calls, swept_runs, wait_for

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

RUNS = 10


@pytest.fixture
def llm() -> Iterator[FakeLLM]:
    with FakeLLM(latency_ms=2000) as server:
        yield server


def test_a_worker_killed_mid_call(llm: FakeLLM, reliability: Reliability) -> None:
    env = {
        "OPENAI_API_KEY": "sk-test-killed",
        "DUET_STEP_LEASE_S": "5",
        "DUET_SWEEP_INTERVAL_S": "1",
        "DUET_SWEEP_AFTER_S": "8",
    }
    with EmbeddedRedis() as server, contextlib.ExitStack() as stack:
        survivor, doomed, team = _fleet(stack, server.url, llm, env, concurrency=16)
        handles = [team.submit(f"task {n}") for n in range(RUNS)]
        # Every first call is in flight on the doomed worker (the survivor takes only
        # coordinator work until then): kill it.
        wait_for(lambda: llm.stats()["requests"] >= RUNS, 60, "the calls to be in flight")
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(10)
        heir = stack.enter_context(celery_worker(server.url, env=env, concurrency=16, name="heir"))
        statuses = [h.result(timeout=120).status for h in handles]
        served = llm.stats()
        ledger = BudgetLedger(store().r)
        spent = [ledger.get(f"run:{h.run_id}").spent for h in handles]
        calls, tokens = sum(s.calls for s in spent), sum(s.tokens for s in spent)
        stored = stored_calls(server.url, [h.run_id for h in handles])
        usage = served["usage"]
        logs = [Path(w.log_path).read_text(errors="replace") for w in (survivor, heir)]
        print(
            f"kill -9 with {RUNS} calls in flight: {RUNS}/{RUNS} runs finished; "
            f"{served['requests']} requests served, {stored} stored calls; "
            f"budgets charged {calls} calls, {tokens} tokens "
            f"(the stand-in sent {usage['input_tokens'] + usage['output_tokens']})"
        )
        approved = statuses.count("approved")
        billed = usage["input_tokens"] + usage["output_tokens"]
        unexplained = served["requests"] - stored - RUNS
        wrong = [
            lost_of(RUNS - approved, RUNS, "runs not approved"),
            lost_of(
                max(served["requests"] - calls, 0), served["requests"], "served calls uncharged"
            ),
            lost_of(max(billed - tokens, 0), billed, "billed tokens uncharged"),
            lost_of(
                max(unexplained, 0),
                served["requests"],
                "requests beyond the stored and the dead calls",
            ),
        ]
        reliability.record(
            section=ENGINE,
            fault=f"A worker killed (`SIGKILL`) with a call in flight on each of {RUNS} runs (each "
            "run with a budget of its own); the broker's visibility timeout an hour, so only the "
            "sweep moves them",
            load=f"{RUNS} runs, 2 s calls; lease 5 s, sweep every 1 s after 8 s",
            lost=f"{'; '.join(w for w in wrong if w != 'nothing') or 'nothing'}: {approved} of "
            f"{RUNS} approved, with no resume (the sweep sent on {swept_runs(logs)} run(s)); the "
            f"stand-in served {served['requests']} requests ({stored} stored + the {RUNS} dead "
            f"calls, whose answers were lost) and the budgets charged {calls} calls and "
            f"{tokens:,} tokens against the {billed:,} tokens the stand-in billed (dead holds are "
            "charged their worst case)",
            before="a dead worker's hold was released, so a call the vendor billed was charged "
            "nothing",
        )
        assert survivor.poll() is None
        assert statuses == ["approved"] * RUNS
        # The dead calls (at most one a run: a kill can land before a run's call went
        # out), and nothing else.
        assert stored < served["requests"] <= stored + RUNS
        assert calls >= served["requests"]
        assert tokens >= usage["input_tokens"] + usage["output_tokens"]


def test_duet_resume_right_after_a_worker_died_mid_call(
    llm: FakeLLM, reliability: Reliability
) -> None:
    """No sweep (it would wait 10 minutes) and a 5-minute lease: ``duet resume`` of the
    batch, run as soon as the worker is dead, sends the dead steps again; each finds the
    dead delivery's claim, sees that its process is gone (no liveness key) and takes the
    step over at once, charging the dead call's hold. Every run finishes in seconds, far
    inside the lease."""
    lease_s = 300
    env = {
        "OPENAI_API_KEY": "sk-test-killed",
        "DUET_STEP_LEASE_S": str(lease_s),
        "DUET_SWEEP_AFTER_S": "600",
        "DUET_PROCESS_TTL_S": "3",
    }
    with EmbeddedRedis() as server, contextlib.ExitStack() as stack:
        _, doomed, team = _fleet(stack, server.url, llm, env, concurrency=8)
        batch = team.submit_batch([f"task {n}" for n in range(4)])
        wait_for(lambda: llm.stats()["requests"] >= 4, 60, "the calls to be in flight")
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(10)
        killed = time.monotonic()
        stack.enter_context(celery_worker(server.url, env=env, concurrency=8, name="heir"))
        resumed = subprocess.run(
            [sys.executable, "-m", "duet", "resume", batch.batch_id],
            env={**os.environ, "DUET_REDIS_URL": server.url},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert resumed.returncode == 0, resumed.stderr
        assert "re-enqueued 4 unfinished run(s)" in resumed.stdout
        wait_for(lambda: batch.progress()["done"] == 4, lease_s / 5, "every run to finish")
        took = time.monotonic() - killed
        requests = llm.stats()["requests"]
        run_ids = batch.run_ids()
        stored = stored_calls(server.url, run_ids)
        ledger = BudgetLedger(store().r)
        spent = [ledger.get(f"run:{r}") for r in run_ids]
        charged = sum(s.spent.calls for s in spent)
        print(
            f"duet resume after kill -9 (lease {lease_s} s): 4/4 finished {took:.1f} s after "
            f"the kill; {requests} requests, {stored} stored; budgets charged {charged} "
            f"calls, {sum(s.open_reservations for s in spent)} holds left"
        )
        counts = batch.progress()["counts"]
        left = sum(s.open_reservations for s in spent)
        reliability.record(
            section=ENGINE,
            fault="`duet resume` of a batch right after its worker was killed (`SIGKILL`) "
            "mid-call, no sweep (`DUET_SWEEP_AFTER_S` 600) and a long lease: each re-sent step "
            "finds the dead delivery's claim, sees its process's liveness key gone, and takes "
            "the step over at once, charging the dead call's hold",
            load=f"4 runs with a budget each, 2 s calls; lease {lease_s} s, process liveness "
            f"TTL {env['DUET_PROCESS_TTL_S']} s",
            lost=f"{lost_of(4 - counts.get('approved', 0), 4, 'runs unfinished')}: every run "
            f"finished {took:.0f} s after the kill; {requests} requests = {stored} stored + "
            f"{requests - stored} dead calls; budgets charged {charged} calls, {left} holds "
            "left",
            before="resume's messages were turned away as busy until the dead claim's lease "
            "ran out (issue 9: `DUET_STEP_LEASE_S` 900 s); the dead holds stayed reserved as "
            "long",
        )
        assert counts == {"approved": 4}
        assert took < lease_s / 5
        assert requests == stored + 4  # the 4 dead calls, and nothing else
        # The dead calls' holds were charged when their steps were taken over, not left
        # to their lease.
        assert charged == requests
        assert left == 0


def _fleet(
    stack: contextlib.ExitStack, url: str, llm: FakeLLM, env: dict[str, str], concurrency: int
) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes], Team]:
    """A client on ``url``, a worker taking only coordinator work (the survivor), one taking
    everything (the doomed), and a one-round team whose runs each have a budget."""
    stack.enter_context(client_pointed_at(url))
    survivor = stack.enter_context(
        celery_worker(url, env=env, concurrency=concurrency, name="survivor", queues="coordinator")
    )
    doomed = stack.enter_context(
        celery_worker(url, env=env, concurrency=concurrency, name="doomed")
    )
    return survivor, doomed, _one_round_team(llm, budget=Budget(max_tokens=1_000_000))


def _one_round_team(llm: FakeLLM, budget: Budget | None = None) -> Team:
    """A team on the stand-in whose critic approves the first draft (2 calls a run)."""
    return Team.actor_critic(
        actor=Agent("Fix.", model="openai:sim", base_url=llm.url),
        critic=Agent("Review.", model="openai:sim:critic?scores=0.95", base_url=llm.url),
        max_rounds=1,
        budget=budget,
    )


def test_a_worker_killed_before_its_acks_were_written(
    llm: FakeLLM, reliability: Reliability
) -> None:
    """Acks are written in batches (with the next pop's note, within a second when idle, on close, or 32 at a time): a worker
    killed right after its runs finished leaves the messages of tasks it ran noted as
    unacknowledged. After the visibility timeout another worker gets them back; each finds
    its step done or its run over and calls no model."""
    from orchestration.state.broker import UNACKED_SUFFIX
    from orchestration.state.keys import ALL_QUEUES, BROKER_PREFIX, QUEUE_PRIORITIES, queue_key

    runs = 8
    env = {
        "OPENAI_API_KEY": "sk-test-acks",
        "DUET_VISIBILITY_TIMEOUT_S": "5",
        "DUET_CHECK_TIMEOUTS": "false",
    }
    unacked = f"{BROKER_PREFIX}unacked_index{UNACKED_SUFFIX}"
    llm.set_faults(latency_ms=50)
    with EmbeddedRedis() as server, contextlib.ExitStack() as stack:
        stack.enter_context(client_pointed_at(server.url))
        admin = store().r
        doomed = stack.enter_context(
            celery_worker(server.url, env=env, concurrency=8, name="doomed")
        )
        team = _one_round_team(llm)
        batch = team.submit_batch([f"task {n}" for n in range(runs)])
        wait_for(lambda: batch.progress()["done"] == runs, 60, "every run to finish", interval=0.01)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(10)
        left_noted = int(admin.zcard(unacked))
        requests = llm.stats()["requests"]
        stack.enter_context(celery_worker(server.url, env=env, concurrency=8, name="heir"))
        wait_for(
            lambda: (
                admin.zcard(unacked) == 0
                and all(
                    admin.llen(queue_key(q, p)) == 0 for q in ALL_QUEUES for p in QUEUE_PRIORITIES
                )
            ),
            60,
            "the noted messages to come back and be taken",
        )
        after = llm.stats()["requests"]
        stored = stored_calls(server.url, batch.run_ids())
        counts = batch.progress()["counts"]
        print(
            f"kill -9 before the acks were written: {left_noted} messages left noted; "
            f"{requests} -> {after} requests, {stored} stored calls; {counts}"
        )
        reliability.record(
            section=ENGINE,
            fault="A worker killed (`SIGKILL`) as soon as its runs finished, before the batch "
            "of acks it gathered was written: the messages of tasks it ran are still noted as "
            "unacknowledged and come back after the visibility timeout (5 s)",
            load=f"{runs} one-round runs on 1 worker × 8 threads, then 1 worker to take the "
            "messages back",
            lost=f"{lost_of(after - requests, max(requests, 1), 'second model calls')}: "
            f"{left_noted} messages came back and were taken; {after} requests = {stored} "
            f"stored calls; {counts.get('approved', 0)} of {runs} runs approved",
        )
        assert left_noted > 0, "the kill came after the acks were written (no fault met)"
        assert after == requests == stored
        assert counts == {"approved": runs}


#: Loaded by a worker (``sitecustomize``) to kill itself (SIGKILL) as soon as the store
#: method named by DUET_TEST_DIE_AFTER has returned: the change is in Redis, the task has
#: not returned, its message is not acked.
_DIE_AFTER = """
import os, signal
from orchestration.state import runs

_name = os.environ["DUET_TEST_DIE_AFTER"]
_original = getattr(runs.RunStore, _name)

def _then_die(self, *args, **kwargs):
    out = _original(self, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
    return out

setattr(runs.RunStore, _name, _then_die)
"""


@pytest.mark.parametrize(
    ("change", "doomed_queues", "others"),
    [
        ("complete_step", "actor", "coordinator,critic"),
        ("record_step", "coordinator", "actor,critic"),
    ],
    ids=["after-a-store", "after-a-transition"],
)
def test_a_worker_killed_between_a_change_and_its_message(
    llm: FakeLLM,
    reliability: Reliability,
    tmp_path: Path,
    change: str,
    doomed_queues: str,
    others: str,
) -> None:
    """A worker killed right after a step's answer was stored (or a transition made), before
    its task returned: the message that moves the run on went with the change, in its
    script, so the run goes on at once — not after the broker's visibility timeout (an
    hour here) or the sweep (off here)."""
    (tmp_path / "sitecustomize.py").write_text(_DIE_AFTER)
    env = {"OPENAI_API_KEY": "sk-test-between", "DUET_SWEEP_IN_WORKER": "false"}
    doomed_env = {
        **env,
        "DUET_TEST_DIE_AFTER": change,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
    }
    llm.set_faults(latency_ms=50)
    with EmbeddedRedis() as server, contextlib.ExitStack() as stack:
        stack.enter_context(client_pointed_at(server.url))
        stack.enter_context(
            celery_worker(server.url, env=env, concurrency=4, name="others", queues=others)
        )
        doomed = stack.enter_context(
            celery_worker(
                server.url, env=doomed_env, concurrency=1, name="doomed", queues=doomed_queues
            )
        )
        team = _one_round_team(llm)
        handle = team.submit("task")
        assert doomed.wait(30) == -signal.SIGKILL, "the worker did not die at its change"
        died = time.monotonic()
        stack.enter_context(
            celery_worker(server.url, env=env, concurrency=4, name="heir", queues=doomed_queues)
        )
        status = handle.result(timeout=60).status
        took = time.monotonic() - died
        requests = llm.stats()["requests"]
        stored = stored_calls(server.url, [handle.run_id])
        where = "a step's store" if change == "complete_step" else "a transition"
        reliability.record(
            section=ENGINE,
            fault=f"A worker killed (`SIGKILL`) right after {where} was written, before its "
            "task returned (its message not acked, the visibility timeout an hour, the sweep "
            "off): the message that moves the run on went with the change, in its script",
            load="1 one-round run; the killed worker alone on the "
            f"`{doomed_queues}` queue, then a new one",
            lost=f"{lost_of(0 if status == 'approved' else 1, 1, 'runs not finished')}: the "
            f"run {status} {took:.1f} s after the kill (a new worker started in between); "
            f"{requests} requests = "
            f"{stored} stored calls<br>Before the fix: the run waited for the message's "
            "redelivery after the visibility timeout, or for the sweep",
        )
        # Without the fix the run waits for the visibility timeout (an hour) or the sweep.
        assert status == "approved" and took < 120
        assert requests == stored == 2


FROZEN_S = 20.0


def test_a_worker_frozen_longer_than_its_liveness_ttl(
    llm: FakeLLM, reliability: Reliability
) -> None:
    """Shipped defaults (process TTL 10 s): a worker frozen (``SIGSTOP``) for 20 s mid-call
    counts as dead; its claimed steps are taken over and called again (the documented
    repeat), and once it runs again its own answers are not stored twice. Measured: how
    many calls were repeated, and what the budgets charged against the stand-in's bill."""
    env = {"OPENAI_API_KEY": "sk-test-frozen"}
    runs = 6
    with EmbeddedRedis() as server, contextlib.ExitStack() as stack:
        _, frozen, team = _fleet(stack, server.url, llm, env, concurrency=8)
        heir = stack.enter_context(
            celery_worker(server.url, env=env, concurrency=8, name="heir", queues="critic")
        )
        handles = [team.submit(f"task {n}") for n in range(runs)]
        wait_for(lambda: llm.stats()["requests"] >= runs, 60, "the drafts to be in flight")
        frozen.send_signal(signal.SIGSTOP)
        # Another worker takes the steps sent on (the frozen one holds its calls).
        extra = stack.enter_context(celery_worker(server.url, env=env, concurrency=8, name="x"))
        time.sleep(FROZEN_S)  # the fault itself
        frozen.send_signal(signal.SIGCONT)
        statuses = [h.result(timeout=120).status for h in handles]
        served = llm.stats()
        ledger = BudgetLedger(store().r)
        spent = [ledger.get(f"run:{h.run_id}").spent for h in handles]
        stored = stored_calls(server.url, [h.run_id for h in handles])
        alive = [w.poll() is None for w in (frozen, heir, extra)]
    usage = served["usage"]
    billed = usage["input_tokens"] + usage["output_tokens"]
    tokens = sum(s.tokens for s in spent)
    repeated = served["requests"] - stored
    print(
        f"SIGSTOP {FROZEN_S:.0f}s mid-call: {statuses.count('approved')}/{runs} approved; "
        f"{served['requests']} requests for {stored} stored calls ({repeated} repeated); "
        f"charged {tokens:,} tokens for {billed:,} billed; alive {alive}"
    )
    reliability.record(
        section=ENGINE,
        fault=f"A worker frozen (`SIGSTOP`) for {FROZEN_S:.0f} s with a call in flight on "
        f"each of {runs} runs, shipped defaults (process TTL 10 s), another worker up",
        load=f"{runs} runs, 2 s calls, a budget each",
        lost=f"{lost_of(runs - statuses.count('approved'), runs, 'runs not approved')}: "
        f"{repeated} calls repeated (the frozen worker's, taken over as dead); the budgets "
        f"charged {tokens:,} tokens for the {billed:,} billed",
        before="not measured",
    )
    assert statuses == ["approved"] * runs
    assert all(alive)
    assert tokens >= billed  # never under the bill


def test_a_worker_killed_holding_a_message_it_never_noted(
    llm: FakeLLM, reliability: Reliability
) -> None:
    """A worker killed right after it took a message (a step scheduled for later, not yet
    claimed) and before its next beat noted it: the message is in the broker's
    unacknowledged set only, no claim names the dead worker, and the sweep is off. Once
    every live worker has noted what it holds, the message no one holds goes back to its
    queue, and the run goes on — not after the visibility timeout (an hour)."""
    env = {"OPENAI_API_KEY": "sk-test-orphan", "DUET_SWEEP_IN_WORKER": "false"}
    llm.set_faults(latency_ms=50)
    with EmbeddedRedis() as server, contextlib.ExitStack() as stack:
        stack.enter_context(client_pointed_at(server.url))
        stack.enter_context(
            celery_worker(server.url, env=env, concurrency=4, name="survivor", queues="coordinator")
        )
        handle = _one_round_team(llm).submit("task")
        r = store().r
        drafts = keys.queue_key(keys.QUEUE_ACTOR, keys.DRAFT_PRIORITY)
        wait_for(lambda: r.llen(drafts) == 1, 30, "the draft's message")
        # The step's message, scheduled a few seconds ahead: a worker takes and holds it.
        message = json.loads(r.rpop(drafts))
        message["headers"]["eta"] = (datetime.now(UTC) + timedelta(seconds=5)).isoformat()
        r.lpush(drafts, json.dumps(message))
        doomed = stack.enter_context(
            celery_worker(server.url, env=env, concurrency=4, name="doomed", queues="actor")
        )
        unacked = f"{keys.BROKER_PREFIX}unacked_index{UNACKED_SUFFIX}"
        wait_for(lambda: r.zcard(unacked) == 1 and not r.llen(drafts), 30, "the message taken")
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(10)
        died = time.monotonic()
        # Its next beat would have noted the message within a third of its TTL; it died
        # first (made certain here: its note is dropped).
        procs = r.zrange(keys.processes(), 0, -1)
        dead = [keys.process_held(p) for p in procs if f".{doomed.pid}." in p]
        assert dead, procs
        r.delete(*dead)
        stack.enter_context(
            celery_worker(server.url, env=env, concurrency=4, name="heir", queues="actor,critic")
        )
        status = handle.result(timeout=90).status
        took = time.monotonic() - died
        requests = llm.stats()["requests"]
        stored = stored_calls(server.url, [handle.run_id])
    print(f"killed holding a message it never noted: {status} {took:.1f}s after the kill")
    reliability.record(
        section=ENGINE,
        fault="A worker killed (`SIGKILL`) right after it took a step's message (scheduled "
        "for later, not yet claimed), before its next beat noted what it holds; no claim "
        "names it, the visibility timeout an hour, the sweep off",
        load="1 one-round run; the killed worker alone on the `actor` queue, then a new one",
        lost=f"{lost_of(0 if status == 'approved' else 1, 1, 'runs not finished')}: the run "
        f"{status} {took:.1f} s after the kill (the message no live worker held put back "
        f"once every live worker had noted what it holds); {requests} requests = {stored} "
        "stored calls",
        before="the run waited for the visibility timeout (an hour) or the sweep (600 s): "
        "5 of 120 runs of the chaos soak",
    )
    # Without the fix the run waits for the visibility timeout (an hour) or the sweep.
    assert status == "approved" and took < 60
    assert requests == stored == 2
