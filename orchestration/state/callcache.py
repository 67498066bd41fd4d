"""Where the model-call cache keeps its entries: one interface, two backends.

:class:`RedisCallStore` on a cluster (shared by the fleet; LRU over its own keys only, in
Lua; under a ``maxmemory`` it keeps :data:`RESERVE_SHARE` of it free for run state and
gives room back when run state meets ``OOM``, so it never competes with run state), :class:`DiskCallStore` on the embedded default
(a SQLite file under the user's cache dir, so a rerun on a laptop is free too).
"""

from __future__ import annotations

import logging
import os
import secrets
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any, Protocol

from orchestration.core.callcache import DEFAULT_MAX_ENTRIES, CacheStats
from orchestration.core.integrity import opened, seal
from orchestration.state import keys
from orchestration.state.connection import INFRA_ERRORS
from orchestration.state.scripts import ScriptCall, register, run_scripts

log = logging.getLogger(__name__)
#: The file of the embedded default's fleet key, beside the cache file.
KEY_FILE = "fleet.key"
#: Random bytes of a generated fleet key.
KEY_BYTES = 32
#: Default size cap of a store, bytes of answers.
DEFAULT_MAX_BYTES = 512 * 1024 * 1024
#: Share of a Redis's ``maxmemory`` the cache leaves to run state: it never grows the
#: server past the rest, and shrinks when run state needs the room (:meth:`make_room`).
RESERVE_SHARE = 0.2
#: Most entries one :meth:`RedisCallStore.make_room` evicts.
YIELD_MAX = 10_000
_PARTS = ("entries", "used", "stored", "stats")


#: What a broken store raises; a lookup or a write that fails is a miss, never a failure.
STORE_ERRORS: tuple[type[BaseException], ...] = (*INFRA_ERRORS, OSError, sqlite3.Error)


class CallStore(Protocol):
    """A store of cached answers by key."""

    def get(self, key: str, ttl_s: float) -> str | None: ...

    def put(self, key: str, value: str, *, max_entries: int, max_bytes: int) -> None: ...

    def get_many(self, keys: list[str], ttl_s: float) -> list[str | None]: ...

    def put_many(
        self, entries: list[tuple[str, str]], *, max_entries: int, max_bytes: int
    ) -> None: ...

    def stats(self) -> CacheStats: ...

    def clear(self, older_than_s: float | None = None) -> int: ...


class RedisCallStore:
    """The fleet's cache, in Redis under Duet's prefix (:func:`keys.call_cache`)."""

    def __init__(self, client: Any) -> None:
        self.r = client
        self._keys = [keys.call_cache(p) for p in _PARTS]
        self._get = register(client, "cache_get")
        self._put = register(client, "cache_put")
        self._clear = register(client, "cache_clear")
        self._yield = register(client, "cache_yield")

    def get(self, key: str, ttl_s: float) -> str | None:
        found = self._get(keys=self._keys, args=[key, time.time(), ttl_s])
        return found.decode() if isinstance(found, bytes) else found

    def put(self, key: str, value: str, *, max_entries: int, max_bytes: int) -> None:
        self._put(
            keys=self._keys,
            args=[key, time.time(), value, max_entries, max_bytes, RESERVE_SHARE],
        )

    def make_room(self) -> int:
        """Evict the cache's oldest entries until the server is :data:`RESERVE_SHARE` of
        its ``maxmemory`` below it (run state met ``OOM``); how many went."""
        return int(self._yield(keys=self._keys, args=[RESERVE_SHARE, YIELD_MAX]))

    def get_many(self, keys: list[str], ttl_s: float) -> list[str | None]:
        """:meth:`get` of each key, in one round trip."""
        now = time.time()
        calls = [ScriptCall(self._get, self._keys, [key, now, ttl_s]) for key in keys]
        found = run_scripts(self.r, calls) if calls else []
        return [f.decode() if isinstance(f, bytes) else f for f in found]

    def put_many(self, entries: list[tuple[str, str]], *, max_entries: int, max_bytes: int) -> None:
        """:meth:`put` of each ``(key, value)``, in one round trip."""
        now = time.time()
        calls = [
            ScriptCall(
                self._put, self._keys, [key, now, value, max_entries, max_bytes, RESERVE_SHARE]
            )
            for key, value in entries
        ]
        if calls:
            run_scripts(self.r, calls)

    def stats(self) -> CacheStats:
        entries, used, _, stats = self._keys
        counts = {
            k.decode() if isinstance(k, bytes) else k: int(v)
            for k, v in self.r.hgetall(stats).items()
        }
        oldest = self.r.zrange(used, 0, 0, withscores=True)
        return CacheStats(
            "redis",
            keys.call_cache("*"),
            int(self.r.hlen(entries)),
            counts.get("bytes", 0),
            counts.get("hits", 0),
            counts.get("misses", 0),
            oldest[0][1] if oldest else None,
        )

    def clear(self, older_than_s: float | None = None) -> int:
        if older_than_s is None:
            n = int(self.r.hlen(self._keys[0]))
            self.r.delete(*self._keys)
            return n
        cutoff, total = time.time() - older_than_s, 0
        while (n := int(self._clear(keys=self._keys, args=[cutoff, 1000]))) > 0:
            total += n
        return total


