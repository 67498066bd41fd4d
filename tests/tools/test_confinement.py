"""Hostile paths: each asks for something outside the reviewed tree and must get a refusal.

Every case checks both that the tool refused and that no result holds the secret beside
the repository (or in a home folder), so removing the confinement fails the test.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability import MODEL_OUTPUT, Reliability, lost_of
from tests.tools.conftest import SECRET, Repo
from workers.tools import registry, review
from workers.tools.context import ToolContext
from workers.tools.errors import ToolError
from workers.tools.paths import confine

#: The key in the fake home folder a hostile input asks for.
HOME_KEY = "-----BEGIN OPENSSH PRIVATE KEY----- not-for-models"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(HOME_KEY + "\n")
    monkeypatch.setenv("HOME", str(home))
    return home


def _refused(call: Callable[[], str], message: str) -> None:
    with pytest.raises(ToolError, match=message) as refused:
        result = call()
        assert SECRET not in result and HOME_KEY not in result
    assert SECRET not in str(refused.value) and HOME_KEY not in str(refused.value)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("~/.ssh/id_rsa", "outside the repository"),
        ("{home}/.ssh/id_rsa", "outside the repository"),
        ("/etc/passwd", "outside the repository"),
        ("../../etc/passwd", r"leaves the repository \('..' is not allowed\)"),
        ("../outside/secret.txt", "leaves the repository"),
        ("pkg/../../outside/secret.txt", "leaves the repository"),
        ("{secret}", "outside the repository"),
        ("leak", "leads out of the repository through a symlink"),
        ("up/secret.txt", "leads out of the repository through a symlink"),
        (".git/config", "git internals"),
        ("pkg/.GIT/HEAD", "git internals"),
        ("README.md\0", "not a usable path"),
    ],
)
def test_read_file_refuses_paths_out_of_the_tree(
    ctx: ToolContext, repo: Repo, home: Path, path: str, message: str
) -> None:
    path = path.format(home=home, secret=repo.secret)
    _refused(lambda: review.read_file(ctx, path), message)


@pytest.mark.parametrize("path", ["up", "..", "/", "~", "leak"])
def test_list_files_refuses_folders_out_of_the_tree(
    ctx: ToolContext, home: Path, path: str
) -> None:
    _refused(lambda: review.list_files(ctx, path), "list_files: ")


def test_list_files_does_not_walk_into_a_symlinked_folder(ctx: ToolContext) -> None:
    listed = review.list_files(ctx).splitlines()
    assert "up" in listed and not any(p.startswith("up/") for p in listed)
    assert "secret.txt" not in review.list_files(ctx, ".", "*secret*")


def test_grep_does_not_read_through_symlinks_out(ctx: ToolContext) -> None:
    # The secret's text is reachable from the tree only through `leak` and `up/`.
    assert review.grep(ctx, "TOP-SECRET") == "no match for 'TOP-SECRET'"
    for path in ("leak", "up", "up/secret.txt", "../outside"):
        _refused(lambda path=path: review.grep(ctx, "TOP", path), "grep: ")


@pytest.mark.parametrize("path", ["../outside/secret.txt", "/etc/passwd", ".git/config", "~"])
def test_git_tools_refuse_paths_out_of_the_tree(ctx: ToolContext, path: str) -> None:
    _refused(lambda: review.git_show(ctx, "HEAD", path), "git_show: ")
    _refused(lambda: review.git_blame(ctx, path), "git_blame: ")
    _refused(lambda: review.git_log(ctx, path), "git_log: ")


def test_git_show_of_a_symlink_gives_its_target_text_not_the_file(ctx: ToolContext) -> None:
    shown = review.git_show(ctx, "HEAD", "leak")
    assert shown.endswith("outside/secret.txt") and SECRET not in shown


def test_through_the_registry_a_refusal_is_the_result_the_model_reads(ctx: ToolContext) -> None:
    result, ok = registry.call("read_file", {"path": "../../etc/passwd"}, ctx)
    assert not ok
    assert (
        result == "ERROR: read_file: '../../etc/passwd' leaves the repository ('..' is not allowed)"
    )
    result, ok = registry.call("read_file", {"path": "leak"}, ctx)
    assert not ok and SECRET not in result and "through a symlink" in result


#: Calls a hostile input could steer a model into, through the engine's registry.
HOSTILE_CALLS: list[tuple[str, dict[str, object]]] = [
    ("read_file", {"path": path})
    for path in (
        "~/.ssh/id_rsa",
        "{home}/.ssh/id_rsa",
        "../../etc/passwd",
        "../outside/secret.txt",
        "{secret}",
        "leak",
        "up/secret.txt",
        ".git/config",
    )
] + [
    ("list_files", {"path": "up"}),
    ("list_files", {"path": ".", "pattern": "*secret*"}),
    ("grep", {"pattern": "TOP-SECRET|OPENSSH"}),
    ("grep", {"pattern": "TOP", "path": "leak"}),
    ("git_show", {"rev": "HEAD", "path": "../outside/secret.txt"}),
    ("git_show", {"rev": "HEAD", "path": "leak"}),
    ("git_blame", {"path": "../outside/secret.txt"}),
    ("git_log", {"path": "{home}"}),
]


def test_hostile_tool_calls_leak_nothing(
    ctx: ToolContext, repo: Repo, home: Path, reliability: Reliability
) -> None:
    leaked = []
    for name, arguments in HOSTILE_CALLS:
        filled = {
            k: v.format(home=home, secret=repo.secret) if isinstance(v, str) else v
            for k, v in arguments.items()
        }
        result, _ok = registry.call(name, filled, ctx)
        if SECRET in result or HOME_KEY in result:
            leaked.append((name, filled))
    reliability.record(
        section=MODEL_OUTPUT,
        fault="a model steered into asking the review tools for files outside the repository "
        "(a home key, '..', absolute paths, symlinks out, .git)",
        load=f"{len(HOSTILE_CALLS)} hostile tool calls through the registry",
        lost=lost_of(len(leaked), len(HOSTILE_CALLS), "calls returned a secret"),
    )
    assert leaked == []


#: Parts a generated path is made of: names in the tree, links out, and every trick.
PARTS = [
    "pkg",
    "calc.py",
    "README.md",
    "leak",
    "up",
    "inside_link",
    "..",
    ".",
    "",
    ".git",
    ".GIT",
    "~",
    "secret.txt",
    "outside",
    "etc",
    "passwd",
    "\\..",
    "...",
]


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.booleans(), st.lists(st.sampled_from(PARTS), min_size=1, max_size=6))
def test_any_path_is_refused_or_inside_the_tree(
    tree: Path, repo: Repo, reliability: Reliability, absolute: bool, parts: list[str]
) -> None:
    path = ("/" if absolute else "") + "/".join(parts)
    with reliability.case(
        section=MODEL_OUTPUT,
        fault="Confined paths (property): any path of up to 6 parts made of the tree's names, "
        "symlinks out of it, '..', '.', '~', '.git' and empty parts, absolute or not",
    ):
        try:
            target = confine(tree, path, what="test")
        except ToolError:
            return
        top = tree.resolve()
        assert target == top or top in target.parents, path
        assert ".git" not in [p.casefold() for p in target.relative_to(top).parts]
        if target.is_file():
            assert SECRET not in target.read_text(errors="replace")
