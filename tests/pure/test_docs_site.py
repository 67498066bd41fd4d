"""The docs build as a site with ``mkdocs build --strict`` (a broken link, an anchor that
is not there or a page missing from the nav fails it), and the README's links resolve."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT


def test_the_docs_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    assert (tmp_path / "site" / "cli" / "index.html").is_file()


@pytest.mark.parametrize("document", ["README.md", "CHANGELOG.md"])
def test_every_relative_link_resolves(document: str) -> None:
    text = (ROOT / document).read_text(encoding="utf-8")
    targets = [t for t in re.findall(r"\]\(([^)#\s]+)", text) if "://" not in t]
    assert document != "README.md" or targets, "the README links its docs"
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, missing


def test_the_readme_stays_short() -> None:
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 200
