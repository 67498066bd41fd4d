"""``keep = "best"`` and the plateau stop on a real worker process and real Redis: the
scripted critic's scores fall (0.6, 0.4, 0.3), so the first draft is the best revision."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestration import Agent, Team

pytestmark = pytest.mark.system

#: The critic scores revision 0, 1, 2... by this schedule; the actor marks each revision.
FALLING = "sim:critic?scores=0.6,0.4,0.3"
CONFIG = f"""\
[actor]
instructions = "Fix the code."
model = "sim"

[critic]
instructions = "Find security bugs."
model = "{FALLING}"

[loop]
max_rounds = 3
keep = "best"
"""


def _duet(*args: str | Path, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "duet", *map(str, args)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_keep_best_returns_the_first_draft_when_the_scores_fall(
    worker: Any, system_redis_url: str, tmp_path: Path
) -> None:
    env = {**os.environ, "DUET_REDIS_URL": system_redis_url, "COLUMNS": "200"}
    (tmp_path / "review.toml").write_text(CONFIG)
    (tmp_path / "in.jsonl").write_text('{"id": "q", "prompt": "Review: eval(input())"}\n')
    out = tmp_path / "out.jsonl"
    done = _duet("run", "review.toml", "-i", "in.jsonl", "-o", out, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    [record] = [json.loads(line) for line in out.read_text().splitlines()]
    assert (record["status"], record["n_rounds"], record["usage"]["calls"]) == (
        "max_rounds_reached",
        3,
        7,  # the actor wrote revisions 1..3 all the same...
    )
    assert record["output"].startswith("[revision 0]")  # ...and the first draft is kept
    assert (record["output_round"], record["best_round"], record["final_score"]) == (0, 1, 0.6)
    assert record["keep"] == "best" and record["issues"] == record["rounds"][0]["issues"]

    shown = _duet("show", record["run_id"], env=env, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    kept = "the best-scored revision, the first draft (scored 0.60 in round 1)"
    assert re.search(rf"^ kept +{re.escape(kept)}", shown.stdout, re.M), shown.stdout
    assert f"kept output: {kept}" in shown.stdout

    as_csv = tmp_path / "out.csv"
    fetched = _duet("results", record["batch_id"], "-o", as_csv, env=env, cwd=tmp_path)
    assert fetched.returncode == 0, fetched.stderr
    [row] = list(csv.DictReader(io.StringIO(as_csv.read_text())))
    assert (row["keep"], row["output_round"], row["best_round"]) == ("best", "0", "1")
    assert row["output"].startswith("[revision 0]")


def test_the_plateau_stop_ends_the_loop_when_the_score_stops_rising(
    worker: Any, client_on: str
) -> None:
    actor, critic = Agent("Fix the code.", model="sim"), Agent("Judge.", model=FALLING)
    team = Team.actor_critic(
        actor=actor, critic=critic, max_rounds=5, keep="best", min_improvement=0.05
    )
    result = team.run_sync("Review: pickle.loads(body)", timeout=60)
    assert (result.status, result.interruption_reason) == ("max_rounds_reached", "plateau")
    assert [r.score for r in result.rounds] == [0.6, 0.4]  # stopped at the first fall
    assert result.model_calls == 4  # draft, critique, revision, critique: no 2nd revision
    assert result.output is not None and result.output.startswith("[revision 0]")
    assert (result.output_round, result.best_round, result.final_score) == (0, 1, 0.6)

    without = Team.actor_critic(actor=actor, critic=critic, max_rounds=5)
    last = without.run_sync("Review: pickle.loads(body)", timeout=60)
    assert (last.status, last.interruption_reason, len(last.rounds)) == (
        "max_rounds_reached",
        None,
        5,
    )
    assert last.output is not None and last.output.startswith("[revision 5]")
