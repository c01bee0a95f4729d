"""What the extension and its two continuous delivery modes (push, webhook) share.

``EventType`` is one declared event type. ``EventSource`` is the extension as a
push stream or a webhook subscription sees it: a ``typing.Protocol``, so that
``_stream`` and the ``_webhook*`` modules never import ``_extension`` (which
imports them). The functions below are the read-scheduling rules both modes
follow: when to read again, where a batch starts, how a failed read backs off.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal, Protocol

from mcp.shared.exceptions import MCPError

from agentwake import protocol
from agentwake.backoff import backoff_s
from agentwake.server._buffer import RingBuffer
from agentwake.server._leases import Lease
from agentwake.server._types import (
    CheckFunction,
    DeliveryModeName,
    EventContext,
    EventResult,
    MatchHook,
    TransformHook,
)

# Every mode this SDK can serve; webhook only when the extension has WebhookSettings.
SERVED_MODES: Final[tuple[DeliveryModeName, ...]] = ("poll", "push", "webhook")
UNCONFIGURED_MODES: Final[tuple[DeliveryModeName, ...]] = ("poll", "push")

# A failed read is retried after the poll interval, doubling per consecutive failure up to this.
MAX_RETRY_MS: Final = 30_000
# How long on_unsubscribe hooks may take once a subscription has ended (they run shielded).
HOOK_TIMEOUT_S: Final = 10.0
# Errors that end a subscription: retrying the same read cannot succeed.
TERMINAL_CODES: Final = frozenset(
    {protocol.NOT_FOUND, protocol.FORBIDDEN, protocol.INVALID_PARAMS, protocol.UNSUPPORTED}
)


@dataclass(slots=True)
class EventType:
    """One declared event type. Built by ``EventsExtension.event``."""

    name: str
    description: str | None
    input_schema: dict[str, Any]
    payload_schema: dict[str, Any] | None
    check: CheckFunction | None = None
    emit_only: bool = False
    replay: bool = True
    match: MatchHook | None = None
    transform: TransformHook | None = None
    delivery: tuple[DeliveryModeName, ...] | None = None
    next_poll_ms: int | None = None
    meta: dict[str, Any] | None = None
    validator: Any = field(default=None, repr=False)
    buffer: RingBuffer | None = field(default=None, repr=False)
    # What the extension it is declared on serves (set by add_event_type).
    served: tuple[DeliveryModeName, ...] = field(default=UNCONFIGURED_MODES, repr=False)

    def modes(self) -> list[str]:
        return [m for m in self.served if self.delivery is None or m in self.delivery]

    def descriptor(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": self.name,
            "delivery": self.modes(),
            "inputSchema": self.input_schema,
        }
        if self.description:
            body["description"] = self.description
        if self.payload_schema is not None:
            body["payloadSchema"] = self.payload_schema
        if self.meta:
            body["_meta"] = self.meta
        return body


class EventSource(Protocol):
    """The parts of ``EventsExtension`` a push stream or a webhook subscription uses."""

    @property
    def default_max_events(self) -> int: ...

    @property
    def default_next_poll_ms(self) -> int: ...

    def now(self) -> datetime: ...

    def serves(self, event_type: EventType) -> bool: ...

    def event_types(self) -> list[EventType]: ...

    async def read(
        self,
        event_type: EventType,
        ctx: EventContext,
        arguments: dict[str, Any],
        cursor: str | None,
        lease: Lease | None,
    ) -> EventResult: ...

    async def fire_hooks(
        self,
        kind: Literal["subscribe", "unsubscribe"],
        lease: Lease,
        *,
        request: Any,
        mode: DeliveryModeName = "poll",
    ) -> None: ...


def error_object(exc: MCPError) -> dict[str, Any]:
    """The JSON-RPC error object of ``exc``, as ``terminated`` and ``error`` frames carry it."""
    body: dict[str, Any] = {"code": exc.error.code, "message": exc.error.message}
    if exc.error.data is not None:
        body["data"] = exc.error.data
    return body


def _poll_ms(source: EventSource, event_type: EventType, batch: EventResult | None) -> int:
    candidates = (
        batch.next_poll_ms if batch is not None else None,
        event_type.next_poll_ms,
        source.default_next_poll_ms,
    )
    return next(ms for ms in candidates if ms is not None)


def idle_delay(source: EventSource, event_type: EventType, batch: EventResult) -> float | None:
    """How long a push stream or webhook subscription waits before reading again after ``batch``.

    None means until woken (an emit, a close): emit-only types are never read on a timer.
    """
    if event_type.buffer is not None:
        return None
    return _poll_ms(source, event_type, batch) / 1000


def start_cursor(event_type: EventType, batch: EventResult, *, fallback: str | None) -> str | None:
    """The position delivery of ``batch`` starts from: just before its first event, when that is known."""
    if not batch.events:
        return batch.cursor
    buffer, first = event_type.buffer, batch.events[0].cursor
    if buffer is not None and first is not None:
        position = buffer.parse_cursor(first)
        if position is not None:
            return buffer.cursor_for(position - 1)
    return fallback


def retry_delay(source: EventSource, event_type: EventType, failures: int) -> float:
    """The wait after ``failures`` failed reads in a row: the poll interval, doubling, capped.

    Without jitter, so the schedule is deterministic.
    """
    base_s = _poll_ms(source, event_type, None) / 1000
    # At least one failure: the schedule starts at the poll interval, not at zero.
    return backoff_s(max(failures, 1), initial_s=base_s, max_s=max(MAX_RETRY_MS / 1000, base_s), jitter_s=0)
