"""``duet watch``'s spend: each figure once, with its label."""

from __future__ import annotations

import re

from duet.commands.progress import ProgressView, spend_text


def _p(**budget: dict[str, float]) -> dict:
    return {"done": 1, "total": 4, "counts": {}, "tokens": 1234, "usd": 0.5, "budget": budget}


def test_without_a_budget_the_spend_is_one_labelled_figure() -> None:
    assert spend_text(_p()).plain == "1,234 tokens  spent $0.5000"


def test_a_usd_budget_is_said_with_the_spend_not_beside_it() -> None:
    text = spend_text(_p(usd={"spent": 0.5, "limit": 2.0}, calls={"spent": 3, "limit": 10})).plain
    assert text == "1,234 tokens  spent $0.5000 of a $2.00 budget  budget calls: 3 of 10"


def test_the_log_line_has_each_dollar_figure_once() -> None:
    view = ProgressView()
    view.update(_p(usd={"spent": 0.5, "limit": 2.0}))
    line = view.line()
    assert re.findall(r"\$[\d.]+", line) == ["$0.5000", "$2.00"], line
    assert "spent $0.5000 of a $2.00 budget" in line
