"""Packaging: every dependency is pinned with an upper bound, the pins hold what is
installed, and each fast path's tested range lies inside its package's pin."""

from __future__ import annotations

import importlib.metadata
import re
import sys

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from orchestration.state import fastpaths
from tests.reliability import PACKAGING, Reliability, lost_of
from tests.support import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


def _requirements(extra: str | None = None) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    raw = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return [Requirement(line) for line in raw]


def _extras() -> list[str]:
    return list(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )


#: Every requirement of the core and of each extra, less an extra's reference to others of
#: Duet's own (``duet-review[all]``).
ALL = [
    req
    for req in _requirements() + [r for extra in _extras() for r in _requirements(extra)]
    if req.name != "duet-review"
]
#: The row of docs/RELIABILITY.md the pin and image checks record.
UNPINNED = (
    "A dependency without an upper bound, or installed outside its pin; a package the image "
    "does not copy"
)


@pytest.mark.parametrize("req", ALL, ids=lambda r: r.name)
def test_every_dependency_has_an_upper_bound(reliability: Reliability, req: Requirement) -> None:
    bounded = any(spec.operator in ("<", "<=", "==", "~=") for spec in req.specifier)
    reliability.record(
        section=PACKAGING,
        fault=UNPINNED,
        load=f"{len(ALL)} dependencies in `pyproject.toml`: their upper bounds",
        lost="nothing" if bounded else f"`{req}` has no upper bound",
    )
    assert bounded, str(req)


@pytest.mark.parametrize("req", ALL, ids=lambda r: r.name)
def test_the_installed_release_is_inside_the_pin(
    reliability: Reliability, req: Requirement
) -> None:
    if req.marker is not None and not req.marker.evaluate():
        pytest.skip(f"{req} does not apply here")
    try:
        version = importlib.metadata.version(req.name)
    except importlib.metadata.PackageNotFoundError:
        if req in _requirements():
            raise
        pytest.skip(f"{req.name} is in an extra not installed here")
    inside = req.specifier.contains(version, prereleases=True)
    reliability.record(
        section=PACKAGING,
        fault=UNPINNED,
        load=f"{len(ALL)} dependencies: the installed releases",
        lost="nothing" if inside else f"{req.name} {version} is outside `{req}`",
    )
    assert inside, f"{req.name} {version} vs {req}"


def test_celery_comes_with_its_redis_extra() -> None:
    # kombu's Redis transport imports `packaging` and `redis`, which only the extra brings.
    (celery,) = [r for r in _requirements() if r.name == "celery"]
    assert "redis" in celery.extras


@pytest.mark.parametrize("path", list(fastpaths.FAST_PATHS.values()), ids=lambda p: p.name)
def test_each_fast_paths_tested_range_lies_inside_the_pin(path: fastpaths.FastPath) -> None:
    # The pins are the stock path's range; a fast path's tested range is a part of it.
    pins = {r.name: r.specifier for r in _requirements()}
    tested = SpecifierSet(path.tested)
    floor = next(s.version for s in tested if s.operator == ">=")
    ceiling = next(s.version for s in tested if s.operator == "<")
    pin = pins[path.package]
    assert floor in pin, f"{path.name}: {path.package}{path.tested} vs the pin {pin}"
    assert Version(ceiling) <= Version(next(s.version for s in pin if s.operator == "<"))


def test_httpx2_the_sdks_post_with_is_declared() -> None:
    assert "httpx2" in {r.name for r in _requirements()}


@pytest.mark.parametrize("path", list(fastpaths.FAST_PATHS.values()), ids=lambda p: p.name)
def test_auto_runs_each_fast_path_exactly_on_its_tested_releases(path: fastpaths.FastPath) -> None:
    # The dev venv installs the tested releases (every fast path on); the oldest-release
    # job older ones (the stock paths, each with its notice).
    version = fastpaths.installed_version(path.package)
    assert version is not None
    decision = fastpaths.decide(
        fastpaths.parse("auto"), path, version, fastpaths.missing_names(path)
    )
    assert decision.on is SpecifierSet(path.tested).contains(version), decision.notice
    assert (decision.notice is None) is decision.on


def test_the_image_copies_every_package_the_wheel_holds(reliability: Reliability) -> None:
    # The Dockerfile builds the wheel from what it copied: a package left out (and its
    # console script) would be missing from the image with no error at build time.
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in config["tool"]["setuptools"]["packages"]["find"]["include"]]
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    ignore = (ROOT / "deploy" / "Dockerfile.dockerignore").read_text().split()
    left_out = [
        p
        for p in packages
        if not re.search(rf"^COPY {p} \./{p}$", dockerfile, re.M) or f"!{p}/" not in ignore
    ]
    reliability.record(
        section=PACKAGING,
        fault=UNPINNED,
        load=f"the {len(packages)} packages of the wheel, `deploy/Dockerfile`",
        lost=lost_of(len(left_out), len(packages), "packages not in the image"),
    )
    assert left_out == []


def test_the_distribution_is_published_under_its_free_name_with_its_licence() -> None:
    from duet import DISTRIBUTION

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION != "duet"  # `duet` on the index is another project
    assert (
        project["license-files"] == ["LICENSE"] and "MIT License" in (ROOT / "LICENSE").read_text()
    )
    assert "## Upgrading" in (ROOT / "CHANGELOG.md").read_text()


def test_the_classifiers_name_every_python_the_floor_allows() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floor = int(project["requires-python"].removeprefix(">=3."))
    versions = [
        re.fullmatch(r"Programming Language :: Python :: 3\.(\d+)", c)
        for c in project["classifiers"]
    ]
    named = sorted(int(m[1]) for m in versions if m)
    assert named == list(range(floor, 14)), named


def _locked() -> dict[str, list[tuple[Version, str]]]:
    """``deploy/constraints.txt``: each package's pinned versions, with their markers."""
    pins: dict[str, list[tuple[Version, str]]] = {}
    for line in (ROOT / "deploy" / "constraints.txt").read_text().splitlines():
        spec = line.split("#", 1)[0].strip()
        if not spec:
            continue
        pinned, _, marker = spec.partition(";")
        name, _, version = pinned.strip().partition("==")
        assert version, f"deploy/constraints.txt: {line!r} pins no version"
        pins.setdefault(_normal(name), []).append((Version(version), marker.strip()))
    return pins


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.parametrize("req", ALL, ids=lambda r: r.name)
def test_the_lock_pins_every_dependency_inside_its_range(req: Requirement) -> None:
    """The image, `make test` and CI install deploy/constraints.txt: every version it pins
    is one pyproject.toml allows (`make lock` re-resolves it after a range changes)."""
    pins = _locked().get(_normal(req.name))
    assert pins, f"{req.name} is not in deploy/constraints.txt: run make lock"
    outside = [str(v) for v, _ in pins if not req.specifier.contains(v, prereleases=True)]
    assert not outside, f"deploy/constraints.txt pins {req.name} {outside}, outside {req}"
