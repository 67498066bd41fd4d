"""`duet dead ls / show / purge` against a real Redis, through typer's runner."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from duet.commands.main import app
from orchestration.state import deadletters

runner = CliRunner()


@pytest.fixture
def cluster(redis_url: str, redis_client: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    from orchestration.state import connection

    monkeypatch.setenv("DUET_REDIS_URL", redis_url)
    yield redis_client
    connection.reset()


def test_ls_show_purge(cluster: Any) -> None:
    assert runner.invoke(app, ["dead", "ls"]).output.strip() == "no dead letters"
    deadletters.add(cluster, "actor", "not json {\x1b[31m", "not JSON: Expecting value")
    deadletters.add(cluster, "critic", "x" * (deadletters.MAX_TEXT + 5), "not JSON: too long")
    listed = runner.invoke(app, ["dead", "ls"])
    assert listed.exit_code == 0, listed.output
    assert "Dead letters (2)" in listed.output and "not JSON: Expecting value" in listed.output
    assert "\x1b" not in listed.output  # the text is untrusted: escapes shown, not run
    first, second = (d.id for d in deadletters.newest(cluster)[::-1])
    shown = runner.invoke(app, ["dead", "show", first])
    assert shown.exit_code == 0, shown.output
    assert "queue:  actor" in shown.output and "not json {\\x1b[31m" in shown.output
    cut = runner.invoke(app, ["dead", "show", second])
    assert f"(first {deadletters.MAX_TEXT:,} of {deadletters.MAX_TEXT + 5:,} characters)" in (
        cut.output
    )
    purged = runner.invoke(app, ["dead", "purge", first])
    assert purged.exit_code == 0 and "deleted 1 dead letter" in purged.output
    assert [d.id for d in deadletters.newest(cluster)] == [second]
    assert "deleted 1 dead letter" in runner.invoke(app, ["dead", "purge", "--all"]).output
    assert deadletters.count(cluster) == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["dead", "show", "nope"], "'nope' is not a dead letter's id"),
        (["dead", "show", "1-0"], "no dead letter '1-0'"),
        (["dead", "purge"], "name the letters to delete, or give --all"),
        (["dead", "purge", "1-0", "--all"], "name the letters to delete, or give --all"),
        (["dead", "purge", "x"], "'x' is not a dead letter's id"),
    ],
)
def test_bad_arguments_exit_2(cluster: Any, args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and message in result.output, result.output
