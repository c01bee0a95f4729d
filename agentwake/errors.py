"""The one exception tree of agentwake.

    AgentwakeError
     ├── ConfigError            bad agentwake.toml, unknown event, bad arguments, unusable mode
     │    └── PolicyError       a bad policy file (names the file, the line and the rule)
     ├── StoreError             the store could not be opened, read or written (locked, corrupt, full)
     │    ├── FencedOut         another process drives this subscription now: this one stops
     │    └── LeaseLost         a run's claim on its event is no longer current: it sends nothing more
     └── DeliveryError          talking to an MCP server failed
          ├── ConnectError      the server could not be started or reached
          └── EventsCallError   an events/* request got a JSON-RPC error
               ├── SubscriptionEnded   -32011 NotFound / -32012 Forbidden: stop this subscription
               └── TransientEventsError  -32603 and other retryable answers

Third-party exceptions are converted once, at the boundary that knows which
server and which subscription they belong to.
"""

from __future__ import annotations

from typing import Any

from agentwake import codes as protocol
from agentwake.text import peer


class AgentwakeError(Exception):
    """Base of every error agentwake raises on purpose."""


class ConfigError(AgentwakeError):
    """The configuration is invalid; the message says where and how to fix it."""


class PolicyError(ConfigError):
    """A policy file is invalid; the message names the file, the line and the rule."""


class StoreError(AgentwakeError):
    """The store could not be opened, migrated, read or written."""


class FencedOut(StoreError):
    """A cursor write carried a fence older than the subscription's: another process took it over.

    Nothing was written. The loop that got it stops driving the subscription (not an error).
    """

    def __init__(self, subscription: str, stored: int | None, given: int) -> None:
        if stored is None:
            held = f"it has no fence; this one had {given}"
        else:
            held = f"fence {stored} {'>' if stored > given else '!='} {given}"
        super().__init__(
            f"subscription {subscription} is now driven by another process ({held});"
            " this process stops driving it"
        )
        self.subscription = subscription
        self.stored = stored
        self.given = given


class LeaseLost(StoreError):
    """A run's claim on its event is no longer current (its lease lapsed, or the event was claimed
    again or moved on), so the tool call it was about to journal was not journaled and must not be sent.

    Raised by the store inside the journaling transaction; the run ends without sending (not an error
    of the event: whoever holds the event now handles it).
    """

    def __init__(self, run_id: int, why: str) -> None:
        super().__init__(f"run {run_id} lost its lease: {why}; nothing was journaled or sent")
        self.run_id = run_id
        self.why = why


class DeliveryError(AgentwakeError):
    """Talking to an MCP server failed."""

    def __init__(self, message: str, *, server: str | None = None) -> None:
        super().__init__(message)
        self.server = server


class ConnectError(DeliveryError):
    """The server process could not be started, or the URL could not be reached."""


class ConnectionLost(DeliveryError):
    """An established connection broke; the caller reconnects."""


class EventsUnsupported(DeliveryError):
    """The server declares no MCP Events capability: no events/* request may be sent to it."""


class EventsCallError(DeliveryError):
    """An events/* request was answered with a JSON-RPC error."""

    def __init__(
        self,
        method: str,
        code: int,
        message: str,
        data: Any = None,
        *,
        server: str | None = None,
        subscription: str | None = None,
    ) -> None:
        where = f"server {server!r}" if server else "server"
        if subscription:
            where = f"subscription {subscription!r} on {where}"
        text = f"{method} on {where} failed: {protocol.error_name(code)} ({code}): {message}"
        if data is not None:
            text += f" {peer(repr(data), 300)}"
        super().__init__(text, server=server)
        self.method = method
        self.code = code
        self.error_message = message
        self.data = data
        self.subscription = subscription


class SubscriptionEnded(EventsCallError):
    """The server says this subscription cannot go on (unknown event, access refused)."""


class TransientEventsError(EventsCallError):
    """A retryable server-side failure."""


ENDING_CODES = frozenset({protocol.NOT_FOUND, protocol.FORBIDDEN})
# Codes that say the request itself is wrong: the same request cannot succeed later.
PERMANENT_CODES = frozenset(
    {
        protocol.INVALID_PARAMS,
        protocol.UNSUPPORTED,
        protocol.METHOD_NOT_FOUND,
        protocol.CALLBACK_ENDPOINT_ERROR,
    }
)


def events_call_error(
    method: str,
    code: int,
    message: str,
    data: Any = None,
    *,
    server: str | None = None,
    subscription: str | None = None,
) -> EventsCallError:
    """Pick the subclass a caller branches on for this error code.

    Ending codes end the subscription; codes that say the request is wrong are kept as they
    are (the caller decides); every other code, a server's own (-32000 "busy") or one this
    client does not know (-32099), is transient: retried with backoff, never the end.
    """
    cls: type[EventsCallError] = TransientEventsError
    if code in ENDING_CODES:
        cls = SubscriptionEnded
    elif code in PERMANENT_CODES:
        cls = EventsCallError
    message = peer(message)
    return cls(method, code, message, data, server=server, subscription=subscription)
