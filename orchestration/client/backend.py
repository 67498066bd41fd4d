"""Which Redis the client API uses: ``DUET_REDIS_URL``, else the embedded default.

The embedded default (an embedded Redis and an in-process worker, for one machine) is
part of the face, ``duet.embedded.local``, which sits above both the client and the workers. It is
found by module name on first use without a cluster, the way ``celery -A`` finds an app,
so the client imports nothing above it and needs no worker code to submit to a cluster.
"""

from __future__ import annotations

import importlib

from orchestration.settings import get_settings

#: The module that starts the embedded default (its ``ensure_backend() -> url``).
EMBEDDED_DEFAULT = "duet.embedded.local"


def ensure_backend() -> str:
    """The Redis URL to use: DUET_REDIS_URL, else the process's embedded default."""
    configured = get_settings().redis_url
    if configured:
        return configured
    url: str = importlib.import_module(EMBEDDED_DEFAULT).ensure_backend()
    return url
