"""``duet flower``: Flower, the Celery dashboard, for the fleet in DUET_REDIS_URL, on
loopback unless told otherwise and never with a missing or placeholder login (Flower can
revoke tasks and shut workers down)."""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import sys
from typing import Annotated

import typer

from duet.commands.app import app
from duet.commands.support import fails_cleanly, note
from orchestration.core.errors import ConfigError

#: Passwords that are examples, never secrets (compared without case).
PLACEHOLDERS = frozenset(
    {"change-me", "changeme", "change_me", "password", "secret", "admin", "flower", "example"}
)
#: The shortest password accepted, characters.
MIN_PASSWORD = 12


def check_logins(value: str) -> None:
    """Refuse a ``FLOWER_BASIC_AUTH`` (``user:password``, comma-separated) that is empty or
    holds a placeholder or short password, naming the variable but never the password."""
    if not value.strip():
        raise ConfigError(
            "FLOWER_BASIC_AUTH is not set: give Flower a login (user:password), or set "
            "FLOWER_AUTH for OAuth"
        )
    for login in value.split(","):
        user, sep, password = login.partition(":")
        if not sep or not user.strip():
            raise ConfigError("FLOWER_BASIC_AUTH: expected user:password[,user:password...]")
        if password.strip().lower() in PLACEHOLDERS or len(password) < MIN_PASSWORD:
            raise ConfigError(
                f"FLOWER_BASIC_AUTH: the password of {user.strip()!r} is a placeholder or "
                f"shorter than {MIN_PASSWORD} characters: set a real one"
            )


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


@app.command(epilog="Example: FLOWER_BASIC_AUTH=ops:$(cat flower-password) duet flower")
@fails_cleanly
def flower(
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to serve on.")] = 5555,
    address: Annotated[
        str,
        typer.Option(
            "--address",
            help="Address to listen on: loopback by default; 0.0.0.0 inside a container "
            "whose port only its host reaches.",
        ),
    ] = "127.0.0.1",
) -> None:
    """Start Flower for the cluster in DUET_REDIS_URL, with the login in FLOWER_BASIC_AUTH
    (user:password; or Flower's OAuth in FLOWER_AUTH). A placeholder password is refused."""
    if importlib.util.find_spec("flower") is None:
        from workers.providers.sdk import install_hint

        raise ConfigError("Flower is not installed here: " + install_hint("flower"))
    if not os.environ.get("FLOWER_AUTH"):
        check_logins(os.environ.get("FLOWER_BASIC_AUTH", ""))
    if not _loopback(address):
        note(f"Flower listens on {address}: reachable beyond this machine")
    argv = [sys.executable, "-m", "celery", "-A", "workers", "flower"]
    argv += [f"--port={port}", f"--address={address}"]
    sys.stdout.flush()
    os.execv(sys.executable, argv)  # Flower becomes this process: signals reach it
