"""The pure core imports no Celery, no Redis and no vendor SDK, checked by importing it.

``test_structure.py`` reads the source; this imports each module of ``orchestration/core/``
found on disk in a fresh interpreter and looks at what ended up in ``sys.modules``, so an
I/O library pulled in indirectly (through a third-party package) is caught too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "orchestration" / "core"
PURE_MODULES = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for path in CORE.rglob("*.py")
)
FORBIDDEN = ("celery", "kombu", "redis", "openai", "anthropic", "httpx", "requests")


def test_every_core_file_is_checked() -> None:
    assert "orchestration.core" in PURE_MODULES
    assert "orchestration.core.loop" in PURE_MODULES
    assert len(PURE_MODULES) == len(list(CORE.rglob("*.py")))


def _loaded_after(statement: str) -> set[str]:
    code = f"{statement}; import sys, json; print(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return set(json.loads(out.stdout))


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_module_imports_no_io_library(module: str) -> None:
    loaded = _loaded_after(f"import {module}")
    assert not loaded & set(FORBIDDEN), f"{module} pulls in {sorted(loaded & set(FORBIDDEN))}"


def test_public_api_import_is_light() -> None:
    assert not _loaded_after("import orchestration") & set(FORBIDDEN)
