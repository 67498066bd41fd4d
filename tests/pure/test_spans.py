"""Finding JSON objects in free text: one walk, outermost spans, limits, linear work."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from orchestration.core.jsonlimits import MAX_DEPTH
from orchestration.core.spans import MAX_CHARS, find_objects, scan


def _values(text: str) -> list[object]:
    return [o.value for o in find_objects(text).objects]


@pytest.mark.parametrize(
    ("text", "values"),
    [
        pytest.param('a {"x": 1} b {"y": 2}', [{"x": 1}, {"y": 2}], id="two-in-prose"),
        pytest.param('{"x": {"y": 2}}', [{"x": {"y": 2}}], id="outermost-only"),
        pytest.param('{"s": "} {"}', [{"s": "} {"}], id="braces-in-strings"),
        pytest.param('{"s": "\\"}"}', [{"s": '"}'}], id="escaped-quote"),
        pytest.param('{ unclosed {"x": 1}', [{"x": 1}], id="inside-an-unclosed-brace"),
        pytest.param('{prose {"x": 1} prose}', [{"x": 1}], id="inside-prose-in-braces"),
        pytest.param('{a "stray quote\n{"x": 1}', [{"x": 1}], id="line-end-closes-a-string"),
        pytest.param('{"a\\\n{"x": 1}', [{"x": 1}], id="an-escaped-line-end-still-ends"),
        pytest.param("{it's fine} {'x': 1}", [{"x": 1}], id="apostrophe-outside-a-literal"),
        pytest.param("{'x': 'a}b'}", [{"x": "a}b"}], id="literal-quotes-hide-braces"),
        pytest.param('{"x": 1,}', [{"x": 1}], id="trailing-comma"),
        pytest.param("} stray {}", [{}], id="stray-closing-brace"),
    ],
)
def test_find_objects(text: str, values: list[object]) -> None:
    assert _values(text) == values


@pytest.mark.parametrize(
    ("text", "depth"),
    [("{}", 1), ('{"a": {}}', 2), ('{"a": [[{}]]}', 4), ('{"a": [1], "b": [2]}', 2)],
)
def test_depth_counts_braces_and_brackets(text: str, depth: int) -> None:
    spans, _ = scan(text)
    assert [s.depth for s in spans] == [depth]


def test_too_deep_is_skipped_with_a_reason() -> None:
    ok = '{"a": ' * (MAX_DEPTH - 1) + "{}" + "}" * (MAX_DEPTH - 1)
    deep = '{"a": ' * MAX_DEPTH + "{}" + "}" * MAX_DEPTH
    assert len(find_objects(ok).objects) == 1
    found = find_objects(deep)
    assert found.objects == ()
    assert found.skipped == (f"a JSON object nested deeper than {MAX_DEPTH} levels was ignored",)
    assert found.ignored == ((0, len(deep)),)


def test_too_long_is_skipped_with_a_reason() -> None:
    text = json.dumps({"a": "x" * MAX_CHARS})
    found = find_objects(text)
    assert found.objects == ()
    assert found.skipped == (f"a JSON object over {MAX_CHARS:,} characters was ignored",)


# Text made of what the walk reacts to, so every state and transition is exercised.
_PIECES = st.sampled_from(['{"a": ', "{", "}", "[", "]", '"', "'", "\\", "\n", "{'", "1", " "])
TEXT = st.one_of(st.text(), st.lists(_PIECES, max_size=300).map("".join))


@settings(max_examples=300, deadline=None)
@given(TEXT)
@example("{" * 3000 + "}" * 3000)
@example('{"a": [' * 2000)
def test_work_is_linear_in_the_length(text: str) -> None:
    found = find_objects(text)
    assert found.steps <= len(text)
    assert found.decoded <= MAX_DEPTH * len(text)


def test_work_grows_linearly_where_decoding_from_every_brace_was_quadratic() -> None:
    # Each '{"a": ' opening made a decode attempt reading the rest of the text.
    small, large = ('{"a": ' * n + "1" + "}" * n for n in (1000, 8000))
    counts = [find_objects(t) for t in (small, large)]
    assert counts[0].steps == 4 * 1000  # '{', two quotes and '}' per level
    assert counts[1].steps == 8 * counts[0].steps
    assert counts[0].decoded == counts[1].decoded == 0  # too deep: nothing decoded
