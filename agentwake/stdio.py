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

Shutdown is the SDK's sequence, with shorter waits: close stdin, wait, SIGTERM the process group,
wait, SIGKILL, every wait bounded and shielded from cancellation so no server process outlives the
context; on Linux the server is also spawned so that it dies with agentwake
(``agentwake.stdio_process`` says how and why).

The transport's other jobs are modules of their own, which this one uses and re-exports:
``agentwake.stdio_limits`` (``StdioLimits``: every bound, and its default), ``agentwake.stdio_lines``
(bounded line splitting, rate windows, cleaning what a server writes), ``agentwake.stdio_calls``
(the requests sent beside the session), ``agentwake.stdio_stderr`` (the stderr copier) and
``agentwake.stdio_process`` (spawning, ``ServerExit``, the steps of the bounded stop). What stays
here shares the connection's state: the reader, the writer and the order of the shutdown.
"""

from __future__ import annotations

import codecs
import itertools
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from types import TracebackType
from typing import Any, Final, TextIO

import anyio
import mcp_types
from anyio.abc import ByteReceiveStream, Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.stdio import StdioServerParameters, get_default_environment
from mcp.shared.message import SessionMessage
from mcp_types import ErrorData, JSONRPCError, JSONRPCRequest
from pydantic import ValidationError
from pydantic_core import from_json

from agentwake.ratelimit import ServerRequestLimit
from agentwake.stdio_calls import CALL_ID_PREFIX as CALL_ID_PREFIX
from agentwake.stdio_calls import CALL_MARK, CallsBesideSession
from agentwake.stdio_limits import DEFAULT_BAD_LINE_LOGS as DEFAULT_BAD_LINE_LOGS
from agentwake.stdio_limits import DEFAULT_BAD_LINE_WINDOW_S as DEFAULT_BAD_LINE_WINDOW_S
from agentwake.stdio_limits import DEFAULT_EXIT_REPORT_WAIT_S as DEFAULT_EXIT_REPORT_WAIT_S
from agentwake.stdio_limits import DEFAULT_FLUSH_WAIT_S as DEFAULT_FLUSH_WAIT_S
from agentwake.stdio_limits import DEFAULT_KILL_WAIT_S as DEFAULT_KILL_WAIT_S
from agentwake.stdio_limits import DEFAULT_LOG_PREVIEW_CHARS as DEFAULT_LOG_PREVIEW_CHARS
from agentwake.stdio_limits import DEFAULT_MAX_MESSAGE_BYTES as DEFAULT_MAX_MESSAGE_BYTES
from agentwake.stdio_limits import DEFAULT_SERVER_REQUESTS_PER_S as DEFAULT_SERVER_REQUESTS_PER_S
from agentwake.stdio_limits import DEFAULT_STDERR_DRAIN_WAIT_S as DEFAULT_STDERR_DRAIN_WAIT_S
from agentwake.stdio_limits import DEFAULT_STDERR_LINE_CHARS as DEFAULT_STDERR_LINE_CHARS
from agentwake.stdio_limits import DEFAULT_STDERR_LINES as DEFAULT_STDERR_LINES
from agentwake.stdio_limits import DEFAULT_STDERR_WINDOW_S as DEFAULT_STDERR_WINDOW_S
from agentwake.stdio_limits import DEFAULT_STDIN_CLOSE_WAIT_S as DEFAULT_STDIN_CLOSE_WAIT_S
from agentwake.stdio_limits import DEFAULT_TERMINATE_WAIT_S as DEFAULT_TERMINATE_WAIT_S
from agentwake.stdio_limits import StdioLimits as StdioLimits
from agentwake.stdio_lines import JSON_CACHE_STRINGS, UTF8_MAX_BYTES, answered_request
from agentwake.stdio_lines import Line as Line
from agentwake.stdio_lines import LineSplitter as LineSplitter
from agentwake.stdio_lines import Overflow as Overflow
from agentwake.stdio_lines import OverflowEnd as OverflowEnd
from agentwake.stdio_lines import RateWindow as RateWindow
from agentwake.stdio_lines import clean_line as clean_line
from agentwake.stdio_process import ServerExit as ServerExit
from agentwake.stdio_process import close_quietly, drain, spawn_command, terminate_tree, wait_for_exit
from agentwake.stdio_stderr import StderrCopier

logger = logging.getLogger(__name__)

# The transport's look at a notification before the session gets it: True consumes it.
Claim = Callable[[str, Mapping[str, Any] | None], bool]
# Lines queued for stdin before a sender waits for the writer. Quiet polls come in waves (their loops
# started together, and wait the same interval): ten thousand subscriptions put thousands of polls
# in a few seconds to a server that reads them slower than that, and a sender that waits for the
# writer costs two more task switches a poll. A line is a few hundred bytes: a few MB at most.
WRITE_QUEUE: Final = 10_000
# The most bytes one read of stdout takes.
READ_BYTES: Final = 65_536
# The most lines the writer joins into one write to the pipe.
WRITE_BATCH: Final = 256
# Only lines holding this are worth parsing on the claim path: every MCP notification method has it.
_NOTIFICATION_MARK: Final = '"notifications/'
_NOTIFICATION_MARK_BYTES: Final = _NOTIFICATION_MARK.encode()

StdioStreams = tuple[
    MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]
]


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


# ---- the transport ----------------------------------------------------------------------------


class BoundedStdioClient(CallsBesideSession):
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
        self._calls = None
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

    @asynccontextmanager
    async def _run(self) -> AsyncIterator[StdioStreams]:
        params = self.params
        self._exited = anyio.Event()
        env = get_default_environment() | (params.env or {})
        process = await anyio.open_process(
            spawn_command(params.command, list(params.args), env, params.cwd),
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
        # A few queue, so a sender rarely waits for the writer's turn, and the writer takes them in one go.
        write_send, write_receive = anyio.create_memory_object_stream[SessionMessage | bytes](WRITE_QUEUE)
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
                    # The common line, a notification in UTF-8, is parsed as bytes and claimed here.
                    claim_line = self._claim_line if self.claim is not None and self._utf8 else None
                    while chunk := await _receive(stdout):
                        for event in splitter.feed(chunk):
                            claimed = (
                                None if claim_line is None or type(event) is not Line else claim_line(event)
                            )
                            if claimed:
                                continue
                            item = self._stdout_item(event, claim_tried=claimed is not None)
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
                        # not yield: let the tasks consuming them run between chunks. A chunk shorter
                        # than a read takes was all there was: the next read waits (and yields) anyway.
                        if len(chunk) >= READ_BYTES:
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
                    await drain(stdout)
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

    def _stdout_item(
        self, event: Line | Overflow | OverflowEnd, *, claim_tried: bool = False
    ) -> SessionMessage | Exception | None:
        """What the session gets for one splitter event, if anything (``claim_tried``: the line was
        shown to ``claim`` already, which declined it)."""
        limits = self.limits
        if isinstance(event, Overflow):
            self._report_bad_line(
                f"a line over the {limits.max_message_bytes}-byte message limit (dropped)",
                event.head[: limits.log_preview_chars * UTF8_MAX_BYTES],
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
        data: bytes = event  # a whole line
        if not data.strip():
            return None  # a blank line carries no message
        try:
            text = data.decode(self.params.encoding)
            replaced = False
        except UnicodeDecodeError:
            text = data.decode(self.params.encoding, errors=self._errors)
            replaced = True
        if (
            self.claim is not None and not claim_tried and _NOTIFICATION_MARK in text and self._claimed(text)
        ) or (self._calls and CALL_MARK in text and self._took_result(text)):
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
        if self._calls and CALL_MARK in text and self._answered_call(message):
            return None
        return SessionMessage(message)

    def _claim_line(self, data: bytes) -> bool | None:
        """``_claimed`` for a line still in bytes (UTF-8, parsed as such): True if ``claim`` consumed
        it, False if it declined it, None if the line was not shown to it (not a plain notification,
        or not valid UTF-8 JSON: the full path then reads it as it reads any other line)."""
        if _NOTIFICATION_MARK_BYTES not in data:
            return None
        try:
            message = from_json(data, cache_strings=JSON_CACHE_STRINGS)
        except ValueError:
            return None
        return self._offer(message)

    def _claimed(self, text: str) -> bool:
        """Whether ``claim`` consumed the line, read as a notification exactly when the session would.

        The line is parsed by the JSON parser the SDK's validation uses (pydantic-core's), and only
        a plain notification is offered (an object of ``jsonrpc`` "2.0", a string ``method``,
        ``params`` an object, null or absent, no other member): the SDK reads one the very same way,
        so what ``claim`` sees is what the session's own intercept would have. Anything else,
        unparsable lines included, is left to the session's path, unchanged.
        """
        try:
            message = from_json(text, cache_strings=JSON_CACHE_STRINGS)
        except ValueError:
            return False
        return bool(self._offer(message))

    def _offer(self, message: Any) -> bool | None:
        """Show a parsed line to ``claim`` if it is a plain notification (None if not): whether it took it."""
        if type(message) is not dict or message.get("jsonrpc") != "2.0":
            return None
        method = message.get("method")
        params = message.get("params")
        if type(method) is not str or not (params is None or type(params) is dict):
            return None
        # No member but jsonrpc, method and params: with the first two there, the count says it (no
        # keys view made and compared a line).
        if len(message) != (3 if "params" in message else 2):
            return None
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
            preview = data[: self.limits.log_preview_chars * UTF8_MAX_BYTES].decode(
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
        copier = StderrCopier(self.limits, self.params.encoding, self._write_errlog)
        await copier.run(process.stderr, done)

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
        stdin = process.stdin
        try:
            async with write_receive:
                async for item in write_receive:
                    line = self._line(item)
                    # What queued meanwhile goes in the same write, in order: one pipe write, one turn.
                    lines: list[bytes] | None = None
                    while True:
                        try:
                            queued = write_receive.receive_nowait()
                        except (anyio.WouldBlock, anyio.EndOfStream):
                            break
                        if lines is None:
                            lines = [line]
                        lines.append(self._line(queued))
                        if len(lines) >= WRITE_BATCH:
                            break
                    await stdin.send(line if lines is None else b"".join(lines))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            # The server may still be alive: end the read stream so no request waits forever.
            self._end_calls()
            await read_send.aclose()
        finally:
            done.set()

    def _line(self, item: SessionMessage | bytes) -> bytes:
        """One line for stdin: a line of ``call``'s is encoded already; a session message is serialised."""
        if isinstance(item, bytes):
            return item
        json = item.message.model_dump_json(by_alias=True, exclude_unset=True)
        return (json + "\n").encode(self.params.encoding, errors=self._errors)

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
        await close_quietly(process.stdin)
        if not await wait_for_exit(process, limits.stdin_close_wait_s):
            self._escalated = True
            await terminate_tree(process, limits.terminate_wait_s)
            if not await wait_for_exit(process, limits.kill_wait_s):
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
                await close_quietly(pipe)


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


async def _receive(stdout: ByteReceiveStream) -> bytes:
    """The next chunk of stdout, at most READ_BYTES; empty at its end."""
    try:
        return await stdout.receive(READ_BYTES)
    except anyio.EndOfStream:
        return b""


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
