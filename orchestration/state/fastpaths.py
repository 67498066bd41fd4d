"""Which of Duet's fast paths run: the registry, and the ``DUET_FAST_PATHS`` switch.

A fast path replaces part of a library with Duet's own code through names the library
does not document. Each declares the package it touches, the releases it was tested
with and the private names it needs; every other case runs the stock library.

``DUET_FAST_PATHS`` (default ``auto``), a mode and optional per-path changes, e.g.
``auto,-endpoint`` or ``off,+transport``:

* ``auto``: a fast path is on when the installed release is in its tested range and its
  names exist; otherwise the stock library runs, with one line logged (INFO) saying why;
* ``on``: every fast path is on whatever the release (a missing name: ``ConfigError``);
* ``off``: the stock libraries everywhere.

What each skips is in :data:`FAST_PATHS` (``skips``) and docs/performance.md. The
``publish`` fast path also steps aside while any receiver is connected to Celery's
``before_task_publish`` / ``after_task_publish`` signals (it sends no signals):
``workers.app.direct_push``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import threading
from dataclasses import dataclass

from orchestration.core.errors import ConfigError

#: The environment variable holding the switch.
SWITCH = "DUET_FAST_PATHS"
MODES = ("auto", "on", "off")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FastPath:
    """One fast path: what it touches, the releases it is tested with, the private names
    it needs (``module:Attr.attr``), and what the stock path it replaces does that it
    does not."""

    name: str
    package: str
    tested: str
    names: tuple[str, ...]
    skips: str


_KOMBU_REDIS = "kombu.transport.redis"
#: Every fast path, by name.
FAST_PATHS: dict[str, FastPath] = {
    path.name: path
    for path in (
        FastPath(
            "transport",
            "kombu",
            ">=5.7,<5.8",
            tuple(
                f"{_KOMBU_REDIS}:{name}"
                for name in (
                    "Channel._create_client",
                    "Channel._get_pool",
                    "Channel.pool",
                    "Channel.conn_or_acquire",
                    "Channel.unacked_restore_throttle",
                    "QoS.pipe_or_acquire",
                    "QoS.append",
                    "QoS.restore_by_tag",
                    "QoS.restore_visible",
                    "Channel._do_restore_message",
                    "Channel._brpop_start",
                    "Channel._brpop_read",
                    "Channel._flush_brpop_reauth",
                    "Channel._in_poll",
                    "Channel._brpop_sent_at",
                    "Channel._get",
                    "Channel.global_keyprefix",
                    "Mutex",
                    "MutexHeld",
                )
            )
            + ("kombu:Connection.resolve_aliases",),
            "a ZREM per ack (here batched; the unacked format is Duet's either way) "
            "and one BRPOP per message (here up to 16 a pop); its client rebuilt per command",
        ),
        FastPath(
            "publish",
            "celery",
            ">=5.7,<5.8",
            ("celery.app.base:Celery.thread_oid", "celery.app.base:Celery.current_worker_task"),
            "send_task: routing, producer pool, kombu's ensure/retry wrapper, queue "
            "declaration, the before/after_task_publish signals (on while none is connected)",
        ),
        FastPath(
            "endpoint",
            "httpx2",
            ">=2.16,<2.18",
            (
                "httpx2:Client._transport_for_url",
                "httpx2:HTTPTransport._pool",
                "httpx2._transports.default:map_httpcore_exceptions",
            ),
            "the SDK client's per-request layers (options, models, header/cookie merging, "
            "auth and event hooks, the pool's lock): calls after the first",
        ),
    )
}


@dataclass(frozen=True)
class Switch:
    """The parsed switch: its mode and the paths turned on (``+``) or off (``-``)."""

    mode: str
    forced_on: frozenset[str] = frozenset()
    forced_off: frozenset[str] = frozenset()


def parse(text: str) -> Switch:
    """The switch ``text`` (``auto|on|off`` then ``,+name`` / ``,-name``).

    Raises:
        ConfigError: an unknown mode or fast path name, naming the variable.
    """
    mode, *changes = [part.strip() for part in (text.strip() or "auto").split(",")]
    if mode not in MODES:
        raise ConfigError(f"{SWITCH}={text!r}: the mode is one of {', '.join(MODES)}")
    on: set[str] = set()
    off: set[str] = set()
    for change in changes:
        name = change[1:]
        if change[:1] not in ("+", "-") or name not in FAST_PATHS:
            raise ConfigError(
                f"{SWITCH}={text!r}: {change!r} is not +NAME or -NAME with NAME one of "
                f"{', '.join(FAST_PATHS)}"
            )
        (on if change[0] == "+" else off).add(name)
        (off if change[0] == "+" else on).discard(name)
    return Switch(mode, frozenset(on), frozenset(off))


@dataclass(frozen=True)
class Decision:
    """Whether a fast path runs, and the notice to log once when it does not (or None)."""

    on: bool
    notice: str | None = None


def decide(switch: Switch, path: FastPath, version: str | None, missing: list[str]) -> Decision:
    """Whether ``path`` runs with ``version`` of its package installed (None: not
    installed) and the private names ``missing`` of it.

    Raises:
        ConfigError: the path is forced on and a name (or the package) is missing.
    """
    from packaging.specifiers import SpecifierSet

    name = path.name
    forced = switch.mode == "on" and name not in switch.forced_off or name in switch.forced_on
    if forced:
        gone = missing if version is not None else [path.package]
        if gone:
            raise ConfigError(
                f"{SWITCH} forces the {name} fast path on, but {path.package} "
                f"{version or '(not installed)'} lacks {', '.join(gone)}: set "
                f"{SWITCH}=auto to run the stock library"
            )
        return Decision(True)
    if switch.mode == "off" or name in switch.forced_off:
        return Decision(False)
    if version is None:
        return Decision(False, f"fast path {name} off: {path.package} is not installed")
    if not SpecifierSet(path.tested).contains(version, prereleases=True):
        return Decision(
            False,
            f"fast path {name} off: {path.package} {version} is outside "
            f"its tested {path.tested}; running the stock library",
        )
    if missing:
        return Decision(
            False,
            f"fast path {name} off: {path.package} {version} lacks "
            f"{', '.join(missing)}; running the stock library",
        )
    return Decision(True)


def missing_names(path: FastPath) -> list[str]:
    """The private names of ``path`` the installed package lacks (an attribute set in a
    class's ``__init__`` counts as present when ``__init__`` assigns it)."""
    missing = []
    for spec in path.names:
        module_name, _, attrs = spec.partition(":")
        try:
            owner: object = importlib.import_module(module_name)
        except ImportError:
            missing.append(spec.replace(":", "."))
            continue
        for attr in attrs.split("."):
            if hasattr(owner, attr):
                owner = getattr(owner, attr)
                continue
            init = getattr(getattr(owner, "__init__", None), "__code__", None)
            if init is None or attr not in init.co_names:
                missing.append(spec.replace(":", "."))
            break
    return missing


def installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


_lock = threading.Lock()
_decided: dict[str, bool] = {}


def enabled(name: str) -> bool:
    """Whether fast path ``name`` runs in this process (decided once; a notice logged
    once when ``auto`` turns it off)."""
    on = _decided.get(name)
    if on is not None:
        return on
    with _lock:
        if name not in _decided:
            path = FAST_PATHS[name]
            decision = decide(
                parse(os.environ.get(SWITCH, "auto")),
                path,
                installed_version(path.package),
                missing_names(path),
            )
            if decision.notice:
                log.info(decision.notice)
            _decided[name] = decision.on
        return _decided[name]


def reset() -> None:
    """Decide again on the next :func:`enabled` (tests, a changed switch)."""
    with _lock:
        _decided.clear()


__all__ = [
    "FAST_PATHS",
    "SWITCH",
    "Decision",
    "FastPath",
    "Switch",
    "decide",
    "enabled",
    "missing_names",
    "parse",
    "reset",
]
