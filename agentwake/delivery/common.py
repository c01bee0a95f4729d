"""What the delivery loops share: the subscription key, their retry pacing and progress cadence."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

from agentwake.config import SubscriptionConfig
from agentwake.store import SubscriptionKey

# A failed request or a dropped stream is tried again after backoff_s(failures, RETRY_INITIAL_S, RETRY_MAX_S).
RETRY_INITIAL_S: Final = 0.5
RETRY_MAX_S: Final = 30.0
# A server's cursor in a log line, at most (it is stored and sent back whole).
CURSOR_SHOWN: Final = 120
# A cursor longer than this is not one: the page is malformed.
MAX_CURSOR_CHARS: Final = 4096
# A long backlog is reported every this many events.
PROGRESS_EVERY: Final = 10_000
# A quiet subscription (no events, the cursor unchanged) writes its "still active" at most this often.
QUIET_WRITE_S: Final = 120.0

Sleep = Callable[[float], Awaitable[None]]


def subscription_key(sub: SubscriptionConfig) -> SubscriptionKey:
    return SubscriptionKey(sub.name, sub.server, sub.event, dict(sub.arguments))


# A subscription whose requests keep failing is shown as stalled after this many failures in a row.
STALLED_AFTER_FAILURES: Final = 3
# A repeated warning (a gap per poll, a refused event per page) is logged at most this often.
SUMMARY_INTERVAL_S: Final = 60.0


@dataclass
class Summary:
    """A warning a peer can make us repeat: logged the first time, then counted and summarised
    at most once per SUMMARY_INTERVAL_S, so a server cannot flood the log."""

    interval_s: float = SUMMARY_INTERVAL_S
    clock: Callable[[], float] = time.monotonic
    _last: float | None = field(default=None, init=False)
    _since: int = field(default=0, init=False)

    def note(self, log: logging.Logger, message: str) -> None:
        now = self.clock()
        if self._last is None or now - self._last >= self.interval_s:
            more = f" ({self._since} more like it since the last report)" if self._since else ""
            log.warning("%s%s", message, more)
            self._last, self._since = now, 0
        else:
            self._since += 1


@dataclass
class QuietWrites:
    """When a batch with nothing new (no event, the same cursor) is worth a store write.

    Such a write only says "still active" (status, last activity); on a thousand quiet
    subscriptions it was most of the idle cost. It is written at most every ``every_s``, and
    always the first time after a start or an error, so an error shown in ``status`` clears
    as soon as delivery works again. A batch with events, a gap or a new cursor always goes.
    """

    every_s: float = QUIET_WRITE_S
    clock: Callable[[], float] = time.monotonic
    _written_at: float | None = None

    def skip(self) -> bool:
        """True: a quiet batch need not be written now."""
        return self._written_at is not None and self.clock() - self._written_at < self.every_s

    def wrote(self) -> None:
        self._written_at = self.clock()

    def failed(self) -> None:
        """An error was recorded: the next batch is written, whatever it holds."""
        self._written_at = None
