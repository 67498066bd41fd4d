"""The one error a tool raises on purpose: its message is the tool result the model sees."""

from __future__ import annotations

from orchestration.core.errors import DuetError


class ToolError(DuetError):
    """A tool refused or failed; ``str(error)`` is a short message for the model, no traceback."""
