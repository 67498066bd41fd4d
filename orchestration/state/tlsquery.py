"""redis-py's TLS arguments as a URL's query spells them (``?ssl_ca_certs=...``), for
``rediss://`` and TLS Sentinel URLs alike: read, checked, and given to redis-py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: redis-py's TLS arguments a URL may give in its query (file paths and checks; a key
#: file's password is not taken from a URL).
TLS_QUERY = (
    "ssl_ca_certs",
    "ssl_ca_path",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_cert_reqs",
    "ssl_check_hostname",
)
#: The files among them, which must exist for a connection to be made.
TLS_FILES = ("ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile")
#: ``ssl_cert_reqs`` values redis-py reads (``required`` unless given).
CERT_REQS = ("required", "optional", "none")
_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def problem(name: str, value: str) -> str | None:
    """Why ``name=value`` is no TLS argument redis-py would take; None when it is one."""
    if name not in TLS_QUERY:
        return f"parameter {name!r} is not one Duet reads (only {', '.join(TLS_QUERY)})"
    if name == "ssl_cert_reqs" and value.lower() not in CERT_REQS:
        return f"ssl_cert_reqs={value!r}: use {', '.join(CERT_REQS)}"
    if name == "ssl_check_hostname" and value.lower() not in _BOOLS:
        return f"ssl_check_hostname={value!r}: use true or false"
    if name in TLS_FILES and not value:
        return f"{name} is empty: give a file path"
    return None


def client_kwargs(options: Mapping[str, str]) -> dict[str, Any]:
    """``options`` (the query's strings) as redis-py's ``SSLConnection`` takes them:
    ``ssl_check_hostname`` a bool (the string ``"false"`` would be true)."""
    kwargs: dict[str, Any] = dict(options)
    if "ssl_check_hostname" in kwargs:
        kwargs["ssl_check_hostname"] = _BOOLS[str(kwargs["ssl_check_hostname"]).lower()]
    return kwargs
