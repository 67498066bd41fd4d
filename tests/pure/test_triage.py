"""What the report triages from: worst-first order, issues grouped by similar wording,
reasons grouped by kind, and an output's diff from its input."""

from __future__ import annotations

from typing import Any

import pytest

from duet.report.html import render_report
from duet.report.triage import (
    group_issues,
    group_reasons,
    input_diff,
    normalise_issue,
    reason_kind,
    similar,
    worst_first,
)


def _rec(ident: str, status: str, score: float | None, reason: str | None = None) -> dict[str, Any]:
    return {"id": ident, "status": status, "final_score": score, "reason": reason}


def test_worst_first_no_score_then_score_then_reason_then_input_order() -> None:
    records = [
        _rec("ok", "approved", 0.95),
        _rec("b", "max_rounds_reached", 0.5),
        _rec("a", "max_rounds_reached", 0.2),
        _rec("rej", "rejected", None, "prompt is 9 characters over"),
        _rec("key", "interrupted", None, "actor:round_0:missing_key"),
        _rec("budget", "interrupted", 0.5, "budget:batch:usd"),
        _rec("b2", "max_rounds_reached", 0.5),
    ]
    assert [r["id"] for r in worst_first(records)] == ["key", "rej", "a", "b", "b2", "budget"]


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("SQL built with an f-string on line 3", "sql built with an F-string on line 12", True),
        ("db.py:3: error: SQL injection", "api.py:40: SQL injection", True),
        ("Use “parameterised” queries", "use 'parameterised' queries.", True),
        ("No input validation on the name field", "No input validation on the email field", True),
        ("No tests", "No docs", False),
        ("Missing docstring", "Hard-coded AWS secret key", False),
    ],
)
def test_similar_issues(a: str, b: str, same: bool) -> None:
    assert similar(normalise_issue(a), normalise_issue(b)) is same


def test_group_issues_counts_each_input_once_most_inputs_first() -> None:
    groups = group_issues(
        [
            ("1", "No tests"),
            ("2", "SQL built with an f-string on line 3"),
            ("3", "SQL built with an f-string on line 9"),
            ("3", "sql built with an f-string on line 10"),  # same input, same group: once
            ("4", "SQL built with an F-string on line 1"),
            ("4", "  "),  # nothing to say: no group
        ]
    )
    assert [(g.inputs, len(g.wordings)) for g in groups] == [(["2", "3", "4"], 4), (["1"], 1)]
    assert groups[0].text in {w for w in groups[0].wordings}


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("actor:round_2:missing_key", "actor:round_*:missing_key"),
        (
            "rejected: prompt is 61,204 characters, over the limit of 50,000",
            "rejected: prompt is N characters, over the limit of N",
        ),
        ("budget:batch:usd", "budget:batch:usd"),
    ],
)
def test_reason_kind(reason: str, kind: str) -> None:
    assert reason_kind(reason) == kind


def test_group_reasons_one_row_per_kind_with_its_examples() -> None:
    groups = group_reasons(
        [
            ("1", "actor:round_0:missing_key"),
            ("2", "actor:round_1:missing_key"),
            ("3", "budget:batch:usd"),
            ("4", "actor:round_0:missing_key"),
        ]
    )
    assert [(g.kind, g.inputs) for g in groups] == [
        ("actor:round_*:missing_key", ["1", "2", "4"]),
        ("budget:batch:usd", ["3"]),
    ]
    assert groups[0].examples == ["actor:round_0:missing_key", "actor:round_1:missing_key"]


def test_input_diff_compares_code_blocks_and_drops_the_directory_header() -> None:
    prompt = "Fix this:\n```python\nx = eval(s)\ny = 1\n```"
    output = "Done.\n```python\nx = ast.literal_eval(s)\ny = 1\n```\n"
    assert input_diff(prompt, output)[2:] == [
        "@@ -1,2 +1,2 @@",
        "-x = eval(s)",
        "+x = ast.literal_eval(s)",
        " y = 1",
    ]
    from_dir = input_diff("File: a.py\n\nx = eval(s)\n", "```\nx = 1\n```", "a.py")
    assert from_dir[2:] == ["@@ -1 +1 @@", "-x = eval(s)", "+x = 1"]
    assert input_diff("same", "same") == []


def test_the_page_escapes_untrusted_text_and_links_groups_to_inputs() -> None:
    evil = "<script>alert(1)</script>"
    records = [
        {
            **_rec(evil, "max_rounds_reached", 0.3),
            "issues": [evil, "No tests"],
            "output": f"```\n{evil}\n```",
            "run_id": "f" * 32,
        },
        {
            **_rec("b", "max_rounds_reached", 0.6),
            "issues": ["no tests."],
            "output": "x",
            "run_id": "e" * 32,
        },
    ]
    page = render_report(records, title=evil, inputs={evil: f"<b>{evil}</b>", "b": "y"})
    assert "<script" not in page and "<b>" not in page
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 5  # title x2, id, issue, diff
    issues = page.split('id="most-frequent-issues"', 1)[1].split("</section>", 1)[0]
    # "No tests" and "no tests." are one row of 2 inputs, each linked to its block.
    assert '<td class="n">2</td>' in issues
    assert 'href="#input-1"' in issues and 'href="#input-2"' in issues
    assert 'id="input-1"' in page and 'id="input-2"' in page
    assert '<code title="' + "f" * 32 + '">ffffffff</code>' in page  # short run id
