"""The bounds of the stdio transport (``agentwake.stdio``): ``StdioLimits`` and its defaults.

Limits (``StdioLimits`` fields; the defaults are the DEFAULT_* constants):

    max_message_bytes    4 MiB  the longest stdout line (one message) kept; longer ones are dropped
    log_preview_chars    200    how much of a bad stdout line a log record shows
    bad_line_logs        1      bad stdout lines (unparsable, oversized, invalid UTF-8) logged per
    bad_line_window_s    60 s   window; the rest are counted and summarised once a window
    stderr_line_chars    2,000  the longest stderr line copied; longer ones are cut and marked
    stderr_lines         100    stderr lines copied per window; the rest are counted and
    stderr_window_s      10 s   summarised in one line
    stdin_close_wait_s   1.5 s  for the server to exit once its stdin closes (the SDK: 2 s)
    terminate_wait_s     0.4 s  from SIGTERM to SIGKILL of its process group (the SDK: 2 s)
    kill_wait_s          2 s    for the exit to be seen after SIGKILL, before abandoning it
    flush_wait_s         0.5 s  for accepted messages to be written before stdin closes
    exit_report_wait_s   0.5 s  after stdout ends, for the exit status, so that the session
                                learns of the closure with ``.exit`` already set
    stderr_drain_wait_s  0.5 s  after the exit, for its last stderr lines to be copied
    server_requests_per_s
                         20/s   requests from the server handed on per second, in bursts of twice
                                that; beyond, the reader waits ([limits] max_server_requests_per_s)
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Final

DEFAULT_MAX_MESSAGE_BYTES: Final = 4 * 1024 * 1024
DEFAULT_LOG_PREVIEW_CHARS: Final = 200
DEFAULT_BAD_LINE_LOGS: Final = 1
DEFAULT_BAD_LINE_WINDOW_S: Final = 60.0
DEFAULT_STDERR_LINE_CHARS: Final = 2_000
DEFAULT_STDERR_LINES: Final = 100
DEFAULT_STDERR_WINDOW_S: Final = 10.0
# Together under the service's 2 s stop grace, leaving room for the SIGKILL and the rest of the stop.
DEFAULT_STDIN_CLOSE_WAIT_S: Final = 1.5
DEFAULT_TERMINATE_WAIT_S: Final = 0.4
DEFAULT_KILL_WAIT_S: Final = 2.0
DEFAULT_FLUSH_WAIT_S: Final = 0.5
DEFAULT_EXIT_REPORT_WAIT_S: Final = 0.5
DEFAULT_STDERR_DRAIN_WAIT_S: Final = 0.5
# As [limits] max_server_requests_per_s's default.
DEFAULT_SERVER_REQUESTS_PER_S: Final = 20.0


@dataclass(frozen=True, slots=True)
class StdioLimits:
    """Every bound the transport applies; see the module docstring."""

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    log_preview_chars: int = DEFAULT_LOG_PREVIEW_CHARS
    bad_line_logs: int = DEFAULT_BAD_LINE_LOGS
    bad_line_window_s: float = DEFAULT_BAD_LINE_WINDOW_S
    stderr_line_chars: int = DEFAULT_STDERR_LINE_CHARS
    stderr_lines: int = DEFAULT_STDERR_LINES
    stderr_window_s: float = DEFAULT_STDERR_WINDOW_S
    stdin_close_wait_s: float = DEFAULT_STDIN_CLOSE_WAIT_S
    terminate_wait_s: float = DEFAULT_TERMINATE_WAIT_S
    kill_wait_s: float = DEFAULT_KILL_WAIT_S
    flush_wait_s: float = DEFAULT_FLUSH_WAIT_S
    exit_report_wait_s: float = DEFAULT_EXIT_REPORT_WAIT_S
    stderr_drain_wait_s: float = DEFAULT_STDERR_DRAIN_WAIT_S
    server_requests_per_s: float = DEFAULT_SERVER_REQUESTS_PER_S

    def __post_init__(self) -> None:
        if not self.server_requests_per_s > 0:
            raise ValueError("server_requests_per_s must be above 0")
        for item in fields(self):
            least = 1 if item.name in ("max_message_bytes", "log_preview_chars", "stderr_line_chars") else 0
            if getattr(self, item.name) < least:
                raise ValueError(f"{item.name} must be at least {least}")
