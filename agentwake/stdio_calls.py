"""Requests of our own sent beside the session's on a stdio connection, answered off the reader's path.

``call`` writes a request under a string id of its own (``CALL_ID_PREFIX``; the SDK's are
integers) through the session's writer, and the transport's reader hands its answer straight back
(``_took_result`` on the raw line, ``_answered_call`` after the full validation) instead of through
the session, whose request machinery costs most of a quiet poll's round trip. It keeps the
session's contract: the timeout counts from the write, an abandoned request is cancelled with
``notifications/cancelled``, an error answer or a closed connection is an ``MCPError`` with the
SDK's codes. ``send`` writes an events/stream request the same way and hands its answer, when it
comes at the stream's end, to a callback: no task waits for it. ``agentwake.stdio.BoundedStdioClient`` is the one user of this mixin.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping
from contextlib import suppress
from typing import Any, Final

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT, ErrorData, JSONRPCError, JSONRPCResponse
from pydantic_core import from_json, to_json

from agentwake import coarse_timers
from agentwake.coarse_timers import Cancellable
from agentwake.stdio_lines import JSON_CACHE_STRINGS

# The ids of ``call``'s requests: strings, so never one of the session's (integers).
CALL_ID_PREFIX: Final = "agentwake-call-"
# The ids of events/stream requests (``send``'s, over stdio; the session's, over HTTP).
STREAM_ID_PREFIX: Final = "agentwake-stream-"
# Only lines holding this may answer a ``call`` or a ``send``: the prefix both kinds of id share.
CALL_MARK: Final = '"agentwake-'
RESULT_KEYS: Final = frozenset({"jsonrpc", "id", "result"})
# The SDK's bound on writing the cancel of an abandoned request (its _ABANDON_WRITE_TIMEOUT).
CANCEL_WRITE_S: Final = 5.0
# What a ``call`` still waiting gets once the connection has closed: the SDK's own outcome.
CLOSED: Final = ErrorData(code=CONNECTION_CLOSED, message="Connection closed")
# What a ``call`` gets when its timeout passes first (never sent by a server: compared by identity).
TIMED_OUT: Final = ErrorData(code=REQUEST_TIMEOUT, message="timed out")


class _Call:
    """A request of ``call``'s waiting for its answer: the result, or the error (the closure's included).

    Its wait is a bare future of the running loop, and its timeout a timer that settles it with
    TIMED_OUT: a quiet poll's round trip pays no cancel scope and no event wrapper. Cancelling the
    caller's task (its scope) cancels the wait as it would any other.
    """

    __slots__ = ("answer", "timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.answer: asyncio.Future[dict[str, Any] | ErrorData] = loop.create_future()
        self.timer: Cancellable | None = None

    def settle(self, outcome: dict[str, Any] | ErrorData) -> None:
        """The first outcome counts: an answer, the closure, or the timeout (TIMED_OUT)."""
        if not self.answer.done():
            self.answer.set_result(outcome)

    def time_out(self) -> None:
        self.settle(TIMED_OUT)


class _Handed:
    """A request of ``send``'s: its outcome is handed to ``on_answer`` (once), not waited for."""

    __slots__ = ("on_answer",)

    def __init__(self, on_answer: Callable[[dict[str, Any] | ErrorData], None]) -> None:
        self.on_answer = on_answer

    def settle(self, outcome: dict[str, Any] | ErrorData) -> None:
        self.on_answer(outcome)


