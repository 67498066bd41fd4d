"""The shipped GitHub workflow run as GitHub would run it, against a pull request made here.

Its steps' ``run:`` scripts run one after another (``if: always()`` honoured) in bash with
GitHub's options, in a fresh venv where its own install step installs Duet from the
source it names: that source (the repository at a tag) is this checkout at the same tag,
reached as ``file://``, with no package index. ``gh`` is a local stand-in keeping the PR's
comments in a file; no network is used."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import jsonschema
import pytest
import yaml

from duet.formats.text import MARKER, MAX_COMMENT_CHARS, reviewed_sha
from tests.github_sarif import upload_problems
from tests.reliability import PACKAGING

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]  # a pip install and two pushes

ROOT = Path(__file__).resolve().parents[2]
FLOW = ROOT / "examples/github/duet-review.yml"
SCHEMA = json.loads((ROOT / "tests/data/sarif-schema-2.1.0.json").read_text())
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SOURCE_URL = PROJECT["urls"]["Source"]
TAG = f"v{PROJECT['version']}"
SAFE = 'return db.execute("SELECT * FROM users WHERE name = ?", (name,))'
INJECTED = 'return db.execute("SELECT * FROM users WHERE name = \'" + name + "\'")'
PEM = (
    "-----BEGIN "
    + "RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo\n-----END "
    + ("RSA PRIVATE KEY-----\n")
)
#: The review config the base commit holds: the sim critic flags the injected line only.
CONFIG = f"""\
[actor]
instructions = "Return the fixed file in one fenced block."
model = "sim?echo=1"

[critic]
instructions = "Find security bugs."
model = "sim:critic?scores=0.4&when={quote(INJECTED)}&issue={quote("app.py:5: error: SQL injection: name is concatenated into the query")}"

[loop]
max_rounds = 1
"""
GH_STUB = """\
#!{python}
# A stand-in for `gh api` on one PR's comments, kept in $GH_STUB_STATE (JSON).
import json, os, subprocess, sys
args = sys.argv[1:]
assert args[0] == "api", args
method, jq, fields, path = "GET", None, {{}}, None
rest = args[1:]
while rest:
    a = rest.pop(0)
    if a == "--method": method = rest.pop(0)
    elif a == "--jq": jq = rest.pop(0)
    elif a == "--paginate": pass
    elif a == "-F":
        k, _, v = rest.pop(0).partition("=")
        fields[k] = open(v[1:], encoding="utf-8").read() if v.startswith("@") else v
    else: path = a
state_file = os.environ["GH_STUB_STATE"]
state = json.load(open(state_file)) if os.path.exists(state_file) else {{"comments": [], "calls": []}}
state["calls"].append([method, path])
parts = path.split("/")
if method == "GET":
    out = json.dumps(state["comments"])
    if jq:
        out = subprocess.run(["jq", "-r", jq], input=out, capture_output=True, text=True, check=True).stdout
    sys.stdout.write(out)
elif method == "POST":
    assert len(fields["body"]) <= 65536, "GitHub: body is too long (maximum is 65536 characters)"
    state["comments"].append({{"id": 1000 + len(state["comments"]), "body": fields["body"]}})
elif method == "PATCH":
    assert len(fields["body"]) <= 65536, "GitHub: body is too long (maximum is 65536 characters)"
    (c,) = [c for c in state["comments"] if str(c["id"]) == parts[-1]]
    c["body"] = fields["body"]