def default_path() -> Path:
    """``$DUET_CACHE_DIR/calls.sqlite``, else under ``$XDG_CACHE_HOME`` or ``~/.cache``."""
    folder = os.environ.get("DUET_CACHE_DIR")
    if not folder:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        folder = str(Path(base) / "duet")
    return Path(folder) / "calls.sqlite"


def _private_file(path: Path) -> None:
    """Make ``path`` a file only its owner reads (0600) in a folder only they enter
    (0700), opened without following a symlink: answers are the user's code and
    reviews, and a link planted at the path would put the database where it points.
    SQLite gives its journal files the database's mode."""
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    if folder.stat().st_uid == os.getuid() and folder.stat().st_mode & 0o077:
        os.chmod(folder, 0o700)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if os.path.islink(path):
            raise OSError(
                exc.errno, f"the cache file {path} is a symlink: not followed; remove it"
            ) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"the cache file {path} is not a regular file")
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


class DiskCallStore:
    """The embedded default's cache: a SQLite file that outlives the per-command Redis."""

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._ready: Path | None = None

    @property
    def path(self) -> Path:
        """The file: the one given, else :func:`default_path` as the environment says now."""
        return self._path or default_path()

    def _create(self) -> None:
        """The file and its tables, on first use (a worker with no cache touches no disk)."""
        path = self.path
        _private_file(path)
        db = sqlite3.connect(path, timeout=30, isolation_level=None)
        try:
            db.execute(
                "CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, "
                "value TEXT NOT NULL, stored REAL NOT NULL, used REAL NOT NULL, "
                "size INTEGER NOT NULL)"
            )
            db.execute("CREATE INDEX IF NOT EXISTS entries_used ON entries (used)")
            db.execute("CREATE TABLE IF NOT EXISTS stats (name TEXT PRIMARY KEY, n INTEGER)")
        finally:
            db.close()
        self._ready = path

    def _db(self) -> sqlite3.Connection:
        if self._ready != self.path:
            self._create()
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def _count(self, db: sqlite3.Connection, name: str, n: int = 1) -> None:
        if n:
            db.execute(
                "INSERT INTO stats VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET n = n + ?",
                (name, n, n),
            )

    def get(self, key: str, ttl_s: float) -> str | None:
        return self.get_many([key], ttl_s)[0]

    def get_many(self, keys: list[str], ttl_s: float) -> list[str | None]:
        """The entries of ``keys`` no older than ``ttl_s`` (None: a miss), in one
        transaction; each found is marked used now, and hits and misses are counted."""
        now = time.time()
        db = self._db()
        try:
            db.execute("BEGIN IMMEDIATE")
            found: list[str | None] = []
            for key in keys:
                row = db.execute(
                    "SELECT value FROM entries WHERE key = ? AND stored >= ?", (key, now - ttl_s)
                ).fetchone()
                found.append(str(row[0]) if row is not None else None)
            hits = [k for k, f in zip(keys, found, strict=True) if f is not None]
            db.executemany("UPDATE entries SET used = ? WHERE key = ?", [(now, k) for k in hits])
            self._count(db, "hits", len(hits))
            self._count(db, "misses", len(keys) - len(hits))
            db.execute("COMMIT")
            return found
        finally:
            db.close()

    def put(self, key: str, value: str, *, max_entries: int, max_bytes: int) -> None:
        self.put_many([(key, value)], max_entries=max_entries, max_bytes=max_bytes)

    def put_many(self, entries: list[tuple[str, str]], *, max_entries: int, max_bytes: int) -> None:
        """Store each ``(key, value)`` in one transaction, then evict the least recently
        used past ``max_entries`` or ``max_bytes``."""
        now = time.time()
        db = self._db()
        try:
            db.execute("BEGIN IMMEDIATE")
            db.executemany(
                "INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?)",
                [(k, v, now, now, len(v.encode())) for k, v in entries],
            )
            count, size = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM entries"
            ).fetchone()
            while count > max_entries or size > max_bytes:
                row = db.execute("SELECT key, size FROM entries ORDER BY used LIMIT 1").fetchone()
                if row is None:
                    break
                db.execute("DELETE FROM entries WHERE key = ?", (row[0],))
                count, size = count - 1, size - row[1]
            db.execute("COMMIT")
        finally:
            db.close()

    def stats(self) -> CacheStats:
        db = self._db()
        try:
            count, size, oldest = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(size), 0), MIN(used) FROM entries"
            ).fetchone()
            counts = dict(db.execute("SELECT name, n FROM stats").fetchall())
        finally:
            db.close()
        return CacheStats(
            "disk",
            str(self.path),
            count,
            size,
            counts.get("hits", 0),
            counts.get("misses", 0),
            oldest,
        )

    def clear(self, older_than_s: float | None = None) -> int:
        db = self._db()
        try:
            if older_than_s is None:
                n = db.execute("DELETE FROM entries").rowcount
                db.execute("DELETE FROM stats")
            else:
                cutoff = time.time() - older_than_s
                n = db.execute("DELETE FROM entries WHERE stored < ?", (cutoff,)).rowcount
            return int(n)
        finally:
            db.close()


