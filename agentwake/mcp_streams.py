"""The events/stream requests of one connection (``agentwake.mcp.ServerConnection``'s part).

Over agentwake's stdio transport a stream's request is written beside the session
(``BoundedStdioClient.send``) and its answer, when the server ends the stream, comes off the
reader's path into the route (``StreamRoute.finish``): no task waits for it, so an idle stream
costs its subscription's loop waiting on the route and little more. Over HTTP, ``stream`` sends
it through the session and waits for its final frame, in a task of the caller's.
"""

from __future__ import annotations

import itertools
from typing import Any

import anyio
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import ErrorData

from agentwake import protocol
from agentwake._compat import connection_closed, send_raw_request, stamped_params
from agentwake.errors import ConnectionLost, DeliveryError, events_call_error
from agentwake.stdio import BoundedStdioClient
from agentwake.stdio_calls import STREAM_ID_PREFIX
from agentwake.streams import STREAM_BUFFER, StreamRoute, StreamRoutes

_stream_ids = itertools.count(1)


class EventStreams:
    """Opening, sending and ending events/stream requests; mixed into ``ServerConnection``."""

    name: str
    stdio: BoundedStdioClient | None
    _streams: StreamRoutes

    @property
    def client(self) -> Client:
        raise NotImplementedError

    def _closed_message(self) -> str:
        raise NotImplementedError

    def open_stream_route(self) -> StreamRoute:
        """A route for a new events/stream; register it before sending the request."""
        _ = self.client  # raises ConnectionLost when not connected
        route = StreamRoute(f"{STREAM_ID_PREFIX}{next(_stream_ids)}", STREAM_BUFFER)
        self._streams.routes[route.request_id] = route
        return route

    def close_stream_route(self, route: StreamRoute) -> None:
        self._streams.routes.pop(route.request_id, None)
        route.close()

    @property
    def streams_beside_session(self) -> bool:
        """Whether ``send_stream`` is how an events/stream goes out here (agentwake's stdio transport).

        Elsewhere (HTTP) ``stream`` sends it through the session and waits for its end in a task.
        """
        return self.stdio is not None

    async def send_stream(
        self, route: StreamRoute, params: dict[str, Any], *, subscription: str | None = None
    ) -> None:
        """Send events/stream under the route's id beside the session; its answer ends the route.

        No task waits for the request: its final frame (the server closed the stream, or refused
        it) comes off the reader's path into ``route.finish``, where ``stream_ended`` reads it, and
        the connection's end finishes it as closed. ``end_stream`` abandons it. Over stdio only.
        """
        assert self.stdio is not None
        session = self.client.session
        try:
            await self.stdio.send(
                protocol.METHOD_STREAM,
                stamped_params(session, protocol.METHOD_STREAM, params),
                request_id=route.request_id,
                on_answer=route.finish,
            )
        except MCPError as exc:
            raise self._stream_failure(exc, subscription) from None
        # Notifications are being lost: the server is told to stop at once rather than send
        # what would be dropped (as cancelling the request does over HTTP).
        route.on_overflow = self._abandon_stream

    def _abandon_stream(self, route: StreamRoute) -> None:
        if self.stdio is not None:
            self.stdio.forget_now(route.request_id, "the client fell behind")
        route.end()

    async def end_stream(self, route: StreamRoute) -> None:
        """Close a route of ``send_stream``'s: the request is cancelled if it is still open.

        Safe in a cancelled task (the cancel's write is shielded and bounded)."""
        self.close_stream_route(route)
        if self.stdio is not None and route.answer is None:
            await self.stdio.forget(route.request_id, "the client closed the stream")

    def stream_ended(self, route: StreamRoute, *, subscription: str | None = None) -> None:
        """Raise what a ``send_stream`` request's answer says went wrong; return if it ended well
        (the server closed the stream), or was not answered (abandoned, or its route was closed)."""
        answer = route.answer
        if isinstance(answer, ErrorData):
            raise self._stream_failure(
                MCPError(code=answer.code, message=answer.message, data=answer.data), subscription
            )

    def _stream_failure(self, exc: MCPError, subscription: str | None) -> DeliveryError:
        if connection_closed(exc):
            return ConnectionLost(self._closed_message(), server=self.name)
        return events_call_error(
            protocol.METHOD_STREAM,
            exc.code,
            exc.message,
            exc.data,
            server=self.name,
            subscription=subscription,
        )

    async def stream(
        self, route: StreamRoute, params: dict[str, Any], *, subscription: str | None = None
    ) -> None:
        """Send events/stream under the route's id and wait for its final frame (the server closed it).

        No read timeout: the heartbeat is the liveness signal. Cancelling this (the
        caller's scope) cancels the request: notifications/cancelled on stdio, the POST
        stream aborted on HTTP, as the SDK does for any abandoned request.
        """
        session = self.client.session
        try:
            await send_raw_request(session, protocol.METHOD_STREAM, params, request_id=route.request_id)
        except MCPError as exc:
            raise self._stream_failure(exc, subscription) from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError) as exc:
            raise ConnectionLost(
                f"server {self.name!r}: {type(exc).__name__}: {exc}", server=self.name
            ) from None


__all__ = ["STREAM_BUFFER", "EventStreams"]
