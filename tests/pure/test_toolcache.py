"""The tool-result cache's key: the tool and its definition, the arguments as the schema
checked them, and what the call reads (the review toolset: the repository and commit);
only pure registered functions get one."""

from __future__ import annotations

from typing import Any

import pytest

from orchestration.core.toolcache import ToolIdentity, entry_from, entry_json, tool_key
from orchestration.core.tools import ToolSpec, Workspace
from workers.tools import registry, review
from workers.tools.context import ToolContext, ToolScope


@registry.tool(pure=True, name="tc_plain")
def plain(code: str, strict: bool = False) -> str:
    """Check code.

    Args:
        code: the code.
        strict: be strict.
    """
    return code


@registry.tool(pure=True, name="tc_context")
def with_context(context: ToolContext, path: str) -> str:
    """Read a path of the tree."""
    return path


@registry.tool(pure=True, name="tc_reads", reads=lambda scope: scope.options.get("level"))
def declares(context: ToolContext, path: str) -> str:
    """Reads one option only."""
    return path


@registry.tool(pure=False, name="tc_effects")
def effects(note: str) -> str:
    """Has effects."""
    return note


A = Workspace(source="/srv/repo", commit="a" * 40)
B = Workspace(source="/srv/repo", commit="b" * 40)


def _spec(name: str) -> ToolSpec:
    found = registry.get(name)
    assert found is not None
    return found.spec


def _key(
    name: str,
    arguments: dict[str, Any],
    workspace: Workspace | None = None,
    options: dict[str, Any] | None = None,
) -> str | None:
    identity = registry.identify(_spec(name), arguments, workspace, options or {})
    return tool_key(identity) if identity is not None else None


def test_the_key_covers_the_tool_its_definition_its_arguments_and_what_it_reads() -> None:
    base = ToolIdentity("t", "f1", {"a": 1, "b": [1, 2]}, {"commit": "x"})
    same = ToolIdentity("t", "f1", {"b": [1, 2], "a": 1}, {"commit": "x"})
    assert tool_key(base) == tool_key(same)  # canonical JSON: key order does not matter
    assert tool_key(base).startswith("tool:")
    for other in (
        ToolIdentity("u", "f1", {"a": 1, "b": [1, 2]}, {"commit": "x"}),
        ToolIdentity("t", "f2", {"a": 1, "b": [1, 2]}, {"commit": "x"}),
        ToolIdentity("t", "f1", {"a": 2, "b": [1, 2]}, {"commit": "x"}),
        ToolIdentity("t", "f1", {"a": 1, "b": [1, 2]}, {"commit": "y"}),
        ToolIdentity("t", "f1", {"a": 1, "b": [1, 2]}, None),
    ):
        assert tool_key(other) != tool_key(base), other


def test_an_entry_round_trips_and_a_damaged_one_is_none() -> None:
    found = entry_from(entry_json("tests: 2 passed", 1.23456))
    assert found is not None and (found.result, found.seconds) == ("tests: 2 passed", 1.2346)
    for bad in ("", "[]", '"x"', "{}", '{"result": 3}', "not json"):
        assert entry_from(bad) is None, bad


def test_arguments_are_keyed_as_the_schema_checks_them() -> None:
    """Defaults filled in: a model that spells a default out meets one that leaves it."""
    assert _key("tc_plain", {"code": "x"}) == _key("tc_plain", {"code": "x", "strict": False})
    assert _key("tc_plain", {"code": "x"}) != _key("tc_plain", {"code": "x", "strict": True})
    assert _key("tc_plain", {"code": "x"}) != _key("tc_plain", {"code": "y"})
    # arguments the schema refuses: the call is an error, never cached
    assert _key("tc_plain", {"code": "x", "rm": 1}) is None
    assert _key("tc_plain", {}) is None


def test_only_pure_functions_registered_here_are_keyed() -> None:
    assert _key("tc_effects", {"note": "n"}) is None
    # a spec that says pure while this worker's function has effects: not cached
    lying = _spec("tc_effects").model_copy(update={"pure": True})
    assert registry.identify(lying, {"note": "n"}, None, {}) is None
    # a spec that says effects while the function is pure: the run's spec wins
    careful = _spec("tc_plain").model_copy(update={"pure": False})
    assert registry.identify(careful, {"code": "x"}, None, {}) is None
    # an MCP server's tool of the same name, and a tool no worker here knows
    mcp = _spec("tc_plain").model_copy(update={"source": 'mcp:{"url":"http://x/mcp"}'})
    assert registry.identify(mcp, {"code": "x"}, None, {}) is None
    ghost = ToolSpec(name="tc_ghost", pure=True)
    assert registry.identify(ghost, {}, None, {}) is None


def test_a_review_tool_reads_the_repository_at_the_reviewed_commit() -> None:
    args = {"path": "app/report.py"}
    spec = _spec("read_file")
    at_a = registry.identify(spec, args, A, {"commands": {"tests": ["pytest"]}})
    assert at_a is not None and at_a.reads == {"repository": "/srv/repo", "commit": "a" * 40}
    assert _key("read_file", args, A) == _key("read_file", args, A, {"other": 1})
    assert _key("read_file", args, A) != _key("read_file", args, B)
    elsewhere = Workspace(source="https://git.example/other.git", commit="a" * 40)
    assert _key("read_file", args, A) != _key("read_file", args, elsewhere)
    assert _key("read_file", args, A) != _key("git_log", {"path": "app/report.py"}, A)
    assert all(registry.get(n).reads is not None for n in ("grep", "git_show", "list_files"))  # type: ignore[union-attr]
    assert review.read_file is registry.get("read_file").fn  # type: ignore[union-attr]


def test_a_tool_taking_the_context_without_reads_keys_the_tree_and_options() -> None:
    args = {"path": "a"}
    assert _key("tc_context", args, A) != _key("tc_context", args, B)
    assert _key("tc_context", args, A, {"x": 1}) != _key("tc_context", args, A, {"x": 2})
    assert _key("tc_context", args, None) != _key("tc_context", args, A)
    # one that declares what it reads: only that
    assert _key("tc_reads", args, A, {"level": 1}) == _key("tc_reads", args, B, {"level": 1})
    assert _key("tc_reads", args, A, {"level": 1}) != _key("tc_reads", args, A, {"level": 2})
    scope = ToolScope(A, {"level": 3})
    assert registry.get("tc_reads").reads(scope) == 3  # type: ignore[union-attr]


def test_the_fingerprint_follows_the_definition_and_its_version() -> None:
    def check(code: str) -> str:
        """Check."""
        return code

    one = registry.describe(check, name="tc_fp", pure=True, timeout_s=30)
    again = registry.describe(check, name="tc_fp", pure=True, timeout_s=30)
    assert one.fingerprint == again.fingerprint
    import dataclasses

    assert dataclasses.replace(one, version="2").fingerprint != one.fingerprint
    slower = registry.describe(check, name="tc_fp", pure=True, timeout_s=60)
    assert slower.fingerprint != one.fingerprint

    def check2(code: str) -> str:
        """Check."""
        return code.strip()

    assert registry.describe(check2, name="tc_fp", pure=True, timeout_s=30).fingerprint != (
        one.fingerprint
    )


@pytest.mark.parametrize("value", [(1, 2), {"k": (1,)}])
def test_reads_values_are_keyed_as_json(value: object) -> None:
    assert registry.canonical_value(value) == ([1, 2] if isinstance(value, tuple) else {"k": [1]})
