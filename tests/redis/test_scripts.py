"""The Lua loader: every script file loads on a real server; includes and facts are filled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestration.core.results import FINISHED_STATUSES
from orchestration.state import scripts

NAMES = sorted(p.stem for p in scripts.LUA_DIR.glob("*.lua"))


def test_scripts_are_found() -> None:
    assert {"run_transition", "step_begin", "step_complete", "budget_reserve"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_every_script_compiles_on_redis(name: str, redis_client: Any) -> None:
    text = scripts.source(name)
    assert "{{" not in text and "--! include" not in text
    sha = redis_client.script_load(text)  # the server compiles it: a syntax error raises
    assert redis_client.script_exists(sha) == [True]


def test_includes_come_first_and_facts_are_written_once_in_python() -> None:
    reserve = scripts.source("budget_reserve")
    assert reserve.startswith(scripts.source("budget_common"))
    transition = scripts.source("run_transition")
    for status in FINISHED_STATUSES:
        assert f"['{status}'] = true" in transition


def test_an_unknown_fact_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "odd.lua").write_text("return {{NO_SUCH_FACT}}\n")
    monkeypatch.setattr(scripts, "LUA_DIR", tmp_path)
    scripts.source.cache_clear()
    try:
        with pytest.raises(
            LookupError, match=r"lua/odd.lua names unknown constant \{\{NO_SUCH_FACT\}\}"
        ):
            scripts.source("odd")
    finally:
        scripts.source.cache_clear()
