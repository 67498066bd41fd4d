"""The layout's import contracts (``[tool.importlinter]`` in pyproject.toml) hold, and a
broken one is seen: ``lint-imports`` on this tree, then on a copy with one upward import."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = [sys.executable, "-c", "from importlinter.cli import lint_imports_command as c; c()"]


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LINT, "--no-cache"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )


def test_the_contracts_hold() -> None:
    done = lint(ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_an_upward_import_breaks_a_contract(tmp_path: Path) -> None:
    for name in ("orchestration", "workers", "duet"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    core = tmp_path / "orchestration" / "core" / "loop.py"
    core.write_text(core.read_text() + "\nfrom orchestration.state import keys  # noqa\n")
    done = lint(tmp_path)
    assert done.returncode != 0
    assert (
        "BROKEN" in done.stdout and "orchestration.core.loop -> orchestration.state" in done.stdout
    )
