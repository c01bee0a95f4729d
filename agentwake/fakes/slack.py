"""A fake Slack on loopback, for the Slack bridge's tests and offline walkthroughs.

It plays Slack's three parts the bridge talks to:

* the Web API (``POST|GET /api/<method>``, form, query or JSON arguments, ``Authorization:
  Bearer``): ``auth.test``, ``chat.postMessage`` (with Block Kit ``blocks``), ``chat.update``,
  ``reactions.add``, ``conversations.replies``,
  ``users.info`` with the bot token and ``apps.connections.open`` with the app-level token,
  answering as Slack does (HTTP 200 with ``{"ok": false, "error": "invalid_auth"}`` and the like);
* Socket Mode: ``apps.connections.open`` hands out a one-time ``ws://127.0.0.1/link/?ticket=...``
  URL; the WebSocket says ``hello``, carries envelopes (``send_envelope``), records the client's
  acks and can ask it to reconnect (``disconnect``);
* the Events API's sender: ``deliver`` POSTs an ``event_callback`` to a Request URL signed as Slack
  signs it (``X-Slack-Signature: v0=`` HMAC-SHA256 over ``v0:{timestamp}:{body}``).

Channels, messages, threads and users live in memory. A conversation is a public channel, a
private one (``group``), a DM with the app (``im``; ``DM`` is alice's) or a group DM (``mpim``),
as ``add_channel`` says. A human's message is ``say(...)``, which returns the ``event_callback``
bodies Slack would send for it (``message`` with the conversation's ``channel_type`` and, when it
mentions the bot outside a DM, ``app_mention``), with files (``file_share``) or sent to the channel
from a thread (``thread_broadcast``) if asked. ``edit``, ``delete`` and ``join`` return the
bodies of an edit (``message_changed``), a deletion (``message_deleted``) and a
``member_joined_channel``, shaped as Slack sends them. With ``echo = True`` the bot's own writes
come back as events too, as on Slack (its post as a ``message`` with its ``bot_id``, its update
as a ``message_changed``, its reaction as ``reaction_added``), over Socket Mode when a client is
connected, else to ``events_url``: the bridge must drop them.

It is one module of over 700 lines because its three parts share one workspace's state.

``python -m agentwake.fakes.slack [--port 8790] [--events-url URL]`` serves it until interrupted,
printing its API base on stdout; ``POST /_fake/say {"channel", "text"}`` (and optionally
"thread_ts", "user", "files") then has a human speak (a channel id starting with D is a DM),
and every write the bot makes is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import itertools
import json
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import aiohttp
import anyio
from aiohttp import web

from agentwake.fakes._http import serve, until_stopped

TEAM = "T0FAKE"
APP_ID = "A0FAKE"
BOT_ID = "B0FAKE"
BOT_USER = "U0BOT"
HUMAN = "U0HUMAN"
CHANNEL = "C0GENERAL"
DM = "D0HUMAN"  # alice's DM with the app
# Slack's channel_type of each kind of conversation, and the letter member_joined_channel uses.
CHANNEL_KINDS = ("channel", "group", "im", "mpim")
_JOIN_LETTER = {"channel": "C", "group": "G"}
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
BOT_TOKEN = "xoxb-1-fake-bot-token"
APP_TOKEN = "xapp-1-A0FAKE-fake-app-token"
# Which token kind each method takes; the rest take the bot token.
APP_TOKEN_METHODS = frozenset({"apps.connections.open"})


def signature(secret: str, timestamp: int | str, body: bytes) -> str:
    """``X-Slack-Signature`` as Slack computes it."""
    base = f"v0:{timestamp}:".encode() + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Recorded:
    """One Web API request: the method name, the HTTP verb, headers, and the arguments however sent."""

    method: str
    verb: str
    headers: dict[str, str]
    args: dict[str, Any]
    json: Any | None


@dataclass(frozen=True)
class Ack:
    """A Socket Mode acknowledgement: the envelope, the connection (0 is the first), and what ``on_ack`` saw."""

    envelope_id: str
    connection: int
    payload: Any
    seen: Any


@dataclass
class Delivery:
    """The Request URL's answer to one Events API POST."""

    status: int
    body: Any


