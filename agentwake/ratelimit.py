"""How fast a server may send us requests: a token bucket per connection, and back-pressure beyond it.

An MCP server may send the client requests (``ping``, ``roots/list``, ``sampling/createMessage``,
``elicitation/create``, any unknown method); the SDK answers each (an empty result for ``ping``,
an error for the rest), which costs a parse, a task and a write, and over HTTP a POST. A server
that floods them would keep a core busy answering. ``ServerRequestLimit`` lets through at most
``rate`` a second, in bursts of up to twice as many (``[limits] max_server_requests_per_s``);
beyond that the reader of the connection waits before the request goes on. Nothing is dropped or
answered differently: the server's pipe or socket fills and the server is slowed. One WARNING
names the server per flood episode (a run of waits no more than ``FLOOD_EPISODE_GAP_S`` apart),
not one per request.

Notifications (a push stream's events may come at tens of thousands a second) and answers to our
own requests are never counted or held. Over stdio the transport waits itself, on its reader's
path (``agentwake.stdio``); over Streamable HTTP ``limit_server_requests`` wraps the SDK's
transport so that the session's read loop waits, before the SDK spawns a task for the request.

Neither the standard library nor anyio has a rate limiter (``anyio.CapacityLimiter`` bounds how
many run at once, not how often), hence ``TokenBucket``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Any, Final, Self

import anyio
from mcp.client import Transport
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCRequest

logger = logging.getLogger(__name__)

# Twice the rate: a burst of that many requests passes without waiting.
BURST_FACTOR: Final = 2.0
# Waits closer together than this are one flood episode (one warning).
FLOOD_EPISODE_GAP_S: Final = 60.0


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` held; full to begin with.

    ``take`` never refuses: a token not there yet is reserved ahead, and the caller is told how long
    to wait for it, so callers that wait their turn are served in order at the rate.
    """

    def __init__(self, rate: float, burst: float) -> None:
        if not rate > 0:
            raise ValueError("rate must be above 0")
        if not burst >= 1:
            raise ValueError("burst must be at least 1")
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._stamp: float | None = None

    def take(self, now: float) -> float:
        """Takes a token at ``now`` (seconds, monotonic): 0.0 when one was there, else how long
        until the one taken is due."""
        if math.isinf(self.rate):
            return 0.0
        if self._stamp is None or now > self._stamp:  # a clock that steps back refills nothing
            if self._stamp is not None:
                self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
        self._tokens -= 1
        if self._tokens >= 0:
            return 0.0
        return -self._tokens / self.rate


class ServerRequestLimit:
    """The requests one connection's server may send: ``rate`` a second, bursts of twice that.

    ``delay()`` counts one request and says how long its reader must wait before passing it on;
    ``wait()`` does both. The first wait of a flood episode logs a WARNING naming the server.
    Attributes for tests and status: ``slowed`` (requests that waited), ``episodes``. ``clock`` is
    the event loop's unless given.
    """

    def __init__(self, server: str, rate: float, *, clock: Callable[[], float] | None = None) -> None:
        self.server = server
        self.rate = rate
        self._clock = clock or anyio.current_time
        self._bucket = TokenBucket(rate, max(1.0, BURST_FACTOR * rate))
        self._last_wait: float | None = None
        self.slowed = 0
        self.episodes = 0

    def delay(self) -> float:
        now = self._clock()
        delay = self._bucket.take(now)
        if delay > 0:
            self.slowed += 1
            if self._last_wait is None or now - self._last_wait > FLOOD_EPISODE_GAP_S:
                self.episodes += 1
                logger.warning(
                    "server %r: sends requests faster than %g/s ([limits] max_server_requests_per_s);"
                    " reading from it is slowed",
                    self.server,
                    self.rate,
                )
            self._last_wait = now
        return delay

    async def wait(self) -> None:
        delay = self.delay()
        if delay > 0:
            await anyio.sleep(delay)


def is_request(item: object) -> bool:
    """Whether a read stream's item is a request from the server (not a notification, nor an answer)."""
    return isinstance(item, SessionMessage) and isinstance(item.message, JSONRPCRequest)


class RequestLimitedStream:
    """A transport's read stream whose server requests wait for ``limit`` before they are received.

    The wait happens in whoever receives: the session's read loop, so nothing more is read from the
    transport meanwhile (back-pressure), and the SDK has not yet spawned the request's handler.
    ``last_context`` is the inner stream's (the SDK's dispatcher reads it, duck-typed, per item).
    """

    def __init__(self, inner: Any, limit: ServerRequestLimit) -> None:
        self._inner = inner
        self._limit = limit

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        item: SessionMessage | Exception = await self._inner.receive()
        if is_request(item):
            await self._limit.wait()
        return item

    def close(self) -> None:
        self._inner.close()

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def limit_server_requests(
    transport: Transport, limit: ServerRequestLimit
) -> AbstractAsyncContextManager[tuple[RequestLimitedStream, Any]]:
    """``transport`` (the SDK's Streamable HTTP client, say) with its read stream behind ``limit``."""

    @asynccontextmanager
    async def limited() -> AsyncIterator[tuple[RequestLimitedStream, Any]]:
        async with transport as (read_stream, write_stream):
            yield RequestLimitedStream(read_stream, limit), write_stream

    return limited()
