"""``duet dead``: the broker messages no worker could take (not JSON, no Celery envelope),
kept with the reason in the dead-letter stream instead of ending a worker."""

from __future__ import annotations

import re
from typing import Annotated, Any

import typer
from rich.table import Table

from duet.commands.support import (
    JsonOpt,
    connect,
    emit_json,
    fails_cleanly,
    out,
    plain,
    print_whole,
)
from orchestration.core.errors import ConfigError

dead_app = typer.Typer(
    help="Broker messages no worker could take, with the reason: list, show, purge.",
    epilog="Example: duet dead ls && duet dead show 1733150000000-0 && duet dead purge --all",
    no_args_is_help=True,
)

#: Characters of a message's text ``duet dead ls`` shows.
PREVIEW = 60
#: A letter's id: its stream entry id.
LETTER_ID = re.compile(r"\d+-\d+")


def _client() -> Any:
    """The broker's Redis (where the workers keep dead letters): DUET_BROKER_URL when it
    is a Redis of its own, else the run-state Redis."""
    connect()
    from orchestration.settings import get_settings
    from orchestration.state import connection

    broker = get_settings().broker_url
    if not broker or broker == connection.redis_url():
        return connection.get_redis()
    if not connection.is_redis_url(broker):
        raise ConfigError(
            "DUET_BROKER_URL is not Redis: dead letters are kept by Duet's Redis broker only "
            "(RabbitMQ has its own dead-letter exchanges)"
        )
    return connection.client_for(broker, decode_responses=True, **connection.socket_options())


@dead_app.command("ls", epilog="Example: duet dead ls --limit 20")
@fails_cleanly
def ls(
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many, newest first.")] = 100,
    as_json: JsonOpt = False,
) -> None:
    """The dead letters, newest first: id, queue, reason, and the start of the text."""
    from orchestration.state import deadletters

    client = _client()
    letters = deadletters.newest(client, limit)
    if as_json:
        for d in letters:
            emit_json(_letter_json(d))
        return
    if not letters:
        out.print("no dead letters")
        return
    table = Table(title=f"Dead letters ({deadletters.count(client)})", title_justify="left")
    for column in ("id", "queue", "reason", "size", "text"):
        table.add_column(column, justify="right" if column == "size" else "left")
    for d in letters:
        preview = d.text[:PREVIEW] + ("…" if len(d.text) > PREVIEW else "")
        table.add_row(d.id, plain(d.queue), plain(d.reason), f"{d.size:,}", plain(preview))
    print_whole(table)


@dead_app.command("show", epilog="Example: duet dead show 1733150000000-0")
@fails_cleanly
def show(
    letter_id: Annotated[str, typer.Argument(help="A letter's id, from duet dead ls.")],
    as_json: JsonOpt = False,
) -> None:
    """One dead letter in full: its queue, the reason and the text as it was popped."""
    from orchestration.state import deadletters

    if not LETTER_ID.fullmatch(letter_id):
        raise ConfigError(f"{letter_id!r} is not a dead letter's id (as 1733150000000-0)")
    letter = deadletters.get(_client(), letter_id)
    if letter is None:
        raise ConfigError(f"no dead letter {letter_id!r} (duet dead ls lists them)")
    if as_json:
        emit_json(_letter_json(letter))
        return
    out.print(plain(f"id:     {letter.id}"))
    out.print(plain(f"queue:  {letter.queue}"))
    out.print(plain(f"reason: {letter.reason}"))
    cut = f" (first {len(letter.text):,} of {letter.size:,} characters)"
    out.print(plain(f"text{cut if letter.size > len(letter.text) else ''}:"))
    out.print(plain(letter.text))


@dead_app.command("purge", epilog="Example: duet dead purge 1733150000000-0   (or --all)")
@fails_cleanly
def purge(
    letter_ids: Annotated[
        list[str] | None, typer.Argument(help="Letter ids to delete.", show_default=False)
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="Delete every dead letter.")] = False,
) -> None:
    """Delete dead letters: the ones named, or all of them with --all."""
    from orchestration.state import deadletters

    if bool(letter_ids) == all_:
        raise ConfigError("name the letters to delete, or give --all (not both)")
    bad = [i for i in letter_ids or [] if not LETTER_ID.fullmatch(i)]
    if bad:
        raise ConfigError(f"{bad[0]!r} is not a dead letter's id (as 1733150000000-0)")
    n = deadletters.purge(_client(), None if all_ else list(letter_ids or []))
    out.print(f"deleted {n} dead letter{'s' if n != 1 else ''}")


def _letter_json(letter: Any) -> dict[str, Any]:
    """A dead letter as ``--json`` prints it: its id, queue, reason, size and kept text."""
    return {
        "id": letter.id,
        "queue": letter.queue,
        "reason": letter.reason,
        "size": letter.size,
        "text": letter.text,
    }
