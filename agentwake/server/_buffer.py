"""The emit-only ring buffer: a bounded window of emitted events per event type.

Cursors are ``<epoch>-<seq>``. The epoch is random per process, so after a
restart every old cursor is recognisably stale: the reader gets
``truncated=True`` and a fresh cursor, as the spec asks.
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from agentwake.server._types import Event, utc_now

DEFAULT_BUFFER_MAX_EVENTS: Final = 10_000
DEFAULT_BUFFER_MAX_AGE: Final = timedelta(minutes=10)


@dataclass(frozen=True, slots=True)
class EmitBuffer:
    """How much of each emit-only event type's recent history to keep."""

    max_events: int = DEFAULT_BUFFER_MAX_EVENTS
    max_age: timedelta = DEFAULT_BUFFER_MAX_AGE

    def __post_init__(self) -> None:
        if self.max_events < 1:
            raise ValueError("EmitBuffer.max_events must be at least 1")
        if self.max_age <= timedelta(0):
            raise ValueError("EmitBuffer.max_age must be positive")


@dataclass(slots=True)
class BufferRead:
    events: list[Event]
    position: int
    truncated: bool
    has_more: bool


class RingBuffer:
    """One event type's window. Sequence numbers start at 1; position 0 is "before anything"."""

    def __init__(
        self, limits: EmitBuffer, *, epoch: str | None = None, now: Callable[[], datetime] = utc_now
    ):
        self.limits = limits
        self.epoch = epoch or secrets.token_hex(6)
        self._now = now
        self._items: deque[tuple[int, datetime, Event]] = deque(maxlen=limits.max_events)
        self._head = 0

    @property
    def head(self) -> int:
        return self._head

    def cursor_for(self, position: int) -> str:
        return f"{self.epoch}-{position}"

    def parse_cursor(self, cursor: str) -> int | None:
        """The position a cursor names, or None if it is not one of this process's cursors."""
        epoch, sep, seq = cursor.rpartition("-")
        if not sep or epoch != self.epoch or not (seq.isascii() and seq.isdigit()):
            return None
        position = int(seq)
        return position if position <= self._head else None

    def append(self, event: Event) -> int:
        self._head += 1
        self._items.append((self._head, self._now(), event))
        self._evict()
        return self._head

    def _evict(self) -> None:
        floor = self._now() - self.limits.max_age
        while self._items and self._items[0][1] < floor:
            self._items.popleft()

    def read(
        self,
        position: int,
        max_events: int,
        *,
        not_before: datetime | None = None,
        accept: Callable[[Event], Event | None] = lambda event: event,
    ) -> BufferRead:
        """Events after ``position``, at most ``max_events`` of them after ``accept``.

        ``accept`` applies match and transform; it returns None to skip an event.
        Skipped events still advance the position, so a narrow filter never rereads.
        """
        self._evict()
        oldest = self._items[0][0] if self._items else self._head + 1
        truncated = position < oldest - 1
        out: list[Event] = []
        has_more = False
        for seq, _stored_at, event in self._items:
            if seq <= position:
                continue
            if len(out) >= max_events:
                has_more = True
                break
            position = seq
            if not_before is not None and event.moment < not_before:
                truncated = True
                continue
            shaped = accept(event)
            if shaped is not None:
                out.append(shaped.replace(cursor=self.cursor_for(seq)))
        else:
            position = max(position, self._head)
        return BufferRead(out, position, truncated, has_more)
