"""A stdio transport for MCP servers that a hostile or broken server cannot take down or flood.

A drop-in for the SDK's ``mcp.client.stdio.stdio_client``: ``bounded_stdio_client(...)`` is an
async context manager yielding ``(read_stream, write_stream)`` for ``mcp.Client`` or
``ClientSession``. It differs where the SDK trusts the server:

* stdout is read as bytes and split into lines here, holding at most ``max_message_bytes`` of one
  line: a longer line is skipped to its newline without being kept, and the session gets an
  ``OversizedMessage`` value on the read stream (as it gets parse errors), so it can count the
  message as lost while the connection goes on; when its first bytes show it answers one of our
  requests, that request gets an error response instead, at once, rather than its timeout;
* each line is decoded leniently (invalid UTF-8 becomes U+FFFD), so one bad byte costs at most
  that line, never the connection;
* a line that is not a JSON-RPC message becomes an exception value on the read stream, as in the
  SDK (an ``UnparsableMessage``, which holds a preview rather than the whole line), but is logged
  without a traceback and rate-limited; blank lines are skipped;
* the server's stderr is copied to ``errlog`` line by line, prefixed with the server's name,
  cleaned of control characters, truncated and rate-limited, so a server can neither flood our
  stderr nor print lines that pass for ours;
* how the server ended (exit code or signal) is logged once and kept in ``.exit``;
* ``claim``, when set, sees each well-formed JSON-RPC notification on the reader's own path,
  synchronously and in wire order, and may consume it: a stream's notification then costs one
  JSON parse (by pydantic-core's parser, the one the SDK's own validation uses, so what parses is
  the same) and no hand-off to the session (whose pydantic models and per-message task switch are
  most of the cost of a fast stream). What it declines goes to the session as before;
* ``pace``, when set, is awaited between reads of stdout: the owner of what ``claim`` consumed
  may hold the reader back, a bounded while, when it is far behind storing it;
* requests the server sends us (``ping``, ``roots/list``, ...; the session answers each) pass at
  most ``server_requests_per_s`` a second, in bursts of twice that: beyond, the reader waits
  before handing the next one on (``agentwake.ratelimit``), so a flood fills the server's pipe
  instead of a core of ours. The wait comes after the line's one parse (which every line gets)
  and before the session's; a request is known by that parse, not by a substring, which an
  escaped key would dodge and an event's ``"id"`` would fake. Notifications and answers are never held;
* ``call`` sends a request of our own beside the session's, under string ids of its own
  (``CALL_ID_PREFIX``; the SDK's are integers), and its answer is taken off the reader's path
  (a substring check, then one JSON parse; an answer of another shape than a plain result gets
  the validation every line gets) instead of going through the session, whose request machinery
  costs most of a quiet poll's round trip. An oversized answer fails its ``call`` at once. It keeps
  the session's contract: the timeout counts from the write, an abandoned request is cancelled
  with ``notifications/cancelled``, an error answer or a closed connection is an ``MCPError``
  with the SDK's codes.

Shutdown is the SDK's sequence: close stdin, wait, SIGTERM the process group, wait, SIGKILL, every
wait bounded and shielded from cancellation so no server process outlives the context. The waits
are shorter than the SDK's (1.5 s and 0.4 s, not 2 s each; an SDK server takes 0.5 to 1 s to exit
on stdin's end): stdin closing and SIGTERM together fit inside the service's 2 s stop grace (``agentwake.service.STOP_GRACE_S``), so a server that ignores
stdin's end but exits on SIGTERM stops cleanly, without the grace running out.

A server must not outlive agentwake either when agentwake itself dies (SIGKILL, OOM kill) and
cannot run that sequence: on Linux it is started through a tiny wrapper (``python -I -S -c``) that
sets ``PR_SET_PDEATHSIG`` to SIGKILL and execs the server in place (same pid, same process group),
so the kernel kills the server when agentwake's process (the thread that spawned it: the event
loop's) dies. A wrapper rather than ``preexec_fn``: anyio's ``open_process`` takes none, and a
``preexec_fn`` runs Python between fork and exec in a process with threads (the store's), which
the subprocess docs warn may deadlock. Neither a reaper process (one more process to keep alive,
and the same question of who kills it) nor a process group watched from outside is needed for the
server itself; the signal reaches the server only, not children it started in its group (those
see their pipes close). The wrapper costs one short interpreter start per spawn (about 20 ms).
Elsewhere than Linux servers are spawned directly.

The module runs about 1,050 lines: the reader, the writer, the requests sent beside the session,
the stderr copier and the bounded shutdown share one process's lifecycle and are easier to check
side by side than split up.

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

import codecs
import errno
import itertools
import logging
import os
import re
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from dataclasses import dataclass, fields
from types import TracebackType
from typing import Any, Final, TextIO

import anyio
import mcp_types
from anyio.abc import AsyncResource, ByteReceiveStream, Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.stdio import StdioServerParameters, get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types import (
    CONNECTION_CLOSED,
    REQUEST_TIMEOUT,
    ErrorData,
    JSONRPCError,
    JSONRPCRequest,
    JSONRPCResponse,
)
from pydantic import ValidationError
from pydantic_core import from_json, to_json

from agentwake.ratelimit import ServerRequestLimit
from agentwake.redaction import redact

logger = logging.getLogger(__name__)

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

_EXIT_POLL_S: Final = 0.01
# UTF-8 needs at most 4 bytes a character: enough bytes of a stderr line to fill its character limit.
_UTF8_MAX_BYTES: Final = 4
# Control characters (C0 but tab, DEL, C1), Unicode line/paragraph separators and bidi overrides:
# what could move the cursor, start a new log line or disguise one.
_UNSAFE: Final = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")

# The transport's look at a notification before the session gets it: True consumes it.
Claim = Callable[[str, Mapping[str, Any] | None], bool]
# Only lines holding this are worth parsing on the claim path: every MCP notification method has it.
_NOTIFICATION_MARK: Final = '"notifications/'
_NOTIFICATION_KEYS: Final = frozenset({"jsonrpc", "method", "params"})

# The ids of ``call``'s requests: strings, so never one of the session's (integers).
CALL_ID_PREFIX: Final = "agentwake-call-"
# Only lines holding this may answer a ``call``.
_CALL_MARK: Final = f'"{CALL_ID_PREFIX}'
_RESULT_KEYS: Final = frozenset({"jsonrpc", "id", "result"})
# The SDK's bound on writing the cancel of an abandoned request (its _ABANDON_WRITE_TIMEOUT).
_CANCEL_WRITE_S: Final = 5.0
# What a ``call`` still waiting gets once the connection has closed: the SDK's own outcome.
_CLOSED: Final = ErrorData(code=CONNECTION_CLOSED, message="Connection closed")

StdioStreams = tuple[
    MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]
]


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


# The start of a JSON-RPC response: an id, and no method before it (a request or notification has one).
_RESPONSE_ID: Final = re.compile(rb'^\s*\{(?:(?!"method")[^{}])*?"id"\s*:\s*(-?\d{1,18}|"[^"\\]{1,256}")')


def answered_request(head: bytes) -> int | str | None:
    """The id of the request an oversized line answers, when its first bytes show it is a response."""
    match = _RESPONSE_ID.match(head[:4096])
    if match is None or b'"method"' in head[: match.end()]:
        return None
    raw = match.group(1)
    return int(raw) if raw[:1] != b'"' else raw[1:-1].decode("utf-8", "replace")


class OversizedMessage(ValueError):
    """A stdout line went over ``max_message_bytes``; it is discarded up to its newline.

    Sent on the read stream in place of the message, as the SDK sends parse errors.
    """

    def __init__(self, size_so_far: int, limit: int) -> None:
        super().__init__(f"message over the {limit}-byte limit ({size_so_far} bytes so far): discarded")
        self.size_so_far = size_so_far
        self.limit = limit


class UnparsableMessage(ValueError):
    """A stdout line that is not a JSON-RPC message; sent on the read stream in its place.

    Carries only a preview, not the line (up to ``max_message_bytes``) as pydantic's error would.
    """

    def __init__(self, reason: str, preview: str) -> None:
        super().__init__(f"not a JSON-RPC message ({reason}): {preview!r}")
        self.reason = reason
        self.preview = preview


@dataclass(frozen=True, slots=True)
class ServerExit:
    """How a server process ended."""

    server: str
    returncode: int
    stopped_by_agentwake: bool = False
    """We sent SIGTERM (then SIGKILL) because it did not exit when its stdin closed."""
    during_shutdown: bool = False
    """It ended while we were closing the connection, not on its own mid-session."""

    @property
    def signal(self) -> str | None:
        """The name of the signal that killed it, if one did."""
        if self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    def describe(self) -> str:
        """``exited with code 3`` or ``was killed by SIGKILL``."""
        name = self.signal
        return f"was killed by {name}" if name else f"exited with code {self.returncode}"

    def __str__(self) -> str:
        return f"server {self.server!r} {self.describe()}"


# ---- line splitting ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Line:
    """A whole line, without its newline, within the limit."""

    data: bytes


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
                    events.append(Line(bytes(self._buffer)))
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
        return self.feed(tail)

    def finish(self) -> Line | OverflowEnd | None:
        """What is left at the end of the stream: an unterminated line, or the end of an overlong one."""
        if self._skipped is not None:
            skipped, self._skipped = self._skipped, None
            return OverflowEnd(skipped)
        if self._buffer:
            rest, self._buffer = bytes(self._buffer), bytearray()
            return Line(rest)
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


# ---- the transport ----------------------------------------------------------------------------


class _Call:
    """A request of ``call``'s waiting for its answer: the result, or the error (the closure's included)."""

    __slots__ = ("answered", "outcome")

    def __init__(self) -> None:
        self.answered = anyio.Event()
        self.outcome: dict[str, Any] | ErrorData = _CLOSED

    def settle(self, outcome: dict[str, Any] | ErrorData) -> None:
        if not self.answered.is_set():
            self.outcome = outcome
            self.answered.set()


class BoundedStdioClient:
    """The transport: an async context manager yielding ``(read_stream, write_stream)``.

    Attributes, once entered: ``pid``; ``exit`` (a ``ServerExit``, None while the process runs).
    The arguments are ``bounded_stdio_client``'s.
    """

    def __init__(
        self,
        params: StdioServerParameters,
        *,
        name: str,
        limits: StdioLimits | None = None,
        errlog: TextIO | None = None,
        on_exit: Callable[[ServerExit], None] | None = None,
        on_lost: Callable[[Exception], None] | None = None,
        claim: Claim | None = None,
        pace: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.params = params
        self.name = name
        self.limits = limits or StdioLimits()
        self.errlog = errlog if errlog is not None else sys.stderr
        self.on_exit = on_exit
        self.on_lost = on_lost
        self.claim = claim
        self.pace = pace
        self.pid: int | None = None
        self.exit: ServerExit | None = None
        self._prefix = f"[{clean_line(name)}] "
        # Decoding never fails on a bad byte: "strict" (the SDK's default) would end the connection.
        self._errors = "ignore" if params.encoding_error_handler == "ignore" else "replace"
        self._utf8 = _is_utf8(params.encoding)
        self._bad_lines = RateWindow(self.limits.bad_line_logs, self.limits.bad_line_window_s)
        self._process: Process | None = None
        self._exited: anyio.Event | None = None
        self._shutting_down = False
        self._escalated = False
        self._cm: AbstractAsyncContextManager[StdioStreams] | None = None
        # ``call``'s requests awaiting an answer, by id; None before the start and after the end.
        self._calls: dict[str, _Call] | None = None
        self._call_ids = itertools.count(1)
        self._write_send: MemoryObjectSendStream[SessionMessage | bytes] | None = None
        self.requests = ServerRequestLimit(name, self.limits.server_requests_per_s)
        # The reader's wait for a request's turn, while it waits: the shutdown cuts it short.
        self._request_wait: anyio.CancelScope | None = None

    async def __aenter__(self) -> StdioStreams:
        if self._cm is not None:
            raise RuntimeError("a BoundedStdioClient can be entered only once")
        self._cm = self._run()
        return await self._cm.__aenter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._cm is not None, "not entered"
        return await self._cm.__aexit__(exc_type, exc, tb)

    async def wait_exit(self) -> ServerExit:
        """Wait until the process has ended (bound it with ``anyio.fail_after``)."""
        assert self._exited is not None, "not entered"
        await self._exited.wait()
        assert self.exit is not None
        return self.exit

    async def call(
        self, method: str, params: Mapping[str, Any] | None, *, timeout_s: float | None
    ) -> dict[str, Any]:
        """Send a request beside the session's and wait for its result, as the SDK's dispatcher would.

        ``params`` go as given (stamp them as the session does first). The id is a string of our own
        (``CALL_ID_PREFIX``), so the session never mistakes the answer for one of its requests; the
        line goes through the session's writer, in order with its messages. Raises ``MCPError`` as the
        SDK's ``send_raw_request`` does: the error a server answered; REQUEST_TIMEOUT once
        ``timeout_s`` has passed since the write (a ``notifications/cancelled`` follows, as it does
        when the caller is cancelled); CONNECTION_CLOSED when the connection ends first, or has.
        """
        calls, write = self._calls, self._write_send
        if calls is None or write is None:
            raise MCPError(code=CONNECTION_CLOSED, message="Connection closed")
        request_id = f"{CALL_ID_PREFIX}{next(self._call_ids)}"
        request: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params:  # as the SDK: no "params" at all rather than empty ones
            request["params"] = params
        line = self._encode(request)
        call = calls[request_id] = _Call()
        written = False
        try:
            await anyio.lowlevel.checkpoint_if_cancelled()
            # From here a cancelled write may still have been delivered: count it as sent, as the SDK does.
            written = True
            try:
                try:
                    write.send_nowait(line)  # to the writer waiting for it: no task switch of ours
                except anyio.WouldBlock:
                    await write.send(line)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                raise MCPError(code=CONNECTION_CLOSED, message="Connection closed") from None
            with anyio.move_on_after(timeout_s) as clock:
                await call.answered.wait()
            if clock.cancelled_caught and not call.answered.is_set():  # an answer just in time counts
                with anyio.move_on_after(_CANCEL_WRITE_S):
                    await self._cancel_call(request_id, f"timed out after {timeout_s}s")
                raise MCPError(code=REQUEST_TIMEOUT, message=f"Request {method!r} timed out")
        except anyio.get_cancelled_exc_class():
            if written:
                with anyio.move_on_after(_CANCEL_WRITE_S, shield=True):
                    await self._cancel_call(request_id, "caller cancelled")
            raise
        finally:
            calls.pop(request_id, None)
        outcome = call.outcome
        if isinstance(outcome, ErrorData):
            raise MCPError(code=outcome.code, message=outcome.message, data=outcome.data)
        return outcome

    async def _cancel_call(self, request_id: str, reason: str) -> None:
        """The courtesy cancel of an abandoned ``call``; dropped when the connection is gone."""
        if self._calls is None or self._write_send is None:
            return
        params = {"requestId": request_id, "reason": reason}
        notice = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}
        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await self._write_send.send(self._encode(notice))

    def _encode(self, message: Mapping[str, Any]) -> bytes:
        """One line of JSON, by the serializer the SDK's models use (pydantic-core's)."""
        data = to_json(message)
        if self._utf8:
            return data + b"\n"
        return (data.decode() + "\n").encode(self.params.encoding, errors=self._errors)

    def _took_result(self, text: str) -> bool:
        """Whether the line is a plain result for one of ``call``'s requests, now handed to it.

        Parsed by pydantic-core's JSON parser, the one the SDK's validation uses; only the plain shape
        is taken here (an object of ``jsonrpc`` "2.0", a string ``id`` and an object ``result``, no
        other member), which the SDK reads as that very response. Anything else (an error answer
        included) is left to the full validation every line gets, and ``_answered_call`` after it.
        """
        try:
            message = from_json(text)
        except ValueError:
            return False
        if type(message) is not dict or message.keys() != _RESULT_KEYS or message["jsonrpc"] != "2.0":
            return False
        result = message["result"]
        return type(result) is dict and self._settle_call(message["id"], result)

    def _answered_call(self, message: object) -> bool:
        """Whether ``message`` answers one of ``call``'s requests; if so, that request has its outcome."""
        if isinstance(message, JSONRPCResponse):
            outcome: dict[str, Any] | ErrorData = message.result
        elif isinstance(message, JSONRPCError):
            outcome = message.error
        else:
            return False
        return self._settle_call(message.id, outcome)

    def _settle_call(self, request_id: object, outcome: dict[str, Any] | ErrorData) -> bool:
        call = self._calls.pop(request_id, None) if self._calls and isinstance(request_id, str) else None
        if call is None:
            return False  # not ours, or late: the session drops it as it drops any unknown answer
        call.settle(outcome)
        return True

    def _end_calls(self) -> None:
        """The connection is over: every ``call`` still waiting gets CONNECTION_CLOSED, and new ones at once."""
        calls, self._calls = self._calls, None
        for call in (calls or {}).values():
            call.settle(_CLOSED)

    @asynccontextmanager
    async def _run(self) -> AsyncIterator[StdioStreams]:
        params = self.params
        self._exited = anyio.Event()
        env = get_default_environment() | (params.env or {})
        process = await anyio.open_process(
            _spawn_command(params.command, list(params.args), env, params.cwd),
            env=env,
            cwd=params.cwd,
            # Its own process group, so the shutdown reaches its children too.
            start_new_session=True,
        )
        # No await from here until the task group is entered: a cancellation in the gap
        # would leak the live process.
        self._process = process
        self.pid = process.pid
        read_send, read_receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        # The session's messages, and ``call``'s lines already serialised: one writer keeps them in order.
        write_send, write_receive = anyio.create_memory_object_stream[SessionMessage | bytes](0)
        self._write_send = write_send
        self._calls = {}
        writer_done = anyio.Event()
        stderr_done = anyio.Event()

        async with anyio.create_task_group() as tg:
            tg.start_soon(self._read_stdout, process, read_send)
            tg.start_soon(self._read_stderr, process, stderr_done)
            tg.start_soon(self._write_stdin, process, write_receive, read_send, writer_done)
            tg.start_soon(self._watch_exit, process)
            try:
                yield read_receive, write_send
            finally:
                self._shutting_down = True
                self._end_calls()
                # Every wait inside is bounded; the shield keeps a cancelled caller from leaking the process.
                with anyio.CancelScope(shield=True):
                    # Unblocks the reader into draining, so a server stuck writing stdout can read stdin.
                    read_receive.close()
                    if self._request_wait is not None:
                        self._request_wait.cancel()
                    write_send.close()
                    with anyio.move_on_after(self.limits.flush_wait_s):
                        await writer_done.wait()
                    try:
                        await self._stop(process, stderr_done)
                    finally:
                        await self._close_pipes(process)
                        for stream in (read_send, read_receive, write_send, write_receive):
                            stream.close()
                        unreported = self._bad_lines.take_dropped()
                        if unreported:
                            self._log_bad_line_summary(unreported)
                tg.cancel_scope.cancel()

    # -- stdout ------------------------------------------------------------------------------

    async def _read_stdout(
        self, process: Process, read_send: MemoryObjectSendStream[SessionMessage | Exception]
    ) -> None:
        assert process.stdout is not None
        stdout = process.stdout
        splitter = LineSplitter(self.limits.max_message_bytes)
        try:
            async with read_send:
                try:
                    async for chunk in stdout:
                        for event in splitter.feed(chunk):
                            item = self._stdout_item(event)
                            if item is None:
                                continue
                            if isinstance(item, Exception):
                                self._notify(self.on_lost, item)  # before any later line is sent
                            elif isinstance(item.message, JSONRPCRequest):
                                await self._request_turn()
                            try:
                                await read_send.send(item)
                            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                                return  # the session is gone; only the drain below remains
                        # A chunk of claimed lines sends nothing, and a read of buffered bytes does
                        # not yield: let the tasks consuming them run between chunks.
                        await anyio.lowlevel.checkpoint()
                        if self.pace is not None:
                            await self.pace()
                    # Whatever follows the last newline is dropped, as the SDK does.
                    # stdout ended: give the exit a moment to be seen, so the session learns of the
                    # closure with .exit already set.
                    with anyio.move_on_after(self.limits.exit_report_wait_s):
                        assert self._exited is not None
                        await self._exited.wait()
                    self._record_exit()
                finally:
                    # Nothing more will be read: what still waits for an answer learns it now, as the
                    # session does when the read stream ends.
                    self._end_calls()
                    await _drain(stdout)
        except anyio.ClosedResourceError:
            pass  # our shutdown closed stdout under the read
        except (anyio.BrokenResourceError, OSError) as exc:
            if not self._shutting_down:
                logger.warning("server %r: reading stdout failed: %s: %s", self.name, type(exc).__name__, exc)

    async def _request_turn(self) -> None:
        """Waits, past the server's request rate, before its next request goes on (back-pressure)."""
        delay = self.requests.delay()
        if delay > 0:
            with anyio.CancelScope() as scope:
                self._request_wait = scope
                try:
                    if not self._shutting_down:
                        await anyio.sleep(delay)
                finally:
                    self._request_wait = None

    def _stdout_item(self, event: Line | Overflow | OverflowEnd) -> SessionMessage | Exception | None:
        """What the session gets for one splitter event, if anything."""
        limits = self.limits
        if isinstance(event, Overflow):
            self._report_bad_line(
                f"a line over the {limits.max_message_bytes}-byte message limit (dropped)",
                event.head[: limits.log_preview_chars * _UTF8_MAX_BYTES],
            )
            request_id = answered_request(event.head)
            if request_id is not None:
                # The answer to one of our requests: fail that request now, with the reason, rather
                # than let it wait out its timeout. Nothing of a stream was lost.
                error = ErrorData(
                    code=mcp_types.INTERNAL_ERROR,
                    message=(
                        f"the server's answer is over the {limits.max_message_bytes}-byte message limit"
                        " ([limits] max_message_bytes) and was dropped"
                    ),
                )
                if self._settle_call(request_id, error):
                    return None
                return SessionMessage(JSONRPCError(jsonrpc="2.0", id=request_id, error=error))
            return OversizedMessage(event.size, limits.max_message_bytes)
        if isinstance(event, OverflowEnd):
            return None  # reported at its Overflow
        data = event.data
        if not data.strip():
            return None  # a blank line carries no message
        try:
            text = data.decode(self.params.encoding)
            replaced = False
        except UnicodeDecodeError:
            text = data.decode(self.params.encoding, errors=self._errors)
            replaced = True
        if (self.claim is not None and _NOTIFICATION_MARK in text and self._claimed(text)) or (
            self._calls and _CALL_MARK in text and self._took_result(text)
        ):
            if replaced:
                self._report_bad_line("invalid UTF-8 (replaced with U+FFFD, message kept)", data)
            return None
        try:
            message = mcp_types.jsonrpc_message_adapter.validate_json(text, by_name=False)
        except ValueError as exc:
            what = "a line that is not a JSON-RPC message"
            self._report_bad_line(f"{what}{' (and invalid UTF-8)' if replaced else ''}", data)
            return UnparsableMessage(_reason(exc), text[: self.limits.log_preview_chars])
        if replaced:
            self._report_bad_line("invalid UTF-8 (replaced with U+FFFD, message kept)", data)
        if self._calls and _CALL_MARK in text and self._answered_call(message):
            return None
        return SessionMessage(message)

    def _claimed(self, text: str) -> bool:
        """Whether ``claim`` consumed the line, read as a notification exactly when the session would.

        The line is parsed by the JSON parser the SDK's validation uses (pydantic-core's), and only
        a plain notification is offered (an object of ``jsonrpc`` "2.0", a string ``method``,
        ``params`` an object, null or absent, no other member): the SDK reads one the very same way,
        so what ``claim`` sees is what the session's own intercept would have. Anything else,
        unparsable lines included, is left to the session's path, unchanged.
        """
        try:
            message = from_json(text)
        except ValueError:
            return False
        if (
            type(message) is not dict
            or message.get("jsonrpc") != "2.0"
            or not message.keys() <= _NOTIFICATION_KEYS
        ):
            return False
        method = message.get("method")
        params = message.get("params")
        if type(method) is not str or not (params is None or type(params) is dict):
            return False
        assert self.claim is not None
        try:
            return bool(self.claim(method, params))
        except Exception:
            # As the SDK contains its own intercept's failure: this notification goes on to the session.
            logger.exception("server %r: the notification claim raised; passing %r on", self.name, method)
            return False

    def _report_bad_line(self, what: str, data: bytes) -> None:
        """Logs a bad stdout line without a traceback, at most ``bad_line_logs`` per window."""
        allowed, ended = self._bad_lines.admit(anyio.current_time())
        if ended:
            self._log_bad_line_summary(ended)
        if allowed:
            preview = data[: self.limits.log_preview_chars * _UTF8_MAX_BYTES].decode(
                self.params.encoding, errors="replace"
            )[: self.limits.log_preview_chars]
            logger.warning("server %r sent %s: %r", self.name, what, preview)

    def _log_bad_line_summary(self, count: int) -> None:
        limits = self.limits
        what = "bad stdout lines (unparsable, oversized or invalid UTF-8)"
        per = f"at most {limits.bad_line_logs} per {limits.bad_line_window_s:g}s"
        logger.warning("server %r: %d more %s not logged (%s)", self.name, count, what, per)

    # -- stderr ------------------------------------------------------------------------------

    async def _read_stderr(self, process: Process, done: anyio.Event) -> None:
        assert process.stderr is not None
        limits = self.limits
        splitter = LineSplitter(limits.stderr_line_chars * _UTF8_MAX_BYTES)
        window = RateWindow(limits.stderr_lines, limits.stderr_window_s)
        head = b""
        # Shielded: the pipe must be read while the server shuts down, or a server writing its last
        # words blocks on a full pipe. It ends at EOF, or when the shutdown closes the pipe.
        with anyio.CancelScope(shield=True):
            try:
                async for chunk in process.stderr:
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
                            self._copy_stderr(window, head, event.size)
                            head = b""
                        else:
                            self._copy_stderr(window, event.data, len(event.data))
                rest = splitter.finish()
                if isinstance(rest, OverflowEnd):
                    self._copy_stderr(window, head, rest.size)
                elif isinstance(rest, Line):
                    self._copy_stderr(window, rest.data, len(rest.data))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                pass  # closed by our shutdown, or the pipe broke: nothing more to copy
            finally:
                dropped = window.take_dropped()
                if dropped:
                    self._write_errlog(self._dropped_note(dropped))
                done.set()

    def _copy_stderr(self, window: RateWindow, data: bytes, size: int) -> None:
        allowed, ended = window.admit(anyio.current_time())
        if ended:
            self._write_errlog(self._dropped_note(ended))
        if not allowed:
            return
        limit = self.limits.stderr_line_chars
        text = clean_line(data.decode(self.params.encoding, errors="replace"))
        if size > len(data) or len(text) > limit:
            text = f"{text[:limit]}… [truncated: the line had {size} bytes]"
        # A server's own logs may quote a token: redacted as agentwake's log lines are.
        self._write_errlog(redact(text)[0])

    def _dropped_note(self, count: int) -> str:
        per = f"at most {self.limits.stderr_lines} per {self.limits.stderr_window_s:g}s"
        return f"… [{count} stderr lines dropped: {per}]"

    def _write_errlog(self, text: str) -> None:
        # A closed or broken errlog must not take the connection down.
        with suppress(OSError, ValueError):
            self.errlog.write(f"{self._prefix}{text}\n")
            self.errlog.flush()

    # -- stdin -------------------------------------------------------------------------------

    async def _write_stdin(
        self,
        process: Process,
        write_receive: MemoryObjectReceiveStream[SessionMessage | bytes],
        read_send: MemoryObjectSendStream[SessionMessage | Exception],
        done: anyio.Event,
    ) -> None:
        assert process.stdin is not None
        try:
            async with write_receive:
                async for item in write_receive:
                    if isinstance(item, bytes):
                        await process.stdin.send(item)  # a line of ``call``'s, encoded already
                        continue
                    json = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((json + "\n").encode(self.params.encoding, errors=self._errors))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            # The server may still be alive: end the read stream so no request waits forever.
            self._end_calls()
            await read_send.aclose()
        finally:
            done.set()

    # -- process -----------------------------------------------------------------------------

    async def _watch_exit(self, process: Process) -> None:
        # Reports an exit mid-session at once (where wait() also waits for the pipes, a bit later).
        await process.wait()
        self._record_exit()

    def _record_exit(self) -> None:
        """Logs and keeps how the process ended, once, as soon as it is known."""
        process = self._process
        if self.exit is not None or process is None or process.returncode is None:
            return
        self.exit = ServerExit(
            self.name,
            process.returncode,
            stopped_by_agentwake=self._escalated,
            during_shutdown=self._shutting_down,
        )
        if self._escalated:
            logger.warning("%s: it did not exit when its stdin closed", self.exit)
        elif self._shutting_down and process.returncode == 0:
            logger.info("%s", self.exit)
        else:
            logger.warning("%s", self.exit)
        assert self._exited is not None
        self._exited.set()
        self._notify(self.on_exit, self.exit)

    def _notify(self, callback: Callable[[Any], None] | None, value: object) -> None:
        """Runs a caller's callback: one that raises must not end the connection."""
        if callback is not None:
            try:
                callback(value)
            except Exception:
                logger.exception("server %r: a transport callback failed", self.name)

    async def _stop(self, process: Process, stderr_done: anyio.Event) -> None:
        """Closes stdin, waits, then terminates the process group; the SDK's sequence."""
        limits = self.limits
        await _close_quietly(process.stdin)
        if not await _wait_for_exit(process, limits.stdin_close_wait_s):
            self._escalated = True
            await _terminate_tree(process, limits.terminate_wait_s)
            if not await _wait_for_exit(process, limits.kill_wait_s):
                logger.warning(
                    "server %r (pid %d) is still alive after SIGKILL; abandoning it", self.name, process.pid
                )
        self._record_exit()
        if process.returncode is not None:
            # Let its last stderr lines (a traceback, say) reach errlog before the pipe closes.
            with anyio.move_on_after(limits.stderr_drain_wait_s):
                await stderr_done.wait()

    async def _close_pipes(self, process: Process) -> None:
        if process.returncode is not None:
            # Also closes the pipe transports (no ResourceWarning later); returns at once once exited.
            with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                await process.aclose()
        else:
            for pipe in (process.stdin, process.stdout, process.stderr):
                await _close_quietly(pipe)


