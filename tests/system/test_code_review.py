"""Code review of a git range end to end: ``duet review --git``, SARIF, the patch, CI exit
codes, on repositories made here (the GitHub workflow: test_ci_workflow.py; the pre-commit hook:
test_pre_commit_hook.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import jsonschema
import pytest

from tests.reliability import CLIENTS

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "tests/data/sarif-schema-2.1.0.json").read_text())
BIN = Path(sys.executable).parent
SAFE = 'return db.execute("SELECT * FROM users WHERE name = ?", (name,))'
INJECTED = 'return db.execute("SELECT * FROM users WHERE name = \'" + name + "\'")'


def _app(query: str) -> str:
    return f"import sqlite3\n\n\ndef find(db, name):\n    {query}\n"


#: Scripted sim models: the critic flags the injected line (5) once, the actor's
#: second revision restores the parameterised query, which the critic approves. The loop
#: keeps its best-scored revision: here the approved one.
CONFIG = f"""\
[actor]
instructions = "Return the fixed file in one fenced block."
model = "sim?echo=1&replace={quote(INJECTED + "=>" + SAFE)}"

[critic]
instructions = "Find security bugs."
model = "sim:critic?scores=0.4,0.95&issue={quote("app.py:5: error: SQL injection: name is concatenated into the query")}"

[loop]
max_rounds = 3
keep = "best"
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DUET_REDIS_URL", "DUET_BROKER_URL")}
    return {**env, "COLUMNS": "200", "PATH": f"{BIN}:{env.get('PATH', '')}"}


def _duet(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "duet", *map(str, args)],
        env=_env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """main: a safe query; feature: the SQL injection, a README line, and files to skip."""
    r = tmp_path / "repo"
    r.mkdir()
    _git(r, "init", "-q", "-b", "main")
    _git(r, "config", "user.email", "t@example.com")
    _git(r, "config", "user.name", "t")
    (r / "app.py").write_text(_app(SAFE))
    (r / "README.md").write_text("# demo\n")
    (r / ".gitignore").write_text("build.log\n")
    (r / "vendor").mkdir()
    (r / "vendor/lib.py").write_text("x = 1\n")
    (r / "old.txt").write_text("old\n")
    (r / "config.ini").write_text("[a]\nb = 1\n")
    _git(r, "add", "-A")
    _git(r, "commit", "-qm", "base")
    _git(r, "checkout", "-qb", "feature")
    (r / "app.py").write_text(_app(INJECTED))
    (r / "README.md").write_text("# demo\n\nA harmless line.\n")
    (r / "vendor/lib.py").write_text("x = 2\n")
    (r / "old.txt").unlink()
    (r / "logo.bin").write_bytes(b"\x89PNG\0\0\x01")
    (r / "build.log").write_text("noise\n")
    _git(r, "mv", "config.ini", "settings.ini")
    _git(r, "add", "-f", "-A")
    _git(r, "commit", "-qm", "feature")
    (tmp_path / "review.toml").write_text(CONFIG)
    return r


