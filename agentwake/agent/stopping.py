"""Why a run's task is being cancelled, when it is not the service stopping (a pause with ``--now``):
the worker fills the list in before cancelling, and the run records it as the reason it ended."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Final

STOP_REASON: ContextVar[list[str] | None] = ContextVar("agentwake_stop_reason", default=None)
SERVICE_STOPPED: Final = "the service stopped during the run"


def stop_reason() -> str:
    said = STOP_REASON.get()
    return said[0] if said else SERVICE_STOPPED
