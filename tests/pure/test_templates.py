"""Filling critique and refine prompts: str.format when clean, placeholders-only otherwise."""

from __future__ import annotations

import pytest

from orchestration.core.templates import (
    DEFAULT_CRITIQUE_TEMPLATE,
    DEFAULT_REFINE_TEMPLATE,
    bullet_issues,
    fill_template,
    render_critique_prompt,
    render_refine_prompt,
)


def _flat(text: str) -> str:
    """Whitespace-insensitive view, so prose checks survive re-wrapping the templates."""
    return " ".join(text.split())


@pytest.mark.parametrize(
    ("template", "values", "expected"),
    [
        pytest.param("Task: {prompt}", {"prompt": "sum"}, "Task: sum", id="clean-format"),
        pytest.param(
            "{prompt}|{output}|{critique}|{issues_bulleted}",
            {"prompt": "p", "output": "o", "critique": "c", "issues_bulleted": "- i"},
            "p|o|c|- i",
            id="all-known-placeholders",
        ),
        pytest.param(
            'Reply as {{"score": 0..1}} for {output}',
            {"output": "x"},
            'Reply as {"score": 0..1} for x',
            id="double-braces-become-literal",
        ),
        pytest.param(
            "Extra {name} is fine when given",
            {"name": "n"},
            "Extra n is fine when given",
            id="clean-format-any-name",
        ),
        pytest.param("{output:>3}", {"output": "x"}, "  x", id="clean-format-spec"),
        pytest.param(
            'Task: {prompt}\nOutput: {output}\nReturn {"score": 0..1, "issues": [...]}',
            {"prompt": "p", "output": "o"},
            'Task: p\nOutput: o\nReturn {"score": 0..1, "issues": [...]}',
            id="single-brace-json-fallback",
        ),
        pytest.param(
            'JSON {"score": 1} and {unknown} and {prompt}',
            {"prompt": "p"},
            'JSON {"score": 1} and {unknown} and p',
            id="unknown-placeholder-left-in-fallback",
        ),
        pytest.param(
            "{prompt} and {output}",
            {"prompt": "p"},
            "p and {output}",
            id="missing-value-left-in-fallback",
        ),
        pytest.param(
            '{{"kept": "doubled"}} {"a": 1} {prompt}',
            {"prompt": "p"},
            '{{"kept": "doubled"}} {"a": 1} p',
            id="fallback-leaves-double-braces-as-written",
        ),
        pytest.param("{0} {prompt}", {"prompt": "p"}, "{0} p", id="positional-field-fallback"),
        pytest.param(
            "stray } brace {prompt}", {"prompt": "p"}, "stray } brace p", id="stray-close-brace"
        ),
        pytest.param(
            "stray { brace {prompt}", {"prompt": "p"}, "stray { brace p", id="stray-open-brace"
        ),
        pytest.param(
            '{"k": 1} {output}',
            {"output": "has {prompt} and {output} inside"},
            '{"k": 1} has {prompt} and {output} inside',
            id="values-not-filled-twice",
        ),
        pytest.param(
            '{"k": 1} {output}', {"output": 42}, '{"k": 1} 42', id="non-string-value-in-fallback"
        ),
        pytest.param("no placeholders", {}, "no placeholders", id="nothing-to-fill"),
    ],
)
def test_fill_template(template: str, values: dict[str, object], expected: str) -> None:
    assert fill_template(template, **values) == expected


@pytest.mark.parametrize(
    ("issues", "expected"),
    [
        ([], "- (no specific issues listed)"),
        (["one"], "- one"),
        (["one", "two words", "three"], "- one\n- two words\n- three"),
    ],
)
def test_bullet_issues(issues: list[str], expected: str) -> None:
    assert bullet_issues(issues) == expected


def test_default_critique_template_needs_the_fallback() -> None:
    # The default shows a single-brace JSON example, so str.format must reject it.
    with pytest.raises((KeyError, ValueError, IndexError)):
        DEFAULT_CRITIQUE_TEMPLATE.format(prompt="p", output="o")
    assert '{"score": 0..1' in DEFAULT_CRITIQUE_TEMPLATE


@pytest.mark.parametrize(
    ("template", "must_contain"),
    [
        pytest.param(
            None,
            [
                "TASK-TEXT",
                "OUTPUT-TEXT {with braces}",
                '{"score": 0..1, "issues": ["..."], "summary": "..."}',
                "1.0",
                "0.0",
                "specific and actionable",
            ],
            id="default",
        ),
        pytest.param(
            'Review {output} for {prompt}; reply {"score": x}',
            ["OUTPUT-TEXT {with braces}", "TASK-TEXT", '{"score": x}'],
            id="custom-fallback",
        ),
        pytest.param(
            "Review {output} for {prompt}; reply {{}}",
            [  # the output fenced with the run's markers, as the default template does
                "Review <<<DUET-OUTPUT-0123abcd>>>\nOUTPUT-TEXT {with braces}\n"
                "<<<END-DUET-OUTPUT-0123abcd>>> for TASK-TEXT; reply {}"
            ],
            id="custom-clean",
        ),
    ],
)
def test_render_critique_prompt(template: str | None, must_contain: list[str]) -> None:
    rendered = render_critique_prompt(
        template, prompt="TASK-TEXT", output="OUTPUT-TEXT {with braces}", boundary="0123abcd"
    )
    for text in must_contain:
        assert text in rendered or _flat(text) in _flat(rendered)
    assert "{prompt}" not in rendered
    assert "{output}" not in rendered


@pytest.mark.parametrize(
    ("template", "issues", "must_contain"),
    [
        pytest.param(
            None,
            ["off by one in the loop", "no test for empty input"],
            [
                "TASK-TEXT",
                "OUTPUT-TEXT",
                "SUMMARY-TEXT",
                "- off by one in the loop\n- no test for empty input",
                "complete revised output",
            ],
            id="default",
        ),
        pytest.param(None, [], ["- (no specific issues listed)"], id="default-no-issues"),
        pytest.param(
            "Fix:\n{issues_bulleted}\nin {output} ({critique}) for {prompt}",
            ["x"],
            ["Fix:\n- x\nin OUTPUT-TEXT (SUMMARY-TEXT) for TASK-TEXT"],
            id="custom-clean",
        ),
        pytest.param(
            'Fix {issues_bulleted} then answer {"output": "..."} for {prompt}',
            ["x"],
            ['Fix - x then answer {"output": "..."} for TASK-TEXT'],
            id="custom-fallback",
        ),
    ],
)
def test_render_refine_prompt(
    template: str | None, issues: list[str], must_contain: list[str]
) -> None:
    rendered = render_refine_prompt(
        template, prompt="TASK-TEXT", output="OUTPUT-TEXT", critique="SUMMARY-TEXT", issues=issues
    )
    for text in must_contain:
        assert text in rendered or _flat(text) in _flat(rendered)
    for placeholder in ("{prompt}", "{output}", "{critique}", "{issues_bulleted}"):
        assert placeholder not in rendered


def test_default_refine_template_formats_cleanly() -> None:
    # No JSON example in it, so the ordinary str.format path fills it.
    filled = DEFAULT_REFINE_TEMPLATE.format(
        prompt="p", output="o", critique="c", issues_bulleted="- i"
    )
    assert filled == fill_template(
        DEFAULT_REFINE_TEMPLATE, prompt="p", output="o", critique="c", issues_bulleted="- i"
    )