class CallsBesideSession:
    """``call`` and the reader's side of it, for the transport (which sets these attributes)."""

    params: StdioServerParameters
    # ``call``'s requests awaiting an answer, by id; None before the start and after the end.
    _calls: dict[str, _Call | _Handed] | None
    _call_ids: itertools.count[int]
    _write_send: MemoryObjectSendStream[SessionMessage | bytes] | None
    _utf8: bool
    _errors: str

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
        line = self._request_line(request_id, method, params)
        loop = asyncio.get_running_loop()
        call = calls[request_id] = _Call(loop)
        written = False
        try:
            await anyio.lowlevel.checkpoint_if_cancelled()
            # From here a cancelled write may still have been delivered: count it as sent, as the SDK does.
            written = True
            try:
                try:
                    write.send_nowait(line)  # queued for the writer: no task switch of ours
                except anyio.WouldBlock:
                    await write.send(line)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                raise MCPError(code=CONNECTION_CLOSED, message="Connection closed") from None
            if timeout_s is not None and not call.answer.done():
                # Coarse (at most a quarter second late): each quiet poll arms one, and it rarely fires.
                call.timer = coarse_timers.for_running_loop().call_later(timeout_s, call.time_out)
            outcome = await call.answer
            if outcome is TIMED_OUT:  # an answer just in time settled it first, and counts
                with anyio.move_on_after(CANCEL_WRITE_S):
                    await self._cancel_call(request_id, f"timed out after {timeout_s}s")
                raise MCPError(code=REQUEST_TIMEOUT, message=f"Request {method!r} timed out")
        except anyio.get_cancelled_exc_class():
            if written:
                with anyio.move_on_after(CANCEL_WRITE_S, shield=True):
                    await self._cancel_call(request_id, "caller cancelled")
            raise
        finally:
            calls.pop(request_id, None)
            if call.timer is not None:
                call.timer.cancel()
        if isinstance(outcome, ErrorData):
            raise MCPError(code=outcome.code, message=outcome.message, data=outcome.data)
        return outcome

    async def send(
        self,
        method: str,
        params: Mapping[str, Any] | None,
        *,
        request_id: str,
        on_answer: Callable[[dict[str, Any] | ErrorData], None],
    ) -> None:
        """Send a request beside the session's without waiting for its answer, which goes to ``on_answer``.

        For a request answered only when it ends: an events/stream, whose notifications come
        meanwhile (routed by ``request_id``, which must start with STREAM_ID_PREFIX). Its outcome
        is handed over once: the result, the error a server answered, or CONNECTION_CLOSED when
        the connection ends first. No task waits for it and nothing times it out; ``forget``
        abandons it. Raises ``MCPError`` (CONNECTION_CLOSED) when the connection has ended.
        """
        calls, write = self._calls, self._write_send
        if calls is None or write is None:
            raise MCPError(code=CONNECTION_CLOSED, message="Connection closed")
        line = self._request_line(request_id, method, params)
        calls[request_id] = _Handed(on_answer)
        try:
            try:
                write.send_nowait(line)
            except anyio.WouldBlock:
                await write.send(line)  # cancelled here, it may still go: the caller's forget cancels it
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            calls.pop(request_id, None)
            raise MCPError(code=CONNECTION_CLOSED, message="Connection closed") from None

    async def forget(self, request_id: str, reason: str) -> None:
        """Abandon a ``send`` request still unanswered: the server is told with ``notifications/cancelled``.

        Safe to call in a cancelled task (the write is shielded, bounded by CANCEL_WRITE_S), and
        for a request answered already (then it does nothing).
        """
        calls = self._calls
        if calls is None or calls.pop(request_id, None) is None:
            return
        write = self._write_send
        if write is None:
            return
        notice = self._cancel_line(request_id, reason)
        try:
            write.send_nowait(notice)
        except anyio.WouldBlock:
            with anyio.move_on_after(CANCEL_WRITE_S, shield=True):
                with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await write.send(notice)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass

    def forget_now(self, request_id: str, reason: str) -> None:
        """``forget`` without waiting: the cancel goes if the writer's queue has room now, else it is
        left to a later ``forget`` (the request stays unanswered until then)."""
        calls, write = self._calls, self._write_send
        if calls is None or write is None or request_id not in calls:
            return
        try:
            write.send_nowait(self._cancel_line(request_id, reason))
        except anyio.WouldBlock:
            return
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        calls.pop(request_id, None)

    def _request_line(self, request_id: str, method: str, params: Mapping[str, Any] | None) -> bytes:
        request: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params:  # as the SDK: no "params" at all rather than empty ones
            request["params"] = params
        return self._encode(request)

    def _cancel_line(self, request_id: str, reason: str) -> bytes:
        params = {"requestId": request_id, "reason": reason}
        return self._encode({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params})

    async def _cancel_call(self, request_id: str, reason: str) -> None:
        """The courtesy cancel of an abandoned ``call``; dropped when the connection is gone."""
        if self._calls is None or self._write_send is None:
            return
        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await self._write_send.send(self._cancel_line(request_id, reason))

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
            message = from_json(text, cache_strings=JSON_CACHE_STRINGS)
        except ValueError:
            return False
        if type(message) is not dict or message.keys() != RESULT_KEYS or message["jsonrpc"] != "2.0":
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
            call.settle(CLOSED)
