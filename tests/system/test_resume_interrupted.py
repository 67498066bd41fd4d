"""``duet resume --interrupted`` on a cluster: a batch stopped by its spent budget, run
again once the budget is raised, pays no completed call twice and its spend never falls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, doc_commands, stand_in_batch

pytestmark = pytest.mark.system

#: A db of its own for the test that swaps workers; the key variable those workers lack
#: or have.
RERUN_DB = int(os.environ.get("DUET_RERUN_REDIS_DB", "12"))
KEY = "DUET_TEST_RERUN_KEY"


def _duet(*args: str | Path, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "duet", *map(str, args)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _batch_usd(batch: str, env: dict[str, str], cwd: Path) -> float:
    from orchestration.client.handles import BatchHandle
    from tests.support import client_pointed_at

    with client_pointed_at(env["DUET_REDIS_URL"]):
        return float(BatchHandle(batch).progress()["usd"])


def test_resume_interrupted_reruns_budget_stopped_runs_paying_no_stored_step_twice(
    worker: Any, system_redis_url: str, fake_llm: Any, tmp_path: Path
) -> None:
    env = {**os.environ, "DUET_REDIS_URL": system_redis_url, "COLUMNS": "200"}
    config, inputs = stand_in_batch(tmp_path, fake_llm.url, price=(1000.0, 2000.0), max_usd=2.0)
    before = fake_llm.stats()
    submitted = _duet("submit", config, "-i", inputs, env=env, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    batch = submitted.stdout.strip()
    assert _duet("watch", batch, env=env, cwd=tmp_path).returncode == 1  # some interrupted
    first = tmp_path / "first.jsonl"
    _duet("results", batch, "-o", first, env=env, cwd=tmp_path)
    stopped = [r for r in _records(first) if r["status"] == "interrupted"]
    assert stopped and all(r["reason"].startswith("budget:") for r in stopped)
    spent_first = _batch_usd(batch, env, tmp_path)

    # The cause fixed: the batch's budget raised. Then only the interrupted runs move.
    raised = _duet("budget", "set", f"batch:{batch}", "--max-usd", "1000", env=env, cwd=tmp_path)
    assert raised.returncode == 0, raised.stderr
    resumed = _duet("resume", batch[:10], "--interrupted", env=env, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"re-running {len(stopped)} interrupted run(s)" in resumed.stdout
    watched = _duet("watch", batch, env=env, cwd=tmp_path)
    assert watched.returncode == 0, watched.stderr + watched.stdout
    final = tmp_path / "final.jsonl"
    assert _duet("results", batch, "-o", final, env=env, cwd=tmp_path).returncode == 0
    records = _records(final)
    assert [r["status"] for r in records] == ["max_rounds_reached"] * 8
    # Every completed step was kept: each run made its 5 calls once, plus at most the one
    # call that was cut by the budget and ran again (still counted: it was paid).
    after = fake_llm.stats()
    made = after["requests"] - before["requests"]
    calls = [r["usage"]["calls"] for r in records]
    assert all(5 <= c <= 6 for c in calls), calls
    assert made == sum(calls)
    assert sum(calls) - 8 * 5 <= len(stopped)
    # ...and the batch's spend is what the server billed: it rose, never fell.
    sent_in = after["usage"]["input_tokens"] - before["usage"]["input_tokens"]
    sent_out = after["usage"]["output_tokens"] - before["usage"]["output_tokens"]
    billed = (sent_in * 1000.0 + sent_out * 2000.0) / 1_000_000
    spent = _batch_usd(batch, env, tmp_path)
    assert spent == pytest.approx(billed, abs=1e-6)
    assert spent > spent_first
    # docs/walkthrough.md shows these two commands for it.
    assert doc_commands(ROOT / "docs" / "walkthrough.md", "After fixing a cause") == [
        ("budget", "set", "--max-usd"),
        ("resume", "--interrupted"),
    ]
    # A second --interrupted finds nothing to re-run.
    again = _duet("resume", batch, "--interrupted", env=env, cwd=tmp_path)
    assert "re-running 0 interrupted run(s)" in again.stdout


def test_resume_interrupted_after_the_key_is_set_on_the_workers(
    redis_url: str, fake_llm: Any, tmp_path: Path
) -> None:
    """Runs stopped by a key missing on the workers finish once a worker has it: the
    stopped step (no call was made) runs again, nothing else does."""
    import redis

    from tests.support import celery_worker

    url = f"{redis_url.rpartition('/')[0]}/{RERUN_DB}"
    redis.Redis.from_url(url).flushdb()
    env = {**os.environ, "DUET_REDIS_URL": url, "COLUMNS": "200"}
    env.pop(KEY, None)
    config = tmp_path / "keyed.toml"
    config.write_text(
        f'[actor]\ninstructions = "Fix."\nmodel = "claude-haiku-4-5"\n'
        f'base_url = "{fake_llm.anthropic_url}"\napi_key_env = "{KEY}"\n\n'
        f'[critic]\ninstructions = "Review."\nmodel = "openai:sim:critic?scores=0.95"\n'
        f'base_url = "{fake_llm.url}"\n\n[loop]\nmax_rounds = 1\n'
    )
    inputs = tmp_path / "in.jsonl"
    inputs.write_text(
        "".join(json.dumps({"id": f"k{i}", "prompt": f"x{i}"}) + "\n" for i in range(3))
    )
    before = fake_llm.stats()["requests"]
    with celery_worker(url, name="nokey", env={KEY: ""}):
        submitted = _duet("submit", config, "-i", inputs, env=env, cwd=tmp_path)
        batch = submitted.stdout.strip()
        assert _duet("watch", batch, env=env, cwd=tmp_path).returncode == 1
        first = tmp_path / "first.jsonl"
        _duet("results", batch, "-o", first, env=env, cwd=tmp_path)
        assert {r["reason"] for r in _records(first)} == {
            "actor:round_0:provider_error:missing_key"
        }
    assert fake_llm.stats()["requests"] == before  # no call went out without the key
    with celery_worker(url, name="withkey", env={KEY: "sk-test-not-a-secret"}):
        resumed = _duet("resume", batch, "--interrupted", env=env, cwd=tmp_path)
        assert "re-running 3 interrupted run(s)" in resumed.stdout, resumed.stdout
        assert _duet("watch", batch, env=env, cwd=tmp_path).returncode == 0
        final = tmp_path / "final.jsonl"
        _duet("results", batch, "-o", final, env=env, cwd=tmp_path)
    records = _records(final)
    assert [r["status"] for r in records] == ["approved"] * 3
    assert [r["usage"]["calls"] for r in records] == [2] * 3
    assert fake_llm.stats()["requests"] - before == 3 * 2
    redis.Redis.from_url(url).flushdb()
