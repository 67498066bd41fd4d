"""Property tests: critic parsing and template filling on arbitrary text never fail.

Model output is untrusted: whatever a critic replies, :func:`parse_critique` must give a
score in [0, 1] without reaching its last-resort ``except`` (which would hide a bug as an
"unreadable" reply), and :func:`fill_template` must fill any template with any values.
"""

from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from orchestration.core.critique import CriticOutput, parse_critique, parse_score
from orchestration.core.templates import KNOWN_PLACEHOLDERS, fill_template
from tests.reliability import MODEL_OUTPUT, Reliability

#: The issue parse_critique returns only when something inside it raised.
UNREADABLE = "unreadable critic reply"

#: The `reliability` fixture counts the cases of the whole test: it is meant to outlive
#: each example.
PROPERTY = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
#: The rows of docs/RELIABILITY.md these properties count cases for.
CRITIC_REPLIES = (
    "Arbitrary critic replies: any text, any bytes, critic-like fragments (fences, braces, "
    "`Score:`, `NaN`, `1e309`), any JSON value as score / issues / summary inside prose or a "
    "fence. The property: `parse_critique` never raises and never reaches its last-resort "
    "handler; the score is finite and in [0, 1]; a JSON score in [0, 1] is read exactly"
)
TEMPLATES = (
    "Arbitrary prompt templates (stray braces, `{0}`, `{prompt!r}`, `{prompt[0]}`, JSON "
    "examples) and values (including text holding `{prompt}`). The property: `fill_template` "
    "never raises; values are inserted once, verbatim"
)

# Text that looks like what critics write: JSON punctuation, score words and numbers,
# fences, quotes and braces, mixed with arbitrary unicode.
_PIECES = st.sampled_from(
    [
        '{"score": ',
        '{"issues": [',
        "'score': ",
        "score",
        "Score: ",
        "rating",
        "/10",
        "%",
        " out of ",
        "```json\n",
        "```",
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        '"',
        "'",
        "\\",
        "\n",
        "0.5",
        "9",
        "-3",
        "1e309",
        "NaN",
        "Infinity",
        "null",
        "true",
        "{prompt}",
        "{output}",
    ]
)
CRITIC_TEXT = st.one_of(
    st.text(),
    st.lists(st.one_of(_PIECES, st.text(max_size=5)), max_size=40).map("".join),
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _check(out: CriticOutput) -> None:
    assert isinstance(out, CriticOutput)
    assert 0.0 <= out.score <= 1.0 and math.isfinite(out.score)
    assert all(isinstance(issue, str) for issue in out.issues)
    assert isinstance(out.summary, str)
    assert not any(issue.startswith(UNREADABLE) for issue in out.issues), out.issues


@PROPERTY
@given(CRITIC_TEXT)
@example('{"score": 1e999}')
@example('{"score": "7/0"}')
@example("{" * 5000)
def test_parse_critique_on_any_text_gives_a_score_in_range(
    reliability: Reliability, text: str
) -> None:
    with reliability.case(section=MODEL_OUTPUT, fault=CRITIC_REPLIES):
        _check(parse_critique(text))


@PROPERTY
@given(st.binary())
def test_parse_critique_on_any_bytes_gives_a_score_in_range(
    reliability: Reliability, data: bytes
) -> None:
    with reliability.case(section=MODEL_OUTPUT, fault=CRITIC_REPLIES):
        _check(parse_critique(data))


@PROPERTY
@given(
    score=JSON_VALUES,
    issues=JSON_VALUES,
    summary=JSON_VALUES,
    before=st.text(max_size=30),
    after=st.text(max_size=30),
    fenced=st.booleans(),
)
def test_parse_critique_on_any_json_object_in_prose(
    reliability: Reliability,
    score: object,
    issues: object,
    summary: object,
    before: str,
    after: str,
    fenced: bool,
) -> None:
    with reliability.case(section=MODEL_OUTPUT, fault=CRITIC_REPLIES):
        body = json.dumps({"score": score, "issues": issues, "summary": summary})
        if fenced:
            body = f"```json\n{body}\n```"
        _check(parse_critique(f"{before}\n{body}\n{after}"))


@PROPERTY
@given(st.floats(min_value=0.0, max_value=1.0), st.text(max_size=40))
def test_a_json_score_in_range_is_read_exactly(
    reliability: Reliability, score: float, prose: str
) -> None:
    with reliability.case(section=MODEL_OUTPUT, fault=CRITIC_REPLIES):
        reply = json.dumps({"score": score, "issues": [prose], "summary": "s"})
        out = parse_critique(reply)
        assert out.score == score
        assert out.issues == ([prose.strip()] if prose.strip() else [])


@PROPERTY
@given(JSON_VALUES)
def test_parse_score_on_any_value_is_in_range(reliability: Reliability, value: object) -> None:
    with reliability.case(section=MODEL_OUTPUT, fault=CRITIC_REPLIES):
        score = parse_score(value)
        assert 0.0 <= score <= 1.0 and math.isfinite(score)


PLACEHOLDER_VALUES = st.fixed_dictionaries(
    {},
    optional={name: st.one_of(st.text(), st.integers(), st.none()) for name in KNOWN_PLACEHOLDERS},
)
TEMPLATE_TEXT = st.one_of(
    st.text(),
    st.lists(
        st.one_of(
            st.sampled_from(
                [
                    "{",
                    "}",
                    "{{",
                    "}}",
                    "{0}",
                    "{prompt}",
                    "{output}",
                    "{critique}",
                    "{issues_bulleted}",
                    "{prompt!r}",
                    "{prompt:>5}",
                    "{output.upper}",
                    "{unknown}",
                    "{prompt[0]}",
                    '{"score": 0..1}',
                    "{!}",
                    "{:}",
                ]
            ),
            st.text(max_size=8),
        ),
        max_size=20,
    ).map("".join),
)


@PROPERTY
@given(TEMPLATE_TEXT, PLACEHOLDER_VALUES)
@example("{prompt", {"prompt": "x"})
@example("{prompt[0]}", {"prompt": ""})
@example("{output}", {"output": "{prompt}", "prompt": "P"})
def test_fill_template_on_any_template_never_raises(
    reliability: Reliability, template: str, values: dict
) -> None:
    with reliability.case(section=MODEL_OUTPUT, fault=TEMPLATES):
        filled = fill_template(template, **values)
        assert isinstance(filled, str)


@PROPERTY
@given(st.text().filter(lambda t: "{" not in t and "}" not in t), PLACEHOLDER_VALUES)
def test_a_template_without_braces_is_returned_unchanged(
    reliability: Reliability, template: str, values: dict
) -> None:
    with reliability.case(section=MODEL_OUTPUT, fault=TEMPLATES):
        assert fill_template(template, **values) == template


@PROPERTY
@given(st.text(), st.text(), st.text())
def test_values_are_inserted_verbatim_and_never_filled_again(
    reliability: Reliability, prompt: str, output: str, literal: str
) -> None:
    with reliability.case(section=MODEL_OUTPUT, fault=TEMPLATES):
        # A single-brace JSON example makes str.format fail: the fallback fills placeholders
        # once, so a value holding "{prompt}" (model output is untrusted) stays as written.
        template = '{"score": 0..1}\n' + literal.replace("{", "(").replace("}", ")")
        template += "\n{prompt}\n{output}"
        filled = fill_template(template, prompt=prompt, output=output)
        assert filled.endswith(f"\n{prompt}\n{output}")
