"""checkout(): a read-only tree at one commit, from a path or a URL, built once per commit."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import stat
import threading
import time
from pathlib import Path

import pytest

from tests.reliability import ENGINE, Reliability, lost_of
from tests.tools.conftest import Repo, git
from workers.tools.errors import ToolError
from workers.tools.workspace import checkout, origin


def test_the_tree_is_the_commit_not_the_working_copy(repo: Repo, tmp_path: Path) -> None:
    (repo.path / "README.md").write_text("uncommitted\n")
    old = checkout(str(repo.path), repo.first, tmp_path / "cache")
    new = checkout(str(repo.path), repo.second, tmp_path / "cache")
    assert (old / "README.md").read_text() == "version one\n"
    assert not (old / "run.sh").exists()
    assert (new / "README.md").read_text().startswith("version two")
    assert sorted(p.name for p in new.iterdir()) == [
        "README.md",
        "inside_link",
        "leak",
        "pkg",
        "run.sh",
        "up",
    ]
    assert not any(p.name == ".git" for p in new.rglob("*"))


def test_modes_and_symlinks_are_kept_and_files_are_read_only(tree: Path, repo: Repo) -> None:
    assert os.readlink(tree / "leak") == str(repo.secret)
    assert os.readlink(tree / "inside_link") == "pkg/calc.py"
    assert stat.S_IMODE((tree / "run.sh").stat().st_mode) == 0o555
    assert stat.S_IMODE((tree / "README.md").stat().st_mode) == 0o444
    assert stat.S_IMODE((tree / "pkg").stat().st_mode) == 0o555


def test_origin_names_the_object_store_and_full_commit(tree: Path, repo: Repo) -> None:
    found = origin(tree)
    assert found.commit == repo.second
    assert found.git_dir == (repo.path / ".git").resolve()


def test_a_short_or_symbolic_commit_is_resolved_to_its_id(repo: Repo, tmp_path: Path) -> None:
    by_name = checkout(str(repo.path), "main~1", tmp_path / "cache")
    by_prefix = checkout(str(repo.path), repo.first[:10], tmp_path / "cache")
    assert by_name == by_prefix == tmp_path / "cache" / "trees" / repo.first / "tree"


def test_a_url_is_fetched_into_the_cache_and_reused(repo: Repo, tmp_path: Path) -> None:
    url = f"file://{repo.path}"
    tree = checkout(url, repo.second, tmp_path / "cache")
    assert (tree / "pkg" / "use.py").is_file()
    assert origin(tree).git_dir.parent == tmp_path / "cache" / "git"
    # A finished checkout is reused: the source is no longer needed.
    shutil.rmtree(repo.path)
    assert checkout(url, repo.second, tmp_path / "cache") == tree
    # And the fetched store still answers for the older commit, offline.
    assert (checkout(url, repo.first, tmp_path / "cache") / "README.md").read_text() == (
        "version one\n"
    )


def test_a_url_fetch_finds_a_commit_by_branch_name(repo: Repo, tmp_path: Path) -> None:
    tree = checkout(f"file://{repo.path}", "main", tmp_path / "cache")
    assert origin(tree).commit == repo.second


def _checkout_in_child(args: tuple[str, str, str]) -> str:
    source, commit, cache = args
    return str(checkout(source, commit, Path(cache)))


@pytest.mark.parametrize("url", [False, True], ids=["path", "url"])
def test_concurrent_callers_build_one_tree(repo: Repo, tmp_path: Path, url: bool) -> None:
    source = f"file://{repo.path}" if url else str(repo.path)
    cache = tmp_path / "cache"
    # spawn, not fork: a child forked while another thread of this test process held a
    # lock (logging, a stand-in server's) waits on it for ever (it hung past 120 s once).
    with multiprocessing.get_context("spawn").Pool(6) as pool:
        trees = pool.map(_checkout_in_child, [(source, repo.second, str(cache))] * 12)
    assert set(trees) == {str(cache / "trees" / repo.second / "tree")}
    assert (Path(trees[0]) / "pkg" / "use.py").read_text().startswith("from pkg.calc")
    # Nothing half-built is left beside it.
    assert [p.name for p in (cache / "trees").iterdir()] == [repo.second]


def test_a_killed_builders_leftovers_are_cleared(repo: Repo, tmp_path: Path) -> None:
    trees = tmp_path / "cache" / "trees"
    (trees / f".{repo.second}.999.dead" / "tree").mkdir(parents=True)
    (trees / repo.second / "tree").mkdir(parents=True)  # renamed in, never finished
    tree = checkout(str(repo.path), repo.second, tmp_path / "cache")
    assert (tree / "run.sh").is_file()
    assert sorted(p.name for p in trees.iterdir()) == [repo.second]


@pytest.mark.parametrize(
    ("source", "commit", "message"),
    [
        ("{repo}", "f" * 40, "has no commit"),
        ("{repo}", "--output=/tmp/x", "is not a commit"),
        ("{tmp}/nowhere", "main", "is not a directory"),
        ("{tmp}/outside", "main", "not a git repository"),
        ("ext::sh -c touch% {tmp}/pwned", "main", "fetch"),
        ("file://{tmp}/nowhere", "main", "fetch"),
    ],
)
def test_bad_sources_and_commits_are_clear_errors(
    repo: Repo, tmp_path: Path, source: str, commit: str, message: str
) -> None:
    source = source.format(repo=repo.path, tmp=tmp_path)
    with pytest.raises(ToolError, match=message):
        checkout(source, commit, tmp_path / "cache")
    assert not (tmp_path / "pwned").exists()


def test_a_second_commit_in_the_source_is_checked_out_beside_the_first(
    repo: Repo, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    checkout(str(repo.path), repo.second, cache)
    (repo.path / "new.txt").write_text("new\n")
    git(repo.path, "add", "new.txt")
    git(repo.path, "commit", "--quiet", "-m", "Third")
    third = checkout(str(repo.path), git(repo.path, "rev-parse", "HEAD"), cache)
    assert (third / "new.txt").read_text() == "new\n"
    assert len(list((cache / "trees").iterdir())) == 2


def _build_until_paused(source: str, commit: str, cache: str, marker: str) -> None:
    """A checkout that writes a few files, says so, then hangs until it is killed."""
    written = 0
    real = Path.write_bytes

    def write_bytes(self: Path, data: bytes) -> int:
        nonlocal written
        written += 1
        if written == 3:
            Path(marker).write_text("paused")
            threading.Event().wait()
        return real(self, data)

    Path.write_bytes = write_bytes  # type: ignore[method-assign]
    checkout(source, commit, Path(cache))


def test_a_builder_killed_mid_checkout_leaves_nothing_half_built(
    repo: Repo, tmp_path: Path, reliability: Reliability
) -> None:
    for n in range(20):
        (repo.path / f"file{n}.txt").write_text(f"content {n}\n")
    git(repo.path, "add", "-A")
    git(repo.path, "commit", "--quiet", "-m", "More files")
    commit = git(repo.path, "rev-parse", "HEAD")
    cache, marker = tmp_path / "cache", tmp_path / "paused"
    child = multiprocessing.get_context("spawn").Process(
        target=_build_until_paused, args=(str(repo.path), commit, str(cache), str(marker))
    )
    child.start()
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert child.is_alive() and time.monotonic() < deadline, "the builder never started"
        time.sleep(0.02)  # polling a real condition: the marker file
    # Killed holding the lock, with a scratch tree a few files in.
    os.kill(child.pid, signal.SIGKILL)
    child.join(30)
    scratch = [p for p in (cache / "trees").iterdir() if p.name.startswith(".")]
    tree = checkout(str(repo.path), commit, cache)
    expected = set(git(repo.path, "ls-files").splitlines())
    present = {p.relative_to(tree).as_posix() for p in tree.rglob("*") if not p.is_dir()}
    left = [p.name for p in (cache / "trees").iterdir()]
    reliability.record(
        section=ENGINE,
        fault="a worker killed while it checks a commit out for the review tools",
        load=f"a tree of {len(expected)} files, killed {len(scratch)} scratch tree(s) in",
        lost=lost_of(len(expected - present) + len(left) - 1, len(expected), "files"),
    )
    assert len(scratch) == 1
    assert present == expected
    assert left == [commit]


def test_a_source_missing_an_object_is_a_clear_error(repo: Repo, tmp_path: Path) -> None:
    blob = git(repo.path, "rev-parse", f"{repo.second}:pkg/use.py")
    (repo.path / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    with pytest.raises(ToolError, match=f"object {blob} is missing from the source"):
        checkout(str(repo.path), repo.second, tmp_path / "cache")
    # Nothing half-built is taken for a checkout by the next caller.
    assert not (tmp_path / "cache" / "trees" / repo.second).exists()
