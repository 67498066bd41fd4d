"""What the README promises issues 22 and 25 said it must: how a verdict is read, which
settings each model family takes (the capability table itself), and code review led by the
``duet review --git`` flow."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestration.core.capabilities import FAMILIES, Family

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _section(title: str) -> str:
    found = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, flags=re.S | re.M)
    assert found is not None, f"README has no '## {title}' section"
    return found[1]


def _table(text: str) -> dict[str, list[str]]:
    """First column -> the other cells, for each body row of the first table in ``text``."""
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows[2:]]
    return {row[0]: row[1:] for row in cells}


def _expected(family: Family) -> tuple[str, str]:
    if family.temperature is None:
        temperature = "none"
    else:
        low, high = family.temperature
        temperature = f"{low:g} to {high:g}"
    return temperature, family.token_limit


@pytest.mark.parametrize("document", ["README.md", "docs/models.md"])
def test_the_model_family_tables_are_the_capability_table(document: str) -> None:
    text = (ROOT / document).read_text(encoding="utf-8")
    table = _table(text[text.index("| Family |") :])
    assert len(table) == len(FAMILIES), table
    for family in FAMILIES:
        key = "Simulator" if family.provider == "sim" else family.name.removesuffix(" models")
        _, temperature, limit = table[key]
        want_temperature, want_limit = _expected(family)
        assert temperature.removesuffix(" (ignored)") == want_temperature, family.name
        if family.provider != "sim":
            assert limit == f"`{want_limit}`", family.name


def test_the_readme_says_how_a_verdict_is_read() -> None:
    text = " ".join(_section("How a verdict is read").split())
    for claim in ("natively", "last scored object", "never one it quotes", "per-run markers"):
        assert claim in text, claim


def test_the_readme_leads_code_review_with_the_git_flow() -> None:
    commands = [
        line.strip()
        for block in re.findall(r"^```bash\n(.*?)^```$", README, flags=re.S | re.M)
        for line in block.splitlines()
    ]
    review = [c for c in commands if re.search(r"duet (review|results)|sarif|--patch", c)]
    assert review[0].startswith("duet review --git main..feature"), review
    flow = " ".join(review[:4])
    for step in ("-f sarif", "--patch", "git apply --check", "--fail-on error"):
        assert step in flow, step
