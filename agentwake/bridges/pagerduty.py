"""The PagerDuty bridge: PagerDuty's V3 webhooks or REST API polling in, MCP events out; incident actions as tools.

Webhook ingress (``--listen``), in the order a delivery is checked:

1. the body is read whole (at most ``--max-body-bytes``, else 413) and ``X-PagerDuty-Signature``
   is verified: one or more comma-separated ``v1=<hex HMAC-SHA256 of the raw body>`` (several
   while a secret is rotated), any one of which must match under any of the webhook secrets
   the bridge holds (an old and a new one, while the operator rotates), in constant time.
   Missing or wrong is 401, before anything else of the delivery is looked at;
2. the body must be a V3 envelope, ``{"event": {"id", "event_type", ...}}`` (400);
3. ``pagey.ping`` (sent when the subscription is tested) is answered 200 ``pong``;
4. an event id already received is a replay, or PagerDuty retrying a delivery whose answer it
   did not get: answered 200 ``duplicate`` (so it stops) and stores nothing. The event id is
   the key, not ``X-Webhook-Id``: a retry is the same event under a new delivery;
5. the event is mapped (``pagerduty_events``); an event we do not emit, or one the API key's
   own user caused (the agent's acknowledgement must not wake it again), is remembered and
   answered 202 ``ignored``;
6. an event that happened more than ``--max-delivery-age`` ago is stale (400). PagerDuty
   signs no timestamp, so the event's own ``occurred_at`` in the signed body is the clock;
   event ids are remembered for twice that long, so a replay is caught by one or the other;
7. the event is committed to the log, then the delivery is answered 202 ``accepted``.

Poll ingress (``--poll``): ``GET /log_entries`` (the overview entries: triggers,
acknowledgements, escalations, resolutions, each with its whole incident) and ``GET
/incidents`` (new incidents, in case an overview entry is missing), each read from its own
``since`` cursor, kept in the log's poller state and moved on only once the window's events
are committed. Each window starts ``POLL_OVERLAP`` before the cursor, as a list may show an
item a little after its timestamp; what is read twice has the same event id and is kept
once. What happened before the first poll is not emitted. A window is read page by page
(``limit`` 100, ``offset``, while PagerDuty says ``more``) back to the cursor, at most
``MAX_PAGES`` pages: a window holding more than that (the log entries come newest first, so
the oldest are what is left unread) is recorded in the log as a gap of the feed's event
types, which their readers see as ``truncated``. A 429, or a quota spent (``ratelimit-remaining``
0) before the window's last page, holds both cursors and waits for ``Retry-After`` (or
``ratelimit-reset``); the next round reads the window again. Event ids are the webhook's, so
both ingress paths may run at once.

Tools call the REST API (``pagerduty_api``) with the key named by ``--api-key-env``, writes
as the user ``--from-email`` names; ``resolve`` is registered only with ``--allow-tool resolve``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Final, Literal

import anyio
from aiohttp import web
from pydantic import Field

from agentwake.bridges import _payload, pagerduty_events
from agentwake.bridges.framework import (
    Bridge,
    BridgeOptions,
    BridgeServer,
    bridge_event_types,
    check_optional_tools,
    refuse,
    short_age,
)
from agentwake.bridges.log import NewEvent
from agentwake.bridges.pagerduty_api import (
    MAX_ESCALATION_LEVEL,
    MAX_LIMIT,
    MAX_NOTE_CHARS,
    PAGERDUTY_API,
    Page,
    PagerDutyAPI,
    PagerDutyError,
    RateLimited,
)
from agentwake.clock import iso, parse_iso
from agentwake.text import peer

logger = logging.getLogger("agentwake.bridge.pagerduty")

DESCRIPTION: Final = (
    "PagerDuty as MCP events: incidents triggered, acknowledged, escalated and resolved (V3 webhooks or"
    " REST API polling); reprioritized, reassigned, delegated, reopened, unacknowledged, annotated, given a"
    " responder or a status update (webhooks); with tools to read, acknowledge, annotate, escalate and list"
    " incidents."
)
SIGNATURE_HEADER: Final = "X-PagerDuty-Signature"
SIGNATURE_VERSION: Final = "v1"
# Longest signature header looked at, and most signatures in it: a few, not an attacker's megabyte.
MAX_SIGNATURE_HEADER: Final = 2048
MAX_SIGNATURES: Final = 8
MAX_EVENT_ID_CHARS: Final = 200
DEFAULT_MAX_DELIVERY_AGE: Final = timedelta(hours=24)
DEFAULT_POLL_INTERVAL_S: Final = 30.0
POLL_OVERLAP: Final = timedelta(seconds=60)
# At most this many pages of 100 items per feed and round; beyond, a gap is recorded and the cursor
# moves on. PagerDuty serves no item past offset 10,000 anyway.
MAX_PAGES: Final = 20
OWN_USER_RETRY_S: Final = 60.0
# A webhook waits at most this long for the look-up of the bridge's own user.
OWN_USER_TIMEOUT_S: Final = 5.0
FEEDS: Final = ("log_entries", "incidents")
# The event types each polled feed can produce: what a gap in that feed may have lost.
FEED_TYPES: Final[dict[str, tuple[str, ...]]] = {
    "log_entries": pagerduty_events.LOG_ENTRY_EVENT_TYPES,
    "incidents": ("incident.triggered",),
}
OPTIONAL_TOOLS: Final = ("resolve",)
TOOLS: Final = ("get_incident", "acknowledge", "add_note", "escalate", "list_recent_incidents", "resolve")

IncidentId = Annotated[
    str,
    Field(
        pattern=r"^[A-Za-z0-9]{1,64}$",
        description="The incident's PagerDuty id, like PT4KHLK (the event's incidentId; not its number).",
    ),
]
ServiceId = Annotated[str, Field(pattern=r"^[A-Za-z0-9]{1,64}$", description="A service's PagerDuty id.")]


@dataclass(frozen=True)
class PagerDutySettings:
    """What ``agentwake bridge pagerduty`` takes beyond the common bridge options."""

    webhook_secrets: tuple[bytes, ...] = field(default=(), repr=False)
    api_key: str | None = field(default=None, repr=False)
    from_email: str | None = None
    api_base: str = PAGERDUTY_API
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    max_delivery_age: timedelta = DEFAULT_MAX_DELIVERY_AGE
    allowed_tools: tuple[str, ...] = ()
    ignore_own_actions: bool = True


def signatures(header: str | None) -> list[bytes]:
    """The ``v1`` signatures of an ``X-PagerDuty-Signature`` header, as lowercase hex ASCII; other
    versions and malformed entries are skipped."""
    if not header or len(header) > MAX_SIGNATURE_HEADER or not header.isascii():
        return []
    found = []
    for entry in header.split(",")[:MAX_SIGNATURES]:
        version, equals, digest = entry.strip().partition("=")
        if equals and version == SIGNATURE_VERSION and len(digest) == 64:
            found.append(digest.lower().encode("ascii"))
    return found


def signature_valid(secrets: Sequence[bytes], body: bytes, header: str | None) -> bool:
    """Whether any ``v1=`` signature of ``header`` is the HMAC-SHA256 of ``body`` under any secret."""
    candidates = signatures(header)
    matched = False
    for secret in secrets:
        expected = hmac.new(secret, body, hashlib.sha256).hexdigest().encode("ascii")
        # Every candidate is compared, so timing does not tell which one matched.
        for candidate in candidates:
            matched |= hmac.compare_digest(expected, candidate)
    return matched


class PagerDutyBridge(Bridge):
    name = "pagerduty"
    description = DESCRIPTION
    event_types = bridge_event_types(
        pagerduty_events.EVENT_TYPES,
        pagerduty_events.PAYLOAD_SCHEMAS,
        dict.fromkeys(pagerduty_events.EVENT_TYPES, pagerduty_events.ARGUMENTS_SCHEMA),
        pagerduty_events.matches,
    )

    def __init__(self, options: BridgeOptions, settings: PagerDutySettings) -> None:
        super().__init__(options)
        check_optional_tools(settings.allowed_tools, OPTIONAL_TOOLS)
        if options.listen and not settings.webhook_secrets:
            raise ValueError("--listen needs the webhook secret: set the variable --webhook-secret-env names")
        if options.poll and not settings.api_key:
            raise ValueError("--poll needs the API key: set the variable --api-key-env names")
        self.settings = settings
        self.api = PagerDutyAPI(
            base_url=settings.api_base, api_key=settings.api_key, from_email=settings.from_email
        )
        # Beyond the stale bound a replay is refused as stale; within it, by its remembered event id.
        self.delivery_memory = max(2 * settings.max_delivery_age, Bridge.delivery_memory)
        self._own_user: str | None = None
        self._own_user_retry_at = 0.0

    async def aclose(self) -> None:
        await self.api.aclose()

    # ---- whose actions are the agent's -------------------------------------------------

    async def background(self) -> None:
        # Learnt at start, so the first webhook does not wait for PagerDuty's answer.
        if self.settings.ignore_own_actions and self.settings.api_key:
            await self.own_user_id()

    async def own_user_id(self) -> str | None:
        """The PagerDuty user the bridge acts as: the key's own (a user-level key), else the From
        email's (an account-level key has no user; its writes are done as the From user). None
        while unknown; asked again a minute after a failure."""
        if self._own_user is not None or time.monotonic() < self._own_user_retry_at:
            return self._own_user
        self._own_user_retry_at = time.monotonic() + OWN_USER_RETRY_S
        try:
            with anyio.fail_after(OWN_USER_TIMEOUT_S):
                self._own_user = await self._learn_own_user()
        except (PagerDutyError, KeyError, ValueError, TimeoutError) as exc:
            logger.warning(
                "cannot learn the API key's own user, so its actions may wake the agent: %s",
                exc or "no answer in time",
            )
        return self._own_user

    async def _learn_own_user(self) -> str:
        try:
            return str((await self.api.me())["id"])
        except RateLimited:
            raise
        except PagerDutyError as exc:
            if not 400 <= exc.status < 500 or exc.status == 401 or self.api.from_email is None:
                raise
        user = await self.api.user_by_email(self.api.from_email)
        if user is None:
            raise ValueError("no PagerDuty user has the --from-email address")
        return str(user["id"])

    async def is_own_action(self, mapped: pagerduty_events.Mapped) -> bool:
        """Whether the event was caused by the bridge's own user: the agent's acknowledgement must
        not wake the agent again. Unknown (no key, PagerDuty unreachable) counts as not own."""
        if not self.settings.ignore_own_actions or not self.settings.api_key or mapped.actor_id is None:
            return False
        return mapped.actor_id == await self.own_user_id()

    # ---- webhook ingress -------------------------------------------------------

    async def handle_webhook(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return refuse(413, f"the body is over {self.options.max_body_bytes} bytes")
        if not signature_valid(self.settings.webhook_secrets, body, request.headers.get(SIGNATURE_HEADER)):
            logger.warning("webhook: refused a delivery with a missing or wrong %s", SIGNATURE_HEADER)
            return refuse(401, f"missing or wrong {SIGNATURE_HEADER}")
        delivery = peer(request.headers.get("X-Webhook-Id", "-"), 100)
        try:
            payload = _payload.json_body(body)
            envelope = pagerduty_events.envelope(payload)
        except ValueError as exc:  # Unmapped is a ValueError
            return refuse(400, f"not a PagerDuty V3 webhook: {exc}")
        if envelope.event_type == pagerduty_events.PING:
            return web.json_response({"status": "pong"})
        event_id = envelope.event_id
        if not event_id or len(event_id) > MAX_EVENT_ID_CHARS:
            return refuse(400, f"event.id must be 1 to {MAX_EVENT_ID_CHARS} characters")
        if await self.server_of().seen_delivery(event_id):
            logger.info("webhook: event %s (delivery %s) was received before; ignored", event_id, delivery)
            return web.json_response({"status": "duplicate", "event": event_id})
        try:
            mapped = pagerduty_events.from_webhook(payload)
        except pagerduty_events.Unmapped as exc:
            return refuse(400, f"unreadable {envelope.event_type} payload: {exc}")
        if mapped is None or await self.is_own_action(mapped):
            await self.accept([], source="webhook", delivery_id=event_id)
            return web.json_response({"status": "ignored", "event": event_id}, status=202)
        age = datetime.now(UTC) - mapped.occurred_at
        if age > self.settings.max_delivery_age:
            logger.warning(
                "webhook: refused stale event %s (%s, %s old)", event_id, mapped.type, short_age(age)
            )
            return refuse(400, f"stale delivery: the event happened {short_age(age)} ago")
        added = await self.accept(
            [NewEvent.of(mapped, payload)],
            source="webhook",
            delivery_id=event_id,
        )
        logger.info(
            "webhook: %s %s (delivery %s, %s)",
            mapped.type,
            mapped.event_id,
            delivery,
            "new" if added else "already logged",
        )
        return web.json_response({"status": "accepted", "event": event_id}, status=202)

    # ---- poll ingress ----------------------------------------------------------

    async def poll_forever(self) -> None:
        while True:
            wait = await self.poll_once()
            await anyio.sleep(wait)

    async def poll_once(self) -> float:
        """One round over both feeds: their new events into the log, then their cursors moved on.
        Returns how long to wait before the next round."""
        log = self.server_of().log
        now = datetime.now(UTC)
        baseline_text = await anyio.to_thread.run_sync(log.get_state, "baseline")
        if baseline_text is None:
            # The first poll: what happened before it is history, not news. Whole seconds, as
            # PagerDuty's list timestamps are: an item of this very second is news.
            await anyio.to_thread.run_sync(log.set_state, "baseline", iso(now.replace(microsecond=0)))
            for feed in FEEDS:
                await anyio.to_thread.run_sync(log.set_state, f"{feed}:since", iso(now))
            return self.settings.poll_interval_s
        baseline = parse_iso(baseline_text) or now
        wait = self.settings.poll_interval_s
        fresh: list[tuple[pagerduty_events.Mapped, dict[str, Any]]] = []
        gap_types: list[str] = []
        read_to: dict[str, datetime] = {}
        for feed in FEEDS:
            try:
                found, complete = await self._read_feed(feed, now, baseline)
            except RateLimited as exc:
                pause = max(0.0, exc.retry_at - time.time())
                logger.warning("poll %s: rate limited; next poll in %.0fs", feed, pause)
                wait = max(wait, pause)
                break
            except PagerDutyError as exc:
                logger.warning("poll %s: %s", feed, exc)
                continue
            fresh += found
            if not complete:
                gap_types += FEED_TYPES[feed]
            read_to[feed] = now
        await self._commit(fresh, gap_types)
        for feed, until in read_to.items():
            await anyio.to_thread.run_sync(log.set_state, f"{feed}:since", iso(until))
        limit = self.api.rate_limit
        if limit.remaining == 0 and limit.reset_at is not None:
            wait = max(wait, limit.reset_at - time.time())
        return wait

    async def _read_feed(
        self, feed: str, until: datetime, baseline: datetime
    ) -> tuple[list[tuple[pagerduty_events.Mapped, dict[str, Any]]], bool]:
        """A feed's items from its cursor (less the overlap) to ``until``, mapped, page by page, and
        whether they are all of them (False: more than ``MAX_PAGES`` pages, the rest unread).

        Raises RateLimited (nothing of the feed is kept; the next round reads it again) on a 429, or
        when the quota is spent before the last page."""
        log = self.server_of().log
        cursor = parse_iso(await anyio.to_thread.run_sync(log.get_state, f"{feed}:since") or "") or baseline
        since = max(baseline, cursor - POLL_OVERLAP)
        mapper = _FEED_MAPPERS[feed]
        found = []
        for number in range(MAX_PAGES):
            if number:
                self._check_quota(feed)
            page = await self._fetch(feed, since, until, offset=number * MAX_LIMIT)
            for item in page.items:
                try:
                    mapped = mapper(item)
                except pagerduty_events.Unmapped as exc:
                    logger.warning("poll %s: skipped an item: %s", feed, exc)
                    continue
                if mapped is None or mapped.occurred_at < baseline or await self.is_own_action(mapped):
                    continue
                found.append((mapped, item))
            if not page.more:
                return found, True
        logger.warning(
            "poll %s: more than %d items since %s: the rest are lost, and recorded as a gap",
            feed,
            MAX_PAGES * MAX_LIMIT,
            iso(since),
        )
        return found, False

    def _check_quota(self, feed: str) -> None:
        """RateLimited when the last answer said no request is left until the quota's reset."""
        limit = self.api.rate_limit
        if limit.remaining == 0 and limit.reset_at is not None and limit.reset_at > time.time():
            raise RateLimited(
                429,
                "GET",
                f"/{feed}",
                "the rate limit's quota is spent before the window's last page",
                retry_at=limit.reset_at,
            )

    async def _fetch(self, feed: str, since: datetime, until: datetime, *, offset: int) -> Page:
        if feed == "incidents":
            return await self.api.list_incidents(
                since=since, until=until, limit=MAX_LIMIT, offset=offset, sort_by="created_at:asc"
            )
        return await self.api.log_entries(since=since, until=until, limit=MAX_LIMIT, offset=offset)

    async def _commit(
        self, fresh: list[tuple[pagerduty_events.Mapped, dict[str, Any]]], gap_types: Sequence[str] = ()
    ) -> None:
        if not fresh and not gap_types:
            return
        # In the order things happened; on a tie the log entry (read first, with its actor) is kept.
        fresh.sort(key=lambda pair: pair[0].occurred_at)
        events = [NewEvent.of(m, item) for m, item in fresh]
        added = await self.accept(events, source="poll", gap_types=gap_types)
        if added:
            logger.info("poll: %d new event(s)", added)

    # ---- tools -----------------------------------------------------------------

    def register_tools(self, server: BridgeServer) -> None:
        from mcp.server.mcpserver.exceptions import ToolError

        mcp, api = server.mcp, self.api

        async def call(action: Any) -> Any:
            try:
                return await action
            except (PagerDutyError, ValueError) as exc:
                raise ToolError(str(exc)) from None

        @mcp.tool()
        async def get_incident(incident_id: IncidentId) -> dict[str, Any]:
            """Read an incident: title, status, urgency, priority, service, assignments, escalation policy."""
            result: dict[str, Any] = await call(api.get_incident(incident_id))
            return result

        @mcp.tool()
        async def acknowledge(incident_id: IncidentId) -> dict[str, Any]:
            """Acknowledge an incident (stops its notifications and escalation for now); returns the incident."""
            result: dict[str, Any] = await call(api.acknowledge(incident_id))
            return result

        @mcp.tool()
        async def add_note(
            incident_id: IncidentId,
            note: Annotated[
                str, Field(min_length=1, max_length=MAX_NOTE_CHARS, description="The note's text, plain.")
            ],
        ) -> dict[str, Any]:
            """Add a note to an incident's timeline (what was found, what was done); returns the note."""
            result: dict[str, Any] = await call(api.add_note(incident_id, note))
            return result

        @mcp.tool()
        async def escalate(
            incident_id: IncidentId,
            escalation_level: Annotated[
                int,
                Field(
                    ge=1, le=MAX_ESCALATION_LEVEL, description="The level of its escalation policy to page."
                ),
            ],
        ) -> dict[str, Any]:
            """Escalate an incident to a level of its escalation policy (pages whoever is on call there)."""
            result: dict[str, Any] = await call(api.escalate(incident_id, escalation_level))
            return result

        @mcp.tool()
        async def list_recent_incidents(
            hours: Annotated[int, Field(ge=1, le=24 * 30, description="How far back, in hours.")] = 24,
            service_ids: Annotated[list[ServiceId], Field(max_length=20)] = [],  # noqa: B006
            statuses: Annotated[
                list[Literal["triggered", "acknowledged", "resolved"]], Field(max_length=3)
            ] = [],  # noqa: B006
            limit: Annotated[int, Field(ge=1, le=MAX_LIMIT)] = 25,
        ) -> dict[str, Any]:
            """List the incidents created in the last hours, newest first, in brief (id, number, title, status,
            urgency, priority, service, createdAt, url), to see whether a new one belongs with others."""
            now = datetime.now(UTC)
            page: Page = await call(
                api.list_incidents(
                    since=now - timedelta(hours=hours),
                    until=now,
                    service_ids=list(service_ids),
                    statuses=list(statuses),
                    limit=limit,
                    sort_by="created_at:desc",
                )
            )
            return {"incidents": [pagerduty_events.brief(item) for item in page.items], "more": page.more}

        if "resolve" in self.settings.allowed_tools:

            @mcp.tool()
            async def resolve(incident_id: IncidentId) -> dict[str, Any]:
                """Resolve an incident: only when the problem is fixed. Returns the incident."""
                result: dict[str, Any] = await call(api.resolve(incident_id))
                return result


_FEED_MAPPERS: Final[dict[str, Callable[[dict[str, Any]], pagerduty_events.Mapped | None]]] = {
    "log_entries": pagerduty_events.from_log_entry,
    "incidents": pagerduty_events.from_incident,
}
