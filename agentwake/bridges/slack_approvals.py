"""Approvals in Slack: held events posted with Approve and Deny buttons, answered through agentwake.

Authority stays with agentwake's operator endpoint (``[service] listen``): the bridge lists
held events with ``GET {url}/approvals`` (JSON, the page's sanitized view) and answers one with
``POST {url}/approvals/{row}/approve|deny``, both with a bearer token of the endpoint (best one
of its own, with the scopes read and approve only: ``[service.tokens.slack]``). The answer carries
who clicked as ``on_behalf_of = slack:<user id>``, which agentwake records as who answered. A click grants nothing by itself: it counts only when Slack
signed it (checked by the caller: the interactions route, or the Socket Mode connection), it is
a button of a message this bridge posted for that row in the approvals channel, and the clicking
user is one of ``--approver``.

A held event's message also has a "Pause rule" button: an approver's click pauses that rule
through ``POST {url}/pauses`` (as ``agentwake pause --rule`` does, recorded as the approver), and
the bridge posts a message saying so with a "Resume" button, which resumes it the same way. The
rule is the one agentwake listed for the row, kept with the posted message; a click names nothing.

Each newly held event (of the ``--approvals-rule`` globs) is posted once; the posted rows and
their messages are kept in the bridge log's state, so a restart posts nothing twice. A posted
event answered elsewhere (the CLI, the page) has its buttons taken away at the next poll.
Peer text goes into messages with ``&``, ``<`` and ``>`` escaped: no mention or link can be
injected, and messages are posted without ``link_names``.
"""

from __future__ import annotations

import fnmatch
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Final

import aiohttp
import anyio
from yarl import URL

from agentwake.backoff import backoff_s
from agentwake.text import peer

logger = logging.getLogger("agentwake.bridge.slack.approvals")

APPROVE: Final = "agentwake_approve"
DENY: Final = "agentwake_deny"
PAUSE_RULE: Final = "agentwake_pause_rule"
RESUME_RULE: Final = "agentwake_resume_rule"
STATE_KEY: Final = "slack_approvals:posted"
# The messages saying a rule was paused from Slack, by ts: {channel, rule}; their Resume button.
PAUSES_KEY: Final = "slack_approvals:pauses"
HTTP_TIMEOUT_S: Final = 15
# Clicks waiting for their answer; more than this many at once are dropped (and logged).
QUEUED_CLICKS: Final = 100
# Slack refuses a section's text over 3000 characters (escaping can lengthen it).
SECTION_CHARS: Final = 3000
_TOKEN: Final = re.compile(r"[\x21-\x7e]+")
_ROW: Final = re.compile(r"[0-9]{1,18}")
# A Slack user id (U0123ABCD, W...): what agentwake records as slack:<id>.
_USER: Final = re.compile(r"[A-Z0-9]{1,64}")


def escape(text: object) -> str:
    """Text for Slack mrkdwn with no control sequence left: ``<@U..>``, ``<!channel>``, links."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


@dataclass(frozen=True)
class ApprovalSettings:
    """``--approvals-url`` and the flags that go with it."""

    url: str
    token: str = field(repr=False)
    channel: str
    approvers: frozenset[str]
    rules: tuple[str, ...] = ()
    interval_s: float = 5.0

    def __post_init__(self) -> None:
        try:
            parsed = URL(self.url)
        except (TypeError, ValueError):
            parsed = URL()
        # The URL is not quoted back: a mistyped one may hold a credential.
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError("--approvals-url must be an http(s) URL with a host")
        if parsed.user or parsed.password:
            raise ValueError("--approvals-url must not carry credentials: the token goes in its variable")
        if not _TOKEN.fullmatch(self.token):
            raise ValueError("the approvals token must be printable ASCII without spaces")
        if not self.approvers:
            raise ValueError("--approvals-url needs at least one --approver (a Slack user id)")
        if not self.channel:
            raise ValueError("--approvals-url needs --approvals-channel")
        if self.interval_s <= 0:
            raise ValueError("--approvals-interval must be more than 0")

    def wants(self, rule: str) -> bool:
        return not self.rules or any(fnmatch.fnmatchcase(rule, glob) for glob in self.rules)


@dataclass(frozen=True)
class Click:
    """One verified button click on a message we posted: ``action`` is approve, deny, pause or
    resume; ``rule`` (pause, resume) is the rule kept with that message, never the click's."""

    row: int
    approve: bool
    user: str
    channel: str
    ts: str
    action: str = ""
    rule: str = ""


