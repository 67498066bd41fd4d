"""Duet's workers: the Celery app, the four tasks and the model provider adapters.

``celery -A workers worker`` finds :data:`app` here. It is loaded on first use, so a
process that needs only a provider's pure parts (``duet run`` checking a ``sim`` model
name) does not import Celery.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["app", "configure"]


def __getattr__(name: str) -> Any:
    """``app`` and ``configure`` of :mod:`workers.app`, imported on first use.

    ``celery`` is the app too: where :mod:`workers.app` was imported before anyone asked
    for ``workers.app``, that name is the submodule, and Celery's ``-A workers`` then
    looks for ``workers.celery``.
    """
    if name not in (*__all__, "celery"):
        raise AttributeError(f"module 'workers' has no attribute {name!r}")
    module = importlib.import_module("workers.app")
    if name == "celery":
        return module.app
    # Importing the submodule bound ``workers.app`` to it; the app is what is meant.
    globals()["app"] = module.app
    globals()["configure"] = module.configure
    return getattr(module, name)
