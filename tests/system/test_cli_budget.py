"""`duet budget show / set / reset` against a real Redis, through typer's runner."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from duet.commands.main import app
from orchestration.core.budget import Amount
from orchestration.state.budgets import BudgetLedger

runner = CliRunner()


@pytest.fixture
def cluster(redis_url: str, redis_client: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    from orchestration.state import connection

    monkeypatch.setenv("DUET_REDIS_URL", redis_url)
    yield redis_client
    connection.reset()


def test_set_show_reset(cluster: Any) -> None:
    result = runner.invoke(
        app, ["budget", "set", "global:team-a", "--max-tokens", "1000", "--max-usd", "2"]
    )
    assert result.exit_code == 0, result.output
    ledger = BudgetLedger(cluster)
    assert ledger.get("global:team-a").limits == {"tokens": 1000, "usd": 2.0}

    ledger.settle(
        "r1:r0.generate",
        ["global:team-a"],
        Amount(input_tokens=300, output_tokens=100, usd=0.5, calls=1),
    )
    shown = runner.invoke(app, ["budget", "show", "global:team-a"])
    assert shown.exit_code == 0, shown.output
    row = next(line for line in shown.output.splitlines() if line.strip("│┃ ").startswith("tokens"))
    assert [cell.strip() for cell in row.strip("│┃ ").split("│")] == [
        "tokens",
        "1,000",
        "400",
        "0",
        "600",
    ]
    listed = runner.invoke(app, ["budget", "show", "global:"])
    assert "global:team-a" in listed.output

    assert runner.invoke(app, ["budget", "reset", "global:team-a"]).exit_code == 0
    state = ledger.get("global:team-a")
    assert state.spent.tokens == 0 and state.limits == {"tokens": 1000, "usd": 2.0}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["budget", "set", "bogus:x", "--max-calls", "3"], "unknown budget scope kind"),
        (["budget", "set", "global:x", "--warn-at", "3"], "--warn-at"),
        (["budget", "set", "global:x", "--max-calls", "-1"], "--max-calls"),
    ],
)
def test_bad_budget_arguments_exit_2(cluster: Any, args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.output


def test_budget_commands_need_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DUET_REDIS_URL", raising=False)
    result = runner.invoke(app, ["budget", "show"])
    assert result.exit_code == 2
    assert "DUET_REDIS_URL" in result.output


def test_budget_show_of_a_batch_agrees_with_ls(cluster: Any) -> None:
    """A batch with no limit keeps no ledger: `budget show batch:SHORT` (the id `ls`
    shows) gives what its runs cost, the number `ls` gives, not $0."""
    from orchestration.state import keys

    batch = "4c9e34663fac4c9d8513fd84d3ff8b17"
    cluster.hset(
        keys.batch(batch),
        mapping={"usd": "0.19", "created_at": "1700000000", "total": "2", "done": "2"},
    )
    cluster.zadd(keys.batches_index(), {batch: 1700000000})
    try:
        listed = runner.invoke(app, ["ls"])
        assert listed.exit_code == 0, listed.output
        assert "$0.1900" in listed.output
        shown = runner.invoke(app, ["budget", "show", f"batch:{batch[:8]}"])
        assert shown.exit_code == 0, shown.output
        assert f"batch:{batch}" in shown.output and "$0.1900" in shown.output, shown.output
    finally:
        cluster.delete(keys.batch(batch))
        cluster.zrem(keys.batches_index(), batch)
