"""Is the service healthy: what ``/healthz`` answers, fed by the service as it runs.

The service owns one ``Health``: its heartbeat loop reports each store write (a write
probe the service makes anyway, every HEARTBEAT_S, so a probe of ``/healthz`` costs the
store nothing), and its stop path sets ``stopping`` as soon as a stop signal arrives. A
heartbeat that fails, or that has not succeeded for ``STALE_BEATS`` intervals (a write
that hangs), makes the service unhealthy until the next one succeeds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import anyio

# Heartbeat intervals without a successful store write before the store counts as unwritable.
STALE_BEATS: Final = 3


@dataclass
class Health:
    """The service's health as ``/healthz`` reports it; ``problem()`` is None while healthy."""

    heartbeat_s: float
    stopping: bool = False
    clock: Callable[[], float] = anyio.current_time
    _store_error: str | None = field(default=None, init=False)
    _last_write: float | None = field(default=None, init=False)

    def store_written(self) -> None:
        """A store write (the service record or a heartbeat) succeeded just now."""
        self._store_error = None
        self._last_write = self.clock()

    def store_failed(self, error: str) -> None:
        self._store_error = error

    def problem(self) -> str | None:
        """Why the service is not healthy, in one line; None when it is."""
        if self.stopping:
            return "stopping"
        if self._store_error is not None:
            return f"the store cannot be written: {self._store_error}"
        if self._last_write is not None:
            silent_s = self.clock() - self._last_write
            if silent_s > STALE_BEATS * self.heartbeat_s:
                return f"no store write succeeded for {silent_s:.0f}s"
        return None


__all__ = ["STALE_BEATS", "Health"]
