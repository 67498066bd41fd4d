"""README.md's Python snippets run as written: extracted in order and executed as one
script, on the embedded default, with the real OpenAI and Anthropic SDKs talking to the
stand-in server (the README says how to do the same by hand)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]


def python_snippets() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def test_readme_has_python_snippets_to_run() -> None:
    snippets = python_snippets()
    assert len(snippets) >= 2
    assert all("await " not in s or "async def" in s for s in snippets), "no top-level await"


def test_readme_python_snippets_run_as_written(fake_llm: Any, tmp_path: Path) -> None:
    script = tmp_path / "readme.py"
    script.write_text("\n\n".join(python_snippets()), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUET_")}
    env.update(
        OPENAI_BASE_URL=fake_llm.url, ANTHROPIC_BASE_URL=fake_llm.anthropic_url,
        OPENAI_API_KEY="sk-test-not-a-secret", ANTHROPIC_API_KEY="sk-ant-test-not-a-secret",
        PYTHONPATH=str(ROOT),
    )  # fmt: skip
    before = fake_llm.stats()["by_path"]
    done = subprocess.run(
        [sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    after = fake_llm.stats()["by_path"]
    sent = {path: n - before.get(path, 0) for path, n in after.items()}
    assert sent.get("/v1/messages", 0) > 0 and sent.get("/v1/chat/completions", 0) > 0, sent
    # The batch loop printed one line per item: id, status, score.
    assert re.search(r"^a\.py (approved|max_rounds_reached) ", done.stdout, flags=re.M)
