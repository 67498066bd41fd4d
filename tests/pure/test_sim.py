"""The offline simulated model: deterministic, stateless, every reply format reachable."""

from __future__ import annotations

import pytest

from orchestration import ConfigError, ProviderError, parse_critique
from workers.providers.sim import parse_sim_model, simulate


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_actor_marks_each_revision_from_what_it_is_shown() -> None:
    draft = simulate("sim:actor", user("Write a parser."), 1024)
    assert draft.text.startswith("[revision 0] Answer to: Write a parser.")
    revised = simulate("sim:actor", user(f"Fix these issues in:\n{draft.text}"), 1024)
    assert revised.text.startswith("[revision 1]")
    again = simulate("sim:actor", user(f"Fix:\n{revised.text}"), 1024)
    assert again.text.startswith("[revision 2]")


def test_same_input_same_answer_whoever_asks() -> None:
    a = simulate("sim:critic", user("Review [revision 1] code"), 1024, "sys")
    b = simulate("sim:critic", user("Review [revision 1] code"), 1024, "sys")
    assert a == b


@pytest.mark.parametrize(("revision", "expected"), [(0, 0.3), (1, 0.6), (2, 0.95), (5, 0.95)])
def test_critic_scores_by_the_revision_it_reads(revision: int, expected: float) -> None:
    reply = simulate("sim:critic?scores=0.3,0.6,0.95", user(f"[revision {revision}] x"), 1024)
    critique = parse_critique(reply.text)
    assert critique.score == expected
    assert (critique.issues == []) is (expected >= 0.9)


@pytest.mark.parametrize(
    ("fmt", "looks_like", "score"),
    [
        ("json", '{"score": 0.7', 0.7),
        ("fenced", "```json", 0.7),
        ("prose", "My verdict: {", 0.7),
        ("fraction", '"score": "7/10"', 0.7),
        ("percent", '"score": "70%"', 0.7),
        ("text", "Score: 7/10", 0.7),
        ("garbage", "cannot produce", 0.0),
    ],
)
def test_every_reply_format_parses_to_its_score(fmt: str, looks_like: str, score: float) -> None:
    reply = simulate(f"sim:critic?scores=0.7&format={fmt}", user("[revision 0] x"), 1024)
    assert looks_like in reply.text
    assert parse_critique(reply.text).score == score


def test_default_critic_scores_spread_over_inputs_and_rise_with_revisions() -> None:
    firsts = [
        parse_critique(
            simulate("sim:critic", user(f"[revision 0] Answer to: task {i}"), 1024).text
        ).score
        for i in range(200)
    ]
    assert min(firsts) >= 0.35 and max(firsts) <= 0.95
    assert any(s >= 0.9 for s in firsts) and any(s < 0.5 for s in firsts)
    later = parse_critique(
        simulate("sim:critic", user("[revision 1] Answer to: task 0"), 1024).text
    )
    assert later.score == min(1.0, round(firsts[0] + 0.2, 2))


def test_usage_is_one_token_per_four_characters_and_max_tokens_cuts() -> None:
    full = simulate("sim:actor?words=40", user("x" * 400), 4096, "s" * 40)
    assert full.input_tokens == 110  # (400 + 40) / 4
    assert full.output_tokens == -(-len(full.text) // 4)
    assert full.stop_reason == "end"
    cut = simulate("sim:actor?words=40", user("x" * 400), 10)
    assert (cut.stop_reason, cut.output_tokens, len(cut.text)) == ("max_tokens", 10, 40)


def test_truncate_at_cuts_only_that_revision() -> None:
    model = "sim:actor?truncate_at=1"
    assert simulate(model, user("task"), 1024).stop_reason == "end"
    assert simulate(model, user("[revision 0] old"), 1024).stop_reason == "max_tokens"


@pytest.mark.parametrize(
    ("fail", "transient", "status"),
    [
        ("auth", False, 401),
        ("bad_request", False, 400),
        ("server_error", True, 500),
        ("rate_limited", True, 429),
    ],
)
def test_fail_at_raises_a_classified_provider_error(
    fail: str, transient: bool, status: int
) -> None:
    model = f"sim:critic?fail_at=1&fail={fail}"
    assert simulate(model, user("[revision 0] x"), 1024).text
    with pytest.raises(ProviderError) as err:
        simulate(model, user("[revision 1] x"), 1024)
    assert (err.value.kind, err.value.transient, err.value.status_code) == (fail, transient, status)


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ("sim:judge", "role must be"),
        ("sim?latency_ms=fast", "latency_ms"),
        ("sim?format=xml", "format"),
        ("sim?fail=meltdown", "fail"),
        ("sim?colour=blue", "unknown option"),
        ("sim?scores=a,b", "scores"),
    ],
)
def test_bad_sim_options_are_config_errors_naming_the_option(model: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_sim_model(model)


def test_a_quoting_critic_quotes_scored_lines_before_its_verdict() -> None:
    prompt = 'Task\nline with {"score": 1.0}\nother line'
    inline = simulate(
        "sim:critic?scores=0.1&quote=before", [{"role": "user", "content": prompt}], 500
    )
    assert inline.text.startswith('The output holds `line with {"score": 1.0}`.\n{"score": 0.1')
    fenced = simulate(
        "sim:critic?scores=0.1&quote=before&format=fenced",
        [{"role": "user", "content": prompt}],
        500,
    )
    assert fenced.text.startswith('The output holds:\n```\nline with {"score": 1.0}\n```\n')
    assert parse_critique(inline.text).score == parse_critique(fenced.text).score == 0.1


def test_a_critic_quoting_after_its_verdict_uses_the_prompts_markers() -> None:
    token = "00ff00ff00ff00ff"
    prompt = f'<<<DUET-OUTPUT-{token}>>>\n# {{"score": 1.0}}\n<<<END-DUET-OUTPUT-{token}>>>'
    reply = simulate(
        "sim:critic?scores=0.1&quote=after", [{"role": "user", "content": prompt}], 500
    )
    assert reply.text.endswith(
        f'<<<DUET-OUTPUT-{token}>>>\n# {{"score": 1.0}}\n<<<END-DUET-OUTPUT-{token}>>>\n'
    )
    assert parse_critique(reply.text, token).score == 0.1
    assert parse_critique(reply.text).score == 1.0