json.dump(state, open(state_file, "w"))
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def _source_at_tag(dest: Path) -> Path:
    """This checkout's files as they are now, committed in a repository of their own and
    tagged as the workflow pins them."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        if (ROOT / rel).is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dest / rel)
    _git(dest, "init", "-q")
    _git(dest, "add", "-A")
    _git(dest, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "release")
    _git(dest, "tag", TAG)
    return dest


@dataclass
class Runner:
    """A fresh venv with the stand-in ``gh``: runs the workflow's steps."""

    venv: Path
    bin: Path
    source: Path

    def env(self, tmp: Path, state: Path) -> dict[str, str]:
        keep = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("DUET_", "PIP_", "VIRTUAL_ENV", "PYTHON"))
        }
        return {
            **keep,
            "PATH": f"{self.venv / 'bin'}:{self.bin}:{keep.get('PATH', '')}",
            "VIRTUAL_ENV": str(self.venv),
            # No package index: only the source the workflow names can be installed.
            "PIP_NO_INDEX": "1",
            "PIP_CONFIG_FILE": os.devnull,
            "PIP_NO_BUILD_ISOLATION": "0",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "RUNNER_TEMP": str(tmp),
            "GH_STUB_STATE": str(state),
            "COLUMNS": "200",
        }

    def ensure_installed(self, tmp: Path) -> None:
        """Duet in the venv as the workflow's install step puts it there (for a test run
        on its own)."""
        if not (self.venv / "bin/duet").exists():
            subprocess.run(
                [self.venv / "bin/python", "-m", "pip", "install", "-q", self.pinned],
                env=self.env(tmp, tmp / "gh.json"),
                check=True,
            )

    @property
    def pinned(self) -> str:
        return f"git+file://{self.source}@{TAG}"


def _script(run: str, values: dict[str, str]) -> str:
    def fill(found: re.Match[str]) -> str:
        name = found[1].strip()
        if name.startswith("secrets."):
            return ""
        return values[name]

    return re.sub(r"\$\{\{(.*?)\}\}", fill, run)