def bounded_stdio_client(
    params: StdioServerParameters,
    *,
    name: str,
    limits: StdioLimits | None = None,
    errlog: TextIO | None = None,
    on_exit: Callable[[ServerExit], None] | None = None,
    on_lost: Callable[[Exception], None] | None = None,
    claim: Claim | None = None,
    pace: Callable[[], Awaitable[None]] | None = None,
) -> BoundedStdioClient:
    """Spawns an MCP server and connects over stdio within ``limits``: a drop-in for ``stdio_client``.

    ``name`` prefixes its stderr lines and names it in logs; ``errlog`` (default ``sys.stderr``) is any
    text stream; ``on_exit`` is called once with how the process ended; ``on_lost`` with each line lost
    (``OversizedMessage``, ``UnparsableMessage``), synchronously and in wire order: before any later
    message reaches the session, which the exception values on the read stream do not promise (the
    session hands them to ``message_handler`` in a task of their own); ``claim`` with each well-formed
    notification, in wire order on the same path, consuming it when it returns True (it may be asked
    again by the session when it returns False: declining must have no side effect); ``pace`` is
    awaited between reads of stdout. Entering raises OSError when the server cannot be spawned, as
    ``stdio_client`` does.
    """
    return BoundedStdioClient(
        params,
        name=name,
        limits=limits,
        errlog=errlog,
        on_exit=on_exit,
        on_lost=on_lost,
        claim=claim,
        pace=pace,
    )


