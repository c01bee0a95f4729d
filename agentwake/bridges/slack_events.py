"""Slack's Events API callbacks as the Slack bridge's MCP events. Pure: no I/O.

An ``event_callback`` body arrives either over HTTP (the Events API's Request URL) or inside
a Socket Mode envelope; both carry the same body, so both map here to the same event:

    app_mention            app_mention:<channel>:<ts>
    message.channels       message.channels:<channel>:<ts>       a public channel
    message.groups         message.groups:<channel>:<ts>         a private channel
    message.im             message.im:<channel>:<ts>             a direct message to the app
    message.mpim           message.mpim:<channel>:<ts>           a group DM the app is in
    message.changed        message.changed:<channel>:<ts>:<edit's ts>
    message.deleted        message.deleted:<channel>:<ts>
    member_joined_channel  member_joined_channel:<channel>:<user>:<event_ts, else event_time>
    reaction_added         reaction_added:<item channel>:<item ts>:<user>:<reaction>:<event_ts>

The event id names the occurrence (a message is its channel and ``ts``), not the delivery:
Slack's own ``event_id`` is what the bridge deduplicates deliveries on, and these ids keep
one occurrence one event whichever ingress path brought it. A mention in a channel the app
is in comes twice, as ``app_mention`` and as ``message.channels``: two event types, two events.

A ``message`` is a message event by its ``channel_type`` (channel, group, im, mpim) when its
subtype is someone saying something (none, ``file_share``, ``thread_broadcast``, ``me_message``,
``bot_message``); ``message_changed`` and ``message_deleted`` are edits and deletions of any of
them, events of their own so that a policy can tell them apart; every other subtype (joins,
topics, ...) maps to None, as does a reaction to anything but a message. Whether the app itself
caused an event (its own post, edit, deletion or reaction, which must never wake the agent that
made it) is read from the body alone: the bot user of ``authorizations`` and the app of
``api_app_id``. Other apps' messages are marked ``isBot``; the bridge drops them unless told
to keep them.

``data`` is small, typed and camelCase; text becomes a bounded excerpt, and a file is its name,
type and size, never its content or its URLs. A body of a type we emit with a missing or
ill-typed field raises ``Unmapped`` naming the field, never its value.
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
FILE_NAME_CHARS: Final = 255
# Slack takes at most 10 files per message; more would not be a message Slack sent.
FILES_MAX: Final = 20
# Slack's message timestamps: epoch seconds with a fractional part ("1718000000.000200").
TS_PATTERN: Final = r"^\d{1,12}\.\d{1,9}$"
CHANNEL_PATTERN: Final = r"^[CGD][A-Z0-9]{2,30}$"
USER_PATTERN: Final = r"^[UWB][A-Z0-9]{2,30}$"
_TS: Final = re.compile(TS_PATTERN)
# Message subtypes that are someone saying something; edits, deletions, joins and the rest are not.
MESSAGE_SUBTYPES: Final = frozenset({None, "thread_broadcast", "file_share", "me_message", "bot_message"})
# A message's event type by Slack's channel_type.
MESSAGE_TYPES: Final = {
    "channel": "message.channels",
    "group": "message.groups",
    "im": "message.im",
    "mpim": "message.mpim",
}
CHANNEL_TYPES: Final = tuple(MESSAGE_TYPES)
# member_joined_channel names the channel's type by a letter.
_JOIN_CHANNEL_TYPES: Final = {"C": "channel", "G": "group"}

EVENT_TYPES: dict[str, str] = {
    "app_mention": "The app was mentioned (@app) in a message of a channel it is in.",
    "message.channels": "A message was posted in a public channel the app is in (a channel filter is required).",
    "message.groups": "A message was posted in a private channel the app is in (a channel filter is required).",
    "message.im": "A direct message to the app.",
    "message.mpim": "A message was posted in a group DM (several people and the app).",
    "message.changed": "A message was edited, in any conversation the app gets messages of.",
    "message.deleted": "A message was deleted, in any conversation the app gets messages of.",
    "member_joined_channel": "Someone joined a channel the app is in, or was added to it.",
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
            "Whether another app (a bot) posted the message; reactions and joins do not say, so they are false."
        ),
    }


def _schema(fields: dict[str, dict[str, Any]]) -> dict[str, Any]:
    properties = {**fields, **_common()}
    return closed_schema(properties)


def _channel() -> dict[str, Any]:
    return text_schema(
        "The conversation's id (C0123ABCD; a DM's is D…, a private channel's may be G…).", ID_CHARS
    )


def _channel_type() -> dict[str, Any]:
    return {
        "type": "string",
        "enum": list(CHANNEL_TYPES),
        "description": "Where: channel (public), group (private channel), im (a DM with the app), mpim (a group DM).",
    }


def _excerpt(what: str) -> dict[str, dict[str, Any]]:
    return {
        "text": text_schema(
            f"The first {EXCERPT_CHARS} characters of {what}, as Slack sends it"
            " (<@U0123ABCD> is a mention); '' when it has none.",
            EXCERPT_CHARS,
        ),
        "textTruncated": boolean_schema(f"Whether {what} is longer than the excerpt."),
    }


def _thread_ts() -> dict[str, Any]:
    return text_schema(
        "The thread the message belongs to: its parent's ts when it is a reply, else its own ts"
        " (equal to ts). Replying with threadTs answers in the thread, starting it if need be.",
        ID_CHARS,
    )


def _file_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "name": text_schema(
                "The file's name, or null when Slack hides it.", FILE_NAME_CHARS, nullable=True
            ),
            "filetype": text_schema('Slack\'s short type ("png", "pdf", "text").', NAME_CHARS, nullable=True),
            "mimetype": text_schema('The MIME type ("image/png").', NAME_CHARS, nullable=True),
            "size": {"type": ["integer", "null"], "minimum": 0, "description": "The size in bytes."},
        },
        "required": ["name", "filetype", "mimetype", "size"],
        "additionalProperties": False,
    }


def _message_schema() -> dict[str, Any]:
    return _schema(
        {
            "channel": _channel(),
            "user": text_schema(
                "The author's user id, or null for an app's message without one.", ID_CHARS, nullable=True
            ),
            **_excerpt("the message"),
            "ts": text_schema("The message's timestamp, its id within the channel.", ID_CHARS),
            "threadTs": _thread_ts(),
            "subtype": text_schema(
                "Slack's subtype: null for a plain message, file_share (files attached), thread_broadcast"
                " (a reply also sent to the channel), me_message (/me) or bot_message (an app's).",
                NAME_CHARS,
                nullable=True,
            ),
            "files": {
                "type": "array",
                "maxItems": FILES_MAX,
                "items": _file_schema(),
                "description": "The files attached (name, type, size; never their content or URLs); [] for none.",
            },
            "isReply": boolean_schema(
                "Whether the message is a reply in a thread (threadTs is then its parent's)."
            ),
            "parentUser": text_schema(
                "For a reply, the user id of who started the thread, when Slack says; else null.",
                ID_CHARS,
                nullable=True,
            ),
        }
    )


PAYLOAD_SCHEMAS: dict[str, dict[str, Any]] = {
    "app_mention": _message_schema(),
    **{name: _message_schema() for name in MESSAGE_TYPES.values()},
    "message.changed": _schema(
        {
            "channel": _channel(),
            "channelType": _channel_type(),
            "user": text_schema(
                "Who edited it: the message's author (only the author can edit), or null for an app's"
                " message without one.",
                ID_CHARS,
                nullable=True,
            ),
            **_excerpt("the new text"),
            "ts": text_schema(
                "The edited message's ts (Slack's previous_message.ts): which message it is.", ID_CHARS
            ),
            "threadTs": _thread_ts(),
        }
    ),
    "message.deleted": _schema(
        {
            "channel": _channel(),
            "channelType": _channel_type(),
            "user": text_schema(
                "The deleted message's author (Slack does not say who deleted it), or null.",
                ID_CHARS,
                nullable=True,
            ),
            "ts": text_schema(
                "The deleted message's ts (Slack's deleted_ts): which message it was.", ID_CHARS
            ),
            "threadTs": _thread_ts(),
        }
    ),
    "member_joined_channel": _schema(
        {
            "channel": text_schema("The channel's id.", ID_CHARS),
            "channelType": {
                "type": "string",
                "enum": ["channel", "group"],
                "description": "channel (public) or group (private channel).",
            },
            "user": text_schema("The user id of who joined.", ID_CHARS),
            "inviter": text_schema(
                "The user id of who added them, or null when they joined by themselves.",
                ID_CHARS,
                nullable=True,
            ),
        }
    ),
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
                "description": "Only events caused by this user id (U0123ABCD): the author, who reacted,"
                " or who joined.",
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
    "message.groups": _arguments(channel_required=True),
    # DMs and group DMs are addressed to the app, as mentions are; edits, deletions and joins are few.
    "message.im": _arguments(channel_required=False),
    "message.mpim": _arguments(channel_required=False),
    "message.changed": _arguments(channel_required=False),
    "message.deleted": _arguments(channel_required=False),
    "member_joined_channel": _arguments(channel_required=False),
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

    def whole_text(self) -> str:
        """``text`` whole ('' when absent), for an excerpt that says whether it was cut."""
        value = self.raw.get("text")
        if value is not None and not isinstance(value, str):
            raise Unmapped(f"{self.name('text')}: must be a string, not {_payload.kind(value)}")
        return value or ""

    def optional_size(self, key: str) -> int | None:
        value = self.raw.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise Unmapped(f"{self.name(key)}: must be a size in bytes, not {_payload.kind(value)}")
        return value


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

    def posted(self, message: _Object, user: str | None) -> bool:
        """Whether the app itself posted a message: its bot user, or its app id on the message."""
        if user is not None and user in self.users:
            return True
        if self.app_id is None:
            return False
        profile = message.raw.get("bot_profile")
        profile_app = profile.get("app_id") if isinstance(profile, Mapping) else None
        return self.app_id in (message.raw.get("app_id"), profile_app)


def _is_bot(message: _Object) -> bool:
    return message.raw.get("bot_id") is not None or message.raw.get("subtype") == "bot_message"


def _excerpt_of(message: _Object) -> dict[str, Any]:
    text = message.whole_text()
    return {"text": text[:EXCERPT_CHARS], "textTruncated": len(text) > EXCERPT_CHARS}


def _files(message: _Object) -> list[dict[str, Any]]:
    """What a message's files are: name, type and size. Their content, previews and URLs (private
    ones included) stay out."""
    return [
        {
            "name": file.optional_text("name", FILE_NAME_CHARS),
            "filetype": file.optional_text("filetype", NAME_CHARS),
            "mimetype": file.optional_text("mimetype", NAME_CHARS),
            "size": file.optional_size("size"),
        }
        for file in message.objects("files", FILES_MAX)
    ]


def _message(kind: str, event: _Object, app: _App) -> Mapped:
    channel = event.text("channel", ID_CHARS)
    ts = event.ts("ts")
    user = event.optional_text("user", ID_CHARS)
    thread_ts = event.optional_ts("thread_ts") or ts
    is_reply = thread_ts != ts
    parent_user = event.optional_text("parent_user_id", ID_CHARS)
    if parent_user is None and is_reply and (root := event.optional_object("root")) is not None:
        parent_user = root.optional_text("user", ID_CHARS)  # a thread_broadcast carries its thread's root
    occurred_at = moment_of(ts)
    data = {
        "channel": channel,
        "user": user,
        **_excerpt_of(event),
        "ts": ts,
        "threadTs": thread_ts,
        "subtype": event.optional_text("subtype", NAME_CHARS),
        "files": _files(event),
        "isReply": is_reply,
        "parentUser": parent_user if is_reply else None,
        "occurredAt": iso(occurred_at),
        "isBot": _is_bot(event),
    }
    return Mapped(kind, f"{kind}:{channel}:{ts}", occurred_at, data, own=app.posted(event, user))


def _app_mention(event: _Object, app: _App) -> Mapped | None:
    return _message("app_mention", event, app)


def _message_event(event: _Object, app: _App) -> Mapped | None:
    channel_type = event.raw.get("channel_type")
    if channel_type not in MESSAGE_TYPES:
        return None  # an app home's or a future kind of conversation
    subtype = event.raw.get("subtype")
    if subtype == "message_changed":
        return _changed(event, channel_type, app)
    if subtype == "message_deleted":
        return _deleted(event, channel_type, app, event.object("previous_message"), event.ts("deleted_ts"))
    if subtype not in MESSAGE_SUBTYPES or event.raw.get("hidden") is True:
        return None
    return _message(MESSAGE_TYPES[channel_type], event, app)


def _changed(event: _Object, channel_type: str, app: _App) -> Mapped | None:
    message, previous = event.object("message"), event.optional_object("previous_message")
    if message.raw.get("subtype") == "tombstone":
        # A thread's parent deleted while replies remain is kept as a tombstone: a deletion.
        return _deleted(event, channel_type, app, message, message.ts("ts"))
    if (
        previous is not None
        and "edited" not in message.raw
        and message.raw.get("text") == previous.raw.get("text")
    ):
        return None  # a link unfurled, a reply counted: Slack changed it, nobody edited it
    channel = event.text("channel", ID_CHARS)
    # The edited message's ts: the message's own, else (as in some of Slack's bodies) its previous version's.
    ts = message.optional_ts("ts") or (previous.ts("ts") if previous is not None else message.ts("ts"))
    edit_ts = event.ts("ts")
    user = message.optional_text("user", ID_CHARS)
    occurred_at = moment_of(edit_ts)
    data = {
        "channel": channel,
        "channelType": channel_type,
        "user": user,
        **_excerpt_of(message),
        "ts": ts,
        "threadTs": message.optional_ts("thread_ts") or ts,
        "occurredAt": iso(occurred_at),
        "isBot": _is_bot(message),
    }
    event_id = f"message.changed:{channel}:{ts}:{edit_ts}"
    return Mapped("message.changed", event_id, occurred_at, data, own=app.posted(message, user))


def _deleted(event: _Object, channel_type: str, app: _App, message: _Object, ts: str) -> Mapped:
    channel = event.text("channel", ID_CHARS)
    user = message.optional_text("user", ID_CHARS)
    occurred_at = moment_of(event.ts("ts"))
    data = {
        "channel": channel,
        "channelType": channel_type,
        "user": user,
        "ts": ts,
        "threadTs": message.optional_ts("thread_ts") or ts,
        "occurredAt": iso(occurred_at),
        "isBot": _is_bot(message),
    }
    # One deletion of one message: its ts names it, however Slack told it.
    event_id = f"message.deleted:{channel}:{ts}"
    return Mapped("message.deleted", event_id, occurred_at, data, own=app.posted(message, user))


def _member_joined(event: _Object, app: _App, root: _Object) -> Mapped | None:
    channel = event.text("channel", ID_CHARS)
    user = event.text("user", ID_CHARS)
    letter = event.text("channel_type", NAME_CHARS)
    channel_type = _JOIN_CHANNEL_TYPES.get(letter)
    if channel_type is None:
        raise Unmapped(f"{event.name('channel_type')}: must be C or G")
    inviter = event.optional_text("inviter", ID_CHARS)
    # Slack's bodies carry event_ts; where one does not, the body's event_time is the same on both paths.
    event_ts = event.optional_ts("event_ts")
    if event_ts is not None:
        occurred_at, moment = moment_of(event_ts), event_ts
    else:
        seconds = root.integer("event_time")
        occurred_at, moment = datetime.fromtimestamp(seconds, UTC), str(seconds)
    data = {
        "channel": channel,
        "channelType": channel_type,
        "user": user,
        "inviter": inviter,
        "occurredAt": iso(occurred_at),
        "isBot": False,
    }
    event_id = f"member_joined_channel:{channel}:{user}:{moment}"
    # The app joining by itself is its own doing; being added by someone is news.
    own = user in app.users and (inviter is None or inviter in app.users)
    return Mapped("member_joined_channel", event_id, occurred_at, data, own=own)


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
_MAPPERS: Final[dict[str, Callable[[_Object, _App, _Object], Mapped | None]]] = {
    "app_mention": lambda event, app, root: _app_mention(event, app),
    "message": lambda event, app, root: _message_event(event, app),
    "member_joined_channel": _member_joined,
    "reaction_added": lambda event, app, root: _reaction_added(event, app),
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
    return mapper(event, _App.of(root), root)


# ---- the subscription filter ---------------------------------------------------------


def matches(arguments: dict[str, Any], data: dict[str, Any]) -> bool:
    """Whether an event's data passes a subscription's arguments; an absent argument lets all through."""
    channel = arguments.get("channel")
    if channel is not None and channel != data.get("channel", data.get("itemChannel")):
        return False
    user = arguments.get("user")
    return user is None or user == data.get("user")
