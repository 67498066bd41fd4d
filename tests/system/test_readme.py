"""The Python snippets of README.md and of every docs page run as written: each file's
extracted in order and executed as one script, on the embedded default, with the real
OpenAI and Anthropic SDKs talking to the stand-in server (the README says how to do the
same by hand)."""

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
README = ROOT / "README.md"
#: Every file whose snippets run: the README and the docs pages that hold Python.
DOCUMENTS = [README] + sorted(
    p for p in (ROOT / "docs").glob("*.md") if "```python" in p.read_text()
)


def python_snippets(document: Path = README) -> list[str]:
    text = document.read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def test_readme_and_docs_have_python_snippets_to_run() -> None:
    assert python_snippets() and len(DOCUMENTS) >= 3, DOCUMENTS
    snippets = [s for document in DOCUMENTS for s in python_snippets(document)]
    assert all("await " not in s or "async def" in s for s in snippets), "no top-level await"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_python_snippets_run_as_written(fake_llm: Any, tmp_path: Path, document: Path) -> None:
    script = tmp_path / "snippets.py"
    script.write_text("\n\n".join(python_snippets(document)), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUET_")}
    env.update(
        OPENAI_BASE_URL=fake_llm.url,
        ANTHROPIC_BASE_URL=fake_llm.anthropic_url,
        OPENAI_API_KEY="sk-test-not-a-secret",
        ANTHROPIC_API_KEY="sk-ant-test-not-a-secret",
        PYTHONPATH=str(ROOT),
    )
    before = fake_llm.stats()["by_path"]
    done = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    after = fake_llm.stats()["by_path"]
    sent = {path: n - before.get(path, 0) for path, n in after.items()}
    assert sent.get("/v1/messages", 0) > 0 and sent.get("/v1/chat/completions", 0) > 0, sent
    if "for result in batch.results()" in script.read_text():
        # The batch loop printed one line per item: id, status, score.
        assert re.search(r"^a\.py (approved|max_rounds_reached) ", done.stdout, flags=re.M)
