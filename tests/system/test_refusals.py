"""Refusals, content filters and context overflows end a run ``interrupted`` with that
reason, the model's words in the run's error, nothing stored as a turn, nothing scored:
a real worker, real Redis, the real SDKs talking to the stand-in (synchronous calls and
vendor batches). The stand-in answers each vendor's own shape (``duet.standin.server``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, Literal

import pytest
import redis

from duet.standin.server import FakeLLM
from orchestration import Agent, RunResult, Team
from orchestration.core import events as ev
from tests.reliability import MODEL_OUTPUT, Reliability, lost_of
from tests.support import celery_worker, client_pointed_at
from workers.providers.sim import REFUSAL_TEXT

pytestmark = pytest.mark.system

#: The run error's words, per reason (orchestration.core.completion.REFUSAL_WORDS).
WORDS = {
    "refusal": "the model refused: " + REFUSAL_TEXT,
    "content_filter": "the vendor's content filter stopped the reply: [revision 1]",
    "context_window": "context",
}
FAULT = "refusals, filters, context overflow"


@pytest.fixture(scope="module")
def server() -> Iterator[FakeLLM]:
    with FakeLLM() as llm:
        yield llm


@pytest.fixture(scope="module")
def url(redis_url: str) -> Iterator[str]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    client.close()
    with client_pointed_at(redis_url):
        yield redis_url


@pytest.fixture(scope="module")
def worker(url: str, server: FakeLLM) -> Iterator[Any]:
    env = {
        "OPENAI_BASE_URL": server.url,
        "ANTHROPIC_BASE_URL": server.anthropic_url,
        "OPENAI_API_KEY": "sk-test-not-a-secret",
        "ANTHROPIC_API_KEY": "anthropic-test-not-a-secret",
        "DUET_VENDOR_BATCH_GATHER_S": "0.3",
        "DUET_VENDOR_BATCH_POLL_MAX_S": "0.3",
    }
    with celery_worker(url, env=env, concurrency=8, name="refusals") as proc:
        yield proc


@pytest.fixture
def llm(server: FakeLLM, worker: Any) -> FakeLLM:
    server.reset()
    return server


def tag() -> str:
    return uuid.uuid4().hex[:10]


def team(
    vendor: str,
    role: str,
    stop: str,
    execution: Literal["sync", "vendor_batch"] = "sync",
    structured: bool | None = None,
) -> Team:
    """Both agents on ``vendor``; ``role`` stops with ``stop`` in round 1: the actor on its
    first revision, the critic reviewing the draft (revision 0)."""
    actor = f"{vendor}:sim" + (f"?refuse_at=1&refuse={stop}" if role == "actor" else "")
    critic = f"{vendor}:sim:critic?scores=0.2"
    if role == "critic":
        critic += f"&refuse_at=0&refuse={stop}"
    return Team.actor_critic(
        actor=Agent("Fix the code.", model=actor, execution=execution),
        critic=Agent(
            "Review the code.", model=critic, execution=execution, structured_output=structured
        ),
        max_rounds=3,
        approval_threshold=0.9,
        name=f"refusals-{tag()}",
    )


def sent(llm: FakeLLM) -> list[str]:
    """Every message content the stand-in was sent, all requests together."""
    found = []
    for request in llm.last_requests:
        for m in request["body"].get("messages", []):
            content = m["content"]
            if not isinstance(content, str):  # Anthropic blocks (cache_control)
                content = "".join(part.get("text", "") for part in content)
            found.append(content)
    return found


def check(result: RunResult, role: str, stop: str, llm: FakeLLM, user: str, again: Team) -> int:
    """Assert the run ended interrupted by ``stop`` and stored nothing of it; the number
    of broken expectations (for the reliability row) is 0 when it returns."""
    round_ = 1
    assert result.status == "interrupted", (result.status, result.error)
    assert result.interruption_reason == f"{role}:round_{round_}:{stop}"
    assert result.error is not None and WORDS[stop] in result.error
    # nothing scored: round 1's critique exists only when the actor's revision was refused
    # after it, and a refused critique has no score, issues or critique event of round 1
    critiques = [e for e in result.events if e.type == ev.CRITIQUE]
    if role == "critic":
        assert [(r.round, r.score, r.issues) for r in result.rounds] == [(1, None, [])]
        assert all(e.round != 1 for e in critiques)
    else:
        assert [r.score for r in result.rounds] == [0.2]
        assert result.output is not None and result.output.startswith("[revision 0]")
    # no turn stored: the next run of the same user is sent the round-0 draft's turn,
    # never the refused text
    llm.reset()
    again.run_sync(f"Another task ({tag()}).", user_id=user, timeout=60)
    history = sent(llm)
    assert any("[revision 0]" in m for m in history)  # the conversation is carried...
    assert not any(REFUSAL_TEXT in m for m in history)  # ...without the refusal
    if role == "actor" and stop != "refusal":
        assert not any(m.startswith("[revision 1]") for m in history)  # nor the cut text
    return 0


CASES = [
    ("openai", "actor", "refusal"),
    ("openai", "critic", "refusal"),
    ("openai", "actor", "content_filter"),
    ("openai", "critic", "context_window"),
    ("anthropic", "actor", "refusal"),
    ("anthropic", "critic", "refusal"),
    ("anthropic", "actor", "context_window"),
]


@pytest.mark.parametrize(("vendor", "role", "stop"), CASES)
def test_an_outcome_interrupts_the_run_and_is_never_a_turn(
    llm: FakeLLM, reliability: Reliability, vendor: str, role: str, stop: str
) -> None:
    t, user = team(vendor, role, stop), f"u-{tag()}"
    result = t.run_sync(f"Task ({tag()}): a parser.", user_id=user, timeout=60)
    broken = int(result.interruption_reason != f"{role}:round_1:{stop}")
    reliability.record(
        section=MODEL_OUTPUT,
        fault=f"{FAULT}: {vendor} {role} answers {stop}",
        load="1 run, then the user's next run",
        lost=lost_of(broken, 1, "runs read it as an answer"),
        before="empty text, read as a review scoring 0.0 (or stored as a turn)",
    )
    check(result, role, stop, llm, user, t)


@pytest.mark.parametrize("vendor", ["openai", "anthropic"])
def test_a_structured_critic_that_refuses_scores_nothing(llm: FakeLLM, vendor: str) -> None:
    """Asked for its critique natively (a JSON schema, a forced tool), the critic refuses:
    no critique is read from the reply, the run is interrupted."""
    result = team(vendor, "critic", "refusal", structured=True).run_sync("Task.", timeout=60)
    request = llm.last_requests[-1]["body"]
    assert "response_format" in request or "tool_choice" in request  # asked natively
    assert result.interruption_reason == "critic:round_1:refusal"
    assert [(r.score, r.issues) for r in result.rounds] == [(None, [])]


@pytest.mark.parametrize(
    ("vendor", "role", "stop"),
    [
        ("openai", "critic", "refusal"),
        ("openai", "actor", "context_window"),
        ("anthropic", "critic", "context_window"),
        ("anthropic", "actor", "refusal"),
    ],
)
def test_an_outcome_in_a_vendor_batch_interrupts_the_run(
    llm: FakeLLM, reliability: Reliability, vendor: str, role: str, stop: str
) -> None:
    t = team(vendor, role, stop, execution="vendor_batch")
    result = t.run_sync(f"Task ({tag()}): a lexer.", timeout=90)
    broken = int(result.interruption_reason != f"{role}:round_1:{stop}")
    reliability.record(
        section=MODEL_OUTPUT,
        fault=f"{FAULT} in a vendor batch: {vendor} {role} answers {stop}",
        load="1 run",
        lost=lost_of(broken, 1, "runs read it as an answer"),
        before="empty text, read as a review scoring 0.0",
    )
    assert llm.stats()["batches"]["batch_requests"] > 0
    assert result.status == "interrupted", (result.status, result.error)
    assert result.interruption_reason == f"{role}:round_1:{stop}"
    assert result.error is not None and WORDS[stop] in result.error


@pytest.mark.parametrize("stop", ["refusal", "content_filter", "context_window"])
def test_the_stand_in_answers_each_shape_as_the_vendors_sdk_types_it(
    server: FakeLLM, stop: str
) -> None:
    import anthropic
    import openai

    model, ask = f"sim?refuse_at=0&refuse={stop}", [{"role": "user", "content": "Task."}]
    gpt = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0)
    if stop == "context_window":  # OpenAI: an HTTP 400 with its own code
        with pytest.raises(openai.BadRequestError) as caught:
            gpt.chat.completions.create(model=model, messages=ask)  # type: ignore[arg-type]
        assert caught.value.code == "context_length_exceeded"
    else:
        choice = gpt.chat.completions.create(model=model, messages=ask).choices[0]  # type: ignore[arg-type]
        if stop == "refusal":
            assert (choice.message.content, choice.message.refusal) == (None, REFUSAL_TEXT)
        else:
            assert choice.finish_reason == "content_filter" and choice.message.content
    claude = anthropic.Anthropic(base_url=server.anthropic_url, api_key="x", max_retries=0)
    reply = claude.messages.create(model=model, max_tokens=500, messages=ask)  # type: ignore[arg-type]
    expected = {"context_window": "model_context_window_exceeded"}.get(stop, "refusal")
    assert reply.stop_reason == expected
    if stop == "refusal":  # the wire shape; typed only by SDKs that know `stop_details`
        assert reply.model_dump()["stop_details"]["explanation"] == REFUSAL_TEXT
        if "stop_details" in type(reply).model_fields:
            assert reply.stop_details is not None
            assert reply.stop_details.explanation == REFUSAL_TEXT


def test_duet_show_says_the_model_refused(
    llm: FakeLLM, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from duet.commands.main import app

    result = team("openai", "actor", "refusal").run_sync(f"Task ({tag()}).", timeout=60)
    monkeypatch.setenv("DUET_REDIS_URL", url)
    shown = CliRunner().invoke(app, ["show", result.run_id])
    assert shown.exit_code == 0, shown.output
    flat = " ".join(shown.output.split())  # the table wraps long cells
    assert f"interrupted: refusal — the model refused: {REFUSAL_TEXT}" in flat
