"""The pure core imports no Celery, no Redis and no vendor SDK."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PURE_MODULES = [
    "orchestration.core.agents",
    "orchestration.core.architecture",
    "orchestration.core.budget",
    "orchestration.core.critique",
    "orchestration.core.errors",
    "orchestration.core.events",
    "orchestration.core.loop",
    "orchestration.core.pricing",
    "orchestration.core.results",
    "orchestration.core.templates",
    "orchestration.core.usage",
]
FORBIDDEN = ("celery", "kombu", "redis", "openai", "anthropic", "httpx", "httpx2")


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_module_imports_no_io_library(module: str) -> None:
    code = (
        f"import sys, json, importlib; importlib.import_module({module!r}); "
        "print(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    assert not loaded & set(FORBIDDEN), f"{module} pulls in {sorted(loaded & set(FORBIDDEN))}"


def test_public_api_import_is_light() -> None:
    code = "import sys, json, orchestration; print(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert not set(json.loads(out.stdout)) & set(FORBIDDEN)
