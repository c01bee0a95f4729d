"""Copying a server's stderr to ours without letting it flood us or pass its lines off as ours.

Each line is cleaned of control characters (``clean_line``), cut at ``stderr_line_chars``, redacted
and written through the transport's ``write`` (which prefixes the server's name); past
``stderr_lines`` a window the rest are counted and summarised in one line. The stdio transport
(``agentwake.stdio``) runs one copier per server process.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
from anyio.abc import ByteReceiveStream

from agentwake.redaction import redact
from agentwake.stdio_limits import StdioLimits
from agentwake.stdio_lines import (
    UTF8_MAX_BYTES,
    Line,
    LineSplitter,
    Overflow,
    OverflowEnd,
    RateWindow,
    clean_line,
)


class StderrCopier:
    """Copies one server's stderr, line by line, within ``limits``, through ``write``."""

    def __init__(self, limits: StdioLimits, encoding: str, write: Callable[[str], None]) -> None:
        self.limits = limits
        self.encoding = encoding
        self.write = write

    async def run(self, stderr: ByteReceiveStream, done: anyio.Event) -> None:
        """Copies until EOF or until the shutdown closes the pipe; sets ``done`` then."""
        limits = self.limits
        splitter = LineSplitter(limits.stderr_line_chars * UTF8_MAX_BYTES)
        window = RateWindow(limits.stderr_lines, limits.stderr_window_s)
        head = b""
        # Shielded: the pipe must be read while the server shuts down, or a server writing its last
        # words blocks on a full pipe. It ends at EOF, or when the shutdown closes the pipe.
        with anyio.CancelScope(shield=True):
            try:
                async for chunk in stderr:
                    if window.full(anyio.current_time()) and b"\n" in chunk:
                        # Flooded: count the chunk's lines at C speed instead of splitting them.
                        window.drop(chunk.count(b"\n"))
                        events = splitter.restart(chunk[chunk.rindex(b"\n") + 1 :])
                        head = b""
                    else:
                        events = splitter.feed(chunk)
                    for event in events:
                        if isinstance(event, Overflow):
                            head = event.head
                        elif isinstance(event, OverflowEnd):
                            self._copy(window, head, event.size)
                            head = b""
                        else:
                            self._copy(window, event, len(event))
                rest = splitter.finish()
                if isinstance(rest, OverflowEnd):
                    self._copy(window, head, rest.size)
                elif isinstance(rest, Line):
                    self._copy(window, rest, len(rest))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                pass  # closed by our shutdown, or the pipe broke: nothing more to copy
            finally:
                dropped = window.take_dropped()
                if dropped:
                    self.write(self._dropped_note(dropped))
                done.set()

    def _copy(self, window: RateWindow, data: bytes, size: int) -> None:
        allowed, ended = window.admit(anyio.current_time())
        if ended:
            self.write(self._dropped_note(ended))
        if not allowed:
            return
        limit = self.limits.stderr_line_chars
        text = clean_line(data.decode(self.encoding, errors="replace"))
        if size > len(data) or len(text) > limit:
            text = f"{text[:limit]}… [truncated: the line had {size} bytes]"
        # A server's own logs may quote a token: redacted as agentwake's log lines are.
        self.write(redact(text)[0])

    def _dropped_note(self, count: int) -> str:
        per = f"at most {self.limits.stderr_lines} per {self.limits.stderr_window_s:g}s"
        return f"… [{count} stderr lines dropped: {per}]"