def run_steps(
    runner: Runner,
    repo: Path,
    values: dict[str, str],
    state: Path,
    only: tuple[str, ...] = (),
) -> dict[str, subprocess.CompletedProcess[str]]:
    """The workflow's steps in order as GitHub runs them (a failed step skips the rest
    but those with ``if: always()``), each by its name; ``only``: just these."""
    flow = yaml.safe_load(FLOW.read_text())
    job_env = {k: _script(str(v), values) for k, v in flow.get("env", {}).items()}
    job_env["DUET_SOURCE"] = job_env["DUET_SOURCE"].replace(
        f"git+{SOURCE_URL}@{TAG}", runner.pinned
    )
    tmp = repo.parent / f"runner-temp-{len(list(repo.parent.glob('runner-temp-*')))}"
    tmp.mkdir()
    done: dict[str, subprocess.CompletedProcess[str]] = {}
    failed = False
    for step in flow["jobs"]["review"]["steps"]:
        if "run" not in step:
            continue
        name = step.get("name") or step["run"].split()[0]
        if (only and name not in only) or (failed and step.get("if") != "always()"):
            continue
        env = runner.env(tmp, state) | job_env
        env |= {k: _script(str(v), values) for k, v in step.get("env", {}).items()}
        done[name] = subprocess.run(
            [
                "bash",
                "--noprofile",
                "--norc",
                "-eo",
                "pipefail",
                "-c",
                _script(step["run"], values),
            ],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        failed = failed or done[name].returncode != 0
    return done


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runner]:
    """A fresh venv whose dependencies are this test venv's (a ``.pth``, no index), Duet
    itself not installed: the workflow's install step must install it."""
    base = tmp_path_factory.mktemp("ci")
    source = _source_at_tag(base / "duet-source")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin/python"
    # Its own old setuptools would build the wheel; the test venv's (the `test` extra) must.
    subprocess.run([py, "-m", "pip", "uninstall", "-q", "-y", "setuptools"], check=True)
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(site, "_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    bin_dir = base / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text(GH_STUB.format(python=sys.executable))
    (bin_dir / "gh").chmod(0o755)
    yield Runner(venv, bin_dir, source)


@pytest.fixture
def pull_request(tmp_path: Path) -> Path:
    """main: a safe query, the review config and a .gitattributes; feature: the SQL
    injection, a lock file, a test key and a generated file. The repository has a
    ``workers/`` package of its own, as many do."""
    r = tmp_path / "repo"
    r.mkdir()
    _git(r, "init", "-q", "-b", "main")
    _git(r, "config", "user.email", "t@example.com")
    _git(r, "config", "user.name", "t")
    (r / "app.py").write_text(f"import sqlite3\n\n\ndef find(db, name):\n    {SAFE}\n")
    (r / ".gitattributes").write_text("gen/** linguist-generated\n")
    (r / ".github").mkdir()
    (r / ".github/duet-review.toml").write_text(CONFIG)
    (r / "workers").mkdir()
    (r / "workers/__init__.py").write_text("raise ImportError('the project under review')\n")
    _git(r, "add", "-A")
    _git(r, "commit", "-qm", "base")
    _git(r, "checkout", "-qb", "feature")
    (r / "app.py").write_text(f"import sqlite3\n\n\ndef find(db, name):\n    {INJECTED}\n")
    # Over the 200,000-character prompt limit: it failed the job before it was skipped.
    (r / "uv.lock").write_text('version = 1\n[[package]]\nname = "x"\n' * 7000)
    (r / "tests/certs").mkdir(parents=True)
    (r / "tests/certs/test.key").write_text(PEM)
    (r / "gen").mkdir()
    (r / "gen/client.py").write_text("def call(): ...\n" * 10)
    _git(r, "add", "-A")
    _git(r, "commit", "-qm", "feature")
    return r


def _values(repo: Path, head: str) -> dict[str, str]:
    return {
        "github.repository": "acme/app",
        "github.event.pull_request.number": "7",
        "github.event.pull_request.base.sha": _git(repo, "rev-parse", "main"),
        "github.event.pull_request.head.sha": head,
        "github.server_url": "https://github.example",
        "github.token": "not-a-token",
    }


def test_the_install_step_resolves_only_the_source_the_workflow_names(runner: Runner) -> None:
    flow = yaml.safe_load(FLOW.read_text())
    assert flow["env"]["DUET_SOURCE"] == f"git+{SOURCE_URL}@{TAG}"
    steps = flow["jobs"]["review"]["steps"]
    assert not any("pip install duet-review" in str(s.get("run")) for s in steps)
    category = next(s for s in steps if "upload-sarif" in s.get("uses", ""))["with"]["category"]
    assert f"--category {category} " in str(steps)  # the log's id and the upload's agree
    # Nothing else a user reads names an unpublished distribution to install.
    for doc in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        assert not re.search(r"pip install ['\"]?duet-review(?!\S* @ git\+)", doc.read_text()), doc


def test_the_workflow_reviews_a_pull_request_then_only_its_new_commit(
    runner: Runner, pull_request: Path, reliability
) -> None:
    repo, state = pull_request, pull_request.parent / "gh-state.json"
    first_head = _git(repo, "rev-parse", "feature")
    done = run_steps(runner, repo, _values(repo, first_head), state)
    assert done["Install Duet"].returncode == 0, done["Install Duet"].stderr
    review = done["Review the pull request's changes"]
    assert review.returncode == 0, review.stderr
    assert re.search(r"1 generated, 1 key or credentials, 1 lock file", review.stderr), (
        review.stderr
    )
    records = [json.loads(line) for line in (repo / "review.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["app.py"]
    log = json.loads((repo / "duet.sarif").read_text())
    jsonschema.validate(log, SCHEMA)
    assert upload_problems(log) == []
    (run,) = log["runs"]
    assert run["automationDetails"]["id"] == "duet/"
    assert run["tool"]["driver"]["properties"]["simulated"] is True
    (result,) = run["results"]
    assert result["level"] == "error" and result["ruleId"] == "duet/review"
    assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == 5
    assert result["partialFingerprints"]
    assert done["Fail on errors"].returncode == 1  # the gate: an error finding
    comments = json.loads(state.read_text())["comments"]
    assert len(comments) == 1 and comments[0]["body"].startswith(MARKER)
    assert reviewed_sha(comments[0]["body"]) == first_head
    assert "Simulated review" in comments[0]["body"]

    # The second push: a commit fixing the query. Only it is reviewed.
    (repo / "app.py").write_text(f"import sqlite3\n\n\ndef find(db, name):\n    {SAFE}\n")
    _git(repo, "commit", "-qam", "fix the query")
    second_head = _git(repo, "rev-parse", "feature")
    again = run_steps(runner, repo, _values(repo, second_head), state)
    assert again["Review the pull request's changes"].returncode == 0, again[
        "Review the pull request's changes"
    ].stderr
    records = [json.loads(line) for line in (repo / "review.jsonl").read_text().splitlines()]
    assert [(r["id"], r["metadata"]["git_range"]) for r in records] == [
        ("app.py", f"{first_head}..{second_head}")
    ]
    log = json.loads((repo / "duet.sarif").read_text())
    jsonschema.validate(log, SCHEMA)
    assert upload_problems(log) == []
    (run,) = log["runs"]
    assert run["results"] == [] and run["automationDetails"]["id"] == "duet/"
    assert again["Fail on errors"].returncode == 0
    comments = json.loads(state.read_text())["comments"]
    assert len(comments) == 1 and reviewed_sha(comments[0]["body"]) == second_head
    assert ["PATCH", "repos/acme/app/issues/comments/1000"] in json.loads(state.read_text())[
        "calls"
    ]
    reliability.record(
        section=PACKAGING,
        fault="the shipped GitHub workflow on a PR with a lock file, a test key and a "
        "generated file, pushed twice (a finding, then its fix)",
        load="system: its steps in a fresh venv with no package index; `gh` stood in",
        lost="none: installed from the pinned source, the key never sent, one SARIF run "
        "each time (none empty), one PR comment edited in place, the gate right both times",
    )


def test_the_comment_of_500_findings_fits_and_is_edited_in_place(
    runner: Runner, pull_request: Path
) -> None:
    repo, state = pull_request, pull_request.parent / "gh-state.json"
    runner.ensure_installed(repo.parent)
    head = _git(repo, "rev-parse", "feature")
    base = {
        "status": "max_rounds_reached",
        "models": {"actor": "gpt-5", "critic": "claude-opus-4-7"},
        "usage": {"input_tokens": 1, "output_tokens": 1, "calls": 1, "usd": 0.0},
    }
    records = [
        {
            **base,
            "index": n,
            "id": f"src/m{n}.py",
            "metadata": {"path": f"src/m{n}.py", "git_range": f"main..{head}", "head_sha": head},
            "issues": [
                f"src/m{n}.py:{k + 1}: {'error' if k == 0 else 'warning'}: "
                + textwrap.shorten(f"finding {k} of file {n}: " + "why " * 60, 250)
                for k in range(10)
            ],
        }
        for n in range(50)
    ]
    (repo / "review.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    steps = ("Find Duet's comment and the commit it last reviewed",)
    steps += ("Findings as SARIF, annotations and a summary",)
    steps += ("Comment the summary on the pull request (one comment, edited on every push)",)
    for _ in range(2):
        for name, step in run_steps(runner, repo, _values(repo, head), state, steps).items():
            assert step.returncode == 0, (name, step.stderr)
    (comment,) = json.loads(state.read_text())["comments"]
    assert len(comment["body"]) < MAX_COMMENT_CHARS
    assert (
        comment["body"].count("| error |") == 50 and "more finding(s) not shown" in comment["body"]
    )
    assert "security/code-scanning?query=pr%3A7" in comment["body"]


def test_python_m_duet_runs_from_a_repository_with_its_own_workers_package(
    runner: Runner, pull_request: Path
) -> None:
    env = runner.env(pull_request.parent, pull_request.parent / "gh.json")
    runner.ensure_installed(pull_request.parent)
    python = runner.venv / "bin/python"
    trap = subprocess.run([python, "-c", "import workers"], cwd=pull_request, env=env)
    assert trap.returncode != 0  # the repository's own package is what `import` finds here
    out = pull_request.parent / "m.jsonl"
    done = subprocess.run(
        [python, "-m", "duet", "review", "--git", "main..feature", "-o", out],
        cwd=pull_request,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["app.py"]
