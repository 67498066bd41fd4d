"""Key values are scrubbed whatever they look like: from messages, log lines and tracebacks."""

from __future__ import annotations

import io
import logging
import urllib.parse
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestration.core.agents import Agent
from orchestration.core.errors import ConfigError
from tests.reliability import SECRETS, Reliability, lost_of
from workers import secrets
from workers.providers.base import Provider

KEY = "plain.looking.value.8c1f"
FAULT = (
    "A log line and a chained traceback quoting a key value; the same through Python's "
    "last-resort handler (what `duet run`'s in-process worker logs through)"
)


def test_the_default_key_variables_are_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    assert secrets.redact(f"upstream said: bad credential {KEY}!") == (
        "upstream said: bad credential [REDACTED]!"
    )


def test_a_variable_named_by_a_spec_is_secret_once_its_adapter_exists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DUET_TEST_OWN_KEY_VAR", KEY)
    assert KEY in secrets.redact(KEY)  # not a key variable yet

    class Echo(Provider):
        name = "echo"

        def _call(self, agent, messages):  # type: ignore[no-untyped-def]
            raise RuntimeError(f"refused {KEY}")

    Echo(api_key_env="DUET_TEST_OWN_KEY_VAR")
    assert secrets.redact(f"x {KEY} y") == "x [REDACTED] y"
    error = Echo().classify(RuntimeError(f"refused {KEY}"))
    assert KEY not in str(error)


def test_short_values_are_not_searched_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    assert secrets.redact("x marks the spot") == "x marks the spot"


def test_log_lines_and_chained_tracebacks_are_redacted(
    monkeypatch: pytest.MonkeyPatch, reliability: Reliability
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("duet-test-redaction")
    logger.addHandler(handler)
    logger.propagate = False
    secrets.redact_logs(logger)
    secrets.redact_logs(logger)  # idempotent
    assert len(handler.filters) == 1
    try:
        try:
            raise ValueError(f"vendor echoed {KEY}")
        except ValueError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError:
        logger.exception("call failed with %s", KEY)
    logger.removeHandler(handler)
    text = stream.getvalue()
    reliability.record(
        section=SECRETS,
        fault=FAULT,
        load="unit: a log line quoting the key, with a chained traceback quoting it",
        lost=f"{lost_of(text.count(KEY), 2, 'quotes of the key left in the log')}: "
        f"{text.count('[REDACTED]')} `[REDACTED]` in its place",
    )
    assert "call failed with [REDACTED]" in text
    assert "vendor echoed [REDACTED]" in text  # the chained exception, redacted
    assert KEY not in text


def test_the_last_resort_handler_is_redacted_too(
    monkeypatch: pytest.MonkeyPatch, reliability: Reliability
) -> None:
    # `duet run` (embedded worker) prints warnings through Python's last-resort handler.
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    secrets.redact_process_logs()
    assert logging.lastResort is not None
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "saw %s", (KEY,), None)
    assert all(f.filter(record) for f in logging.lastResort.filters)
    message = record.getMessage()
    reliability.record(
        section=SECRETS,
        fault=FAULT,
        load="unit: a record quoting the key through the last-resort handler",
        lost=f"{lost_of(message.count(KEY), 1, 'quotes of the key left')}: `{message}`",
    )
    assert message == "saw [REDACTED]"


def test_model_output_loses_key_values_and_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY + ".longer")  # one key holds the other
    review = 'Set headers = {"Authorization": "Bearer <token>"}; api_key=os.environ[...]'
    # Key-shaped text in a review is the model's to write: only key values go.
    assert secrets.scrub_output(review) == review
    text = f"I was given {KEY} and {KEY}.longer."
    assert secrets.scrub_output(text) == "I was given [REDACTED] and [REDACTED]."
    assert secrets.scrub_output(review) is review  # nothing found: nothing copied


