"""A small git repository the tool tests read: two commits, a subfolder, an executable,
symlinks inside it and out of it, and a secret beside it that no tool may reach."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from workers.tools.context import ToolContext
from workers.tools.workspace import checkout

#: The secret file's text beside the repository (outside it): no tool result may hold it.
SECRET = "TOP-SECRET-outside-the-repository"


@dataclass(frozen=True)
class Repo:
    """The repository, its two commits (old first) and the secret file outside it."""

    path: Path
    first: str
    second: str
    secret: Path


def git(repo: Path, *args: str) -> str:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(repo.parent),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "Ada",
        "GIT_AUTHOR_EMAIL": "ada@example.com",
        "GIT_COMMITTER_NAME": "Ada",
        "GIT_COMMITTER_EMAIL": "ada@example.com",
    }
    done = subprocess.run(
        ["git", "-C", str(repo), *args], env=env, check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text(SECRET + "\n")
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "--quiet", "--initial-branch=main")
    (path / "pkg").mkdir()
    (path / "pkg" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (path / "README.md").write_text("version one\n")
    git(path, "add", "-A")
    git(path, "commit", "--quiet", "-m", "First commit")
    first = git(path, "rev-parse", "HEAD")
    (path / "README.md").write_text("version two\nsecond line\nthird line\n")
    (path / "pkg" / "use.py").write_text("from pkg.calc import add\n\nprint(add(1, 2))\n")
    (path / "run.sh").write_text("#!/bin/sh\necho run\n")
    (path / "run.sh").chmod(0o755)
    (path / "inside_link").symlink_to("pkg/calc.py")
    (path / "leak").symlink_to(str(secret))
    (path / "up").symlink_to("../outside")
    git(path, "add", "-A")
    git(path, "commit", "--quiet", "-m", "Second commit: use add")
    second = git(path, "rev-parse", "HEAD")
    return Repo(path, first, second, secret)


@pytest.fixture
def tree(repo: Repo, tmp_path: Path) -> Path:
    """The repository at its second commit, checked out into a cache."""
    return checkout(str(repo.path), repo.second, tmp_path / "cache")


@pytest.fixture
def ctx(tree: Path) -> ToolContext:
    return ToolContext(root=tree, run_id="run-1", call_id="call-1")