def _is_utf8(encoding: str) -> bool:
    try:
        return codecs.lookup(encoding).name == "utf-8"
    except LookupError:
        return False


def _reason(exc: ValueError) -> str:
    """Why a line did not parse, in a few words and without the line itself."""
    if isinstance(exc, ValidationError) and exc.error_count():
        return str(exc.errors(include_url=False, include_input=False)[0]["msg"])
    return str(exc)[:DEFAULT_LOG_PREVIEW_CHARS]


async def _drain(stream: ByteReceiveStream) -> None:
    """Discards the rest of stdout until EOF or until the shutdown closes it, so a server
    flushing output can still exit; shielded."""
    with (
        anyio.CancelScope(shield=True),
        suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError),
    ):
        while True:
            await stream.receive()


async def _close_quietly(stream: AsyncResource | None) -> None:
    if stream is not None:
        with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await stream.aclose()


async def _wait_for_exit(process: Process, within_s: float) -> bool:
    """Whether the process died within ``within_s``, polling its returncode.

    Not ``process.wait()``: on some anyio/asyncio versions it also waits for the pipes to
    close, and a child holding them would make an exited server look hung.
    """
    with anyio.move_on_after(within_s):
        while process.returncode is None:  # noqa: ASYNC110 - no event fires on exit alone everywhere
            await anyio.sleep(_EXIT_POLL_S)
        return True
    return False