class SealedStore:
    """A :class:`CallStore` whose entries carry an integrity tag under the fleet key
    (:mod:`orchestration.core.integrity`): an entry without a valid one is a miss, and a
    warning says so. The key is ``fleet_key`` (``DUET_FLEET_KEY``), else the one kept beside
    the embedded default's cache (:func:`local_fleet_key`), read on first use."""

    def __init__(self, store: CallStore, fleet_key: str | None) -> None:
        self.store = store
        self._fleet_key = fleet_key.encode() if fleet_key else None

    @property
    def key(self) -> bytes:
        if self._fleet_key is None:
            self._fleet_key = local_fleet_key(default_path().parent)
            from orchestration.settings import get_settings

            # (On the embedded default, DUET_REDIS_URL unset, this machine is the fleet.)
            if isinstance(self.store, RedisCallStore) and get_settings().redis_url:
                log.warning(
                    "DUET_FLEET_KEY is unset: the cluster's cache entries are tagged with "
                    "this machine's key (%s), so other machines' entries are misses; set "
                    "the same DUET_FLEET_KEY on every worker and submitter",
                    default_path().parent / KEY_FILE,
                )
        return self._fleet_key

    def _open(self, name: str, stored: str | None) -> str | None:
        if stored is None:
            return None
        value = opened(self.key, name, stored)
        if value is None:
            log.warning(
                "model-call cache entry %s has no valid integrity tag (written without the "
                "fleet key, DUET_FLEET_KEY): not served",
                name[:24],
            )
        return value

    def get(self, key: str, ttl_s: float) -> str | None:
        return self._open(key, self.store.get(key, ttl_s))

    def get_many(self, keys: list[str], ttl_s: float) -> list[str | None]:
        found = self.store.get_many(keys, ttl_s)
        return [self._open(k, f) for k, f in zip(keys, found, strict=True)]

    def put(self, key: str, value: str, *, max_entries: int, max_bytes: int) -> None:
        sealed = seal(self.key, key, value)
        self.store.put(key, sealed, max_entries=max_entries, max_bytes=max_bytes)

    def put_many(self, entries: list[tuple[str, str]], *, max_entries: int, max_bytes: int) -> None:
        sealed = [(k, seal(self.key, k, v)) for k, v in entries]
        self.store.put_many(sealed, max_entries=max_entries, max_bytes=max_bytes)

    def stats(self) -> CacheStats:
        return self.store.stats()

    def clear(self, older_than_s: float | None = None) -> int:
        return self.store.clear(older_than_s)


def local_fleet_key(folder: Path) -> bytes:
    """The fleet key kept in ``folder`` (:data:`KEY_FILE`, mode 0600), made on first use:
    the embedded default's, and any process's on this machine without ``DUET_FLEET_KEY``.

    Raises:
        OSError: the file is a symlink, not this user's, or readable by others.
    """
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(KEY_BYTES))
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd) as found:
        info = os.fstat(found.fileno())
        if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
            raise OSError(f"{path}: the fleet key must be this user's file, mode 0600")
        text = found.read().strip()
    if len(text) < KEY_BYTES:
        raise OSError(f"{path}: not a fleet key (too short)")
    return text.encode()


def open_call_store(client: Any, redis_url: str | None, fleet_key: str | None) -> SealedStore:
    """The model-call cache of a process: the cluster's Redis when it has one (the
    embedded Redis lives only as long as one command: the disk file then), its entries
    tagged under the fleet key."""
    store: CallStore = RedisCallStore(client) if redis_url else DiskCallStore()
    return SealedStore(store, fleet_key)


__all__ = [
    "STORE_ERRORS",
    "SealedStore",
    "local_fleet_key",
    "open_call_store",
    "CallStore",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_ENTRIES",
    "DiskCallStore",
    "RedisCallStore",
    "default_path",
]
