"""The shipped pre-commit hook run by the real ``pre-commit`` tool on repositories made
here: ``args:`` reach ``duet review``, the first commit is reviewed against the empty tree,
and a ``git worktree`` keeps its results in its own git directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml

pytestmark = [pytest.mark.system, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
INJECTED = 'query = "SELECT * FROM users WHERE name = \'" + name + "\'"'
#: A config that blocks: the sim critic calls the injected line an error.
BLOCKING = f"""\
[actor]
instructions = "Fix it."
model = "sim?echo=1"

[critic]
instructions = "Find security bugs."
model = "sim:critic?scores=0.4&when={quote(INJECTED)}&issue={quote("app.py:1: error: SQL injection")}"

[loop]
max_rounds = 1
"""


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DUET_", "GIT_"))}
    return {
        **env,
        "PATH": f"{BIN}:{env.get('PATH', '')}",
        "PRE_COMMIT_HOME": str(tmp / "pre-commit-home"),
        "COLUMNS": "200",
    }


def _git(
    repo: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, timeout=300
    )


def _hook_config(args: list[str]) -> str:
    """The shipped hook as a local one (its `entry` and settings as shipped; `system`: the
    `duet` on PATH, since installing the hook's own venv needs a package index)."""
    (hook,) = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    local = {k: v for k, v in hook.items() if k not in ("description",)}
    local |= {"language": "system", "args": args}
    return yaml.safe_dump({"repos": [{"repo": "local", "hooks": [local]}]})


def _repo(tmp: Path, args: list[str]) -> Path:
    repo = tmp / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    (repo / ".pre-commit-config.yaml").write_text(_hook_config(args))
    done = subprocess.run(
        [sys.executable, "-m", "pre_commit", "install"],
        cwd=repo,
        env=_env(tmp),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    return repo


def test_the_hook_passes_args_through_on_the_first_commit(tmp_path: Path) -> None:
    config = tmp_path / "blocking.toml"
    config.write_text(BLOCKING)
    repo = _repo(tmp_path, [str(config)])
    (repo / "app.py").write_text(INJECTED + "\n")
    _git(repo, "add", "-A")
    blocked = _git(repo, "commit", "-qm", "first", env=_env(tmp_path))
    assert blocked.returncode == 1, blocked.stdout + blocked.stderr
    assert "a finding is at least 'error'" in blocked.stdout + blocked.stderr
    assert _git(repo, "rev-parse", "--verify", "--quiet", "HEAD").returncode != 0  # no commit
    results = [
        json.loads(line) for line in (repo / ".git/duet-review.jsonl").read_text().splitlines()
    ]
    assert {r["id"] for r in results} == {"app.py", ".pre-commit-config.yaml"}

    (repo / "app.py").write_text("query = 'SELECT 1'\n")
    _git(repo, "add", "-A")
    passed = _git(repo, "commit", "-qm", "first", env=_env(tmp_path))
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert _git(repo, "log", "--format=%s").stdout.split() == ["first"]


def test_the_hook_reviews_in_a_worktree(tmp_path: Path) -> None:
    config = tmp_path / "blocking.toml"
    config.write_text(BLOCKING)
    repo = _repo(tmp_path, [str(config)])
    _git(repo, "add", "-A")
    assert _git(repo, "commit", "-qm", "base", env=_env(tmp_path)).returncode == 0
    tree = tmp_path / "wt"
    assert _git(repo, "worktree", "add", "-q", "-b", "side", str(tree)).returncode == 0
    (tree / "app.py").write_text(INJECTED + "\n")
    _git(tree, "add", "app.py")
    blocked = _git(tree, "commit", "-qm", "side", env=_env(tmp_path))
    assert blocked.returncode == 1, blocked.stdout + blocked.stderr
    assert "Traceback" not in blocked.stdout + blocked.stderr
    own = Path(_git(tree, "rev-parse", "--absolute-git-dir").stdout.strip())
    assert own != repo / ".git" and (own / "duet-review.jsonl").is_file()
    ids = [json.loads(line)["id"] for line in (own / "duet-review.jsonl").read_text().splitlines()]
    assert ids == ["app.py"]


def test_staged_review_in_a_submodule_keeps_results_in_its_git_dir(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    for repo in (lib, tmp_path / "top"):
        repo.mkdir(exist_ok=True)
        _git(repo, "init", "-q", "-b", "main")
        _git(repo, "config", "user.email", "t@example.com")
        _git(repo, "config", "user.name", "t")
    (lib / "a.py").write_text("x = 1\n")
    _git(lib, "add", "-A")
    _git(lib, "commit", "-qm", "lib")
    top = tmp_path / "top"
    added = _git(top, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "lib")
    assert added.returncode == 0, added.stderr
    sub = top / "lib"
    (sub / "a.py").write_text("x = 2\n")
    _git(sub, "add", "a.py")
    done = subprocess.run(
        [sys.executable, "-m", "duet", "review", "--staged"],
        cwd=sub,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    own = Path(_git(sub, "rev-parse", "--absolute-git-dir").stdout.strip())
    assert own == top / ".git/modules/lib"
    ids = [json.loads(line)["id"] for line in (own / "duet-review.jsonl").read_text().splitlines()]
    assert ids == ["a.py"]
