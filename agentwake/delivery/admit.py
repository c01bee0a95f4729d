"""What a server sends, admitted or refused before it reaches the store. Pure functions.

A peer is untrusted: an event is admitted only if it is an object whose ``eventId`` is a
non-empty string within ``max_event_id_chars``, whose ``name`` is the subscribed type (a
server must not reach another type's policy rule), whose ``timestamp`` is a short string
and whose ``data`` is an object within ``max_event_bytes`` as JSON. Anything else becomes a
``RejectedEvent``: a bounded summary stored in state 'rejected', counted, with a gap, so
the subscription moves on instead of wedging.

A poll page is read the same way: its events one by one (one bad event does not cost the
page), ``nextPollMs`` clamped between the poll floor and ``max_next_poll_ms`` whatever the
server wrote (negative, fractional, a string, ``1e400``), and only a page whose own shape
is wrong (``events`` not a list, ``cursor`` not a string) is an error, naming the field.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from agentwake.config import LimitsConfig
from agentwake.delivery.common import MAX_CURSOR_CHARS
from agentwake.jsontext import encode_json
from agentwake.store import IncomingEvent, RejectedEvent
from agentwake.text import clip

MAX_TIMESTAMP_CHARS: Final = 64
MAX_NAME_CHARS: Final = 256
PREVIEW_CHARS: Final = 300
# What a refused event's id is cut to in its summary (a digest of the whole keeps it unique).
REJECTED_ID_CHARS: Final = 64
# A NamedTuple's own __new__ is a Python function: built from a full tuple, an event costs half.
_new_event: Final = tuple.__new__


@dataclass(frozen=True, slots=True)
class Admitted:
    """One batch as delivery hands it to the store: what may go on, and what was refused."""

    events: list[IncomingEvent]
    rejected: list[RejectedEvent]


def _bounded(value: Any, limit: int) -> str:
    """A peer's id or name as stored for a refused event: short, and still unique per value."""
    text = value if isinstance(value, str) else encode_json(value)
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{text[:limit]}…#{digest}"


def _preview(raw: Any) -> str:
    try:
        text = encode_json(raw)
    except (TypeError, ValueError):  # not JSON at all (a bytes value from a broken transport)
        text = repr(raw)
    return clip(text, PREVIEW_CHARS)


def refuse(raw: Any, reason: str) -> RejectedEvent:
    """The bounded summary of an event agentwake will not store as sent."""
    fields: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    return RejectedEvent(
        event_id=_bounded(fields.get("eventId", "(none)"), REJECTED_ID_CHARS),
        name=_bounded(fields.get("name", "(none)"), REJECTED_ID_CHARS),
        timestamp=_bounded(fields.get("timestamp", ""), MAX_TIMESTAMP_CHARS),
        reason=reason,
        preview=_preview(raw),
    )


def admit(
    raw: Any, expected_name: str, limits: LimitsConfig, *, routing_key: str | None = None
) -> IncomingEvent | RejectedEvent:
    """One event as a server sent it: admitted, or refused with the reason.

    ``routing_key``: a ``_meta`` key that is the transport's, not the event's (a stream
    notification's subscription id); the event's own ``_meta`` is what remains without it.
    """
    # type() first: isinstance against an ABC costs more than a check here, once per event.
    if type(raw) is not dict and not isinstance(raw, Mapping):
        return refuse(raw, f"an event must be a JSON object, not {type(raw).__name__}")
    event_id = raw.get("eventId")
    if not isinstance(event_id, str) or not event_id:
        return refuse(raw, "eventId must be a non-empty string")
    if len(event_id) > limits.max_event_id_chars:
        return refuse(raw, f"eventId is {len(event_id)} characters, over max_event_id_chars")
    name = raw.get("name")
    if name != expected_name:
        shown = clip(name, MAX_NAME_CHARS) if isinstance(name, str) else type(name).__name__
        return refuse(raw, f"an event named {shown!r} on a subscription to {expected_name!r}")
    timestamp = raw.get("timestamp")
    if not isinstance(timestamp, str) or not 0 < len(timestamp) <= MAX_TIMESTAMP_CHARS:
        return refuse(raw, f"timestamp must be a string of at most {MAX_TIMESTAMP_CHARS} characters")
    data = raw.get("data")
    if not isinstance(data, dict):
        return refuse(raw, "data must be a JSON object")
    meta = raw.get("_meta")
    if meta is not None and not isinstance(meta, dict):
        return refuse(raw, "_meta must be a JSON object")
    if routing_key is not None and meta and routing_key in meta:
        # Usually the routing id is all there is: then the event has no _meta of its own.
        meta = {k: v for k, v in meta.items() if k != routing_key} if len(meta) > 1 else None
    data_json = encode_json(data)
    size = len(data_json) + (len(encode_json(meta)) if meta else 0)
    if size > limits.max_event_bytes:
        return refuse(
            raw, f"the event is {size} bytes of JSON, over max_event_bytes ({limits.max_event_bytes})"
        )
    return _new_event(IncomingEvent, (event_id, name, timestamp, data, meta or None, data_json))


def admit_all(raws: Sequence[Any], expected_name: str, limits: LimitsConfig) -> Admitted:
    events: list[IncomingEvent] = []
    rejected: list[RejectedEvent] = []
    for raw in raws:
        outcome = admit(raw, expected_name, limits)
        if isinstance(outcome, IncomingEvent):
            events.append(outcome)
        else:
            rejected.append(outcome)
    return Admitted(events, rejected)


class MalformedPage(ValueError):
    """A poll result whose own shape is wrong; the message names the field."""


@dataclass(frozen=True, slots=True)
class Page:
    """An events/poll result as agentwake reads it: tolerant where that is harmless."""

    events: list[Any]
    cursor: str | None
    truncated: bool
    has_more: bool
    next_poll_ms: int | None


def _flag(raw: Mapping[str, Any], key: str) -> bool:
    value = raw.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise MalformedPage(f"{key}: must be true or false, not {type(value).__name__}")
    return value


def clamp_next_poll_ms(value: Any, *, floor_ms: int, ceiling_ms: int) -> int | None:
    """nextPollMs as agentwake waits it: None when absent or not a number, else between the bounds."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if math.isnan(value):
        return None
    if value >= ceiling_ms:  # inf (``1e400`` parses as inf) included
        return ceiling_ms
    return max(floor_ms, int(value))


def read_page(raw: Any, *, floor_ms: int, ceiling_ms: int) -> Page:
    """A poll result's fields; MalformedPage, naming the field, only where its own shape is wrong."""
    if not isinstance(raw, Mapping):
        raise MalformedPage(f"(result): must be an object, not {type(raw).__name__}")
    events = raw.get("events", [])
    if events is None:
        events = []
    if not isinstance(events, list):
        raise MalformedPage(f"events: must be a list, not {type(events).__name__}")
    cursor = raw.get("cursor")
    if cursor is not None and not isinstance(cursor, str):
        raise MalformedPage(f"cursor: must be a string or null, not {type(cursor).__name__}")
    if cursor is not None and len(cursor) > MAX_CURSOR_CHARS:
        raise MalformedPage(f"cursor: {len(cursor)} characters, over {MAX_CURSOR_CHARS}")
    return Page(
        events=events,
        cursor=cursor,
        truncated=_flag(raw, "truncated"),
        has_more=_flag(raw, "hasMore"),
        next_poll_ms=clamp_next_poll_ms(raw.get("nextPollMs"), floor_ms=floor_ms, ceiling_ms=ceiling_ms),
    )
