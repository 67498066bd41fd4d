"""The embedded default's cache file is private: ``calls.sqlite`` (and its journal) 0600,
its folder 0700, and a symlink at its path refused, never followed."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestration.state.callcache import DiskCallStore
from tests.reliability import FILES, Reliability, lost_of


@pytest.fixture(autouse=True)
def loose_umask() -> Iterator[None]:
    """The common umask 022: what the file would get if Duet asked for nothing."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _use(store: DiskCallStore) -> None:
    store.put("k", "v", max_entries=10, max_bytes=1000)
    assert store.get("k", 60) == "v"


def test_the_cache_file_and_folder_are_private_and_a_symlink_is_refused(
    tmp_path: Path, reliability: Reliability
) -> None:
    fresh = DiskCallStore(tmp_path / "cache" / "calls.sqlite")
    _use(fresh)
    files = sorted(fresh.path.parent.iterdir())
    loose = [f.name for f in files if _mode(f) != 0o600]
    loose += ["folder"] if _mode(fresh.path.parent) != 0o700 else []
    # A file and folder an older release left readable by all are made private on first use.
    old = tmp_path / "old"
    old.mkdir(mode=0o755)
    (old / "calls.sqlite").touch(mode=0o644)
    os.chmod(old, 0o755)
    _use(DiskCallStore(old / "calls.sqlite"))
    loose += [f"old {p.name}" for p in [old, *old.iterdir()] if _mode(p) not in (0o600, 0o700)]
    # A dangling symlink at the path, and one to a file the user owns elsewhere.
    traps = tmp_path / "traps"
    traps.mkdir(mode=0o700)
    (traps / "a").mkdir(mode=0o700)
    (traps / "a" / "calls.sqlite").symlink_to(tmp_path / "created-there.sqlite")
    (traps / "b").mkdir(mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    (traps / "b" / "calls.sqlite").symlink_to(victim)
    followed = []
    for folder in ("a", "b"):
        with pytest.raises(OSError, match="symlink"):
            _use(DiskCallStore(traps / folder / "calls.sqlite"))
    if (tmp_path / "created-there.sqlite").exists():
        followed.append("dangling")
    if victim.read_text() != "mine\n":
        followed.append("to a file")
    reliability.record(
        section=FILES,
        fault="the embedded cache file: the umask's 0644, a file left 0644, a dangling "
        "symlink and a symlink to the user's file at its path",
        load=f"{len(files)} files of a fresh cache, 1 old cache, 2 symlinks; umask 022",
        lost=lost_of(
            len(loose) + len(followed),
            len(files) + 3 + 2,
            "files readable by others or symlinks followed",
        ),
        before="`calls.sqlite` 0644; a dangling symlink made Duet create the database at its "
        "target",
    )
    assert not loose and not followed
