"""Reading a server's untrusted output line by line, within bounds.

``LineSplitter`` splits a byte stream on newlines holding at most a limit of one line (the rest of
an overlong line is counted, never kept); ``RateWindow`` lets through at most so many events a
window and counts the rest; ``clean_line`` strips what could pass a server's line off as ours;
``answered_request`` tells, from the first bytes of an oversized line, which request it answers.
The stdio transport (``agentwake.stdio``) reads stdout and stderr with them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, TypeAlias

# pydantic-core's string cache for parsing a line: keys only. A stream's keys repeat on every line,
# its values (ids, titles) rarely do, and caching those costs more than it saves (a third slower
# on a backlog's event lines). Parsing is the same either way: only which str objects come back.
JSON_CACHE_STRINGS: Final = "keys"
# UTF-8 needs at most 4 bytes a character: enough bytes of a stderr line to fill its character limit.
UTF8_MAX_BYTES: Final = 4
# Control characters (C0 but tab, DEL, C1), Unicode line/paragraph separators and bidi overrides:
# what could move the cursor, start a new log line or disguise one.
_UNSAFE: Final = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")

# The start of a JSON-RPC response: an id, and no method before it (a request or notification has one).
_RESPONSE_ID: Final = re.compile(rb'^\s*\{(?:(?!"method")[^{}])*?"id"\s*:\s*(-?\d{1,18}|"[^"\\]{1,256}")')


def answered_request(head: bytes) -> int | str | None:
    """The id of the request an oversized line answers, when its first bytes show it is a response."""
    match = _RESPONSE_ID.match(head[:4096])
    if match is None or b'"method"' in head[: match.end()]:
        return None
    raw = match.group(1)
    return int(raw) if raw[:1] != b'"' else raw[1:-1].decode("utf-8", "replace")


# A whole line within the limit, without its newline: the bytes themselves. One is made per line
# read, and an object around them would cost more than the split (and the collector's attention).
Line: TypeAlias = bytes


@dataclass(frozen=True, slots=True)
class Overflow:
    """A line has just gone over the limit: its first ``limit`` bytes, and its size so far."""

    head: bytes
    size: int


@dataclass(frozen=True, slots=True)
class OverflowEnd:
    """The newline (or end of stream) closing an overlong line, and the line's full size."""

    size: int


class LineSplitter:
    """Splits a byte stream on ``\\n``, holding at most ``limit`` bytes of a line: the rest of an
    overlong line is only counted, never kept, so memory stays bounded whatever the stream holds."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self._buffer = bytearray()
        self._skipped: int | None = None  # size of the overlong line being skipped

    def feed(self, chunk: bytes) -> list[Line | Overflow | OverflowEnd]:
        first = chunk.find(b"\n")
        last = chunk.rfind(b"\n")
        if first == last:
            return self._feed(chunk)
        # The lines between the chunk's first and last newline are whole: split at C speed. What
        # comes before the first completes the line in progress; what follows the last begins one.
        events = self._feed(chunk[: first + 1])
        limit = self.limit
        for line in chunk[first + 1 : last].split(b"\n"):
            if len(line) <= limit:
                events.append(line)
            else:
                events.append(Overflow(line[:limit], len(line)))
                events.append(OverflowEnd(len(line)))
        if last + 1 < len(chunk):
            events.extend(self._feed(chunk[last + 1 :]))
        return events

    def _feed(self, chunk: bytes) -> list[Line | Overflow | OverflowEnd]:
        events: list[Line | Overflow | OverflowEnd] = []
        start, size = 0, len(chunk)
        while start < size:
            newline = chunk.find(b"\n", start)
            stop = size if newline < 0 else newline
            if self._skipped is not None:
                self._skipped += stop - start
                if newline >= 0:
                    events.append(OverflowEnd(self._skipped))
                    self._skipped = None
            elif len(self._buffer) + stop - start > self.limit:
                seen = len(self._buffer) + stop - start
                room = self.limit - len(self._buffer)
                events.append(Overflow(bytes(self._buffer) + chunk[start : start + room], seen))
                self._buffer = bytearray()  # a new one: clear() could keep the large allocation
                if newline >= 0:
                    events.append(OverflowEnd(seen))
                else:
                    self._skipped = seen
            else:
                self._buffer += chunk[start:stop]
                if newline >= 0:
                    events.append(bytes(self._buffer))
                    self._buffer = bytearray()
            if newline < 0:
                break
            start = newline + 1
        return events

    def restart(self, tail: bytes) -> list[Line | Overflow | OverflowEnd]:
        """Forgets the line in progress, starting the next with ``tail`` (no newline in it): for a
        reader that counted a chunk's lines without splitting them."""
        self._buffer = bytearray()
        self._skipped = None
        return self._feed(tail)

    def finish(self) -> Line | OverflowEnd | None:
        """What is left at the end of the stream: an unterminated line, or the end of an overlong one."""
        if self._skipped is not None:
            skipped, self._skipped = self._skipped, None
            return OverflowEnd(skipped)
        if self._buffer:
            rest, self._buffer = bytes(self._buffer), bytearray()
            return rest
        return None


class RateWindow:
    """At most ``limit`` events per fixed window of ``period`` seconds; the rest are counted."""

    def __init__(self, limit: int, period: float) -> None:
        self.limit = limit
        self.period = period
        self._start: float | None = None
        self._count = 0
        self._dropped = 0

    def admit(self, now: float) -> tuple[bool, int]:
        """Whether to let this event through, and how many the window that just ended dropped (to report)."""
        ended = 0
        if self._start is None or now - self._start >= self.period:
            ended, self._dropped = self._dropped, 0
            self._start, self._count = now, 0
        if self._count < self.limit:
            self._count += 1
            return True, ended
        self._dropped += 1
        return False, ended

    def full(self, now: float) -> bool:
        """Whether every event until the window ends will be dropped."""
        return self._start is not None and now - self._start < self.period and self._count >= self.limit

    def drop(self, count: int) -> None:
        """Counts ``count`` events as dropped without looking at them (the window being full)."""
        self._dropped += count

    def take_dropped(self) -> int:
        """The events dropped and not yet reported (at the end of the stream)."""
        dropped, self._dropped = self._dropped, 0
        return dropped


def clean_line(text: str) -> str:
    """``text`` without control characters (tab excepted), line separators or bidi overrides."""
    return _UNSAFE.sub("", text)
