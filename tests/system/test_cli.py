"""The ``duet`` command, end to end: in-process through typer's CliRunner and as a real
subprocess, on the embedded default and on a cluster with a real worker process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from duet.commands.main import app
from tests.support import CELERY, SIM_CONFIG, wait_for

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_CONFIG = ROOT / "examples" / "review.toml"
EXAMPLE_INPUTS = ROOT / "examples" / "inputs.jsonl"
DUET_SCRIPT = Path(sys.executable).parent / "duet"

FAST_CONFIG = SIM_CONFIG + "\n[loop]\nmax_rounds = 2\n"


def _ids(path: Path) -> list[str | None]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _env(**extra: str) -> dict[str, str]:
    """This environment without a cluster (the embedded default), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("DUET_REDIS_URL", "DUET_BROKER_URL")}
    return {**env, "COLUMNS": "200", "PYTHONUNBUFFERED": "1", **extra}


def _duet(
    *args: str | Path, env: dict[str, str], cwd: Path, script: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run ``duet`` as its own process: the console script, or ``python -m duet``."""
    head = [str(DUET_SCRIPT)] if script else [sys.executable, "-m", "duet"]
    return subprocess.run(
        [*head, *map(str, args)], env=env, cwd=cwd, capture_output=True, text=True, timeout=180
    )


@pytest.fixture
def embedded(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No cluster configured in this process, so `duet run` uses the embedded one.

    The embedded cluster is process-wide and lives until exit (restarting it in one
    process is not supported); only this process's pointer to it is reset afterwards.
    """
    from orchestration.settings import get_settings
    from orchestration.state import connection

    monkeypatch.delenv("DUET_REDIS_URL", raising=False)
    monkeypatch.delenv("DUET_BROKER_URL", raising=False)
    get_settings.cache_clear()
    yield
    connection.reset()
    get_settings.cache_clear()


@pytest.fixture
def fast_config(tmp_path: Path) -> Path:
    path = tmp_path / "fast.toml"
    path.write_text(FAST_CONFIG)
    return path


# --- duet run on the embedded default -----------------------------------------------------
def test_run_examples_in_process(embedded: None, tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    result = CliRunner().invoke(
        app, ["run", str(EXAMPLE_CONFIG), "--input", str(EXAMPLE_INPUTS), "--output", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert _ids(out) == _ids(EXAMPLE_INPUTS), "one record per input, in input order"
    statuses = {r["status"] for r in _records(out)}
    assert statuses <= {"approved", "max_rounds_reached"}
    assert len(statuses) == 2, "the demo shows a mix of outcomes"
    assert "Summary" in result.stdout and "approved" in result.stdout


def test_run_examples_as_console_script(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    done = _duet(
        "run",
        EXAMPLE_CONFIG,
        "--input",
        EXAMPLE_INPUTS,
        "--output",
        out,
        env=_env(),
        cwd=tmp_path,
        script=True,
    )
    assert done.returncode == 0, done.stderr
    records = _records(out)
    assert [r["id"] for r in records] == _ids(EXAMPLE_INPUTS)
    for record in records:
        assert record["run_id"] and record["n_rounds"] == len(record["rounds"]) >= 1
        # approved in round k: 2k calls; max rounds: one refine more
        calls = 2 * record["n_rounds"] + (record["status"] != "approved")
        assert record["usage"]["calls"] == calls and record["usage"]["usd"] > 0
        assert record["final_score"] is not None and record["output"]
    assert "mean rounds" in done.stdout


def test_bad_inputs_are_listed_written_as_rejected_and_exit_1(
    fast_config: Path, tmp_path: Path
) -> None:
    inputs = tmp_path / "bad.jsonl"
    inputs.write_text(
        '{"id": "a", "prompt": "Review this: eval(input())"}\n'
        '["not", "an", "object"]\n'
        '{"id": "b", "prompt": "Review this: pickle.loads(body)"}\n'
        '{"id": "a", "prompt": "a duplicate id"}\n'
        '{"id": "c", "prompt": ""}\n'
        "{oops\n"
    )
    out = tmp_path / "out.jsonl"
    done = _duet("run", fast_config, "-i", inputs, "-o", out, env=_env(), cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    for where in ("bad.jsonl:2", "bad.jsonl:4", "bad.jsonl:5", "bad.jsonl:6"):
        assert where in done.stderr
    assert "duplicate id 'a' (first on line 1)" in done.stderr
    records = _records(out)
    assert [(r["id"], r["status"]) for r in records] == [
        ("a", records[0]["status"]),
        (None, "rejected"),
        ("b", records[2]["status"]),
        ("a", "rejected"),
        ("c", "rejected"),
        (None, "rejected"),
    ], "every input accounted for, in input order"
    assert records[0]["status"] in ("approved", "max_rounds_reached")
    assert [(r["line"], r["reason"][:15]) for r in records if r["status"] == "rejected"] == [
        (2, "expected a JSON"),
        (4, "duplicate id 'a"),
        (5, "empty prompt"),
        (6, "malformed JSON:"),
    ]


def test_interrupted_runs_are_recorded_with_their_reason(embedded: None, tmp_path: Path) -> None:
    # A permanent provider error interrupts the run (status "failed" is kept for errors of
    # Duet itself): the input is accounted for, with why it stopped.
    config = tmp_path / "failing.toml"
    config.write_text(FAST_CONFIG.replace('model = "sim"', 'model = "sim?fail_at=0&fail=auth"', 1))
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('{"id": "x", "prompt": "Review this"}\n')
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(app, ["run", str(config), "-i", str(inputs), "-o", str(out)])
    assert result.exit_code == 1, "an interrupted run is not a success"
    [record] = _records(out)
    assert (record["id"], record["status"]) == ("x", "interrupted")
    assert "auth" in record["reason"]
    assert "interrupted 1" in result.stderr
    assert f"1 × {record['reason']}" in result.stdout, "the summary says why"


def test_ctrl_c_cancels_the_batch_and_still_accounts_for_every_input(tmp_path: Path) -> None:
    config = tmp_path / "slow.toml"
    config.write_text(FAST_CONFIG.replace('model = "sim"', 'model = "sim?latency_ms=2000"'))
    out = tmp_path / "out.jsonl"
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "duet.commands.main",
            "run",
            str(config),
            "-i",
            str(EXAMPLE_INPUTS),
            "-o",
            str(out),
        ],
        env=_env(),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:  # printed once Ctrl-C cancels instead of just quitting
            if "run(s), results ->" in line:
                break
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        stderr = proc.stderr.read()  # the same buffered reader: nothing read ahead is lost
    assert proc.returncode == 130, stderr
    assert "cancelling" in stderr
    records = _records(out)
    assert [r["id"] for r in records] == _ids(EXAMPLE_INPUTS)
    assert "cancelled" in {r["status"] for r in records}


# --- bad usage -----------------------------------------------------------------------------
BAD_CONFIGS = [
    (
        FAST_CONFIG.replace("max_rounds = 2", "max_rounds = 0"),
        "loop.max_rounds: must be >= 1, got 0",
    ),
    (FAST_CONFIG + "\n[budget]\nmax_usd = -1\n", "budget.max_usd: must be >= 0"),
    (
        FAST_CONFIG.replace('model = "sim"', 'model = "llama-3"', 1),
        "actor.model: unknown model 'llama-3'",
    ),
    (FAST_CONFIG.replace('model = "sim"', 'model = "sim?colour=red"', 1), "actor.model: sim model"),
    ("[actor]\nmodel = \n", "line 2, column 9: invalid TOML"),
    (
        FAST_CONFIG + "\n[inputs]\nmax_prompt_chars = 300000\n",
        "inputs.max_prompt_chars: 300,000 is above this process's cap of 200,000 characters "
        "(DUET_MAX_PROMPT_CHARS)",
    ),
]


@pytest.mark.parametrize(("text", "expected"), BAD_CONFIGS)
def test_bad_config_exits_2_naming_file_and_key(
    embedded: None, tmp_path: Path, text: str, expected: str
) -> None:
    config = tmp_path / "review.toml"
    config.write_text(text)
    result = CliRunner().invoke(app, ["run", str(config), "-i", str(EXAMPLE_INPUTS)])
    assert result.exit_code == 2
    assert f"{config}: " in result.stderr and expected in result.stderr


def test_bad_config_as_subprocess(tmp_path: Path) -> None:
    config = tmp_path / "review.toml"
    config.write_text(FAST_CONFIG + "\n[loop_typo]\nx = 1\n")
    done = _duet("run", config, "--input", EXAMPLE_INPUTS, env=_env(), cwd=tmp_path)
    assert done.returncode == 2
    assert f"{config}: loop_typo: unknown key" in done.stderr
    assert not (tmp_path / "inputs.results.jsonl").exists(), "nothing ran, nothing written"


SLOW_CALLS = FAST_CONFIG.replace('model = "sim"', 'model = "sim"\ntimeout_s = 600.0', 1)


def test_a_model_timeout_past_the_visibility_timeout_is_refused(
    tmp_path: Path, redis_url: str
) -> None:
    """At start, one line naming the agent, both timeouts and the variable; exit 2, and
    nothing run. The same for a worker whose visibility timeout is below the agents'
    default timeout (``duet worker``, and ``celery -A workers worker`` itself)."""
    config = tmp_path / "review.toml"
    config.write_text(SLOW_CALLS)
    env = _env(DUET_VISIBILITY_TIMEOUT_S="300")
    for command in ("run", "submit"):
        env = {**env, "DUET_REDIS_URL": redis_url} if command == "submit" else env
        done = _duet(command, config, "--input", EXAMPLE_INPUTS, env=env, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().splitlines() == [
            "error: actor (sim): timeout_s 600 s is not shorter than the broker's visibility "
            "timeout (300 s, DUET_VISIBILITY_TIMEOUT_S): the broker would hand the step to "
            "another worker mid-call. Lower the agent's timeout_s, or raise "
            "DUET_VISIBILITY_TIMEOUT_S (on every worker and client) above it"
        ], command
    assert not (tmp_path / "inputs.results.jsonl").exists(), "nothing ran, nothing written"

    env = _env(DUET_REDIS_URL="redis://127.0.0.1:1/0", DUET_VISIBILITY_TIMEOUT_S="60")
    refused = (
        "this worker will not start: the agents' default (Agent(timeout_s=...)): "
        "timeout_s 120 s is not shorter than the broker's visibility timeout (60 s, "
        "DUET_VISIBILITY_TIMEOUT_S)"
    )
    done = _duet("worker", env=env, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: {refused}")
    celery = subprocess.run(
        [
            *CELERY,
            "worker",
            "--pool",
            "threads",
            "-c",
            "1",
            "--without-heartbeat",
            "--without-mingle",
            "--without-gossip",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert celery.returncode == 2
    assert f"error: {refused}" in celery.stderr


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(
        app, ["run", str(EXAMPLE_CONFIG), "--input", str(tmp_path / "none.jsonl")]
    )
    assert missing.exit_code == 2
    assert runner.invoke(app, ["run", str(EXAMPLE_CONFIG)]).exit_code == 2  # no --input
    assert runner.invoke(app, ["frobnicate"]).exit_code == 2


CLUSTER_COMMANDS = [
    ["submit", str(EXAMPLE_CONFIG), "--input", str(EXAMPLE_INPUTS)],
    ["watch", "b1"],
    ["results", "b1"],
    ["show", "r1"],
    ["report", "b1", "-o", "report.html"],
    ["cancel", "b1"],
    ["resume", "b1"],
    ["worker"],
    ["sweep"],
    ["dead", "ls"],
]


@pytest.mark.parametrize("args", CLUSTER_COMMANDS, ids=lambda a: a[0])
def test_cluster_commands_refuse_without_a_cluster(embedded: None, args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "DUET_REDIS_URL" in result.stderr


def test_worker_refuses_unknown_queues(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DUET_REDIS_URL", "redis://127.0.0.1:1/0")  # never reached
    result = CliRunner().invoke(app, ["worker", "--queues", "actor,bogus"])
    assert result.exit_code == 2
    assert "unknown queue(s) bogus" in result.stderr


def _every_command() -> list[list[str]]:
    """Every command and sub-command of ``duet``, as found on the app itself."""
    import typer.main

    found = [[]]  # `duet --help` too

    def walk(group: Any, path: list[str]) -> None:
        for name, command in sorted(group.commands.items()):
            found.append([*path, name])
            if hasattr(command, "commands"):
                walk(command, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


@pytest.mark.parametrize("command", _every_command(), ids=lambda c: " ".join(c) or "duet")
def test_every_help_ends_with_an_example(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0
    # What follows the last box of options is the epilog: it must be an example.
    epilog = " ".join(result.stdout.rsplit("╯", 1)[-1].split())
    assert epilog.startswith("Example: "), epilog
    assert re.search(rf"\bduet {' '.join(command)}", epilog) or not command, epilog


def test_python_dash_m_works(tmp_path: Path) -> None:
    done = _duet("--help", env=_env(), cwd=tmp_path)
    assert done.returncode == 0
    assert "submit" in done.stdout and "watch" in done.stdout


# --- on a cluster: submit, watch, results, show, report, cancel, resume ---------------------
@pytest.fixture
def cluster_env(worker: subprocess.Popen[bytes], system_redis_url: str) -> dict[str, str]:
    """Environment for ``duet`` processes pointed at the system tests' Redis and worker."""
    return _env(DUET_REDIS_URL=system_redis_url)


def test_submit_watch_results_show_report_on_a_cluster(
    cluster_env: dict[str, str], fast_config: Path, tmp_path: Path
) -> None:
    submitted = _duet("submit", fast_config, "-i", EXAMPLE_INPUTS, env=cluster_env, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    batch = submitted.stdout.strip()
    assert len(batch) == 32, submitted.stdout

    watched = _duet("watch", batch, env=cluster_env, cwd=tmp_path)
    assert watched.returncode == 0, watched.stderr
    total = len(_ids(EXAMPLE_INPUTS))
    assert f"{total}/{total}" in watched.stderr

    out = tmp_path / "results.jsonl"
    fetched = _duet("results", batch, "-o", out, env=cluster_env, cwd=tmp_path)
    assert fetched.returncode == 0, fetched.stderr
    records = _records(out)
    assert [r["id"] for r in records] == _ids(EXAMPLE_INPUTS)

    streamed = _duet("results", batch, env=cluster_env, cwd=tmp_path)
    assert [json.loads(line)["run_id"] for line in streamed.stdout.splitlines()] == [
        r["run_id"] for r in records
    ]
    as_csv = tmp_path / "results.csv"
    assert _duet("results", batch, "-o", as_csv, env=cluster_env, cwd=tmp_path).returncode == 0
    assert as_csv.read_text().splitlines()[0].startswith("index,id,status,final_score")

    revised = next(r for r in records if r["n_rounds"] >= 2)
    shown = _duet("show", revised["run_id"], env=cluster_env, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "round 1: score" in shown.stdout and "round 2: score" in shown.stdout
    assert "--- revision 0" in shown.stdout and "+++ revision 1" in shown.stdout

    page = tmp_path / "report.html"
    reported = _duet("report", batch, "-o", page, env=cluster_env, cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr
    html = page.read_text()
    assert html.count("<svg") >= 4  # outcomes, scores, by round, cost (+ approvals)
    # Each input not approved has its block, its diff taken from the prompt on the cluster.
    for record in records:
        if record["status"] != "approved":
            assert f'data-id="{record["id"]}"' in html
    assert "the input is not at hand" not in html

    cancelled = _duet("cancel", batch, env=cluster_env, cwd=tmp_path)
    assert (cancelled.returncode, cancelled.stdout.strip()) == (
        0,
        f"batch {batch}: cancelled 0 unfinished run(s)",
    )
    resumed = _duet("resume", batch, env=cluster_env, cwd=tmp_path)
    assert resumed.returncode == 0 and "re-enqueued 0" in resumed.stdout


def test_run_on_a_cluster_and_report_from_the_results_file(
    cluster_env: dict[str, str], fast_config: Path, tmp_path: Path
) -> None:
    out = tmp_path / "results.jsonl"
    done = _duet("run", fast_config, "-i", EXAMPLE_INPUTS, "-o", out, env=cluster_env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "embedded" not in done.stderr
    assert _ids(out) == _ids(EXAMPLE_INPUTS)
    page = tmp_path / "report.html"
    # A results file needs no cluster: the report works after an embedded run is gone.
    reported = _duet("report", out, "-o", page, env=_env(), cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr
    assert "<svg" in page.read_text()


def test_unknown_batch_or_run_exits_2(cluster_env: dict[str, str], tmp_path: Path) -> None:
    for args in (["watch", "nope"], ["cancel", "nope"], ["show", "nope"]):
        done = _duet(*args, env=cluster_env, cwd=tmp_path)
        assert done.returncode == 2, args
        assert "nope" in done.stderr
        assert "not found" in done.stderr or "no batch or run" in done.stderr


def test_cancel_and_resume_mid_batch_repeat_no_step_and_count_spend_once(
    cluster_env: dict[str, str], fake_llm: Any, tmp_path: Path
) -> None:
    from tests.support import stand_in_batch

    config, inputs = stand_in_batch(tmp_path, fake_llm.url, price=(1.0, 2.0), max_usd=100.0)
    # Each run's five calls take 15 s at least: the batch outlasts starting `duet cancel`
    # however loaded the machine is; once it is cancelled the rest go at full speed.
    fake_llm.set_faults(latency_ms=3000)
    try:
        before = fake_llm.stats()
        submitted = _duet("submit", config, "-i", inputs, env=cluster_env, cwd=tmp_path)
        assert submitted.returncode == 0, submitted.stderr
        batch = submitted.stdout.strip()
        wait_for(
            lambda: fake_llm.stats()["requests"] - before["requests"] >= 4, 30, "the batch to start"
        )

        cancelled = _duet("cancel", batch, env=cluster_env, cwd=tmp_path)
        assert cancelled.returncode == 0, cancelled.stderr
        fake_llm.set_faults(latency_ms=0)
        watched = _duet("watch", batch, env=cluster_env, cwd=tmp_path)
        assert watched.returncode == 1, "cancelled runs did not finish well"
        halfway = tmp_path / "halfway.jsonl"
        fetched = _duet("results", batch, "-o", halfway, env=cluster_env, cwd=tmp_path)
        stopped = sum(r["status"] == "cancelled" for r in _records(halfway))
        assert stopped >= 1, fetched.stderr

        resumed = _duet("resume", batch, env=cluster_env, cwd=tmp_path)
        assert resumed.returncode == 0 and f"re-enqueued {stopped}" in resumed.stdout
        assert _duet("watch", batch, env=cluster_env, cwd=tmp_path).returncode == 0
        out = tmp_path / "final.jsonl"
        assert _duet("results", batch, "-o", out, env=cluster_env, cwd=tmp_path).returncode == 0
        records = _records(out)
        assert [r["status"] for r in records] == ["max_rounds_reached"] * 8
        assert [r["usage"]["calls"] for r in records] == [5] * 8
        # Counted at the server: every step ran once, across cancel and resume.
        after = fake_llm.stats()
        assert after["requests"] - before["requests"] == 8 * 5
        # ...and the batch's spend is what the server billed, counted once.
        sent_in = after["usage"]["input_tokens"] - before["usage"]["input_tokens"]
        sent_out = after["usage"]["output_tokens"] - before["usage"]["output_tokens"]
        from orchestration.client.handles import BatchHandle, get_budget
        from tests.support import client_pointed_at

        with client_pointed_at(cluster_env["DUET_REDIS_URL"]):
            progress = BatchHandle(batch).progress()
            ledger = get_budget(f"batch:{batch}")
        assert (progress["tokens"], progress["calls"]) == (sent_in + sent_out, 8 * 5)
        billed = (sent_in * 1.0 + sent_out * 2.0) / 1_000_000
        assert progress["usd"] == pytest.approx(billed, abs=1e-9)
        assert ledger.spent.usd == pytest.approx(billed, abs=1e-9)
        assert progress["budget"]["usd"]["spent"] == pytest.approx(progress["usd"], abs=1e-9)
        assert sum(r["usage"]["usd"] for r in records) == pytest.approx(billed, abs=1e-5)
    finally:
        fake_llm.set_faults(latency_ms=0)


def test_strict_refuses_the_whole_batch_listing_every_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"id": "a", "prompt": "ok"}\nnot json\n{"id": "a", "prompt": "dup"}\n{"id": "b"}\n'
    )
    out = tmp_path / "out.jsonl"
    done = _duet("run", EXAMPLE_CONFIG, "-i", bad, "-o", out, "--strict", env=_env(), cwd=tmp_path)
    assert done.returncode == 2
    for where, reason in [
        ("bad.jsonl:2", "malformed JSON"),
        ("bad.jsonl:3", "duplicate id 'a'"),
        ("bad.jsonl:4", "missing prompt"),
    ]:
        assert f"{where}: {reason}" in done.stderr
    assert not out.exists(), "a refused batch runs nothing and writes no results"


def test_short_ids_from_ls_are_whole_and_work_in_every_command(
    cluster_env: dict[str, str], fast_config: Path, tmp_path: Path
) -> None:
    narrow = {**cluster_env, "COLUMNS": "80"}
    submitted = _duet("submit", fast_config, "-i", EXAMPLE_INPUTS, env=narrow, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    batch = submitted.stdout.strip()

    listed = _duet("ls", env=narrow, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    cells = [w for line in listed.stdout.splitlines() for w in line.split()]
    shown = [w for w in cells if len(w) >= 8 and batch.startswith(w)]  # not the "0" counts
    assert len(shown) == 1 and len(shown[0]) < len(batch), listed.stdout
    short = shown[0]
    assert "…" not in listed.stdout
    wide = _duet("ls", "--wide", env=narrow, cwd=tmp_path)
    assert batch in wide.stdout, wide.stdout
    as_json = _duet("ls", "--json", env=narrow, cwd=tmp_path)
    assert batch in [json.loads(line)["batch_id"] for line in as_json.stdout.splitlines()]

    assert _duet("watch", short, env=narrow, cwd=tmp_path).returncode == 0
    out = tmp_path / "results.jsonl"
    assert _duet("results", short, "-o", out, env=narrow, cwd=tmp_path).returncode == 0
    run_id = _records(out)[0]["run_id"]
    run_shown = _duet("show", run_id[:10], env=narrow, cwd=tmp_path)
    assert run_shown.returncode == 0 and "round 1: score" in run_shown.stdout, run_shown.stderr
    reported = _duet("report", short, "-o", tmp_path / "r.html", env=narrow, cwd=tmp_path)
    assert reported.returncode == 0 and batch in (tmp_path / "r.html").read_text()
    cancelled = _duet("cancel", short, env=narrow, cwd=tmp_path)
    assert cancelled.stdout.strip() == f"batch {batch}: cancelled 0 unfinished run(s)"
    resumed = _duet("resume", short, env=narrow, cwd=tmp_path)
    assert f"batch {batch}: re-enqueued 0" in resumed.stdout
    cancelled_run = _duet("cancel", run_id[:10], env=narrow, cwd=tmp_path)
    assert cancelled_run.stdout.strip() == f"run {run_id}: already finished"


#: Every command that reads state, and so takes --json.
READ_COMMANDS = [
    ["ls"],
    ["show"],
    ["watch"],
    ["results"],
    ["budget", "show"],
    ["limits", "show"],
    ["dead", "ls"],
    ["dead", "show"],
    ["cache", "stats"],
]


@pytest.mark.parametrize("command", READ_COMMANDS, ids=" ".join)
def test_every_read_command_offers_json(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "--json" in result.stdout


def test_read_commands_print_json_lines_on_a_cluster(
    cluster_env: dict[str, str], fast_config: Path, tmp_path: Path
) -> None:
    submitted = _duet("submit", fast_config, "-i", EXAMPLE_INPUTS, env=cluster_env, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    batch = submitted.stdout.strip()
    assert (
        _duet(
            "budget", "set", "global:json-t", "--max-usd", "5", env=cluster_env, cwd=tmp_path
        ).returncode
        == 0
    )
    assert (
        _duet("limits", "set", "sim", "--rpm", "100000", env=cluster_env, cwd=tmp_path).returncode
        == 0
    )

    def lines(*args: str) -> list[dict[str, Any]]:
        done = _duet(*args, "--json", env=cluster_env, cwd=tmp_path)
        assert done.returncode in (0, 1), (args, done.stderr)
        return [json.loads(line) for line in done.stdout.splitlines()]

    watched = lines("watch", batch)
    assert watched[-1]["batch_id"] == batch and watched[-1]["done"] == watched[-1]["total"]
    records = lines("results", batch)
    assert len(records) == len(_ids(EXAMPLE_INPUTS))
    [shown] = lines("show", records[0]["run_id"])
    assert shown["run_id"] == records[0]["run_id"] and "rounds" in shown
    assert any(b["batch_id"] == batch for b in lines("ls"))
    [budget] = lines("budget", "show", "global:json-t")
    assert budget["scope"] == "global:json-t" and budget["units"]["usd"]["limit"] == 5
    assert any(limit["rpm"] == 100000 for limit in lines("limits", "show"))
    assert all({"id", "queue", "reason"} <= set(d) for d in lines("dead", "ls"))
    [stats] = lines("cache", "stats")
    assert {"entries", "hits", "misses"} <= set(stats)
    refused = _duet(
        "results", batch, "--json", "-o", tmp_path / "x.csv", env=cluster_env, cwd=tmp_path
    )
    assert refused.returncode == 2 and "--json" in refused.stderr
    assert _duet("limits", "clear", "sim", env=cluster_env, cwd=tmp_path).returncode == 0


def test_shell_completion_completes_commands(tmp_path: Path) -> None:
    # (Typer falls back to detecting the shell when it does not take the argument.)
    script = _duet("--show-completion", "bash", env=_env(SHELL="/bin/bash"), cwd=tmp_path)
    assert script.returncode == 0 and "complete" in script.stdout, script.stderr
    env = _env(_DUET_COMPLETE="complete_bash", COMP_WORDS="duet bu", COMP_CWORD="1")
    completed = _duet(env=env, cwd=tmp_path)
    assert completed.stdout.split() == ["budget"], completed.stdout
