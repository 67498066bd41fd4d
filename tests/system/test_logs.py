"""JSON logs: every line a worker and the CLI write parses, and carries the ids it is about;
Celery's per-task INFO lines are off by default."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestration import Agent, Team
from tests.support import ROOT, celery_worker, client_pointed_at

pytestmark = pytest.mark.system


#: A log record in Celery's text format: "[2026-11-30 20:00:00,000: INFO/MainProcess] ..."
TEXT_RECORD = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+: [A-Z]+/")


def json_lines(text: str) -> list[dict[str, Any]]:
    """The log records in ``text``, each a JSON object (a text-format record fails the test).

    Lines that are not log records (Celery's start banner, a warning Python prints) are
    skipped.
    """
    lines = []
    for line in text.splitlines():
        assert not TEXT_RECORD.match(line), f"a text log line: {line!r}"
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def test_worker_json_lines_carry_run_batch_step_and_task_ids(
    redis_url: str, redis_client: Any
) -> None:
    env = {"DUET_LOG_FORMAT": "json", "DUET_MAX_ATTEMPTS": "3", "DUET_RETRY_BASE_S": "0.05"}
    team = Team.actor_critic(  # every attempt fails: two retries logged, then interrupted
        actor=Agent("Fix.", model="sim?fail_at=0&fail=server_error"),
        critic=Agent("Review.", model="sim"),
    )
    with (
        client_pointed_at(redis_url),
        celery_worker(redis_url, env=env, name="jsonlog", loglevel="INFO") as worker,
    ):
        batch = team.submit_batch(["a", "b"])
        results = list(batch.results(timeout=60))
        log_path: Path = worker.log_path
        # The worker logs a retry before it re-schedules: all are written by now.
        text = log_path.read_text()
    retried = [line for line in json_lines(text) if "retry" in line["message"]]
    assert [r.status for r in results] == ["interrupted", "interrupted"]
    run_ids = {r.run_id for r in results}
    assert len(retried) == 4  # two runs x two retries
    for line in retried:
        assert line["level"] == "INFO" and line["logger"] == "orchestration.services.step"
        assert line["run_id"] in run_ids
        assert line["batch_id"] == batch.batch_id  # from the header, kept across retries
        assert line["step_key"] == "r0.generate"
        assert line["task_id"] and line["time"].endswith("Z")
    assert {line["run_id"] for line in retried} == run_ids
    # Celery's per-task INFO lines are off by default (~1 ms CPU per model call).
    assert " received" not in text and " succeeded in " not in text


def test_cli_json_lines_carry_the_batch_id(
    worker: Any, system_redis_url: str, tmp_path: Path
) -> None:
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text('{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "y"}\nnot json\n')
    env = {**os.environ, "DUET_REDIS_URL": system_redis_url}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "duet.commands.main",
            "--log-format",
            "json",
            "run",
            str(ROOT / "examples" / "review.toml"),
            "-i",
            str(inputs),
            "-o",
            str(tmp_path / "o.jsonl"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr  # one input rejected
    lines = json_lines(proc.stderr)
    submitted = [line for line in lines if "submitted" in line["message"]]
    finished = [line for line in lines if "finished" in line["message"]]
    assert len(submitted) == len(finished) == 1
    batch_id = submitted[0]["batch_id"]
    assert finished[0]["batch_id"] == batch_id and batch_id in submitted[0]["message"]
    (rejected,) = [
        line for line in lines if line["level"] == "WARNING" and line["logger"] == "duet"
    ]
    assert rejected["message"].endswith(
        "inputs.jsonl:3: malformed JSON: Expecting value (column 1)"
    )
    assert all(line.startswith("{") for line in proc.stderr.splitlines()), "only log lines"
