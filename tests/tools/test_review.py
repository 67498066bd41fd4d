"""The review toolset on a real repository: what each tool returns, and its caps."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tools.conftest import Repo, git
from workers.tools import registry, review
from workers.tools.context import ToolContext
from workers.tools.errors import ToolError
from workers.tools.workspace import checkout


def test_every_tool_is_registered_pure_with_its_arguments_described() -> None:
    for name in ("read_file", "list_files", "grep", "git_log", "git_blame", "git_show"):
        found = registry.get(name)
        assert found is not None and found.spec.pure is True and found.takes_context
        properties = found.spec.parameters["properties"]
        assert properties and all(p.get("description") for p in properties.values()), name
    assert registry.get("read_file").spec.parameters["required"] == ["path"]  # type: ignore[union-attr]


def test_read_file_numbers_the_lines_asked_for(ctx: ToolContext) -> None:
    assert review.read_file(ctx, "README.md", 2, 3) == (
        "README.md (lines 2-3 of 3)\n2  second line\n3  third line"
    )
    assert review.read_file(ctx, "./pkg/calc.py").splitlines()[1] == "1  def add(a, b):"


def test_read_file_follows_a_symlink_that_stays_inside(ctx: ToolContext) -> None:
    assert review.read_file(ctx, "inside_link").startswith("pkg/calc.py (lines 1-2 of 2)")


def test_read_file_caps_the_lines_returned(repo: Repo, tmp_path: Path) -> None:
    (repo.path / "big.txt").write_text("".join(f"line {n}\n" for n in range(1, 2001)))
    git(repo.path, "add", "big.txt")
    git(repo.path, "commit", "--quiet", "-m", "Big")
    root = checkout(str(repo.path), "HEAD", tmp_path / "cache")
    ctx = ToolContext(root=root, run_id="r", call_id="c")
    text = review.read_file(ctx, "big.txt", 100, 5000)
    assert text.splitlines()[0] == f"big.txt (lines 100-{99 + review.MAX_LINES} of 2000)"
    assert len(text.splitlines()) == review.MAX_LINES + 1


@pytest.mark.parametrize(
    ("path", "start", "message"),
    [
        ("nothing.py", 1, "is not a file"),
        ("pkg", 1, "is not a file"),
        ("README.md", 9, "past its end"),
    ],
)
def test_read_file_errors_are_short_messages(
    ctx: ToolContext, path: str, start: int, message: str
) -> None:
    with pytest.raises(ToolError, match=message):
        review.read_file(ctx, path, start)


def test_list_files_lists_and_filters(ctx: ToolContext) -> None:
    assert review.list_files(ctx).splitlines() == [
        "README.md",
        "inside_link",
        "leak",
        "run.sh",
        "up",
        "pkg/calc.py",
        "pkg/use.py",
    ]
    assert review.list_files(ctx, "pkg", "*.py").splitlines() == ["pkg/calc.py", "pkg/use.py"]
    assert review.list_files(ctx, ".", "pkg/u*") == "pkg/use.py"
    assert "no files match" in review.list_files(ctx, ".", "*.rs")


def test_grep_finds_lines_with_their_file_and_number(ctx: ToolContext) -> None:
    assert review.grep(ctx, r"add\(") == (
        "pkg/calc.py:1:def add(a, b):\npkg/use.py:3:print(add(1, 2))"
    )
    assert review.grep(ctx, "IMPORT", "pkg", ignore_case=True) == (
        "pkg/use.py:1:from pkg.calc import add"
    )
    assert review.grep(ctx, "nothing-like-this") == "no match for 'nothing-like-this'"


def test_grep_takes_a_pattern_that_looks_like_an_option(ctx: ToolContext) -> None:
    assert review.grep(ctx, "--no-index") == "no match for '--no-index'"


def test_grep_refuses_a_bad_or_huge_pattern(ctx: ToolContext) -> None:
    with pytest.raises(ToolError, match="grep: "):
        review.grep(ctx, "(unclosed")
    with pytest.raises(ToolError, match="1 to 500 characters"):
        review.grep(ctx, "a" * 501)


def test_git_log_lists_commits_up_to_the_reviewed_one(repo: Repo, tmp_path: Path) -> None:
    old = checkout(str(repo.path), repo.first, tmp_path / "cache")
    ctx = ToolContext(root=old, run_id="r", call_id="c")
    # The newer commit exists in the store but is not history of the reviewed one.
    assert review.git_log(ctx).splitlines()[1] == "    First commit"
    assert "Second commit" not in review.git_log(ctx, n=50)


def test_git_log_of_a_path(ctx: ToolContext) -> None:
    lines = review.git_log(ctx, "pkg/use.py").splitlines()
    assert len(lines) == 2 and lines[1] == "    Second commit: use add"
    assert len(review.git_log(ctx, "README.md", n=1).splitlines()) == 2


def test_git_blame_names_the_commit_of_each_line(ctx: ToolContext, repo: Repo) -> None:
    lines = review.git_blame(ctx, "README.md", 1, 2).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(repo.second[:8]) and lines[0].endswith("version two")


def test_git_show_a_commit_and_a_file_at_an_ancestor(ctx: ToolContext, repo: Repo) -> None:
    shown = review.git_show(ctx)
    assert shown.startswith(f"commit {repo.second}") and "+from pkg.calc import add" in shown
    assert review.git_show(ctx, "HEAD~1", "README.md") == "version one\n"
    assert review.git_show(ctx, repo.first[:12], "README.md") == "version one\n"


def test_git_show_refuses_a_commit_after_the_reviewed_one(repo: Repo, tmp_path: Path) -> None:
    old = checkout(str(repo.path), repo.first, tmp_path / "cache")
    ctx = ToolContext(root=old, run_id="r", call_id="c")
    with pytest.raises(ToolError, match="not the reviewed commit or one of its ancestors"):
        review.git_show(ctx, repo.second)


@pytest.mark.parametrize("rev", ["main", "--output=/tmp/x", "HEAD@{1}", "HEAD:README.md", "a" * 40])
def test_git_show_takes_only_ids_and_steps_back(ctx: ToolContext, rev: str) -> None:
    with pytest.raises(ToolError, match="git_show: "):
        review.git_show(ctx, rev)


def test_a_tool_without_a_tree_says_so() -> None:
    ctx = ToolContext(root=None, run_id="r", call_id="c")
    for call in (
        lambda: review.read_file(ctx, "a"),
        lambda: review.grep(ctx, "a"),
        lambda: review.git_log(ctx),
    ):
        with pytest.raises(ToolError, match="no repository is open"):
            call()


def test_a_worker_without_git_says_so(ctx: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ToolError, match="git cannot be started on this worker: No such file"):
        review.git_log(ctx)
    with pytest.raises(ToolError, match="git cannot be started on this worker"):
        review.grep(ctx, "add")
