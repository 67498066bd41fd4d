"""``duet.intake.git`` on repositories made here: prompts, hunks, limits, and that the
repository under review runs none of its own code (external diff, textconv, hooks)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from duet.intake.diffs import MAX_FILE_CHARS
from duet.intake.git import GitChanges
from orchestration.core.errors import ConfigError


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "r"
    r.mkdir()
    _git(r, "init", "-q", "-b", "main")
    _git(r, "config", "user.email", "t@example.com")
    _git(r, "config", "user.name", "t")
    (r / "a.py").write_text("".join(f"line {n}\n" for n in range(1, 41)))
    (r / "big.txt").write_text("x\n" * (MAX_FILE_CHARS // 2 + 10))
    _git(r, "add", "-A")
    _git(r, "commit", "-qm", "base")
    _git(r, "checkout", "-qb", "feature")
    text = (
        (r / "a.py")
        .read_text()
        .replace("line 3\n", "line three\n")
        .replace("line 30\n", "line thirty\n")
    )
    (r / "a.py").write_text(text)
    (r / "big.txt").write_text("y\n" + (r / "big.txt").read_text())
    _git(r, "commit", "-qam", "feature")
    return r


def test_a_file_prompt_has_the_diff_and_the_whole_file_under_the_cap(repo: Path) -> None:
    records = {r.id: r for r in GitChanges(repo, "main..feature", context=2)}
    assert set(records) == {"a.py", "big.txt"}
    prompt = records["a.py"].prompt
    assert "+line three" in prompt and "line thirty" in prompt and "line 40\n" in prompt
    assert "line 10\n" in prompt  # from the whole file, not the 2-line context
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "feature"], capture_output=True, text=True
    ).stdout.strip()
    meta = records["a.py"].metadata
    assert meta == {
        "path": "a.py",
        "git_range": "main..feature",
        "head_sha": head,
        "unit": "file",
        "seen": "file",
        "sha256": hashlib.sha256((repo / "a.py").read_bytes()).hexdigest(),
    }
    assert records["big.txt"].metadata["seen"] == "diff"
    assert "only the diff is shown" in records["big.txt"].prompt


def test_hunks_carry_their_lines_and_too_long_prompts_are_problems(repo: Path) -> None:
    problems = []
    hunks = list(
        GitChanges(
            repo,
            "main..feature",
            unit="hunk",
            context=1,
            max_prompt_chars=400,
            on_problem=problems.append,
        )
    )
    assert [(h.id, h.metadata["line"], h.metadata["end_line"]) for h in hunks] == [
        ("a.py#hunk1", 2, 4),
        ("a.py#hunk2", 29, 31),
        ("big.txt#hunk1", 1, 2),
    ]
    assert "--- a/a.py" in hunks[0].prompt and "line thirty" not in hunks[0].prompt
    problems.clear()
    assert (
        list(GitChanges(repo, "main..feature", max_prompt_chars=100, on_problem=problems.append))
        == []
    )
    assert {p.id for p in problems} == {"a.py", "big.txt"}


def test_the_reviewed_repository_runs_none_of_its_own_code(repo: Path, tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    tool = tmp_path / "tool.sh"
    tool.write_text(f'#!/bin/sh\necho ran >> {ran}\ncat "$1"\n')
    tool.chmod(0o755)
    _git(repo, "config", "diff.external", str(tool))
    _git(repo, "config", "diff.evil.textconv", str(tool))
    _git(repo, "config", "core.fsmonitor", str(tool))
    (repo / ".gitattributes").write_text("*.py diff=evil\n")
    records = list(GitChanges(repo, "main..feature"))
    assert not ran.exists()
    assert "+line three" in records[0].prompt


def test_files_with_any_name_are_read_at_head_by_one_batch_process(repo: Path) -> None:
    names = [
        "spaced name.py",
        "ünïcode.py",
        "new\nline.py",
        " lead.py",
        "colon:x.py",
        'tab\tq"uote\\.py',
        "bell\a.py",
        "del\x7f.py",
    ]
    for name in names:
        (repo / name).write_text(f"print({name!r})\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "names")
    (repo / "a.py").write_text("not committed\n")  # HEAD is read, not the working tree
    records = {r.id: r.prompt for r in GitChanges(repo, "main..feature")}
    assert set(records) == {"a.py", "big.txt", *names}
    for name in names:
        assert f"print({name!r})" in records[name], name
    assert "not committed" not in records["a.py"] and "line thirty" in records["a.py"]


def test_a_renamed_and_changed_file_is_reviewed_under_its_new_name(repo: Path) -> None:
    _git(repo, "mv", "a.py", "moved.py")
    (repo / "moved.py").write_text((repo / "moved.py").read_text().replace("line 7\n", "seven\n"))
    _git(repo, "commit", "-qam", "move")
    records = {r.id: r for r in GitChanges(repo, "main..feature")}
    assert set(records) == {"moved.py", "big.txt"}
    moved = records["moved.py"]
    assert moved.metadata["old_path"] == "a.py"
    assert "Review the change to moved.py (renamed from a.py)" in moved.prompt
    assert "+seven" in moved.prompt and "+line three" in moved.prompt


def test_unknown_commits_and_bad_options_are_named(repo: Path) -> None:
    with pytest.raises(ConfigError, match="BASE 'nope' is not in .*fetch-depth: 0"):
        GitChanges(repo, "nope..feature")
    with pytest.raises(ConfigError, match="--unit 'line'"):
        GitChanges(repo, "main..feature", unit="line")
    with pytest.raises(ConfigError, match="not a git repository"):
        GitChanges(repo.parent, "main..feature")
