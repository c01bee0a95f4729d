"""The Slack bridge: Slack's Events API (signed HTTP) or Socket Mode in, MCP events out; Slack actions as tools.

Events API ingress (``--listen``, Slack's Request URL), in the order a request is checked:

1. the body is read whole (at most ``--max-body-bytes``, else 413) and ``X-Slack-Signature``
   (``v0=`` + hex HMAC-SHA256 of ``v0:{X-Slack-Request-Timestamp}:{body}`` with the signing
   secret) is compared in constant time: missing or wrong is 401, before anything else of the
   request is looked at;
2. ``X-Slack-Request-Timestamp`` more than five minutes off is 401: a recorded request replayed
   later is refused even though its signature is Slack's;
3. ``url_verification`` (sent when the Request URL is saved) is answered with its ``challenge``;
4. an ``event_callback`` whose ``event_id`` was received before (a replay, or one of Slack's
   retries, which carry ``X-Slack-Retry-Num``) is answered 200 ``duplicate`` and stores
   nothing; a retry of a request that never got here is new, and is handled as the first;
5. the body is mapped (``slack_events``); an event we do not emit, the app's own message, edit,
   deletion or reaction (the agent's reply must not wake it again) and, unless ``--keep-other-bots``,
   another app's message, edit or deletion are remembered and answered 200 ``ignored``; a body that cannot be
   read is remembered and answered 200 ``unreadable`` (Slack would only retry it);
6. the event is committed to the log, then answered 200 ``accepted``: well within Slack's 3 s,
   as nothing but a local SQLite commit stands between the request and the answer.

Socket Mode ingress (``--socket-mode``, no public URL): slack-sdk's Socket Mode client opens
``apps.connections.open`` with the app-level token and keeps the WebSocket (reconnecting on
Slack's ``disconnect`` and on a dropped socket). Each ``events_api`` envelope carries the same
``event_callback`` body and goes through steps 4 to 6; it is acknowledged only once its event
is committed, so an envelope lost to a crash is sent again by Slack and deduplicated here.

Interactivity (the Approve and Deny buttons of ``--approvals-url``, agentwake.bridges.slack_approvals):
Slack posts ``payload=<json>`` form-encoded to ``--interactions-path`` on the same listener, signed
the same way, so steps 1 and 2 apply as they are; over Socket Mode the clicks arrive as
``interactive`` envelopes. Either is answered at once; agentwake is asked afterwards.

Tools call the Web API through slack-sdk's ``AsyncWebClient`` with the bot token named by
``--bot-token-env``, retrying nothing (a post must not happen twice because an answer was lost).
``post_message`` and ``reply_in_thread`` escape Slack's control characters in their text and ask Slack
not to link names (agentwake.bridges.mentions), so a post mentions no one and shows every link's real
URL, unless called with ``allow_mentions`` (which the policy pins to false unless its rule allows it).
No token, secret or Socket Mode ticket is in an error, a repr or a log line.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import re
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Final

import aiohttp
import anyio
from aiohttp import web
from pydantic import Field
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.async_client import AsyncBaseSocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient
from yarl import URL

from agentwake.backoff import backoff_s
from agentwake.bridges import _payload, mentions, slack_events
from agentwake.bridges.framework import (
    Bridge,
    BridgeOptions,
    BridgeServer,
    bridge_event_types,
    refuse,
)
from agentwake.bridges.log import NewEvent
from agentwake.bridges.slack_approvals import ApprovalSettings, SlackApprovals
from agentwake.signing import timestamp_error
from agentwake.text import peer

logger = logging.getLogger("agentwake.bridge.slack")
# slack-sdk's clients log here, through a filter that keeps credentials out.
sdk_logger = logging.getLogger("agentwake.bridge.slack.sdk")

DESCRIPTION: Final = (
    "Slack as MCP events: mentions of the app, messages of channels, private channels and DMs, their"
    " edits and deletions, joins and reactions, from Slack's Events API or Socket Mode, with tools to"
    " post, reply in threads, react, and read threads and users."
)
SLACK_API: Final = "https://slack.com/api/"
SIGNATURE_HEADER: Final = "X-Slack-Signature"
TIMESTAMP_HEADER: Final = "X-Slack-Request-Timestamp"
RETRY_HEADER: Final = "X-Slack-Retry-Num"
TOOLS: Final = ("post_message", "reply_in_thread", "add_reaction", "get_thread", "get_user")
API_TIMEOUT_S: Final = 15
# How long one Socket Mode connection attempt may take before a fresh URL is asked for.
CONNECT_TIMEOUT_S: Final = 30.0
MESSAGE_CHARS: Final = 4000
ERROR_CHARS: Final = 300
# A token goes into a header as it is: anything else would make the HTTP library quote it in an error.
_TOKEN: Final = re.compile(r"[\x21-\x7e]+")
# What slack-sdk may put in a log line that must not be there: a Socket Mode URL's one-time
# ticket, a token, a proxy URL's credentials.
_CREDENTIALS: Final = re.compile(
    r"(?P<ticket>ticket=)[^&\s'\"]+|\bx(?:ox[a-z]|app)-[\w-]+|(?P<userinfo>://)[^/\s:@]+:[^/\s@]+@"
)

Channel = Annotated[
    str,
    Field(
        pattern=slack_events.CHANNEL_PATTERN, description="The channel's id (C0123ABCD), as events name it."
    ),
]
Timestamp = Annotated[
    str, Field(pattern=slack_events.TS_PATTERN, description="A message's ts (1718000000.000200).")
]
Text = Annotated[
    str,
    Field(
        min_length=1,
        max_length=40_000,
        description="The message, in Slack's mrkdwn (*bold*, _italic_, `code`). Unless allow_mentions,"
        " it is shown as written: <!here>, <@U…> and <url|label> stay plain text and @here notifies no one.",
    ),
]
AllowMentions = Annotated[
    bool,
    Field(
        description="Send the text as given, so its mentions (<!channel>, <!here>, <@U…>, <!subteam^…>)"
        " notify and its <url|label> links show only their labels. Only honoured when the policy rule"
        " allows it (allow_mentions = true); otherwise it is set to false.",
    ),
]


@dataclass(frozen=True)
class SlackSettings:
    """What ``agentwake bridge slack`` takes beyond the common bridge options."""

    signing_secret: bytes | None = field(default=None, repr=False)
    bot_token: str | None = field(default=None, repr=False)
    app_token: str | None = field(default=None, repr=False)
    api_base: str = SLACK_API
    ignore_other_bots: bool = True
    approvals: ApprovalSettings | None = None
    interactions_path: str = "/slack/interactions"


def signature_valid(secret: bytes, timestamp: str, body: bytes, header: str | None) -> bool:
    """Whether ``header`` is Slack's ``v0=<hex HMAC-SHA256 of v0:{timestamp}:{body}>``, compared in constant time."""
    if not header or not header.startswith("v0=") or not timestamp.isascii():
        return False
    mac = hmac.new(secret, f"v0:{timestamp}:".encode(), hashlib.sha256)
    mac.update(body)
    expected = "v0=" + mac.hexdigest()
    return hmac.compare_digest(expected.encode(), header.strip().encode("ascii", "replace"))