def test_a_completion_is_cleaned_in_its_text_and_structured_critique(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from orchestration.core.completion import Completion
    from orchestration.services.step import clean_completion

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    structured = {"score": 0.5, "issues": [f"key {KEY} in line 3", "ok"], "summary": "s"}
    done = Completion(f"reply {KEY}", 10, 5, "end", structured=structured)
    cleaned = clean_completion(done, secrets.scrub_output)
    assert cleaned.text == "reply [REDACTED]"
    assert cleaned.structured == {**structured, "issues": ["key [REDACTED] in line 3", "ok"]}
    assert (cleaned.input_tokens, cleaned.output_tokens) == (10, 5)
    clean = Completion("reply", 10, 5, "end", structured={"score": 1.0, "issues": []})
    assert clean_completion(clean, secrets.scrub_output) is clean


_FRAGMENTS = st.sampled_from(
    [
        "sk-",
        "SK-",
        "sk-proj-",
        "Bearer ",
        "bearer\t",
        "Authorization: ",
        "x-api-key=",
        "API_KEY=",
        "api-key:",
        "apikey ",
        "access_token=",
        "Access-Token:",
        "abcdefgh1234",
        "value-of-the-key",
        " ",
        '"',
        "'",
        ",",
        "{",
        "}",
        ":",
        "=",
        "\n",
        "ids-0f1e2d3c",
    ]
)


@given(st.lists(st.one_of(_FRAGMENTS, st.text(max_size=8)), max_size=12).map("".join))
def test_text_the_quick_check_passes_over_is_text_redaction_leaves_alone(text: str) -> None:
    """``may_hold_secret`` is what lets ``redact`` (and task events) skip the substitutions:
    whatever it says no to, redacting would not have changed."""
    values = ["value-of-the-key"]
    if not secrets.may_hold_secret(text, values):
        assert secrets.scrub(text, values) == text


def test_task_events_are_redacted_only_when_a_field_may_hold_a_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from celery.worker.request import Request as CeleryRequest

    from workers.celery_ext import Request

    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-0123456789abcdef")
    sent: list[dict[str, object]] = []
    monkeypatch.setattr(CeleryRequest, "send_event", lambda self, type, **f: sent.append(f))
    request = object.__new__(Request)
    request.send_event("task-started", uuid="0f1e2d3c", hostname="w1@host", pid=7)
    request.send_event(
        "task-failed",
        uuid="0f1e2d3c",
        exception="boom",
        traceback="ValueError: key sk-live-0123456789abcdef rejected",
    )
    assert sent[0] == {"uuid": "0f1e2d3c", "hostname": "w1@host", "pid": 7}
    assert "sk-live" not in str(sent[1]) and sent[1]["exception"] == "boom"
    assert "[REDACTED]" in str(sent[1]["traceback"])


def test_task_events_lose_a_percent_encoded_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """What Flower shows of a failed task: a key echoed in a URL is no longer in it."""
    from celery.worker.request import Request as CeleryRequest

    from workers.celery_ext import Request

    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    sent: list[dict[str, object]] = []
    monkeypatch.setattr(CeleryRequest, "send_event", lambda self, type, **f: sent.append(f))
    request = object.__new__(Request)
    echoed = f"GET https://gw/?k={_percent(KEY, 2)} 401"
    request.send_event("task-failed", uuid="0f1e2d3c", exception=echoed, traceback=echoed)
    assert sent[0]["exception"] == sent[0]["traceback"] == "GET https://gw/?k=[REDACTED] 401"


def _json_escaped(value: str, every: int = 1) -> str:
    """``value`` with every ``every``-th character written as a JSON ``\\u`` escape."""
    return "".join(f"\\u{ord(c):04x}" if i % every == 0 else c for i, c in enumerate(value))


def _percent(value: str, every: int = 1, upper: bool = True) -> str:
    code = "%{:02X}" if upper else "%{:02x}"
    return "".join(code.format(ord(c)) if i % every == 0 else c for i, c in enumerate(value))


ENCODED = {
    "JSON escapes": _json_escaped(KEY),
    "JSON escapes, some": _json_escaped(KEY, 3),
    "percent-encoded": urllib.parse.quote(KEY, safe=""),
    "percent, every char": _percent(KEY),
    "percent, lower hex, some": _percent(KEY, 2, upper=False),
    "percent twice": urllib.parse.quote(_percent(KEY), safe=""),
    "percent three times": urllib.parse.quote(urllib.parse.quote(_percent(KEY), safe=""), safe=""),
    "JSON escapes, percent-encoded": urllib.parse.quote(_json_escaped(KEY), safe=""),
    "Python \\x escapes": "".join(f"\\x{ord(c):02x}" for c in KEY),
    "mixed": _json_escaped(KEY[:8]) + _percent(KEY[8:16]) + KEY[16:],
}


@pytest.mark.parametrize("form", list(ENCODED))
def test_a_key_in_any_encoding_is_scrubbed(form: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    text = f"upstream GET https://h/x?key={ENCODED[form]}&y=1 failed"
    for cleaned in (secrets.scrub(text, [KEY]), secrets.redact(text), secrets.scrub_output(text)):
        assert "[REDACTED]" in cleaned and "failed" in cleaned, cleaned
        for _ in range(secrets.DECODE_ROUNDS + 1):  # nothing of it once decoded, either
            assert KEY not in cleaned, (form, cleaned)
            cleaned = secrets.decoded(cleaned)
    assert secrets.may_hold_secret(text, [KEY])


def test_a_json_escaped_key_in_a_critique_goes_and_the_json_stays_readable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from orchestration.core.critique import read_critique

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    reply = '{"score": 0.3, "issues": ["key \\"' + _json_escaped(KEY, 2) + '\\" in line 3"]}'
    assert KEY in read_critique(reply).critique.issues[0]  # what parsing alone would store
    cleaned = secrets.scrub_output(reply)
    critique = read_critique(cleaned).critique
    assert critique.score == 0.3
    assert critique.issues == ['key "[REDACTED]" in line 3']


def test_parsed_critique_fields_are_scrubbed_after_parsing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A key the raw text does not hold, only the parse makes (adjacent Python string
    literals are joined): the stored issues and summary still lose it."""
    from orchestration.core.completion import Completion
    from orchestration.services.step import Seat, _result_from

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    half = len(KEY) // 2
    split = f"'{KEY[:half]}' '{KEY[half:]}'"
    reply = f"{{'score': 0.2, 'issues': ['leaked ' {split}], 'summary': {split}}}"
    assert secrets.scrub_output(reply) == reply  # no key in the raw text
    agent = Agent("Review.", model="sim:critic").spec
    result = _result_from(
        Completion(reply, 1, 1, "end"),
        "critique",
        "k",
        Seat(agent, None, 0, 0),
        scrub=secrets.scrub_output,
    )
    assert (result["issues"], result["summary"]) == (["leaked [REDACTED]"], "[REDACTED]")


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=6, max_size=30),
    st.lists(st.sampled_from(["raw", "json", "pct", "PCT", "pct2", "x"]), min_size=30, max_size=30),
)
def test_any_mixture_of_encodings_of_any_key_is_scrubbed(
    reliability: Reliability, key: str, how: list[str]
) -> None:
    with reliability.case(
        section=SECRETS,
        fault="Decoded secrets (property): any printable key of 6 to 30 characters, each "
        "character as written, JSON `\\u`, `\\x`, percent-encoded (either hex case) or "
        "percent-encoded twice, in an error message",
        before="only the key as written was scrubbed",
    ):
        _mixture_scrubbed(key, how)


def _mixture_scrubbed(key: str, how: list[str]) -> None:
    form = {
        "raw": lambda c: c,
        "json": lambda c: f"\\u{ord(c):04x}",
        "pct": lambda c: f"%{ord(c):02x}",
        "PCT": lambda c: f"%{ord(c):02X}",
        "pct2": lambda c: f"%25{ord(c):02X}",
        "x": lambda c: f"\\x{ord(c):02x}",
    }
    encoded = "".join(form[h](c) for c, h in zip(key, how, strict=False))
    cleaned = secrets.scrub(f"error: {encoded}.", [key])
    for _ in range(secrets.DECODE_ROUNDS + 1):
        assert key not in cleaned, (encoded, cleaned)
        cleaned = secrets.decoded(cleaned)


def test_a_password_in_a_base_url_is_refused_naming_where(
    tmp_path: Path, reliability: Reliability
) -> None:
    from duet.config import load_config

    path = tmp_path / "review.toml"
    path.write_text(
        '[actor]\ninstructions = "Fix."\nmodel = "sim"\n\n[critic]\ninstructions = "Judge."\n'
        'model = "openai:m"\nbase_url = "https://bob:hunter2-secret@gw.example/v1"\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path).build_agents()
    message = str(caught.value)
    reliability.record(
        section=SECRETS,
        fault="URL credentials: a config's `critic.base_url` holds `user:password@`",
        load="unit: `load_config` and `Agent(...)` with a user and password, and a user alone",
        lost="nothing stored: refused at submit time, before any spec is written "
        f"(`{message.removeprefix(f'{path}: ')}`"
        f"; the password {'IS' if 'hunter2' in message else 'is not'} in the message)",
        before="the URL, password included, was stored with the spec in Redis",
    )
    assert "critic.base_url: credentials in the URL: a password written in it" in message
    assert "as https://bob:${GATEWAY_PASSWORD}@gw.example/v1" in message  # how to fix it
    assert "hunter2" not in message
    with pytest.raises(ConfigError, match="base_url: credentials in the URL"):
        Agent("a", model="anthropic:c", base_url="http://user@gw.example")
    assert Agent("a", model="openai:m", base_url="http://gw.example:8/v1").spec.base_url
