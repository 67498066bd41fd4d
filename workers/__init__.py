"""Duet's workers: the Celery app, the four tasks and the model provider adapters.

``celery -A workers worker`` finds :data:`app` here.
"""

from workers.app import app, configure

__all__ = ["app", "configure"]
