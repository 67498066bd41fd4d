"""The fast-path registry: which fast paths run under DUET_FAST_PATHS, and the notices."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import pytest

from orchestration.core.errors import ConfigError
from orchestration.state import fastpaths
from orchestration.state.fastpaths import Decision, FastPath, decide, parse
from tests.reliability import PACKAGING, Reliability

PATH = FastPath("endpoint", "httpx2", ">=2.16,<2.17", ("httpx2:Client._x",), "layers")


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    fastpaths.reset()
    yield
    fastpaths.reset()


def test_auto_runs_a_tested_release_with_its_names() -> None:
    assert decide(parse("auto"), PATH, "2.16.2", []) == Decision(True)


@pytest.mark.parametrize(
    ("version", "missing", "why"),
    [
        ("2.14.0", [], "httpx2 2.14.0 is outside its tested >=2.16,<2.17"),
        ("2.17.0", [], "httpx2 2.17.0 is outside its tested >=2.16,<2.17"),
        ("2.16.1", ["httpx2.Client._x"], "httpx2 2.16.1 lacks httpx2.Client._x"),
        (None, [], "httpx2 is not installed"),
    ],
    ids=["older", "newer", "lacking-a-name", "not-installed"],
)
def test_auto_runs_the_stock_path_elsewhere_with_a_notice(
    reliability: Reliability, version: str | None, missing: list[str], why: str
) -> None:
    decision = decide(parse("auto"), PATH, version, missing)
    reliability.record(
        section=PACKAGING,
        fault="A library release outside a fast path's tested range, or lacking a private "
        "name it uses, at the start of a worker or client (DUET_FAST_PATHS=auto)",
        load=f"httpx2 {version}" + (" lacking a name" if missing else ""),
        lost=f"nothing: the stock library runs, one notice: `{decision.notice}`"
        if not decision.on
        else "the fast path ran",
    )
    assert not decision.on
    assert decision.notice == f"fast path endpoint off: {why}" + (
        "; running the stock library" if version else ""
    )


def test_on_forces_an_untested_release() -> None:
    assert decide(parse("on"), PATH, "2.14.0", []) == Decision(True)


def test_on_refuses_a_release_lacking_a_name() -> None:
    with pytest.raises(
        ConfigError,
        match="forces the endpoint fast path on, but httpx2 "
        "2.17.0 lacks httpx2.Client._x: set DUET_FAST_PATHS=auto",
    ):
        decide(parse("on"), PATH, "2.17.0", ["httpx2.Client._x"])


def test_off_runs_the_stock_path_without_a_notice() -> None:
    assert decide(parse("off"), PATH, "2.16.2", []) == Decision(False)


@pytest.mark.parametrize(
    ("switch", "on"),
    [
        ("auto,-endpoint", False),
        ("on,-endpoint", False),
        ("off,+endpoint", True),
        ("auto,-transport", True),
        ("off,+transport", False),
        (" auto , -endpoint ", False),
        ("auto,-endpoint,+endpoint", True),
        ("", True),
    ],
)
def test_single_paths_are_turned_on_or_off_by_name(switch: str, on: bool) -> None:
    assert decide(parse(switch), PATH, "2.16.2", []).on is on


@pytest.mark.parametrize(
    ("switch", "message"),
    [
        ("fast", "the mode is one of auto, on, off"),
        ("auto,-nope", "'-nope' is not +NAME or -NAME with NAME one of transport, publish"),
        ("auto,endpoint", "'endpoint' is not +NAME or -NAME"),
    ],
)
def test_a_bad_switch_is_refused_naming_the_variable(switch: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"DUET_FAST_PATHS={switch!r}: {message}")):
        parse(switch)


def test_missing_names_finds_class_instance_and_module_names() -> None:
    path = FastPath(
        "x",
        "pytest",
        ">=0",
        (
            "logging:Logger.warning",  # a method
            "logging:Logger.propagate",  # an attribute __init__ sets
            "logging:Logger.no_such_name",
            "logging:no_such_function",
            "no_such_module_here:thing",
        ),
        "",
    )
    assert fastpaths.missing_names(path) == [
        "logging.Logger.no_such_name",
        "logging.no_such_function",
        "no_such_module_here.thing",
    ]


def test_enabled_decides_once_and_logs_the_notice_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(fastpaths.SWITCH, "auto")
    monkeypatch.setattr(fastpaths, "installed_version", lambda package: "0.0.1")
    with caplog.at_level(logging.INFO, logger=fastpaths.__name__):
        first = [fastpaths.enabled("endpoint") for _ in range(3)]
    assert first == [False, False, False]
    notices = [r.getMessage() for r in caplog.records]
    tested = fastpaths.FAST_PATHS["endpoint"].tested
    assert notices == [
        f"fast path endpoint off: httpx2 0.0.1 is outside its tested {tested}; "
        "running the stock library"
    ]


def test_every_fast_path_says_what_it_skips() -> None:
    assert sorted(fastpaths.FAST_PATHS) == sorted(["transport", "publish", "endpoint"])
    assert all(path.skips and path.names for path in fastpaths.FAST_PATHS.values())
