"""``duet cache``: the model-call cache's size and hits, and clearing it: the cluster's
(in its Redis) when DUET_REDIS_URL is set, else the disk file of the embedded default."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

import typer
from rich.table import Table

from duet.commands.support import JsonOpt, connect, emit_json, fails_cleanly, out, plain
from orchestration.core.callcache import parse_ttl
from orchestration.settings import get_settings
from orchestration.state.callcache import CallStore, open_call_store

cache_app = typer.Typer(
    help="The model-call cache (docs/cache.md): stats, clear.",
    epilog="Example: duet cache stats && duet cache clear --older-than 7d",
    no_args_is_help=True,
)


def cache_store() -> CallStore:
    """The cluster's cache when DUET_REDIS_URL is set, else the disk file; its entries
    tagged under the fleet key (``DUET_FLEET_KEY``)."""
    settings = get_settings()
    client = None
    if settings.redis_url:
        connect()
        from orchestration.state import connection

        client = connection.get_redis()
    return open_call_store(client, settings.redis_url, settings.fleet_key_value())


@cache_app.command("stats", epilog="Example: duet cache stats")
@fails_cleanly
def stats(as_json: JsonOpt = False) -> None:
    """Entries, bytes, hits and misses, and the least recently used entry's age."""
    s = cache_store().stats()
    if as_json:
        emit_json(
            {
                "backend": s.backend,
                "where": s.where,
                "entries": s.entries,
                "bytes": s.bytes,
                "hits": s.hits,
                "misses": s.misses,
                "oldest": s.oldest,
            }
        )
        return
    table = Table(title=f"model-call cache ({s.backend}: {s.where})", show_header=False)
    oldest = (
        "-"
        if s.oldest is None
        else dt.datetime.fromtimestamp(s.oldest, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    )
    for name, value in (
        ("entries", s.entries),
        ("bytes", s.bytes),
        ("hits", s.hits),
        ("misses", s.misses),
        ("oldest", oldest),
    ):
        table.add_row(name, str(value))
    out.print(table)


@cache_app.command("clear", epilog="Example: duet cache clear --older-than 7d")
@fails_cleanly
def clear(
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            metavar="TTL",
            help="Only entries written longer ago than this (7d, 12h, 90).",
        ),
    ] = None,
) -> None:
    """Drop cached answers: all, or those older than ``--older-than``."""
    age = parse_ttl(older_than, "--older-than") if older_than is not None else None
    n = cache_store().clear(age)
    out.print(plain(f"cleared {n} cached answer(s)"))
