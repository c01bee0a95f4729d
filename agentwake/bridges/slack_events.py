"""Slack's Events API callbacks as the Slack bridge's MCP events. Pure: no I/O.

An ``event_callback`` body arrives either over HTTP (the Events API's Request URL) or inside
a Socket Mode envelope; both carry the same body, so both map here to the same event:

    app_mention         app_mention:<channel>:<ts>
    message.channels    message.channels:<channel>:<ts>
    reaction_added      reaction_added:<item channel>:<item ts>:<user>:<reaction>:<event_ts>

The event id names the occurrence (a message is its channel and ``ts``), not the delivery:
Slack's own ``event_id`` is what the bridge deduplicates deliveries on, and these ids keep
one occurrence one event whichever ingress path brought it. A mention in a channel the app
is in comes twice, as ``app_mention`` and as ``message.channels``: two event types, two events.

Only channel messages are ``message.channels`` (Slack's ``channel_type`` "channel"); a message
of a private channel, a DM or a group DM, an edit, a deletion or a join maps to None, as does
a reaction to anything but a message. Whether the app itself caused an event (its own post or
reaction, which must never wake the agent that made it) is read from the body alone: the bot
user of ``authorizations`` and the app of ``api_app_id``. Other apps' messages are marked
``isBot``; the bridge drops them unless told to keep them.

``data`` is small, typed and camelCase; text becomes a bounded excerpt. A body of a type we
emit with a missing or ill-typed field raises ``Unmapped`` naming the field, never its value.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from agentwake.bridges import _payload
from agentwake.bridges._payload import boolean_schema, closed_schema, text_schema
from agentwake.clock import iso

EXCERPT_CHARS: Final = 2000
ID_CHARS: Final = 64
NAME_CHARS: Final = 128
# Slack's message timestamps: epoch seconds with a fractional part ("1718000000.000200").
TS_PATTERN: Final = r"^\d{1,12}\.\d{1,9}$"
CHANNEL_PATTERN: Final = r"^[CGD][A-Z0-9]{2,30}$"
USER_PATTERN: Final = r"^[UWB][A-Z0-9]{2,30}$"
_TS: Final = re.compile(TS_PATTERN)
# Message subtypes that are someone saying something; edits, deletions, joins and the rest are not.
MESSAGE_SUBTYPES: Final = frozenset({None, "thread_broadcast", "file_share", "me_message", "bot_message"})

EVENT_TYPES: dict[str, str] = {
    "app_mention": "The app was mentioned (@app) in a message of a channel it is in.",
    "message.channels": "A message was posted in a public channel the app is in (a channel filter is required).",
    "reaction_added": "A reaction (an emoji) was added to a message in a channel the app is in.",
}


@dataclass(frozen=True, slots=True)
class Mapped:
    """One MCP event: its type, an id stable across both ingress paths, when it happened, its payload,
    and whether the app itself caused it."""

    type: str
    event_id: str
    occurred_at: datetime
    data: dict[str, Any]
    own: bool


class Unmapped(_payload.Unmapped):
    """A body of a type we emit with a missing or ill-typed field; the message names the field."""


# ---- payload schemas -----------------------------------------------------------------


def _common() -> dict[str, dict[str, Any]]:
    return {
        "occurredAt": {
            "type": "string",
            "format": "date-time",
            "description": "When it happened in Slack, ISO 8601 in UTC.",
        },
        "isBot": boolean_schema(
            "Whether another app (a bot) posted it; reactions do not say, so they are false."
        ),
    }


def _schema(fields: dict[str, dict[str, Any]]) -> dict[str, Any]:
    properties = {**fields, **_common()}
    return closed_schema(properties)


def _message_schema() -> dict[str, Any]:
    return _schema(
        {
            "channel": text_schema("The channel's id (C0123ABCD).", ID_CHARS),
            "user": text_schema(
                "The author's user id, or null for an app's message without one.", ID_CHARS, nullable=True
            ),
            "text": text_schema(
                f"The first {EXCERPT_CHARS} characters of the message, as Slack sends it"
                " (<@U0123ABCD> is a mention); '' when it has none.",
                EXCERPT_CHARS,
            ),
            "textTruncated": boolean_schema("Whether the message is longer than the excerpt."),
            "ts": text_schema("The message's timestamp, its id within the channel.", ID_CHARS),
            "threadTs": text_schema(
                "The thread the message belongs to: its parent's ts when it is a reply, else its own ts"
                " (equal to ts). Replying with threadTs answers in the thread, starting it if need be.",
                ID_CHARS,
            ),
        }
    )


PAYLOAD_SCHEMAS: dict[str, dict[str, Any]] = {
    "app_mention": _message_schema(),
    "message.channels": _message_schema(),
    "reaction_added": _schema(
        {
            "user": text_schema("The user id of who reacted.", ID_CHARS),
            "reaction": text_schema('The emoji\'s name, without colons ("eyes", "thumbsup").', NAME_CHARS),
            "itemChannel": text_schema("The channel of the message reacted to.", ID_CHARS),
            "itemTs": text_schema("The ts of the message reacted to.", ID_CHARS),
            "itemUser": text_schema(
                "The user id of that message's author, or null.", ID_CHARS, nullable=True
            ),
        }
    ),
}


def _arguments(*, channel_required: bool) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "channel": {
                "type": "string",
                "pattern": CHANNEL_PATTERN,
                "description": "Only events in this channel, by its id (C0123ABCD, at the bottom of the"
                " channel's details in Slack); for a reaction, the channel of the message reacted to.",
            },
            "user": {
                "type": "string",
                "pattern": USER_PATTERN,
                "description": "Only events caused by this user id (U0123ABCD): the author, or who reacted.",
            },
        },
        "additionalProperties": False,
    }
    if channel_required:
        schema["required"] = ["channel"]
    return schema


ARGUMENTS_SCHEMAS: dict[str, dict[str, Any]] = {
    "app_mention": _arguments(channel_required=False),
    # Every message of every channel the app is in would be a firehose: one channel per subscription.
    "message.channels": _arguments(channel_required=True),
    "reaction_added": _arguments(channel_required=False),
}


# ---- reading a body ------------------------------------------------------------------


class _Object(_payload.Fields):
    __slots__ = ()
    error = Unmapped
    root = "(body)"

    # Unlike GitHub's and PagerDuty's payloads, a null here is as good as missing.
    def optional_text(self, key: str, limit: int) -> str | None:
        value = self.raw.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise Unmapped(f"{self.name(key)}: must be a string, not {_payload.kind(value)}")
        return _payload.bounded(value, limit)

    def text(self, key: str, limit: int) -> str:
        value = self.optional_text(key, limit)
        if value is None:
            raise Unmapped(f"{self.name(key)}: missing")
        return value

    def ts(self, key: str) -> str:
        value = self.text(key, ID_CHARS)
        if not _TS.fullmatch(value):
            raise Unmapped(f"{self.name(key)}: must be a Slack timestamp like 1718000000.000200")
        return value

    def optional_ts(self, key: str) -> str | None:
        return None if self.raw.get(key) is None else self.ts(key)


def moment_of(ts: str) -> datetime:
    """A Slack timestamp ("1718000000.000200", epoch seconds) as an aware UTC datetime."""
    seconds, _, fraction = ts.partition(".")
    micros = int((fraction + "000000")[:6]) if fraction else 0
    return datetime.fromtimestamp(int(seconds), UTC).replace(microsecond=micros)


@dataclass(frozen=True, slots=True)
class _App:
    """Who the app is, as the body says: its bot users (``authorizations``) and its id (``api_app_id``)."""

    users: frozenset[str]
    app_id: str | None

    @classmethod
    def of(cls, root: _Object) -> _App:
        users = set()
        authorizations = root.raw.get("authorizations")
        if isinstance(authorizations, list):
            for entry in authorizations:
                if isinstance(entry, Mapping) and entry.get("is_bot") is True:
                    user = entry.get("user_id")
                    if isinstance(user, str) and user:
                        users.add(user)
        app_id = root.raw.get("api_app_id")
        return cls(frozenset(users), app_id if isinstance(app_id, str) and app_id else None)

    def posted(self, event: _Object, user: str | None) -> bool:
        """Whether the app itself posted a message: its bot user, or its app id on the message."""
        if user is not None and user in self.users:
            return True
        if self.app_id is None:
            return False
        profile = event.raw.get("bot_profile")
        profile_app = profile.get("app_id") if isinstance(profile, Mapping) else None
        return self.app_id in (event.raw.get("app_id"), profile_app)


def _message(kind: str, event: _Object, app: _App) -> Mapped:
    channel = event.text("channel", ID_CHARS)
    ts = event.ts("ts")
    user = event.optional_text("user", ID_CHARS)
    text = event.raw.get("text")
    if text is not None and not isinstance(text, str):
        raise Unmapped(f"{event.name('text')}: must be a string, not {_payload.kind(text)}")
    text = text or ""
    is_bot = event.raw.get("bot_id") is not None or event.raw.get("subtype") == "bot_message"
    occurred_at = moment_of(ts)
    data = {
        "channel": channel,
        "user": user,
        "text": text[:EXCERPT_CHARS],
        "textTruncated": len(text) > EXCERPT_CHARS,
        "ts": ts,
        "threadTs": event.optional_ts("thread_ts") or ts,
        "occurredAt": iso(occurred_at),
        "isBot": is_bot,
    }
    return Mapped(kind, f"{kind}:{channel}:{ts}", occurred_at, data, own=app.posted(event, user))


def _app_mention(event: _Object, app: _App) -> Mapped | None:
    return _message("app_mention", event, app)


def _channel_message(event: _Object, app: _App) -> Mapped | None:
    if event.raw.get("channel_type") != "channel" or event.raw.get("subtype") not in MESSAGE_SUBTYPES:
        return None
    if event.raw.get("hidden") is True:
        return None
    return _message("message.channels", event, app)


def _reaction_added(event: _Object, app: _App) -> Mapped | None:
    item = event.object("item")
    if item.raw.get("type") != "message":
        return None  # a reaction to a file or a file comment: no channel to speak of
    user = event.text("user", ID_CHARS)
    reaction = event.text("reaction", NAME_CHARS)
    channel, item_ts = item.text("channel", ID_CHARS), item.ts("ts")
    event_ts = event.ts("event_ts")
    occurred_at = moment_of(event_ts)
    data = {
        "user": user,
        "reaction": reaction,
        "itemChannel": channel,
        "itemTs": item_ts,
        "itemUser": event.optional_text("item_user", ID_CHARS),
        "occurredAt": iso(occurred_at),
        "isBot": False,
    }
    event_id = f"reaction_added:{channel}:{item_ts}:{user}:{reaction}:{event_ts}"
    return Mapped("reaction_added", event_id, occurred_at, data, own=user in app.users)


# The inner event's "type" and its mapper.
_MAPPERS: Final[dict[str, Callable[[_Object, _App], Mapped | None]]] = {
    "app_mention": _app_mention,
    "message": _channel_message,
    "reaction_added": _reaction_added,
}


# ---- the entry point -----------------------------------------------------------------


def event_id_of(body: Any) -> str | None:
    """The ``event_id`` of an ``event_callback`` body (what deliveries are deduplicated on), or None."""
    if not isinstance(body, Mapping):
        return None
    value = body.get("event_id")
    return value if isinstance(value, str) and 0 < len(value) <= ID_CHARS else None


def from_callback(body: Mapping[str, Any]) -> Mapped | None:
    """An ``event_callback`` body as an event, or None if it is not one we emit."""
    root = _Object.of(body, "")
    event = root.object("event")
    mapper = _MAPPERS.get(event.text("type", NAME_CHARS))
    if mapper is None:
        return None
    return mapper(event, _App.of(root))


# ---- the subscription filter ---------------------------------------------------------


def matches(arguments: dict[str, Any], data: dict[str, Any]) -> bool:
    """Whether an event's data passes a subscription's arguments; an absent argument lets all through."""
    channel = arguments.get("channel")
    if channel is not None and channel != data.get("channel", data.get("itemChannel")):
        return False
    user = arguments.get("user")
    return user is None or user == data.get("user")