# Run by ``python -I -S -c``: argv is [-c, parent pid, program path, argv[0], args...]. 1 is
# PR_SET_PDEATHSIG; the parent check closes the race of a parent that died before the prctl.
_PDEATHSIG_WRAPPER: Final = """\
import ctypes, os, signal, sys
if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0) != 0:
    sys.stderr.write("agentwake: prctl(PR_SET_PDEATHSIG) failed\\n")
    os._exit(127)
if os.getppid() != int(sys.argv[1]):
    os._exit(1)
try:
    os.execv(sys.argv[2], sys.argv[3:])
except OSError as exc:
    sys.stderr.write(f"agentwake: cannot run {sys.argv[2]}: {exc.strerror}\\n")
    os._exit(127)
"""


def _spawn_command(command: str, args: list[str], env: Mapping[str, str], cwd: Any) -> list[str]:
    """What to spawn for ``command args``: on Linux the PR_SET_PDEATHSIG wrapper around it, so the
    server dies with this process (see the module docstring); elsewhere the command itself.

    The program is looked up here, on the server's PATH and relative to its ``cwd``, so that a
    missing or non-executable one still raises (FileNotFoundError, PermissionError) at spawn, as
    without the wrapper, rather than becoming an exit code.
    """
    if sys.platform != "linux" or not sys.executable or not command:
        return [command, *args]
    if os.sep in command:
        program = os.path.join(os.fspath(cwd), command) if cwd is not None else command
        if not os.path.exists(program):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)
        if os.path.isdir(program) or not os.access(program, os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), command)
    else:
        found = shutil.which(command, path=env.get("PATH", os.defpath))
        if found is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)
        program = found
    # Absolute: the wrapper runs in ``cwd``, and a relative ``cwd`` is itself taken from here.
    program = os.path.abspath(program)
    return [sys.executable, "-I", "-S", "-c", _PDEATHSIG_WRAPPER, str(os.getpid()), program, command, *args]


async def _terminate_tree(process: Process, terminate_wait_s: float) -> None:
    """SIGTERM the process group, SIGKILL what is left after ``terminate_wait_s``."""
    if sys.platform == "win32":  # pragma: no cover - agentwake runs servers on POSIX
        process.kill()
    else:
        await terminate_posix_process_tree(process, terminate_wait_s)
