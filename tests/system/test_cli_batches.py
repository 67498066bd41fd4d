"""A batch review a user can trust, through the real ``duet`` command: exit codes per
case, live output without a terminal, visible waits, rejected inputs kept with a cluster
batch, resuming from a results file without paying twice, dry runs and written outputs.

Real Redis, real worker processes (or the embedded default), the real OpenAI SDK against
the stand-in server where requests are counted.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from duet import DISTRIBUTION
from duet.commands.main import app
from tests.support import wait_for

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_CONFIG = ROOT / "examples" / "review.toml"
EXAMPLE_INPUTS = ROOT / "examples" / "inputs.jsonl"


def _config(
    tmp_path: Path, actor: str = "sim", critic: str = "sim", extra: str = "", **kw: str
) -> Path:
    lines = [
        f'[actor]\ninstructions = "Fix the code."\nmodel = "{actor}"\n{kw.get("actor_extra", "")}',
        f'[critic]\ninstructions = "Find security bugs."\nmodel = "{critic}"\n{kw.get("critic_extra", "")}',
        "[loop]\nmax_rounds = 2\n",
        extra,
    ]
    path = tmp_path / f"review-{len(list(tmp_path.glob('review-*.toml')))}.toml"
    path.write_text("\n".join(lines))
    return path


def _inputs(tmp_path: Path, n: int, name: str = "in.jsonl", bad: str = "") -> Path:
    path = tmp_path / name
    rows = [json.dumps({"id": f"i{k}", "prompt": f"Review: os.system(x{k})"}) for k in range(n)]
    path.write_text("\n".join(rows) + "\n" + bad)
    return path


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DUET_REDIS_URL", "DUET_BROKER_URL")}
    return {**env, "COLUMNS": "200", "PYTHONUNBUFFERED": "1", **extra}


def _duet(*args: str | Path, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "duet", *map(str, args)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
    )


@contextlib.contextmanager
def _start(*args: str | Path, env: dict[str, str], cwd: Path) -> Iterator[subprocess.Popen[str]]:
    """``duet`` running in the background; killed if still running when the block ends."""
    with subprocess.Popen(
        [sys.executable, "-m", "duet", *map(str, args)],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


class _Lines:
    """Lines a process writes to stderr, read on a thread so a test can wait on them."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        import threading

        self.lines: list[str] = []
        assert proc.stderr is not None
        self._thread = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)


