"""Packaging: every dependency is pinned with an upper bound, the pins hold what is
installed, and the Celery/kombu overrides refuse a release they were not tested with."""

from __future__ import annotations

import importlib.metadata
import re
import sys

import pytest
from packaging.requirements import Requirement

from orchestration.core.errors import ConfigError
from orchestration.state import broker
from tests.reliability import PACKAGING, Reliability, lost_of
from tests.support import ROOT
from workers import celery_ext
from workers.providers import endpoint

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


def _requirements(extra: str | None = None) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    raw = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return [Requirement(line) for line in raw]


ALL = _requirements() + _requirements("test")
#: The row of docs/RELIABILITY.md the pin and image checks record.
UNPINNED = (
    "A dependency without an upper bound, or installed outside its pin; a package the image "
    "does not copy"
)


@pytest.mark.parametrize("req", ALL, ids=lambda r: r.name)
def test_every_dependency_has_an_upper_bound(reliability: Reliability, req: Requirement) -> None:
    bounded = any(spec.operator in ("<", "<=", "==", "~=") for spec in req.specifier)
    reliability.record(section=PACKAGING, fault=UNPINNED,
                       load=f"{len(ALL)} dependencies in `pyproject.toml`: their upper bounds",
                       lost="nothing" if bounded else f"`{req}` has no upper bound")  # fmt: skip
    assert bounded, str(req)


@pytest.mark.parametrize("req", ALL, ids=lambda r: r.name)
def test_the_installed_release_is_inside_the_pin(
    reliability: Reliability, req: Requirement
) -> None:
    if req.marker is not None and not req.marker.evaluate():
        pytest.skip(f"{req} does not apply here")
    version = importlib.metadata.version(req.name)
    inside = req.specifier.contains(version, prereleases=True)
    reliability.record(section=PACKAGING, fault=UNPINNED,
                       load=f"{len(ALL)} dependencies: the installed releases",
                       lost="nothing" if inside else f"{req.name} {version} is outside `{req}`")  # fmt: skip
    assert inside, f"{req.name} {version} vs {req}"


def test_celery_comes_with_its_redis_extra() -> None:
    # kombu's Redis transport imports `packaging` and `redis`, which only the extra brings.
    (celery,) = [r for r in _requirements() if r.name == "celery"]
    assert "redis" in celery.extras


def test_the_checked_ranges_are_the_pinned_ones() -> None:
    pins = {r.name: str(r.specifier) for r in _requirements()}

    def norm(spec: str) -> set[str]:
        return set(re.sub(r"\s", "", spec).split(","))

    assert norm(pins["celery"]) == norm(celery_ext.CELERY_TESTED)
    assert norm(pins["kombu"]) == norm(broker.KOMBU_TESTED)


def test_the_installed_celery_and_kombu_pass_the_start_check() -> None:
    celery_ext.check_versions()  # raises ConfigError otherwise


def test_the_installed_httpx2_passes_the_start_check() -> None:
    endpoint.check_versions()  # raises ConfigError otherwise


def test_an_httpx2_lacking_a_private_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx2

    monkeypatch.delattr(httpx2.Client, "_transport_for_url")
    with pytest.raises(ConfigError, match="lacks httpx2.Client._transport_for_url"):
        endpoint.check_versions()


@pytest.mark.parametrize(
    ("version", "missing", "message"),
    [
        ("5.8.0", [], "celery 5.8.0 is installed, but Duet's customisations of it are tested "
                     "with celery>=5.7,<5.8: install that (pip install 'celery>=5.7,<5.8')"),
        ("5.6.2", [], "celery 5.6.2 is installed"),
        ("5.7.1", ["celery.worker.consumer.consumer.Consumer._flush_events"],
         "celery 5.7.1 is installed and lacks celery.worker.consumer.consumer.Consumer._flush_events"),
    ],
    ids=["newer", "older", "lacking-a-name"],
)  # fmt: skip
def test_an_untested_release_is_refused_with_what_to_install(
    reliability: Reliability, version: str, missing: list[str], message: str
) -> None:
    try:
        broker.check_release("celery", version, celery_ext.CELERY_TESTED, missing)
        refused = None
    except ConfigError as exc:
        refused = str(exc)
    reliability.record(
        section=PACKAGING,
        fault="A Celery or kombu release outside the tested pins, or one missing a private "
        "name Duet overrides, at the start of a worker or client",
        load=f"celery {version}"
        + (f" lacking `{missing[0].rsplit('.', 1)[-1]}`" if missing else ""),
        lost=f"nothing: refused at start: `{refused}`" if refused else "started: not refused",
    )
    assert refused is not None and refused.startswith(message)


def test_a_tested_release_passes() -> None:
    broker.check_release("kombu", "5.7.3", broker.KOMBU_TESTED, [])


def test_the_image_copies_every_package_the_wheel_holds(reliability: Reliability) -> None:
    # The Dockerfile builds the wheel from what it copied: a package left out (and its
    # console script) would be missing from the image with no error at build time.
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in config["tool"]["setuptools"]["packages"]["find"]["include"]]
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    ignore = (ROOT / "deploy" / "Dockerfile.dockerignore").read_text().split()
    left_out = [p for p in packages
                if not re.search(rf"^COPY {p} \./{p}$", dockerfile, re.M) or f"!{p}/" not in ignore]  # fmt: skip
    reliability.record(section=PACKAGING, fault=UNPINNED,
                       load=f"the {len(packages)} packages of the wheel, `deploy/Dockerfile`",
                       lost=lost_of(len(left_out), len(packages), "packages not in the image"))  # fmt: skip
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