@dataclass
class _Connection:
    index: int
    ws: web.WebSocketResponse
    closed: bool = False


@dataclass
class _Channel:
    id: str
    name: str
    kind: str = "channel"
    messages: list[dict[str, Any]] = field(default_factory=list)


class FakeSlack:
    """Slack's Web API, Socket Mode and Events API sender, in memory on 127.0.0.1."""

    def __init__(
        self,
        *,
        bot_token: str = BOT_TOKEN,
        app_token: str = APP_TOKEN,
        signing_secret: str = SIGNING_SECRET,
        port: int = 0,
    ) -> None:
        self.bot_token = bot_token
        self.app_token = app_token
        self.signing_secret = signing_secret
        self.port = port
        self.url = ""  # the API base, ending in /api/
        self.requests: list[Recorded] = []
        self.acks: list[Ack] = []
        self.connections: list[_Connection] = []
        self.deliveries: list[Delivery] = []
        # Knobs a test may change at any time.
        self.echo = False
        self.events_url: str | None = None
        self.on_ack: Callable[[str], Any] | None = None
        self.on_write: Callable[[Recorded], None] | None = None
        self.say_line: Callable[[str], None] | None = None  # the program prints what happens here
        self.users: dict[str, dict[str, Any]] = {}
        self.channels: dict[str, _Channel] = {}
        self._tickets: set[str] = set()
        self._envelopes: dict[str, Any] = {}
        self._ids = itertools.count(1)
        self._last_ts = 0.0
        self._changed: anyio.Event | None = None
        self._runner: web.AppRunner | None = None
        # The echoes in flight: Slack sends events after it answered the write that caused them.
        self._echoes: set[asyncio.Task[None]] = set()
        self.add_user(HUMAN, "alice", real_name="Alice Example")
        self.add_user(BOT_USER, "agentwake", real_name="agentwake", is_bot=True)
        self.add_channel(CHANNEL, "general")
        self.add_channel(DM, "alice", kind="im")

    # -- lifecycle -----------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_get("/link/", self._socket)
        app.router.add_post("/_fake/say", self._say)
        self._runner = runner = await serve(app, self.port)
        self.port = runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{self.port}/api/"
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with anyio.CancelScope(shield=True):
            for connection in self.connections:
                if not connection.closed:
                    await connection.ws.close()
            for task in self._echoes:
                task.cancel()
            await asyncio.gather(*self._echoes, return_exceptions=True)
            if self._runner is not None:
                await self._runner.cleanup()

    # -- waiting -------------------------------------------------------------------------------

    def _poke(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    async def _until(self, ready: Callable[[], Any], limit_s: float, what: str) -> Any:
        try:
            with anyio.fail_after(limit_s):
                while not (found := ready()):
                    if self._changed is None:
                        self._changed = anyio.Event()
                    await self._changed.wait()
        except TimeoutError:
            seen = ", ".join(r.method for r in self.requests[-10:]) or "no API call"
            raise TimeoutError(f"no {what} within {limit_s} s (last seen: {seen})") from None
        return found

    # ASYNC109: these helpers take a timeout argument, as agentwake/fakes/github.py's do.
    async def wait_for(self, method: str, *, count: int = 1, timeout: float = 60) -> Recorded:  # noqa: ASYNC109
        """The ``count``-th Web API call of ``method``, waiting for it if it has not come yet."""

        def ready() -> Recorded | None:
            calls = self.calls(method)
            return calls[count - 1] if len(calls) >= count else None

        found: Recorded = await self._until(ready, timeout, f"{method} (#{count})")
        return found

    async def wait_ack(self, envelope_id: str, *, timeout: float = 60) -> Ack:  # noqa: ASYNC109
        def ready() -> Ack | None:
            return next((ack for ack in self.acks if ack.envelope_id == envelope_id), None)

        found: Ack = await self._until(ready, timeout, f"ack of envelope {envelope_id}")
        return found

    async def wait_connection(self, count: int = 1, *, timeout: float = 60) -> None:  # noqa: ASYNC109
        """Until ``count`` Socket Mode connections were made and the latest one is open."""

        def ready() -> bool:
            return len(self.connections) >= count and not self.connections[-1].closed

        await self._until(ready, timeout, f"Socket Mode connection #{count}")

    async def wait_deliveries(self, count: int, *, timeout: float = 60) -> list[Delivery]:  # noqa: ASYNC109
        """Until ``count`` Events API requests were answered (``emit`` sends some in the background)."""
        await self._until(lambda: len(self.deliveries) >= count, timeout, f"Events API answer #{count}")
        return self.deliveries[:count]

    async def wait_quiet(self, *, timeout: float = 60) -> None:  # noqa: ASYNC109
        """Until no echo is on its way and every envelope sent was acknowledged."""

        def quiet() -> bool:
            acked = {ack.envelope_id for ack in self.acks}
            return not self._echoes and acked >= set(self._envelopes)

        await self._until(quiet, timeout, "quiet: every envelope acknowledged")

    def calls(self, method: str | None = None) -> list[Recorded]:
        return [r for r in self.requests if method is None or r.method == method]

    # -- state ---------------------------------------------------------------------------------

    def add_user(
        self, user_id: str, name: str, *, real_name: str = "", is_bot: bool = False
    ) -> dict[str, Any]:
        self.users[user_id] = {
            "id": user_id,
            "team_id": TEAM,
            "name": name,
            "deleted": False,
            "real_name": real_name or name,
            "tz": "Europe/Amsterdam",
            "tz_label": "Central European Time",
            "is_admin": False,
            "is_bot": is_bot,
            "is_app_user": False,
            "updated": 1_718_000_000,
            "profile": {
                "title": "",
                "real_name": real_name or name,
                "display_name": name,
                "email": f"{name}@example.com",
                "image_48": f"https://avatars.example/{name}.png",
                "team": TEAM,
                **({"bot_id": BOT_ID, "api_app_id": APP_ID} if is_bot else {}),
            },
        }
        return self.users[user_id]

    def add_channel(self, channel_id: str, name: str, *, kind: str = "channel") -> None:
        """A conversation the app is in: ``kind`` is Slack's channel_type (channel, group, im, mpim)."""
        if kind not in CHANNEL_KINDS:
            raise ValueError(f"kind must be one of {', '.join(CHANNEL_KINDS)}")
        self.channels.setdefault(channel_id, _Channel(channel_id, name, kind))

    def next_ts(self) -> str:
        """A fresh message timestamp, after every earlier one (Slack's ts is a message's id)."""
        now = max(time.time(), self._last_ts + 0.000001)
        self._last_ts = now
        return f"{now:.6f}"

    def say(
        self,
        channel: str,
        text: str,
        *,
        user: str = HUMAN,
        thread_ts: str | None = None,
        files: Iterable[dict[str, Any]] = (),
        broadcast: bool = False,
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """A human's message; returns it and the event_callback bodies Slack would send for it.

        ``files`` are {name, filetype, mimetype, size} (sent as Slack's file objects, private URLs
        and all); ``broadcast`` sends a thread reply to the channel too."""
        author: dict[str, Any] = {"user": user}
        shared = [self._file(spec, user) for spec in files]
        if shared:
            author.update(subtype="file_share", files=shared, upload=False, display_as_bot=False)
        if broadcast:
            if thread_ts is None:
                raise ValueError("a broadcast is a thread reply: give its thread_ts")
            author["subtype"] = "thread_broadcast"
        message = self._post(channel, text, author, thread_ts)
        if broadcast:
            root = self._message(channel, str(thread_ts))
            if root is not None:
                message["root"] = {k: v for k, v in root.items() if k != "blocks"}
        return message, self.callbacks_for(channel, message)

    def callbacks_for(self, channel: str, message: dict[str, Any]) -> list[dict[str, Any]]:
        kind = self.channels[channel].kind
        event = {**message, "channel": channel, "event_ts": message["ts"]}
        bodies = [self.event_callback({**event, "channel_type": kind})]
        # Slack sends no app_mention for a DM: every message there is to the app.
        if f"<@{BOT_USER}>" in message.get("text", "") and "bot_id" not in message and kind != "im":
            mention = {k: v for k, v in event.items() if k not in ("reply_count", "replies")}
            bodies.insert(0, self.event_callback({**mention, "type": "app_mention"}))
        return bodies

    def edit(self, channel: str, ts: str, text: str) -> dict[str, Any]:
        """The event_callback of a message's author editing it to ``text`` (``message_changed``)."""
        message = self._message(channel, ts)
        if message is None:
            raise KeyError(f"no message {ts} in {channel}")
        previous = {k: v for k, v in message.items() if k not in ("reactions",)}
        editor = message.get("user", BOT_USER)
        message["text"] = text
        message["edited"] = {"user": editor, "ts": self.next_ts()}
        if "bot_id" not in message:
            message["blocks"] = self._blocks(text)
        return self._edited(channel, message, previous)

    def delete(self, channel: str, ts: str) -> dict[str, Any]:
        """The event_callback of a message's deletion (``message_deleted``); it is gone from the channel."""
        state = self.channels[channel]
        message = self._message(channel, ts)
        if message is None:
            raise KeyError(f"no message {ts} in {channel}")
        state.messages.remove(message)
        now = self.next_ts()
        previous = {k: v for k, v in message.items() if k not in ("reactions", "blocks")}
        return self.event_callback(
            {
                "type": "message",
                "subtype": "message_deleted",
                "previous_message": previous,
                "channel": channel,
                "hidden": True,
                "deleted_ts": ts,
                "event_ts": now,
                "ts": now,
                "channel_type": state.kind,
            }
        )

    def join(self, channel: str, user: str = HUMAN, *, inviter: str | None = None) -> dict[str, Any]:
        """The event_callback of ``user`` joining a channel, or being added to it by ``inviter``."""
        kind = self.channels[channel].kind
        if kind not in _JOIN_LETTER:
            raise ValueError("only channels and private channels are joined")
        event: dict[str, Any] = {
            "type": "member_joined_channel",
            "user": user,
            "channel": channel,
            "channel_type": _JOIN_LETTER[kind],
            "team": TEAM,
            "event_ts": self.next_ts(),
        }
        if inviter is not None:
            event["inviter"] = inviter
        return self.event_callback(event)

    def _edited(self, channel: str, message: dict[str, Any], previous: dict[str, Any]) -> dict[str, Any]:
        now = self.next_ts()
        return self.event_callback(
            {
                "type": "message",
                "subtype": "message_changed",
                "message": {k: v for k, v in message.items() if k not in ("reactions",)},
                "previous_message": previous,
                "channel": channel,
                "hidden": True,
                "ts": now,
                "event_ts": now,
                "channel_type": self.channels[channel].kind,
            }
        )

    def _file(self, spec: dict[str, Any], user: str) -> dict[str, Any]:
        """A file object as a message event carries it: its URLs, previews and permalinks included."""
        file_id = f"F{next(self._ids):08d}"
        name = spec["name"]
        created = int(time.time())
        private = f"https://files.slack.com/files-pri/{TEAM}-{file_id}"
        return {
            "id": file_id,
            "created": created,
            "timestamp": created,
            "name": name,
            "title": name,
            "mimetype": spec.get("mimetype", "application/octet-stream"),
            "filetype": spec.get("filetype", "binary"),
            "pretty_type": str(spec.get("filetype", "binary")).upper(),
            "user": user,
            "editable": False,
            "size": spec.get("size", 0),
            "mode": "hosted",
            "is_external": False,
            "is_public": False,
            "url_private": f"{private}/{name}",
            "url_private_download": f"{private}/download/{name}",
            "thumb_64": f"https://files.slack.com/files-tmb/{TEAM}-{file_id}-0a1b2c/{name}_64.png",
            "permalink": f"https://fake-workspace.slack.com/files/{user}/{file_id}/{name}",
            "permalink_public": f"https://slack-files.com/{TEAM}-{file_id}-3e534e",
            "preview": spec.get("preview", ""),
            "has_rich_preview": False,
        }

    def reaction_added(self, channel: str, ts: str, name: str, *, user: str = HUMAN) -> dict[str, Any]:
        """The event_callback of ``user`` reacting to a message."""
        message = self._message(channel, ts)
        event = {
            "type": "reaction_added",
            "user": user,
            "reaction": name,
            "item": {"type": "message", "channel": channel, "ts": ts},
            "event_ts": self.next_ts(),
        }
        if message is not None and "user" in message:
            event["item_user"] = message["user"]
        return self.event_callback(event)

    def event_callback(self, event: dict[str, Any], *, event_id: str | None = None) -> dict[str, Any]:
        """The Events API body around ``event``, as Slack wraps it for this app."""
        return {
            "token": "Jhj5dZrVaK7ZwHHjRyZWjbDl",
            "team_id": TEAM,
            "context_team_id": TEAM,
            "context_enterprise_id": None,
            "api_app_id": APP_ID,
            "event": {"team": TEAM, **event},
            "type": "event_callback",
            "event_id": event_id or f"Ev{next(self._ids):08d}FAKE",
            "event_time": int(time.time()),
            "authorizations": [
                {
                    "enterprise_id": None,
                    "team_id": TEAM,
                    "user_id": BOT_USER,
                    "is_bot": True,
                    "is_enterprise_install": False,
                }
            ],
            "is_ext_shared_channel": False,
            "event_context": "4-" + uuid.uuid4().hex,
        }

    def messages(self, channel: str) -> list[dict[str, Any]]:
        return list(self.channels[channel].messages)

    def _message(self, channel: str, ts: str) -> dict[str, Any] | None:
        state = self.channels.get(channel)
        return next((m for m in state.messages if m["ts"] == ts), None) if state else None

    @staticmethod
    def _blocks(text: str) -> list[dict[str, Any]]:
        return [
            {
                "type": "rich_text",
                "block_id": uuid.uuid4().hex[:5],
                "elements": [{"type": "rich_text_section", "elements": [{"type": "text", "text": text}]}],
            }
        ]

    def _post(self, channel: str, text: str, author: dict[str, Any], thread_ts: str | None) -> dict[str, Any]:
        message: dict[str, Any] = {
            "type": "message",
            "text": text,
            **author,
            "ts": self.next_ts(),
            "blocks": self._blocks(text),
        }
        if "bot_id" not in author:
            message["client_msg_id"] = str(uuid.uuid4())
        if thread_ts is not None:
            message["thread_ts"] = thread_ts
            parent = self._message(channel, thread_ts)
            if parent is not None:
                if "user" in parent:
                    message["parent_user_id"] = parent["user"]
                parent.setdefault("thread_ts", thread_ts)
                parent["reply_count"] = parent.get("reply_count", 0) + 1
        self.channels[channel].messages.append(message)
        return message

    # -- Events API: Slack -> the app's Request URL --------------------------------------------

    async def deliver(
        self,
        url: str,
        body: dict[str, Any] | bytes,
        *,
        timestamp: int | None = None,
        secret: str | None = None,
        signature_header: str | None = None,
        retry_num: int | None = None,
        retry_reason: str = "http_timeout",
    ) -> Delivery:
        """POST one Events API request, signed as Slack signs it (or with ``signature_header``)."""
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        stamp = int(time.time()) if timestamp is None else timestamp
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
            "X-Slack-Request-Timestamp": str(stamp),
            "X-Slack-Signature": signature_header
            if signature_header is not None
            else signature(secret or self.signing_secret, stamp, raw),
        }
        if retry_num is not None:
            headers["X-Slack-Retry-Num"] = str(retry_num)
            headers["X-Slack-Retry-Reason"] = retry_reason
        async with aiohttp.ClientSession() as session, session.post(url, data=raw, headers=headers) as answer:
            text = await answer.text()
            try:
                parsed: Any = json.loads(text)
            except ValueError:
                parsed = text
        delivery = Delivery(answer.status, parsed)
        self.deliveries.append(delivery)
        self._poke()
        return delivery

    async def emit(self, body: dict[str, Any]) -> None:
        """Send an event_callback the way this app gets events: Socket Mode if connected, else the Request URL."""
        kind = body["event"].get("type")
        if self.connections and not self.connections[-1].closed:
            await self.send_envelope(body)
            self._note(f"{kind} event sent over Socket Mode connection #{len(self.connections)}")
        elif self.events_url is not None:
            answer = await self.deliver(self.events_url, body)
            self._note(f"{kind} event POSTed to {self.events_url}: {answer.status} {answer.body}")
        else:
            self._note(f"{kind} event dropped: no Socket Mode connection and no --events-url")

    # -- Socket Mode ---------------------------------------------------------------------------

    async def send_envelope(
        self,
        payload: dict[str, Any],
        *,
        kind: str = "events_api",
        envelope_id: str | None = None,
        retry_attempt: int = 0,
        retry_reason: str = "",
    ) -> str:
        """Send an envelope on the latest connection; its envelope_id."""
        envelope_id = envelope_id or str(uuid.uuid4())
        self._envelopes[envelope_id] = payload
        envelope = {
            "envelope_id": envelope_id,
            "payload": payload,
            "type": kind,
            "accepts_response_payload": kind != "events_api",
            "retry_attempt": retry_attempt,
            "retry_reason": retry_reason,
        }
        await self._current().ws.send_str(json.dumps(envelope))
        return envelope_id

    async def disconnect(self, reason: str = "refresh_requested") -> None:
        """Ask the connected client to move to a new connection, as Slack does every few hours."""
        message = {"type": "disconnect", "reason": reason, "debug_info": {"host": "applink-fake"}}
        await self._current().ws.send_str(json.dumps(message))

    async def drop(self) -> None:
        """Close the latest connection from Slack's side without a word, as a lost link or a restart does."""
        await self._current().ws.close(code=aiohttp.WSCloseCode.GOING_AWAY)

    def _current(self) -> _Connection:
        if not self.connections or self.connections[-1].closed:
            raise RuntimeError("no Socket Mode client is connected")
        return self.connections[-1]

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        if ticket not in self._tickets:
            raise web.HTTPUnauthorized(text="invalid ticket")
        self._tickets.discard(ticket)  # one connection per ticket, as on Slack
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        connection = _Connection(len(self.connections), ws)
        self.connections.append(connection)
        hello = {
            "type": "hello",
            "num_connections": sum(not c.closed for c in self.connections),
            "debug_info": {"host": "applink-fake", "approximate_connection_time": 18060},
            "connection_info": {"app_id": APP_ID},
        }
        await ws.send_str(json.dumps(hello))
        self._poke()
        self._note(f"Socket Mode: connection #{connection.index + 1} opened")
        try:
            async for message in ws:
                if message.type == aiohttp.WSMsgType.TEXT:
                    self._acked(connection, message.data)
        finally:
            connection.closed = True
            self._poke()
            self._note(f"Socket Mode: connection #{connection.index + 1} closed")
        return ws

    def _note(self, line: str) -> None:
        if self.say_line is not None:
            self.say_line(line)

    def _acked(self, connection: _Connection, text: str) -> None:
        try:
            message = json.loads(text)
        except ValueError:
            return
        envelope_id = message.get("envelope_id") if isinstance(message, dict) else None
        if isinstance(envelope_id, str):
            seen = self.on_ack(envelope_id) if self.on_ack is not None else None
            self.acks.append(Ack(envelope_id, connection.index, message.get("payload"), seen))
            self._poke()
            self._note(f"Socket Mode: envelope {envelope_id} acknowledged")

    # -- the Web API ---------------------------------------------------------------------------

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        args: dict[str, Any] = dict(request.query)
        body: Any = None
        if request.content_type == "application/json":
            body = await request.json()
            if isinstance(body, dict):
                args.update(body)
        elif request.can_read_body:
            args.update((await request.post()).items())
        recorded = Recorded(method, request.method, dict(request.headers), args, body)
        self.requests.append(recorded)
        self._poke()
        error = self._auth_error(method, request.headers.get("Authorization"), args.get("token"))
        if error is not None:
            return _answer({"ok": False, "error": error})
        handler = self._methods().get(method)
        if handler is None:
            return _answer({"ok": False, "error": "unknown_method"}, status=404)
        result = handler(args)
        if result.get("ok") and method in ("chat.postMessage", "reactions.add") and self.on_write:
            self.on_write(recorded)
        return _answer(result)

    def _auth_error(self, method: str, header: str | None, form_token: Any) -> str | None:
        token = header[len("Bearer ") :] if header and header.startswith("Bearer ") else form_token
        if not token:
            return "not_authed"
        if token not in (self.bot_token, self.app_token):
            return "invalid_auth"
        wanted = self.app_token if method in APP_TOKEN_METHODS else self.bot_token
        return None if token == wanted else "not_allowed_token_type"

    def _methods(self) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
        return {
            "auth.test": self._auth_test,
            "apps.connections.open": self._connections_open,
            "chat.postMessage": self._post_message,
            "chat.update": self._update,
            "reactions.add": self._reactions_add,
            "conversations.replies": self._replies,
            "users.info": self._users_info,
        }

    def _auth_test(self, args: dict[str, Any]) -> dict[str, Any]:
        return {
            "ok": True,
            "url": "https://fake-workspace.slack.com/",
            "team": "Fake Workspace",
            "user": "agentwake",
            "team_id": TEAM,
            "user_id": BOT_USER,
            "bot_id": BOT_ID,
            "is_enterprise_install": False,
        }

    def _connections_open(self, args: dict[str, Any]) -> dict[str, Any]:
        ticket = uuid.uuid4().hex
        self._tickets.add(ticket)
        return {"ok": True, "url": f"ws://127.0.0.1:{self.port}/link/?ticket={ticket}&app_id={APP_ID}"}

    def _post_message(self, args: dict[str, Any]) -> dict[str, Any]:
        channel, text = args.get("channel"), args.get("text")
        if channel not in self.channels:
            return {"ok": False, "error": "channel_not_found"}
        if not isinstance(text, str) or not text:
            return {"ok": False, "error": "no_text"}
        thread_ts = args.get("thread_ts") or None
        author = {
            "user": BOT_USER,
            "bot_id": BOT_ID,
            "app_id": APP_ID,
            "bot_profile": {
                "id": BOT_ID,
                "app_id": APP_ID,
                "name": "agentwake",
                "deleted": False,
                "team_id": TEAM,
            },
            "team": TEAM,
        }
        message = self._post(channel, text, author, thread_ts)
        if isinstance(args.get("blocks"), list):
            message["blocks"] = args["blocks"]
        self._echo(self.callbacks_for(channel, message))
        return {"ok": True, "channel": channel, "ts": message["ts"], "message": message}

    def _update(self, args: dict[str, Any]) -> dict[str, Any]:
        channel, ts, text = args.get("channel"), args.get("ts"), args.get("text")
        if channel not in self.channels:
            return {"ok": False, "error": "channel_not_found"}
        message = self._message(channel, str(ts))
        if message is None:
            return {"ok": False, "error": "message_not_found"}
        if message.get("bot_id") != BOT_ID:
            return {"ok": False, "error": "cant_update_message"}
        if not isinstance(text, str) or not text:
            return {"ok": False, "error": "no_text"}
        previous = dict(message)
        message["text"] = text
        message["blocks"] = args["blocks"] if isinstance(args.get("blocks"), list) else []
        message["edited"] = {"user": BOT_USER, "ts": self.next_ts()}
        self._echo([self._edited(channel, message, previous)])
        return {"ok": True, "channel": channel, "ts": message["ts"], "text": text}

    def _reactions_add(self, args: dict[str, Any]) -> dict[str, Any]:
        channel, ts, name = args.get("channel"), args.get("timestamp"), args.get("name")
        if channel not in self.channels:
            return {"ok": False, "error": "channel_not_found"}
        if not isinstance(name, str) or not name:
            return {"ok": False, "error": "invalid_name"}
        message = self._message(channel, str(ts))
        if message is None:
            return {"ok": False, "error": "message_not_found"}
        reactions = message.setdefault("reactions", [])
        entry = next((r for r in reactions if r["name"] == name), None)
        if entry is not None and BOT_USER in entry["users"]:
            return {"ok": False, "error": "already_reacted"}
        if entry is None:
            entry = {"name": name, "users": [], "count": 0}
            reactions.append(entry)
        entry["users"].append(BOT_USER)
        entry["count"] += 1
        self._echo([self.reaction_added(channel, str(ts), name, user=BOT_USER)])
        return {"ok": True}

    def _replies(self, args: dict[str, Any]) -> dict[str, Any]:
        channel, ts = args.get("channel"), args.get("ts")
        if channel not in self.channels:
            return {"ok": False, "error": "channel_not_found"}
        parent = self._message(channel, str(ts))
        if parent is None:
            return {"ok": False, "error": "thread_not_found"}
        thread = [
            parent,
            *(m for m in self.channels[channel].messages if m.get("thread_ts") == ts and m is not parent),
        ]
        limit = int(args.get("limit") or 1000)
        return {
            "ok": True,
            "messages": thread[:limit],
            "has_more": len(thread) > limit,
            "response_metadata": {"next_cursor": ""},
        }

    def _users_info(self, args: dict[str, Any]) -> dict[str, Any]:
        user = self.users.get(str(args.get("user")))
        return {"ok": True, "user": user} if user is not None else {"ok": False, "error": "user_not_found"}

    def _echo(self, bodies: Iterable[dict[str, Any]]) -> None:
        if not self.echo:
            return
        for body in bodies:
            task = asyncio.get_running_loop().create_task(self.emit(body))
            self._echoes.add(task)
            task.add_done_callback(self._echoed)

    def _echoed(self, task: asyncio.Task[None]) -> None:
        self._echoes.discard(task)
        self._poke()

    # -- the walkthrough's control endpoint ----------------------------------------------------

    async def _say(self, request: web.Request) -> web.Response:
        asked = await request.json()
        channel = asked.get("channel", CHANNEL)
        self.add_channel(channel, channel.lower(), kind="im" if channel.startswith("D") else "channel")
        message, bodies = self.say(
            channel,
            asked["text"],
            user=asked.get("user", HUMAN),
            thread_ts=asked.get("thread_ts"),
            files=asked.get("files", ()),
        )
        for body in bodies:
            await self.emit(body)
        return web.json_response({"ts": message["ts"], "events": [b["event"]["type"] for b in bodies]})


def _answer(body: dict[str, Any], *, status: int = 200) -> web.Response:
    return web.json_response(body, status=status)


async def _serve(args: argparse.Namespace) -> None:
    def line(text: str) -> None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def show(call: Recorded) -> None:
        where = call.args.get("channel")
        thread = f" (thread {call.args['thread_ts']})" if call.args.get("thread_ts") else ""
        what = call.args.get("text") or f":{call.args.get('name')}: on {call.args.get('timestamp')}"
        line(f"{call.method} {where}{thread}: {what}")

    async with FakeSlack(
        port=args.port, bot_token=args.bot_token, app_token=args.app_token, signing_secret=args.signing_secret
    ) as fake:
        fake.echo = True
        fake.events_url = args.events_url
        fake.on_write = show
        fake.say_line = line
        for channel in args.channel:
            fake.add_channel(channel, channel.lower())
        line(fake.url)
        await until_stopped()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="A fake Slack (Web API, Socket Mode, Events API) on 127.0.0.1."
    )
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    parser.add_argument("--bot-token", default=BOT_TOKEN, help=f"the bot token (default {BOT_TOKEN})")
    parser.add_argument("--app-token", default=APP_TOKEN, help=f"the app-level token (default {APP_TOKEN})")
    parser.add_argument("--signing-secret", default=SIGNING_SECRET, help="the signing secret")
    parser.add_argument(
        "--events-url", help="the Request URL events go to when no Socket Mode client is connected"
    )
    parser.add_argument(
        "--channel", action="append", default=[], help=f"a channel id to create ({CHANNEL} always is)"
    )
    asyncio.run(_serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