class AgentwakeError(Exception):
    """The operator endpoint could not be asked, or refused (not for the event's own state)."""


# chat.postMessage / chat.update as the bridge's SlackAPI makes them: (channel, ts or None, text, blocks).
PostFn = Callable[[str, str | None, str, list[dict[str, Any]]], Awaitable[dict[str, Any]]]
StateFns = tuple[Callable[[str], Any], Callable[[str, Any], None]]


class SlackApprovals:
    """Polls agentwake for held events, posts them, and answers verified clicks through agentwake."""

    def __init__(self, settings: ApprovalSettings, post: PostFn, state: StateFns) -> None:
        self.settings = settings
        self._post = post
        self._get_state, self._set_state = state
        self._lock = anyio.Lock()
        self._answering: set[int] = set()
        self._send, self._receive = anyio.create_memory_object_stream[Click](max_buffer_size=QUEUED_CLICKS)
        self._http: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"<SlackApprovals {self.settings.url} -> {self.settings.channel}>"

    # ---- talking to agentwake --------------------------------------------------------------

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S))
        return self._http

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.settings.token}", "Accept": "application/json"}

    async def held(self) -> tuple[list[dict[str, Any]], int]:
        """The held events agentwake lists (the oldest ones, if many), and how many are held."""
        url = str(URL(self.settings.url) / "approvals")
        try:
            async with self._session().get(url, headers=self._headers()) as response:
                if response.status != 200:
                    raise AgentwakeError(f"GET /approvals answered HTTP {response.status}")
                body = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise AgentwakeError(f"GET /approvals: {type(exc).__name__}") from None
        held = body.get("held") if isinstance(body, dict) else None
        if not isinstance(held, list):
            raise AgentwakeError("GET /approvals: the answer has no held list")
        total = body.get("total")
        entries = [h for h in held if isinstance(h, dict) and isinstance(h.get("row"), int)]
        return entries, total if isinstance(total, int) else len(entries)

    async def _decide(self, click: Click) -> tuple[bool, str]:
        """Agentwake's answer to an approval or denial: (done, its message)."""
        verb = "approve" if click.approve else "deny"
        field_name, said = ("note", "approved") if click.approve else ("reason", "denied")
        url = str(URL(self.settings.url) / "approvals" / str(click.row) / verb)
        # Who clicked goes as a structured identity: agentwake records it as who answered, but only
        # because this bridge's token has the approve scope (the token's name says who relayed it).
        form = {field_name: f"{said} in Slack by <@{click.user}>", "on_behalf_of": f"slack:{click.user}"}
        try:
            async with self._session().post(url, data=form, headers=self._headers()) as response:
                status = response.status
                body = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise AgentwakeError(f"POST /approvals/{click.row}/{verb}: {type(exc).__name__}") from None
        message = body.get("message") if isinstance(body, dict) else None
        if status == 200:
            return True, peer(message, 300) if isinstance(message, str) else said
        if status == 409:  # no longer held: answered elsewhere, or gone
            return False, peer(message, 300) if isinstance(message, str) else "not held"
        raise AgentwakeError(f"POST /approvals/{click.row}/{verb} answered HTTP {status}")

    async def _pause(self, click: Click, *, resume: bool) -> tuple[bool, str]:
        """Pause (or resume) the click's rule in agentwake: (done, its message)."""
        pauses = URL(self.settings.url) / "pauses"
        url = str(pauses / "resume" if resume else pauses)
        form = {"scope": "rule", "name": click.rule, "on_behalf_of": f"slack:{click.user}"}
        if not resume:
            form["reason"] = f"paused in Slack by <@{click.user}>"
        try:
            async with self._session().post(url, data=form, headers=self._headers()) as response:
                status = response.status
                body = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise AgentwakeError(f"POST /pauses: {type(exc).__name__}") from None
        message = body.get("message") if isinstance(body, dict) else None
        said = peer(message, 300) if isinstance(message, str) else ("resumed" if resume else "paused")
        if status == 200:
            return True, said
        if status in (400, 404, 409):  # e.g. the rule is gone from the policy
            return False, said
        raise AgentwakeError(f"POST /pauses answered HTTP {status}")

    # ---- posting ---------------------------------------------------------------------------

    async def _posted(self) -> dict[str, dict[str, str]]:
        found = await anyio.to_thread.run_sync(self._get_state, STATE_KEY)
        return found if isinstance(found, dict) else {}

    async def _save(self, posted: dict[str, dict[str, str]]) -> None:
        await anyio.to_thread.run_sync(self._set_state, STATE_KEY, posted)

    async def poll_once(self) -> int:
        """Post the newly held events; take the buttons off those answered elsewhere. How many posted."""
        held, total = await self.held()
        count = 0
        async with self._lock:
            posted = await self._posted()
            for entry in held:
                row = str(entry["row"])
                if row in posted or not self.settings.wants(str(entry.get("rule", ""))):
                    continue
                text, blocks = held_message(entry)
                sent = await self._post(self.settings.channel, None, text, blocks)
                ts = sent.get("ts")
                if not isinstance(ts, str):
                    logger.warning("approvals: chat.postMessage gave no ts for row %s", row)
                    continue
                posted[row] = {
                    "channel": str(sent.get("channel") or self.settings.channel),
                    "ts": ts,
                    "rule": str(entry.get("rule") or ""),
                }
                await self._save(posted)  # at once: a failure later must not post this one again
                count += 1
                logger.info("approvals: posted held event %s (row %s)", peer(entry.get("event_id"), 100), row)
            if total <= len(held):  # the listing is whole: what is missing from it was answered
                listed = {str(h["row"]) for h in held}
                for row, where in list(posted.items()):
                    if row in listed or int(row) in self._answering:
                        continue
                    await self._close(where, "No longer held: answered outside Slack.")
                    del posted[row]
                    await self._save(posted)
        return count

    async def _close(self, where: dict[str, str], text: str) -> None:
        blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]
        await self._post(where["channel"], where["ts"], text, blocks)

    # ---- clicks ----------------------------------------------------------------------------

    async def on_interaction(self, payload: Any, *, source: str) -> bool:
        """A payload Slack signed (the caller checked): queue its click if it counts; whether it did."""
        click = self._click(payload, source)
        if click is None:
            return False
        if click.action == "resume":
            pauses = await self._pause_messages()
            kept = pauses.get(click.ts)
            if kept is None or kept.get("channel") != click.channel:
                logger.warning("%s: a resume click on a message not posted for a pause; ignored", source)
                return False
            return self._queue(replace(click, rule=str(kept.get("rule"))), source)
        posted = await self._posted()
        where = posted.get(str(click.row))
        if where is None or (where.get("channel"), where.get("ts")) != (click.channel, click.ts):
            logger.warning("%s: a click on a message not posted for row %s; ignored", source, click.row)
            return False
        if click.action == "pause":
            if not where.get("rule"):
                logger.warning("%s: row %s has no rule to pause; ignored", source, click.row)
                return False
            return self._queue(replace(click, rule=str(where["rule"])), source)
        if click.row in self._answering:
            logger.info("%s: row %s is being answered already; click ignored", source, click.row)
            return False
        try:
            self._send.send_nowait(click)
        except anyio.WouldBlock:
            logger.warning("%s: too many clicks waiting; the click on row %s is dropped", source, click.row)
            return False
        self._answering.add(click.row)
        return True

    def _queue(self, click: Click, source: str) -> bool:
        try:
            self._send.send_nowait(click)
        except anyio.WouldBlock:
            logger.warning("%s: too many clicks waiting; a %s click is dropped", source, click.action)
            return False
        return True

    async def _pause_messages(self) -> dict[str, dict[str, str]]:
        found = await anyio.to_thread.run_sync(self._get_state, PAUSES_KEY)
        return found if isinstance(found, dict) else {}

    def _click(self, payload: Any, source: str) -> Click | None:
        if not isinstance(payload, dict) or payload.get("type") != "block_actions":
            kind = payload.get("type") if isinstance(payload, dict) else None
            logger.info("%s: interaction %s ignored", source, peer(kind, 40))
            return None
        user = _dict(payload.get("user")).get("id")
        actions = payload.get("actions")
        action = actions[0] if isinstance(actions, list) and actions and isinstance(actions[0], dict) else {}
        action_id, value = action.get("action_id"), action.get("value")
        actions_by_id = {APPROVE: "approve", DENY: "deny", PAUSE_RULE: "pause", RESUME_RULE: "resume"}
        if action_id not in actions_by_id:
            return None
        channel, message = _dict(payload.get("channel")), _dict(payload.get("message"))
        channel_id, ts = channel.get("id"), message.get("ts")
        if action_id == RESUME_RULE:
            value = "0"  # a resume click is known by its message alone
        if not (isinstance(value, str) and _ROW.fullmatch(value)):
            logger.warning("%s: a click without a row; ignored", source)
            return None
        if not isinstance(user, str) or user not in self.settings.approvers or not _USER.fullmatch(user):
            # Only --approver users count; anyone else's click changes nothing.
            logger.warning(
                "%s: %s clicked on row %s but is not an approver; ignored", source, peer(user, 40), value
            )
            return None
        if channel_id != self.settings.channel or not isinstance(ts, str):
            logger.warning("%s: a click outside the approvals channel; ignored", source)
            return None
        return Click(int(value), action_id == APPROVE, user, channel_id, ts, actions_by_id[action_id])

    async def _pause_or_resume(self, click: Click) -> None:
        resume = click.action == "resume"
        try:
            done, message = await self._pause(click, resume=resume)
        except AgentwakeError as exc:
            logger.warning("approvals: rule %s not %s (%s)", click.rule, click.action + "d", exc)
            return
        rule = escape(click.rule)
        logger.info(
            "approvals: rule %s %s by %s", click.rule, click.action + "d" if done else "unchanged", click.user
        )
        if resume:
            async with self._lock:
                pauses = await self._pause_messages()
                pauses.pop(click.ts, None)
                await anyio.to_thread.run_sync(self._set_state, PAUSES_KEY, pauses)
            text = f"Rule `{rule}` resumed by <@{click.user}>." if done else f"Not resumed: {escape(message)}"
            await self._close({"channel": click.channel, "ts": click.ts}, text)
            return
        if not done:
            text = f"Rule `{rule}` not paused: {escape(message)}"
            await self._post(
                click.channel, None, text, [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]
            )
            return
        text = f"Rule `{rule}` paused by <@{click.user}>: no agent run starts for it until it is resumed."
        blocks: list[dict[str, Any]] = [
            {"type": "section", "text": {"type": "mrkdwn", "text": text}},
            {
                "type": "actions",
                "elements": [
                    {
                        "type": "button",
                        "action_id": RESUME_RULE,
                        "text": {"type": "plain_text", "text": "Resume"},
                        "value": "resume",
                    }
                ],
            },
        ]
        sent = await self._post(click.channel, None, text, blocks)
        ts = sent.get("ts")
        if isinstance(ts, str):
            async with self._lock:
                pauses = await self._pause_messages()
                pauses[ts] = {"channel": str(sent.get("channel") or click.channel), "rule": click.rule}
                await anyio.to_thread.run_sync(self._set_state, PAUSES_KEY, pauses)

    async def _answer(self, click: Click) -> None:
        if click.action in ("pause", "resume"):
            await self._pause_or_resume(click)
            return
        try:
            done, message = await self._decide(click)
        except AgentwakeError as exc:
            logger.warning("approvals: row %s not answered (%s); the buttons stay", click.row, exc)
            self._answering.discard(click.row)
            return
        async with self._lock:
            posted = await self._posted()
            where = posted.pop(str(click.row), {"channel": click.channel, "ts": click.ts})
            await self._save(posted)
            self._answering.discard(click.row)
        if done:
            outcome = "Approved" if click.approve else "Denied"
            text = f"{outcome} by <@{click.user}>: {escape(message)}"
        else:
            text = f"Not answered ({escape(message)}): it is no longer held."
        logger.info("approvals: row %s %s by %s", click.row, "answered" if done else "not held", click.user)
        try:
            await self._close(where, text)
        except Exception as exc:  # agentwake has the answer; only the message is stale
            logger.warning("approvals: the message of row %s not updated (%s)", click.row, type(exc).__name__)

    # ---- running ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Poll and answer clicks until cancelled."""
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._poll_forever)
                async with self._receive:
                    async for click in self._receive:
                        try:
                            await self._answer(click)
                        except Exception as exc:  # one click must not stop the others
                            if click.action in ("approve", "deny"):
                                self._answering.discard(click.row)
                            logger.warning("approvals: row %s: %s", click.row, type(exc).__name__)
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        self._send.close()
        self._receive.close()
        if self._http is not None:
            with anyio.CancelScope(shield=True):
                await self._http.close()

    async def _poll_forever(self) -> None:
        failures = 0
        while True:
            try:
                await self.poll_once()
                failures, wait = 0, self.settings.interval_s
            except Exception as exc:
                failures += 1
                wait = max(self.settings.interval_s, backoff_s(failures, initial_s=1.0, max_s=300.0))
                logger.warning("approvals: %s; trying again in %.0f s", peer(str(exc), 300), wait)
            await anyio.sleep(wait)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def held_message(entry: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """A held event's message: its fallback text and its blocks with Approve and Deny."""
    tools = entry.get("tools")
    tools = tools if isinstance(tools, list) else []
    tools_text = ", ".join(f"`{escape(t)}`" for t in tools) or "none"
    text = (
        f"*Held for approval*: `{escape(entry.get('event_id'))}` {escape(entry.get('name'))}"
        f" (server {escape(entry.get('server'))}, subscription {escape(entry.get('subscription'))})\n"
        f"Rule `{escape(entry.get('rule'))}`; tools if approved: {tools_text}\n"
        f"> {escape(entry.get('summary'))}"
    )[:SECTION_CHARS]
    row = str(entry["row"])
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": text}},
        {
            "type": "actions",
            "block_id": f"agentwake_{row}",
            "elements": [
                {
                    "type": "button",
                    "action_id": APPROVE,
                    "text": {"type": "plain_text", "text": "Approve"},
                    "style": "primary",
                    "value": row,
                },
                {
                    "type": "button",
                    "action_id": DENY,
                    "text": {"type": "plain_text", "text": "Deny"},
                    "style": "danger",
                    "value": row,
                },
                *(
                    [
                        {
                            "type": "button",
                            "action_id": PAUSE_RULE,
                            "text": {"type": "plain_text", "text": "Pause rule"},
                            "value": row,
                        }
                    ]
                    if entry.get("rule")
                    else []
                ),
            ],
        },
    ]
    return text, blocks


__all__ = [
    "APPROVE",
    "DENY",
    "PAUSE_RULE",
    "RESUME_RULE",
    "ApprovalSettings",
    "SlackApprovals",
    "escape",
    "held_message",
]
