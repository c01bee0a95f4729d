"""Plain data types a server author works with."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from agentwake import clock

DeliveryModeName = Literal["poll", "push", "webhook"]


# The server's names for the shared clock helpers (agentwake.clock), kept for existing imports.
utc_now = clock.utc_now
isoformat = clock.iso
parse_timestamp = clock.parse_iso


def canonical_json(value: Any) -> str:
    """Equal JSON values give equal text: keys sorted, and a number written one way (1.0 is 1, as
    in RFC 8785), so arguments compare by canonical-JSON equality as the spec asks."""
    return json.dumps(_one_number_form(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _one_number_form(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {key: _one_number_form(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_one_number_form(item) for item in value]
    return value


def canonical_hash(arguments: Mapping[str, Any] | None) -> str:
    """A stable hash of subscription arguments, equal for canonically equal JSON."""
    return hashlib.sha256(canonical_json(dict(arguments or {})).encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Event:
    """One occurrence. ``event_id`` should be the upstream's stable id; one is generated otherwise.

    ``cursor`` is the position just after this event. A check function that sets it
    lets the SDK cut a large batch at ``maxEvents`` and still hand out a valid
    intermediate cursor.

    ``timestamp`` may also be a string already in wire form (ISO 8601, UTC, e.g. as
    stored upstream by ``isoformat``); it is then sent as is, saving a parse and a
    format per event on large reads.
    """

    name: str
    data: dict[str, Any]
    event_id: str = field(default_factory=lambda: f"evt_{uuid.uuid4().hex}")
    timestamp: datetime | str = field(default_factory=utc_now)
    cursor: str | None = None
    meta: dict[str, Any] | None = None

    @property
    def moment(self) -> datetime:
        """The timestamp as an aware datetime."""
        if isinstance(self.timestamp, datetime):
            return self.timestamp
        parsed = parse_timestamp(self.timestamp)
        if parsed is None:
            raise ValueError(f"event {self.event_id!r} has a malformed timestamp {self.timestamp!r}")
        return parsed

    def replace(self, **changes: Any) -> Event:
        return dataclasses.replace(self, **changes)

    def to_wire(self, *, with_cursor: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {
            "eventId": self.event_id,
            "name": self.name,
            "timestamp": self.timestamp if isinstance(self.timestamp, str) else isoformat(self.timestamp),
            "data": self.data,
        }
        if with_cursor:
            body["cursor"] = self.cursor
        if self.meta:
            body["_meta"] = self.meta
        return body


@dataclass(frozen=True, slots=True)
class EventResult:
    """What a check function returns: the events after ``cursor`` and the new position.

    Set ``truncated`` when the check itself skipped events (for example the cursor
    fell out of the upstream's retention window), and ``has_more`` when it stopped
    early on purpose.
    """

    events: Sequence[Event]
    cursor: str | None
    has_more: bool = False
    truncated: bool = False
    next_poll_ms: int | None = None


@dataclass(frozen=True, slots=True)
class EventContext:
    """Handed to check functions and to the match/transform hooks."""

    event_name: str
    principal: str | None
    mode: DeliveryModeName
    max_events: int
    max_age_ms: int | None = None
    not_before: datetime | None = None
    request: Any = None  # the SDK's ServerRequestContext, when there is one


CheckFunction = Callable[[EventContext, dict[str, Any], str | None], Awaitable[EventResult] | EventResult]
MatchHook = Callable[[EventContext, Event, dict[str, Any]], bool]
TransformHook = Callable[[EventContext, Event, dict[str, Any]], Event]
LifecycleHook = Callable[[EventContext, dict[str, Any], str], Awaitable[None] | None]