def _answer(status: str, *, code: int = 200, **fields: Any) -> web.Response:
    return web.json_response({"status": status, **fields}, status=code)


class _Scrub(logging.Filter):
    """Takes credentials out of slack-sdk's log lines, and their tracebacks (which repeat its URLs)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = scrub(record.getMessage())
        record.args = None
        record.exc_info = None
        record.exc_text = None
        return True


def scrub(text: str) -> str:
    """``text`` without Socket Mode tickets, Slack tokens or URL credentials."""

    def redacted(found: re.Match[str]) -> str:
        if found["ticket"]:
            return "ticket=[redacted]"
        return "://[redacted]@" if found["userinfo"] else "[redacted]"

    return _CREDENTIALS.sub(redacted, text)


if not any(isinstance(f, _Scrub) for f in sdk_logger.filters):
    sdk_logger.addFilter(_Scrub())


@dataclass(frozen=True)
class Outcome:
    """What became of one event_callback: accepted, duplicate, ignored or unreadable (and why)."""

    status: str
    reason: str = ""


class SlackError(Exception):
    """A Web API call that failed: Slack's ``error`` code, or (no answer) what went wrong on the way."""

    def __init__(self, method: str, message: str) -> None:
        self.method = method
        self.message = message
        super().__init__(f"Slack API {method}: {message}")