@pytest.fixture
def embedded(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from orchestration.settings import get_settings
    from orchestration.state import connection

    monkeypatch.delenv("DUET_REDIS_URL", raising=False)
    monkeypatch.delenv("DUET_BROKER_URL", raising=False)
    get_settings.cache_clear()
    yield
    connection.reset()
    get_settings.cache_clear()


@pytest.fixture
def cluster_env(worker: subprocess.Popen[bytes], system_redis_url: str) -> dict[str, str]:
    return _env(DUET_REDIS_URL=system_redis_url, OPENAI_API_KEY="sk-test-not-a-secret")


# --- exit codes, case by case -------------------------------------------------------------
def test_exit_0_only_when_every_input_is_accepted_and_finishes_well(
    embedded: None, tmp_path: Path
) -> None:
    inputs = _inputs(tmp_path, 3)
    out = tmp_path / "out.jsonl"
    good = _config(tmp_path, critic="sim?scores=0.95")
    result = CliRunner().invoke(app, ["run", str(good), "-i", str(inputs), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert {r["status"] for r in _records(out)} == {"approved"}

    # Every run interrupted (a permanent provider error): exit 1, and the summary says why.
    failing = _config(tmp_path, actor="sim?fail_at=0&fail=auth")
    result = CliRunner().invoke(app, ["run", str(failing), "-i", str(inputs), "-o", str(out)])
    assert result.exit_code == 1
    reason = _records(out)[0]["reason"]
    assert {r["status"] for r in _records(out)} == {"interrupted"}
    assert f"3 × {reason}" in result.stdout


def test_empty_input_file_exits_2_and_runs_nothing(embedded: None, tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(app, ["run", str(EXAMPLE_CONFIG), "-i", str(empty), "-o", str(out)])
    assert result.exit_code == 2
    assert f"{empty}: no inputs found" in result.stderr
    assert not out.exists()


def test_report_on_an_input_file_exits_2_naming_it(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["report", str(EXAMPLE_INPUTS), "-o", str(tmp_path / "r.html")]
    )
    assert result.exit_code == 2
    assert f"{EXAMPLE_INPUTS}:1: not a results record" in result.stderr
    assert not (tmp_path / "r.html").exists()


def test_report_with_inputs_diffs_each_output_not_approved_from_its_input(
    tmp_path: Path,
) -> None:
    inputs = tmp_path / "in.jsonl"
    inputs.write_text(json.dumps({"id": "a", "prompt": "```py\nx = eval(s)\n```"}) + "\n")
    results = tmp_path / "r.jsonl"
    record = {
        "id": "a",
        "status": "max_rounds_reached",
        "final_score": 0.4,
        "index": 0,
        "output": "```py\nx = int(s)\n```",
        "issues": ["still <unsafe>"],
        "rounds": [],
        "usage": {"usd": 0.0},
    }
    results.write_text(json.dumps(record) + "\n")
    page = tmp_path / "r.html"
    result = CliRunner().invoke(
        app, ["report", str(results), "--inputs", str(inputs), "-o", str(page)]
    )
    assert result.exit_code == 0, result.stderr
    html = page.read_text()
    assert "-x = eval(s)" in html and "+x = int(s)" in html
    assert "still &lt;unsafe&gt;" in html


def test_python_dash_m_duet_is_the_duet_command() -> None:
    from importlib.metadata import version

    shown = subprocess.run(
        [sys.executable, "-m", "duet", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (shown.returncode, shown.stdout.strip()) == (0, f"duet {version(DISTRIBUTION)}"), (
        shown.stderr
    )


def test_version_and_top_level_help_examples() -> None:
    from importlib.metadata import version

    runner = CliRunner()
    shown = runner.invoke(app, ["--version"])
    assert (shown.exit_code, shown.stdout.strip()) == (0, f"duet {version(DISTRIBUTION)}")
    for args in (["--help"], ["budget", "--help"], ["ls", "--help"]):
        helped = runner.invoke(app, args)
        assert helped.exit_code == 0
        after_the_options = " ".join(helped.stdout.rsplit("╯", 1)[-1].split())
        assert after_the_options.startswith("Example: duet"), (args, after_the_options)


# --- live output without a terminal --------------------------------------------------------
def test_without_a_terminal_run_logs_progress_lines_and_flushes_records_as_runs_finish(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, actor="sim?latency_ms=400", critic="sim?latency_ms=400")
    inputs = _inputs(tmp_path, 12)
    out = tmp_path / "out.jsonl"
    # stderr is a pipe: no live bar, one line per interval. Three worker threads: the runs
    # finish in waves, never all in one poll interval of this test.
    env = _env(DUET_WORKER_CONCURRENCY="3")
    with _start(
        "run", config, "-i", inputs, "-o", out, "--log-every", "0.3", env=env, cwd=tmp_path
    ) as proc:
        lines = _Lines(proc)
        seen_midway = wait_for(
            lambda: (
                proc.poll() is None
                and out.exists()
                and 0 < len(_records(out)) < 12
                and len(_records(out))
            ),
            60,
            "records in the file while the batch still runs",
        )
        assert proc.wait(timeout=120) == 0, lines.text()
    progress = [line for line in lines.lines if " done" in line and "/12 done" in line]
    assert len(progress) >= 3, lines.text()
    assert progress[-1].split(" ", 1)[1].startswith("12/12 done (100%)"), progress[-1]
    assert any(f"{n}/12 done" in line for line in progress for n in range(1, 12)), (
        "lines in between"
    )
    assert seen_midway >= 1
    records = _records(out)
    assert [r["index"] for r in records] == list(range(12)), "input order at the end"
    assert [r["id"] for r in records] == [f"i{k}" for k in range(12)]


# --- waits are visible ---------------------------------------------------------------------
def test_rate_limited_cluster_run_shows_the_wait_and_one_ctrl_c_stops_waiting(
    cluster_env: dict[str, str], fake_llm: Any, system_redis_url: str, tmp_path: Path
) -> None:
    actor = "openai:limited-actor"  # its own name: the limit touches no other test
    config = _config(
        tmp_path,
        actor=actor,
        critic="openai:limited-critic",
        actor_extra=f'base_url = "{fake_llm.url}"',
        critic_extra=f'base_url = "{fake_llm.url}"',
        extra=f'[rate_limits."{actor}"]\nrpm = 2\n',
    )
    out = tmp_path / "out.jsonl"
    with _start(
        "run",
        config,
        "-i",
        _inputs(tmp_path, 3),
        "-o",
        out,
        "--log-every",
        "0.3",
        env=cluster_env,
        cwd=tmp_path,
    ) as proc:
        lines = _Lines(proc)
        wait_for(
            lambda: (
                f"waiting: rate limit openai:limited-actor@{fake_llm.url}: next slot in"
                in lines.text()
            ),
            60,
            "the rate-limit wait on screen",
        )
        batch = next(ln.split()[1].rstrip(":") for ln in lines.lines if ln.startswith("batch "))
        asked = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=20)
        took = time.monotonic() - asked
    assert code == 130, lines.text()
    # Not waiting would be the rate limit's 60 s window: half of it tells the two apart
    # under any load a test machine has.
    assert took < 30, f"one Ctrl-C stops waiting at once (took {took:.1f}s)"
    text = lines.text()
    assert f"keeps running on the cluster. Cancel it: duet cancel {batch}" in text
    assert "duet watch" in text and "duet results" in text
    assert f"(set by {config.name}; duet limits show)" in text, "the wait names its origin"
    assert _duet("cancel", batch, env=cluster_env, cwd=tmp_path).returncode == 0
    cleared = _duet("limits", "clear", actor, env=cluster_env, cwd=tmp_path)
    assert cleared.stdout.strip() == "cleared 1 rate limit(s)", cleared.stderr


def test_limits_outlive_a_batch_and_are_shown_set_and_cleared(
    cluster_env: dict[str, str], fake_llm: Any, tmp_path: Path
) -> None:
    model = "openai:stale-limit-model"  # its own name: the limit touches no other test
    done = _duet(
        "limits",
        "set",
        model,
        "--rpm",
        "7",
        "--base-url",
        fake_llm.url,
        env=cluster_env,
        cwd=tmp_path,
    )
    name = f"{model}@{fake_llm.url}"  # a limit is kept per model and endpoint
    assert done.returncode == 0 and f"{name}: 7 requests per 60s" in done.stdout
    shown = _duet("limits", "show", env=cluster_env, cwd=tmp_path)
    row = next(line for line in shown.stdout.splitlines() if model in line)
    assert "7" in row and "duet limits set" in row, shown.stdout

    # A later config for that model sets no limit: submitting says the old one applies.
    config = _config(
        tmp_path, actor=model, critic="sim", actor_extra=f'base_url = "{fake_llm.url}"'
    )
    sent = _duet("submit", config, "-i", _inputs(tmp_path, 1), env=cluster_env, cwd=tmp_path)
    assert f"{name} keeps the fleet rate limit set by duet limits set" in sent.stderr, sent.stderr
    assert _duet("watch", sent.stdout.strip(), env=cluster_env, cwd=tmp_path).returncode == 0

    assert _duet("limits", "clear", model, env=cluster_env, cwd=tmp_path).stdout.strip() == (
        "cleared 1 rate limit(s)"
    )
    after = _duet("limits", "show", env=cluster_env, cwd=tmp_path)
    assert model not in after.stdout
    refused = _duet("limits", "set", model, env=cluster_env, cwd=tmp_path)
    assert refused.returncode == 2 and "--rpm, --tpm" in refused.stderr


def test_watch_with_no_worker_says_so_and_ctrl_c_exits_130(
    redis_url: str, redis_client: Any, tmp_path: Path
) -> None:
    # The test db has no worker: nothing consumes its queues.
    env = _env(DUET_REDIS_URL=redis_url)
    submitted = _duet("submit", EXAMPLE_CONFIG, "-i", _inputs(tmp_path, 2), env=env, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    assert "no worker is consuming queue" in submitted.stderr
    batch = submitted.stdout.strip()
    with _start("watch", batch, "--log-every", "0.5", env=env, cwd=tmp_path) as proc:
        lines = _Lines(proc)
        wait_for(
            lambda: (
                "waiting: no worker is consuming queue actor, coordinator, critic" in lines.text()
            ),
            30,
            "the no-worker hint",
        )
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 130, lines.text()
    assert "the batch keeps running" in lines.text()
    timed_out = _duet("results", batch, "--timeout", "1.5", env=env, cwd=tmp_path)
    assert timed_out.returncode == 1
    assert f"batch {batch} did not finish within 1.5s" in timed_out.stderr, timed_out.stderr
    from orchestration.client.handles import BatchHandle
    from tests.support import client_pointed_at

    with client_pointed_at(redis_url):
        waits = BatchHandle(batch).progress(check_workers=True)["waits"]
    assert waits == ["no worker is consuming queue actor, critic, coordinator, tools"]


# --- rejected inputs on a cluster ------------------------------------------------------------
def test_cluster_rejected_inputs_are_in_results_progress_report_and_ls(
    cluster_env: dict[str, str], tmp_path: Path
) -> None:
    bad = '{"id": "i1", "prompt": "a duplicate"}\nnot json\n{"id": "empty", "prompt": " "}\n'
    inputs = _inputs(tmp_path, 3, bad=bad)
    submitted = _duet("submit", EXAMPLE_CONFIG, "-i", inputs, env=cluster_env, cwd=tmp_path)
    assert submitted.returncode == 1, "some inputs were rejected"
    batch = submitted.stdout.strip()
    assert len(batch) == 32, "the batch was queued and its id printed all the same"
    assert _duet("watch", batch, env=cluster_env, cwd=tmp_path).returncode == 1

    out = tmp_path / "results.jsonl"
    fetched = _duet("results", batch, "-o", out, env=cluster_env, cwd=tmp_path)
    assert fetched.returncode == 1
    records = _records(out)
    assert [(r["index"], r["id"], r["status"] == "rejected") for r in records] == [
        (0, "i0", False),
        (1, "i1", False),
        (2, "i2", False),
        (3, "i1", True),
        (4, None, True),
        (5, "empty", True),
    ]
    assert [r["line"] for r in records if r["status"] == "rejected"] == [4, 5, 6]
    assert all(r["batch_id"] == batch for r in records)

    approved = _duet("results", batch, "--status", "approved", env=cluster_env, cwd=tmp_path)
    assert {json.loads(x)["status"] for x in approved.stdout.splitlines()} <= {"approved"}

    page = tmp_path / "report.html"
    # The page is written: that is the command's success, whatever the batch's outcomes.
    assert _duet("report", batch, "-o", page, env=cluster_env, cwd=tmp_path).returncode == 0
    html = page.read_text()
    assert "rejected: duplicate id" in html and "malformed JSON" in html
    assert "<title>rejected: 3</title>" in html

    listed = _duet("ls", env=cluster_env, cwd=tmp_path)
    assert listed.returncode == 0
    lines = listed.stdout.splitlines()
    at = next(n for n, line in enumerate(lines) if batch[:8] in line)
    assert "3/3" in lines[at]
    # The rejected inputs are counted among the outcomes, which may wrap to the next line.
    assert "rejected 3" in " ".join(lines[at : at + 2]).replace("│", " ")


# --- resume from a results file: finished inputs are not paid again ---------------------------
def test_resume_from_skips_finished_inputs_and_the_stand_in_sees_no_request_for_them(
    fake_llm: Any, tmp_path: Path
) -> None:
    config = _config(
        tmp_path,
        actor="openai:sim",
        critic="openai:sim:critic?scores=0.95",
        actor_extra=f'base_url = "{fake_llm.url}"',
        critic_extra=f'base_url = "{fake_llm.url}"',
    )
    inputs = _inputs(tmp_path, 6)
    env = _env(OPENAI_API_KEY="sk-test-not-a-secret")
    first = tmp_path / "first.jsonl"
    before = fake_llm.stats()["requests"]
    done = _duet("run", config, "-i", inputs, "-o", first, "--limit", "4", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [r["id"] for r in _records(first)] == ["i0", "i1", "i2", "i3"]
    assert fake_llm.stats()["requests"] - before == 4 * 2  # approved in round 1

    middle = fake_llm.stats()["requests"]
    final = tmp_path / "final.jsonl"
    done = _duet(
        "run", config, "-i", inputs, "-o", final, "--resume-from", first, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "4 input(s) already finished" in done.stderr
    records = _records(final)
    assert [r["id"] for r in records] == [f"i{k}" for k in range(6)]
    assert [r["run_id"] for r in records[:4]] == [r["run_id"] for r in _records(first)]
    assert fake_llm.stats()["requests"] - middle == 2 * 2, "only i4 and i5 were sent"


# --- dry run, written outputs ----------------------------------------------------------------
def test_dry_run_prints_the_worst_case_and_sends_nothing(fake_llm: Any, tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        actor="openai:sim",
        critic="openai:sim",
        actor_extra=f'base_url = "{fake_llm.url}"\nmax_tokens = 100\nprice = {{ input_per_mtok = 1.0, output_per_mtok = 1.0 }}',
        critic_extra=f'base_url = "{fake_llm.url}"\nmax_tokens = 100\nprice = {{ input_per_mtok = 1.0, output_per_mtok = 1.0 }}',
    )
    before = fake_llm.stats()["requests"]
    out = tmp_path / "never.jsonl"
    done = _duet(
        "run",
        config,
        "-i",
        _inputs(tmp_path, 4),
        "-o",
        out,
        "--dry-run",
        env=_env(OPENAI_API_KEY="x"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "model calls (at most)" in done.stdout and "20 (1 + 2 × 2 per run)" in done.stdout
    assert "output tokens (at most)" in done.stdout and "2,000" in done.stdout
    assert fake_llm.stats()["requests"] == before, "nothing was sent"
    assert not out.exists()


def test_output_dir_mirrors_a_directory_input_with_the_approved_outputs(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "a.py").write_text("eval(input())\n")
    (src / "pkg" / "b.py").write_text("os.system(cmd)\n")
    config = _config(tmp_path, critic="sim?scores=0.95")
    fixed = tmp_path / "fixed"
    done = _duet(
        "run",
        config,
        "-i",
        src,
        "-o",
        tmp_path / "out.jsonl",
        "--output-dir",
        fixed,
        env=_env(),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    records = {r["id"]: r for r in _records(tmp_path / "out.jsonl")}
    assert sorted(p.relative_to(fixed).as_posix() for p in fixed.rglob("*.py")) == [
        "a.py",
        "pkg/b.py",
    ]
    assert (fixed / "pkg" / "b.py").read_text() == records["pkg/b.py"]["output"]
    assert (
        "File: pkg/b.py" in json.dumps(records["pkg/b.py"]["output"])
        or records["pkg/b.py"]["output"]
    )


def test_results_of_a_file_filters_by_status_and_restores_input_order(tmp_path: Path) -> None:
    shuffled = tmp_path / "shuffled.jsonl"
    rows = [
        {"index": 2, "id": "c", "status": "approved", "usage": {}},
        {"index": 0, "id": "a", "status": "max_rounds_reached", "usage": {}},
        {"index": 1, "id": "b", "status": "approved", "usage": {}},
    ]
    shuffled.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = CliRunner().invoke(app, ["results", str(shuffled)])
    assert result.exit_code == 0
    assert [json.loads(x)["id"] for x in result.stdout.splitlines()] == ["a", "b", "c"]
    only = CliRunner().invoke(app, ["results", str(shuffled), "--status", "approved"])
    assert [json.loads(x)["id"] for x in only.stdout.splitlines()] == ["b", "c"]
    wrong = CliRunner().invoke(app, ["results", str(shuffled), "--status", "aproved"])
    assert wrong.exit_code == 2 and "unknown status aproved" in wrong.stderr


def test_a_spent_batch_budget_stops_runs_and_the_summary_says_so(
    embedded: None, tmp_path: Path
) -> None:
    # Three calls for a batch whose runs need at least two each: the budget stops them.
    config = _config(tmp_path, critic="sim?scores=0.1", extra="[budget]\nmax_calls = 3\n")
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(
        app, ["run", str(config), "-i", str(_inputs(tmp_path, 3)), "-o", str(out)]
    )
    assert result.exit_code == 1, result.output
    records = _records(out)
    assert sum(r["usage"]["calls"] for r in records) <= 3, "a hard cap"
    stopped = [r for r in records if r["status"] == "interrupted"]
    assert stopped and all(r["reason"].startswith("budget:batch:calls") for r in stopped)
    assert f"{len(stopped)} × budget:batch:calls" in result.stdout


# --- triage while a batch runs, and a malformed cluster URL ---------------------------------
def test_results_status_streams_each_match_the_moment_its_run_finishes(
    cluster_env: dict[str, str], tmp_path: Path
) -> None:
    """`duet results BATCH --status cancelled` prints a run cancelled late in input order
    while the inputs before it still run: matches come in finish order, not input order."""
    # 5 calls of 3 s each a run: the others run on well after the cancel lands.
    config = _config(
        tmp_path, actor="sim?latency_ms=3000", critic="sim:critic?scores=0.1&latency_ms=3000"
    )
    submitted = _duet("submit", config, "-i", _inputs(tmp_path, 6), env=cluster_env, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    batch = submitted.stdout.strip()
    from orchestration.client.handles import BatchHandle
    from tests.support import client_pointed_at

    with (
        client_pointed_at(cluster_env["DUET_REDIS_URL"]),
        _start("results", batch, "--status", "cancelled", env=cluster_env, cwd=tmp_path) as proc,
    ):
        handle = BatchHandle(batch)
        last = handle.run_ids()[-1]
        assert _duet("cancel", last, env=cluster_env, cwd=tmp_path).returncode == 0
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the first match
        assert line, (proc.wait(30), proc.stderr.read() if proc.stderr else "")
        first = json.loads(line)
        progress = handle.progress()
        assert first["run_id"] == last and first["status"] == "cancelled"
        assert progress["done"] < progress["total"], "printed before the batch finished"
        assert _duet("cancel", batch, env=cluster_env, cwd=tmp_path).returncode == 0
        rest = proc.stdout.read()
        assert proc.wait(timeout=60) == 1  # cancelled runs did not finish well
    assert all(json.loads(line)["status"] == "cancelled" for line in rest.splitlines()), rest


@pytest.mark.parametrize("command", [["ls"], ["watch", "abcd1234"], ["limits", "show"]])
def test_a_redis_url_without_a_scheme_is_one_line_exit_2(
    command: list[str], tmp_path: Path
) -> None:
    done = _duet(*command, env=_env(DUET_REDIS_URL="localhost:6379"), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert "DUET_REDIS_URL=localhost:6379" in done.stderr and "redis://" in done.stderr


def test_dry_run_lists_rejected_inputs_whole_at_80_columns(tmp_path: Path) -> None:
    long_id = "a-long-input-id-that-goes-on-and-on-for-a-while/in/a/deep/tree/module.py"
    inputs = tmp_path / "in.jsonl"
    inputs.write_text(json.dumps({"id": long_id, "prompt": "x" * 30_000}) + "\n")
    done = _duet(
        "run",
        EXAMPLE_CONFIG,
        "-i",
        inputs,
        "-o",
        tmp_path / "never.jsonl",
        "--dry-run",
        env=_env(COLUMNS="80"),
        cwd=tmp_path,
    )
    assert "…" not in done.stdout + done.stderr
    assert long_id in done.stdout + done.stderr
    assert "prompt is 30,000 characters, over the limit of 20,000" in done.stdout + done.stderr