def test_review_of_a_branch_gives_sarif_a_patch_and_a_ci_exit(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "review.jsonl"
    done = _duet(
        "review",
        tmp_path / "review.toml",
        "--git",
        "main..feature",
        "--repo",
        repo,
        "-o",
        out,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in records) == [
        "README.md",
        "app.py",
    ]  # the rename has no text change
    assert re.search(
        r"1 binary, 1 deleted, 1 gitignored, 1 unchanged text, 1 vendored", done.stderr
    )
    assert all(r["status"] == "approved" for r in records)
    # keep = "best": the approved revision (round 1's) is the best-scored, and is kept.
    assert {(r["keep"], r["output_round"], r["best_round"]) for r in records} == {("best", 1, 2)}

    sarif = _duet("results", out, "-f", "sarif", "--all", cwd=tmp_path)
    assert sarif.returncode == 0, sarif.stderr
    log = json.loads(sarif.stdout)
    jsonschema.validate(log, SCHEMA)
    located = [
        (
            res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
            res["locations"][0]["physicalLocation"]["region"]["startLine"],
            res["level"],
        )
        for run in log["runs"]
        for res in run["results"]
    ]
    assert ("app.py", 5, "error") in located
    assert (repo / "app.py").read_text().splitlines()[4].strip() == INJECTED

    patch = _duet("results", out, "--patch", "--root", repo, cwd=tmp_path)
    assert patch.returncode == 0, patch.stderr
    assert "+++ b/app.py" in patch.stdout and "README" not in patch.stdout
    (tmp_path / "fixes.patch").write_text(patch.stdout)
    subprocess.run(
        ["git", "-C", str(repo), "apply", "--check", str(tmp_path / "fixes.patch")], check=True
    )

    failing = _duet("results", out, "-f", "github", "--all", "--fail-on", "error", cwd=tmp_path)
    assert failing.returncode == 1
    assert "::error file=app.py,line=5," in failing.stdout
    assert (
        _duet(
            "results", out, "-f", "github", "--all", "--fail-on", "never", cwd=tmp_path
        ).returncode
        == 0
    )


def test_keep_best_returns_the_best_scored_revision_of_each_file(
    repo: Path, tmp_path: Path
) -> None:
    """Scores that fall round after round: each file's first draft is kept, SARIF shows the
    issues of the critique that judged it (the sim critic names the revision it read), and
    the patch (approved fixes only) says why it is empty."""
    critic = re.search(r'model = "(sim:critic[^"]*)"', CONFIG)
    assert critic is not None
    falling = CONFIG.replace(critic[1], "sim:critic?scores=0.7,0.5,0.3")
    (tmp_path / "falling.toml").write_text(falling)
    out = tmp_path / "falling.jsonl"
    done = _duet(
        "review",
        tmp_path / "falling.toml",
        "--git",
        "main..feature",
        "--repo",
        repo,
        "-o",
        out,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    records = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(records) == ["README.md", "app.py"]
    for record in records.values():
        assert (record["status"], record["n_rounds"]) == ("max_rounds_reached", 3)
        assert record["output"].startswith("[revision 0]"), record["output"]
        assert (record["output_round"], record["best_round"], record["final_score"]) == (0, 1, 0.7)
    assert SAFE in records["app.py"]["output"]  # the draft already fixed the query

    sarif = _duet("results", out, "-f", "sarif", cwd=tmp_path)
    assert sarif.returncode == 0, sarif.stderr
    log = json.loads(sarif.stdout)
    jsonschema.validate(log, SCHEMA)
    results = [res for run in log["runs"] for res in run["results"]]
    assert {res["properties"]["input"] for res in results} == {"app.py", "README.md"}
    assert all("(revision 0)" in res["message"]["text"] for res in results), results
    patch = _duet("results", out, "--patch", "--root", repo, cwd=tmp_path)
    assert (patch.returncode, patch.stdout) == (0, "")
    assert "2 input(s) not approved" in patch.stderr


def test_hunks_are_inputs_of_their_own(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "hunks.jsonl"
    done = _duet(
        "review",
        "--git",
        "main..feature",
        "--repo",
        repo,
        "--unit",
        "hunk",
        "--context",
        "1",
        "-o",
        out,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in records) == ["README.md#hunk1", "app.py#hunk1"]
    assert {r["metadata"]["line"] for r in records if r["id"] == "app.py#hunk1"} == {4}


def test_a_shallow_clone_without_base_says_fetch_depth(
    repo: Path, tmp_path: Path, reliability
) -> None:
    shallow = tmp_path / "shallow"
    subprocess.run(
        [
            "git",
            "clone",
            "-q",
            "--depth",
            "1",
            "--branch",
            "feature",
            f"file://{repo}",
            str(shallow),
        ],
        check=True,
    )
    base = _git(repo, "rev-parse", "main").strip()
    done = _duet("review", "--git", f"{base}..HEAD", "--repo", shallow, cwd=tmp_path)
    assert done.returncode == 2
    assert "fetch-depth: 0" in done.stderr and base in done.stderr
    reliability.record(
        section=CLIENTS,
        fault="`duet review --git` on a shallow CI clone without the base commit",
        load="system: a depth-1 clone of a two-commit repository, the base named by its hash",
        lost="none: exit 2 naming the missing commit and saying to set `fetch-depth: 0`",
    )


def test_duet_run_takes_git_inputs_and_refuses_both_or_neither(repo: Path, tmp_path: Path) -> None:
    config = tmp_path / "review.toml"
    out = tmp_path / "run.jsonl"
    done = _duet("run", config, "--git", "main..feature", "--repo", repo, "-o", out, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(json.loads(line)["id"] for line in out.read_text().splitlines()) == [
        "README.md",
        "app.py",
    ]
    both = _duet("run", config, "--git", "main..feature", "-i", config, cwd=tmp_path)
    assert both.returncode == 2 and "not both" in both.stderr
    neither = _duet("run", config, cwd=tmp_path)
    assert neither.returncode == 2 and "--git BASE..HEAD" in neither.stderr
    bad_unit = _duet(
        "review", "--git", "main..feature", "--repo", repo, "--unit", "line", cwd=tmp_path
    )
    assert bad_unit.returncode == 2 and "--unit 'line'" in bad_unit.stderr
    bad_format = _duet("results", out, "-f", "xml", cwd=tmp_path)
    assert bad_format.returncode == 2 and "--format 'xml'" in bad_format.stderr


def test_on_a_cluster_results_of_a_batch_id_are_findings_too(
    repo: Path, tmp_path: Path, worker: subprocess.Popen[bytes], system_redis_url: str
) -> None:
    env = {**_env(), "DUET_REDIS_URL": system_redis_url}
    out = tmp_path / "cluster.jsonl"
    run = [sys.executable, "-m", "duet"]
    done = subprocess.run(
        [
            *run,
            "review",
            str(tmp_path / "review.toml"),
            "--git",
            "main..feature",
            "--repo",
            str(repo),
            "-o",
            str(out),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    batch = json.loads(out.read_text().splitlines()[0])["batch_id"]
    sarif = subprocess.run(
        [*run, "results", batch, "-f", "sarif", "--all"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert sarif.returncode == 0, sarif.stderr
    log = json.loads(sarif.stdout)
    jsonschema.validate(log, SCHEMA)
    assert {r["properties"]["input"] for run_ in log["runs"] for r in run_["results"]} == {
        "app.py",
        "README.md",
    }


def test_submit_queues_a_git_range_on_a_cluster(
    repo: Path, tmp_path: Path, worker: subprocess.Popen[bytes], system_redis_url: str
) -> None:
    env = {**_env(), "DUET_REDIS_URL": system_redis_url}
    run = [sys.executable, "-m", "duet"]
    queued = subprocess.run(
        [
            *run,
            "submit",
            str(tmp_path / "review.toml"),
            "--git",
            "main..feature",
            "--repo",
            str(repo),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert queued.returncode == 0, queued.stderr
    batch = queued.stdout.strip()
    summary = subprocess.run(
        [*run, "results", batch, "-f", "markdown", "--timeout", "120"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert summary.returncode == 0, summary.stderr
    assert "2 input(s) reviewed: 2 approved." in summary.stdout


def test_a_change_with_nothing_to_review_exits_0_with_empty_sarif(
    repo: Path, tmp_path: Path
) -> None:
    _git(repo, "checkout", "-q", "-b", "vendor-only", "main")
    (repo / "vendor/lib.py").write_text("x = 3\n")
    _git(repo, "commit", "-qam", "vendor bump")
    out = tmp_path / "empty.jsonl"
    done = _duet("review", "--git", "main..vendor-only", "--repo", repo, "-o", out, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "1 vendored" in done.stderr and "no changed file to review" in done.stderr
    sarif = _duet("results", out, "-f", "sarif", "--fail-on", "warning", cwd=tmp_path)
    assert sarif.returncode == 0, sarif.stderr
    jsonschema.validate(json.loads(sarif.stdout), SCHEMA)


def test_excludes_gates_and_messages_tell_the_truth(repo: Path, tmp_path: Path) -> None:
    """--exclude and [inputs] exclude with --git; --fail-on without -f; a missing results
    file named as such; a review on the sim model says it was simulated."""
    config = tmp_path / "excluding.toml"
    config.write_text(CONFIG + '\n[inputs]\nexclude = ["*.md"]\n')
    out = tmp_path / "ex.jsonl"
    done = _duet(
        "review", config, "--git", "main..feature", "--repo", repo, "-o", out, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["app.py"]
    assert "1 excluded" in done.stderr
    assert "SIMULATED" in done.stdout + done.stderr
    cli = _duet(
        "review", "--git", "main..feature", "--repo", repo, "--exclude", "app.py", cwd=tmp_path
    )
    assert cli.returncode == 0 and "1 excluded" in cli.stderr, cli.stderr

    gated = _duet("results", out, "--all", "--fail-on", "error", cwd=tmp_path)
    assert gated.returncode == 1 and '"id": "app.py"' in gated.stdout.replace('":"', '": "')
    assert _duet("results", out, "--all", "--fail-on", "never", cwd=tmp_path).returncode == 0

    missing = _duet("results", tmp_path / "nosuch.jsonl", "-f", "sarif", cwd=tmp_path)
    assert missing.returncode == 2 and "no such file" in missing.stderr, missing.stderr
    assert "DUET_REDIS_URL" not in missing.stderr

    page = tmp_path / "report.html"
    assert _duet("report", out, "-o", page, cwd=tmp_path).returncode == 0
    assert "Simulated review" in page.read_text()
    sarif = json.loads(_duet("results", out, "-f", "sarif", "--all", cwd=tmp_path).stdout)
    assert sarif["runs"][0]["tool"]["driver"]["properties"]["simulated"] is True