class SlackAPI:
    """The Web API methods the tools use, through slack-sdk's AsyncWebClient at ``base_url``."""

    def __init__(self, *, base_url: str = SLACK_API, token: str | None = None) -> None:
        # The URL is not quoted back: a mistyped one may hold a credential.
        try:
            parsed = URL(base_url)
        except (TypeError, ValueError):
            parsed = URL()
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError("the API base URL must be an http(s) URL with a host")
        if parsed.user or parsed.password:
            raise ValueError("the API base URL must not carry credentials: pass the token in its variable")
        if token is not None and not _TOKEN.fullmatch(token):
            raise ValueError("the Slack bot token must be printable ASCII without spaces")
        self.base_url = str(parsed)
        self._token = token
        self.client = AsyncWebClient(
            token=token, base_url=self.base_url, timeout=API_TIMEOUT_S, retry_handlers=[], logger=sdk_logger
        )

    def __repr__(self) -> str:
        return f"<SlackAPI {self.base_url} {'with a token' if self._token else 'without a token'}>"

    async def call(self, method: str, send: Callable[[AsyncWebClient], Awaitable[Any]]) -> dict[str, Any]:
        """Slack's answer to one method as a dict; SlackError for an ``ok: false`` or no answer."""
        if not self._token:
            raise SlackError(method, "no bot token: set the variable --bot-token-env names")
        try:
            response = await send(self.client)
        except SlackApiError as exc:
            raise SlackError(method, _api_error(exc.response)) from None
        except (SlackClientError, aiohttp.ClientError, TimeoutError, OSError) as exc:
            # from None: the cause holds the request, and with it the Authorization header.
            raise SlackError(method, f"no answer ({self._scrub(f'{type(exc).__name__}: {exc}')})") from None
        data = response.data
        if not isinstance(data, dict):
            raise SlackError(method, f"expected a JSON object, got {peer(data, 100)!r}")
        return data

    def _scrub(self, text: str) -> str:
        if self._token:
            text = text.replace(self._token, "[token]")
        return peer(scrub(text), ERROR_CHARS)

    async def post_message(
        self, channel: str, text: str, thread_ts: str | None = None, *, allow_mentions: bool = False
    ) -> dict[str, Any]:
        """Post ``text``; unless ``allow_mentions``, escaped so it mentions no one and links nowhere
        but where it shows."""
        if allow_mentions:
            data = await self.call(
                "chat.postMessage",
                lambda c: c.chat_postMessage(channel=channel, text=text, thread_ts=thread_ts),
            )
        else:
            # Escaping covers <!here> and <@U…>; these two keep Slack from making plain
            # "@here" or "@oncall" words into mentions.
            data = await self.call(
                "chat.postMessage",
                lambda c: c.chat_postMessage(
                    channel=channel,
                    text=mentions.slack_text(text),
                    thread_ts=thread_ts,
                    link_names=False,
                    parse="none",
                ),
            )
        return {"channel": data.get("channel", channel), "ts": data.get("ts")}

    async def post_blocks(
        self, channel: str, ts: str | None, text: str, blocks: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """A message with Block Kit blocks (``text`` is the notification's fallback); with ``ts``, that
        message is replaced instead."""
        if ts is None:
            data = await self.call(
                "chat.postMessage", lambda c: c.chat_postMessage(channel=channel, text=text, blocks=blocks)
            )
        else:
            data = await self.call(
                "chat.update", lambda c: c.chat_update(channel=channel, ts=ts, text=text, blocks=blocks)
            )
        return {"channel": data.get("channel", channel), "ts": data.get("ts")}

    async def add_reaction(self, channel: str, timestamp: str, name: str) -> dict[str, Any]:
        try:
            await self.call(
                "reactions.add", lambda c: c.reactions_add(channel=channel, timestamp=timestamp, name=name)
            )
        except SlackError as exc:
            if exc.message != "already_reacted":
                raise
            return {"ok": True, "alreadyReacted": True}
        return {"ok": True, "alreadyReacted": False}

    async def get_thread(self, channel: str, thread_ts: str, limit: int) -> dict[str, Any]:
        data = await self.call(
            "conversations.replies",
            lambda c: c.conversations_replies(channel=channel, ts=thread_ts, limit=limit),
        )
        messages = data.get("messages")
        if not isinstance(messages, list):
            raise SlackError("conversations.replies", "the answer has no messages list")
        return {
            "messages": [_message(m) for m in messages[:limit] if isinstance(m, dict)],
            "hasMore": bool(data.get("has_more")),
        }

    async def get_user(self, user: str) -> dict[str, Any]:
        data = await self.call("users.info", lambda c: c.users_info(user=user))
        found = data.get("user")
        if not isinstance(found, dict):
            raise SlackError("users.info", "the answer has no user")
        profile = found.get("profile")
        if not isinstance(profile, dict):
            profile = {}
        return {
            "id": found.get("id"),
            "name": found.get("name"),
            "realName": found.get("real_name") or profile.get("real_name"),
            "displayName": profile.get("display_name"),
            "title": profile.get("title"),
            "isBot": bool(found.get("is_bot")),
            "deleted": bool(found.get("deleted")),
            "timezone": found.get("tz"),
        }


def _api_error(response: Any) -> str:
    """Slack's error code, with the scope it lacks or when to retry where Slack says."""
    data = getattr(response, "data", None)
    error = data.get("error") if isinstance(data, dict) else None
    text = peer(error, 100) if isinstance(error, str) else f"HTTP {getattr(response, 'status_code', '?')}"
    if error == "missing_scope" and isinstance(data, dict) and isinstance(data.get("needed"), str):
        text += f" (the app needs {peer(data['needed'], 100)})"
    retry_after = getattr(response, "headers", {}).get("Retry-After") if error == "ratelimited" else None
    if retry_after:
        text += f" (retry after {peer(retry_after, 20)} s)"
    return text


def _message(raw: dict[str, Any]) -> dict[str, Any]:
    text = raw.get("text")
    if not isinstance(text, str):
        text = ""
    return {
        "user": raw.get("user"),
        "text": text[:MESSAGE_CHARS],
        "textTruncated": len(text) > MESSAGE_CHARS,
        "ts": raw.get("ts"),
        "threadTs": raw.get("thread_ts"),
        "isBot": raw.get("bot_id") is not None or raw.get("subtype") == "bot_message",
    }


class SlackBridge(Bridge):
    name = "slack"
    description = DESCRIPTION
    event_types = bridge_event_types(
        slack_events.EVENT_TYPES,
        slack_events.PAYLOAD_SCHEMAS,
        slack_events.ARGUMENTS_SCHEMAS,
        slack_events.matches,
    )

    def __init__(self, options: BridgeOptions, settings: SlackSettings) -> None:
        super().__init__(options)
        if options.listen and not settings.signing_secret:
            raise ValueError("--listen needs the signing secret: set the variable --signing-secret-env names")
        # Socket Mode runs where the framework runs a poller (options.poll).
        if options.poll and not settings.app_token:
            raise ValueError(
                "--socket-mode needs the app-level token: set the variable --app-token-env names"
            )
        if settings.app_token is not None and not (
            settings.app_token.startswith("xapp-") and _TOKEN.fullmatch(settings.app_token)
        ):
            raise ValueError(
                "the app-level token must be an xapp- token (Basic Information, App-Level Tokens)"
            )
        if settings.approvals is not None and (
            not settings.interactions_path.startswith("/")
            or settings.interactions_path == options.webhook_path
        ):
            raise ValueError("--interactions-path must be a path of its own, starting with /")
        self.settings = settings
        self.api = SlackAPI(base_url=settings.api_base, token=settings.bot_token)
        self.approvals: SlackApprovals | None = None
        if settings.approvals is not None:
            self.approvals = SlackApprovals(
                settings.approvals, self.api.post_blocks, (self._get_state, self._set_state)
            )

    def _get_state(self, key: str) -> Any:
        return self.server_of().log.get_state(key)

    def _set_state(self, key: str, value: Any) -> None:
        self.server_of().log.set_state(key, value)

    async def background(self) -> None:
        if self.approvals is not None:
            await self.approvals.run()

    async def aclose(self) -> None:
        if self.approvals is not None:
            await self.approvals.aclose()

    def routes(self) -> Sequence[tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]]:
        if self.approvals is None:
            return ()
        return (("POST", self.settings.interactions_path, self.handle_interaction),)

    # ---- both ingress paths ----------------------------------------------------

    async def ingest(self, body: Any, *, source: str) -> Outcome:
        """One event_callback body into the log (steps 4 to 6 of the module docstring)."""
        event_id = slack_events.event_id_of(body)
        if event_id is None:
            return Outcome("unreadable", "an event_callback without its event_id")
        if await self.server_of().seen_delivery(event_id):
            logger.info("%s: event %s was received before; ignored", source, event_id)
            return Outcome("duplicate")
        try:
            mapped = slack_events.from_callback(body)
        except slack_events.Unmapped as exc:
            logger.warning("%s: event %s cannot be read: %s", source, event_id, exc)
            await self.accept([], source=source, delivery_id=event_id)
            return Outcome("unreadable", str(exc))
        reason = self._skip_reason(mapped)
        if mapped is None or reason:
            await self.accept([], source=source, delivery_id=event_id)
            if mapped is not None:
                logger.info("%s: %s %s is %s; ignored", source, mapped.type, mapped.event_id, reason)
            return Outcome("ignored", reason or "not an event this bridge emits")
        added = await self.accept(
            [NewEvent(mapped.type, mapped.event_id, mapped.occurred_at, mapped.data, body)],
            source=source,
            delivery_id=event_id,
        )
        logger.info(
            "%s: %s %s (%s)", source, mapped.type, mapped.event_id, "new" if added else "already logged"
        )
        return Outcome("accepted")

    def _skip_reason(self, mapped: slack_events.Mapped | None) -> str:
        if mapped is None:
            return ""
        if mapped.own:
            return "the app's own"  # the agent's reply must never wake the agent
        if mapped.data.get("isBot") and self.settings.ignore_other_bots:
            return "another app's (--keep-other-bots keeps them)"
        return ""

    # ---- Events API ingress ----------------------------------------------------

    async def _verified(self, request: web.Request, what: str) -> bytes | web.Response:
        """The body of a request Slack signed within the last five minutes (steps 1 and 2), or the refusal."""
        secret = self.settings.signing_secret
        assert secret is not None
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return refuse(413, f"the body is over {self.options.max_body_bytes} bytes")
        stamp = request.headers.get(TIMESTAMP_HEADER, "")
        if not signature_valid(secret, stamp, body, request.headers.get(SIGNATURE_HEADER)):
            logger.warning("%s: refused a request with a missing or wrong %s", what, SIGNATURE_HEADER)
            return refuse(401, f"missing or wrong {SIGNATURE_HEADER}")
        problem = timestamp_error(stamp, time.time())
        if problem is not None:
            logger.warning("%s: refused a signed request whose %s is %s", what, TIMESTAMP_HEADER, problem)
            return refuse(401, f"{TIMESTAMP_HEADER} is {problem}: a replayed request?")
        return body

    async def handle_interaction(self, request: web.Request) -> web.StreamResponse:
        """A button click (Interactivity's request URL): verified, then answered at once."""
        body = await self._verified(request, "interactions")
        if isinstance(body, web.Response):
            return body
        assert self.approvals is not None
        try:
            fields = urllib.parse.parse_qs(body.decode(), max_num_fields=10)
            payload = _payload.json_body(fields["payload"][0])
        except (UnicodeDecodeError, ValueError, KeyError, IndexError):
            return refuse(400, "the body is not an interaction payload")
        await self.approvals.on_interaction(payload, source="interactions")
        # Slack shows an error to the clicking user unless it gets a 200 within 3 s.
        return web.Response(status=200)

    async def handle_webhook(self, request: web.Request) -> web.StreamResponse:
        body = await self._verified(request, "events")
        if isinstance(body, web.Response):
            return body
        try:
            payload = _payload.json_body(body)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            # Interactivity's form-encoded payloads go to --interactions-path instead.
            return refuse(400, "the body is not a JSON object (only the Events API is served)")
        kind = payload.get("type")
        if kind == "url_verification":
            challenge = payload.get("challenge")
            if not isinstance(challenge, str) or not challenge or len(challenge) > 500:
                return refuse(400, "url_verification without a challenge")
            logger.info("events: answered Slack's url_verification")
            return web.json_response({"challenge": challenge})
        if kind != "event_callback":
            logger.warning("events: %s request ignored", peer(kind, 40))
            return _answer("ignored", reason=f"type {peer(kind, 40)} is not handled")
        retry = request.headers.get(RETRY_HEADER)
        if retry is not None:
            reason = request.headers.get("X-Slack-Retry-Reason", "")
            logger.info("events: Slack's retry #%s (%s)", peer(retry, 10), peer(reason, 40))
        outcome = await self.ingest(payload, source="events_api")
        if outcome.status == "unreadable" and slack_events.event_id_of(payload) is None:
            return refuse(400, outcome.reason)
        fields: dict[str, Any] = {"event": slack_events.event_id_of(payload)}
        if outcome.reason:
            fields["reason"] = outcome.reason
        return _answer(outcome.status, **fields)

    # ---- Socket Mode ingress ---------------------------------------------------

    async def poll_forever(self) -> None:
        """Socket Mode: envelopes from slack-sdk's client, each committed and then acknowledged."""
        assert self.settings.app_token is not None
        send, receive = anyio.create_memory_object_stream[SocketModeRequest](max_buffer_size=100)
        client = SocketModeClient(
            app_token=self.settings.app_token,
            web_client=AsyncWebClient(base_url=self.api.base_url, timeout=API_TIMEOUT_S, logger=sdk_logger),
            logger=sdk_logger,
        )

        async def enqueue(_: AsyncBaseSocketModeClient, request: SocketModeRequest) -> None:
            # Called from slack-sdk's own tasks; the envelopes are handled in this task, in order.
            # Stopping: an envelope left unacknowledged is sent again by Slack.
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await send.send(request)

        client.socket_mode_request_listeners.append(enqueue)
        try:
            await self._connect(client)
            async with receive:
                async for request in receive:
                    await self.on_envelope(client, request)
        finally:
            send.close()
            with anyio.CancelScope(shield=True):
                await client.close()  # type: ignore[no-untyped-call]

    async def _connect(self, client: SocketModeClient) -> None:
        """The first connection; later reconnects (Slack's ``disconnect``, a dropped socket) are slack-sdk's."""
        failures = 0
        while True:
            try:
                opened = await client.web_client.apps_connections_open(app_token=client.app_token)
                client.wss_uri = str(opened["url"])
                with anyio.fail_after(CONNECT_TIMEOUT_S):
                    await client.connect()  # type: ignore[no-untyped-call]
                logger.info("socket_mode: connected")
                return
            except SlackApiError as exc:
                problem = _api_error(exc.response)
            except (SlackClientError, aiohttp.ClientError, TimeoutError, OSError, KeyError) as exc:
                problem = scrub(peer(f"{type(exc).__name__}: {exc}", ERROR_CHARS))
            failures += 1
            wait = backoff_s(failures, initial_s=1.0, max_s=300.0)
            logger.warning("socket_mode: cannot connect (%s); trying again in %.0f s", problem, wait)
            await anyio.sleep(wait)

    async def on_envelope(self, client: AsyncBaseSocketModeClient, request: SocketModeRequest) -> None:
        """Commit an envelope's event, then acknowledge it; a failed commit leaves it for Slack to resend."""
        if request.type == "events_api":
            try:
                outcome = await self.ingest(request.payload, source="socket_mode")
            except Exception:
                logger.exception(
                    "socket_mode: envelope %s not stored; Slack will send it again", request.envelope_id
                )
                return
            if outcome.status == "unreadable":
                logger.warning("socket_mode: envelope %s: %s", request.envelope_id, outcome.reason)
        elif request.type == "interactive" and self.approvals is not None:
            try:
                await self.approvals.on_interaction(request.payload, source="socket_mode")
            except Exception as exc:  # a click lost must not end the connection; it can be repeated
                logger.warning("socket_mode: interaction not handled (%s)", type(exc).__name__)
        else:
            logger.info("socket_mode: %s envelopes are not handled; acknowledged", peer(request.type, 40))
        try:
            await client.send_socket_mode_response(SocketModeResponse(envelope_id=request.envelope_id))
        except Exception as exc:  # the socket went away: the event is stored, Slack's resend is a duplicate
            problem = scrub(peer(f"{type(exc).__name__}: {exc}", ERROR_CHARS))
            logger.warning("socket_mode: envelope %s not acknowledged (%s)", request.envelope_id, problem)

    # ---- tools -----------------------------------------------------------------

    def register_tools(self, server: BridgeServer) -> None:
        from mcp.server.mcpserver.exceptions import ToolError

        mcp, api = server.mcp, self.api

        async def call(action: Awaitable[dict[str, Any]]) -> dict[str, Any]:
            try:
                return await action
            except SlackError as exc:
                raise ToolError(str(exc)) from None

        @mcp.tool()
        async def post_message(
            channel: Channel, text: Text, allow_mentions: AllowMentions = False
        ) -> dict[str, Any]:
            """Post a message in a channel the app is in; returns its channel and ts."""
            return await call(api.post_message(channel, text, allow_mentions=allow_mentions))

        @mcp.tool()
        async def reply_in_thread(
            channel: Channel,
            thread_ts: Annotated[
                str,
                Field(
                    pattern=slack_events.TS_PATTERN,
                    description="The thread: an event's threadTs (a message's own ts starts a thread under it).",
                ),
            ],
            text: Text,
            allow_mentions: AllowMentions = False,
        ) -> dict[str, Any]:
            """Reply in a message's thread; returns the reply's channel and ts."""
            result = await call(api.post_message(channel, text, thread_ts, allow_mentions=allow_mentions))
            return {**result, "threadTs": thread_ts}

        @mcp.tool()
        async def add_reaction(
            channel: Channel,
            timestamp: Timestamp,
            name: Annotated[
                str,
                Field(
                    pattern=r"^:?[a-z0-9_+'\-]{1,100}(::skin-tone-[2-6])?:?$",
                    description='The emoji\'s name, e.g. "eyes" or "white_check_mark".',
                ),
            ],
        ) -> dict[str, Any]:
            """Add an emoji reaction to a message (already there counts as done)."""
            return await call(api.add_reaction(channel, timestamp, name.strip(":")))

        @mcp.tool()
        async def get_thread(
            channel: Channel,
            thread_ts: Timestamp,
            limit: Annotated[int, Field(ge=1, le=200)] = 30,
        ) -> dict[str, Any]:
            """Read a thread: its parent message and replies, oldest first (texts cut at 4000 characters)."""
            return await call(api.get_thread(channel, thread_ts, limit))

        @mcp.tool()
        async def get_user(
            user: Annotated[
                str, Field(pattern=slack_events.USER_PATTERN, description="The user id (U0123ABCD).")
            ],
        ) -> dict[str, Any]:
            """Look a user up: name, real and display name, title, time zone, whether a bot."""
            return await call(api.get_user(user))
