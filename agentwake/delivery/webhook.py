"""The webhook side of one subscription: events/subscribe, then a refresh loop that keeps it alive.

The subscription's ``whsec_`` secret comes from the CSPRNG and lives in the store
(never in a log line). Each subscribe carries the last persisted cursor (and
``maxAgeMs`` on the first one after a start) and the configured ``ttlMs``; the
response's id routes deliveries in the receiver, its cursor is persisted as any
other (a gap when ``truncated``), and its ``deliveryStatus`` is stored for
`agentwake status`. The next refresh goes well before ``refreshBefore``, at a
jittered 50 to 75% of the time left; a grant with no expiry gets an occasional
health refresh instead. `agentwake rotate-secret` leaves a pending secret in the
store, which the next refresh (within ``ROTATION_CHECK_S``) sends; the old secret
is still accepted for ``rotation_grace_s``.

Errors name the subscription: -32602, -32012 and -32014 end it (retrying cannot
help); -32013 and -32015 are retried with backoff while the grant lasts.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import anyio
from pydantic import TypeAdapter, ValidationError

from agentwake import metrics, protocol, signing
from agentwake.backoff import backoff_s
from agentwake.clock import iso
from agentwake.config import SubscriptionConfig, WebhookConfig
from agentwake.delivery.common import (
    CURSOR_SHOWN,
    RETRY_INITIAL_S,
    RETRY_MAX_S,
    shown_cursor,
    subscription_key,
)
from agentwake.delivery.routes import WebhookRoutes
from agentwake.errors import EventsCallError, StoreError, SubscriptionEnded, TransientEventsError
from agentwake.logs import event_fields
from agentwake.mcp import ServerConnection
from agentwake.store import Store, SubscriptionKey, WebhookRecord
from agentwake.text import peer

logger = logging.getLogger(__name__)

# When to refresh: this fraction of the time left before refreshBefore, drawn at random.
REFRESH_FRACTION: Final = (0.5, 0.75)
HEALTH_REFRESH_JITTER: Final = (0.8, 1.0)
MIN_REFRESH_S: Final = 0.05
# The pace when a grant looks over as soon as it arrives and no TTL was asked for (see refresh_delay).
EXPIRED_GRANT_REFRESH_S: Final = 60.0
# How often a waiting loop looks for a rotation asked for by `agentwake rotate-secret`.
ROTATION_CHECK_S: Final = 2.0
ENDING_SUBSCRIBE_CODES: Final = frozenset(
    {protocol.INVALID_PARAMS, protocol.NOT_FOUND, protocol.FORBIDDEN, protocol.UNSUPPORTED}
)


_DATETIME: Final = TypeAdapter(datetime)


def parse_time(value: str) -> datetime:
    """An RFC 3339 time (lowercase t and z, any fraction of a second); one without an offset is UTC.

    ValueError when it is not a time.
    """
    try:
        parsed = _DATETIME.validate_python(value)
    except ValidationError:
        raise ValueError(f"not a time: {value[:60]!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def refresh_delay(
    refresh_before: datetime | None,
    now: datetime,
    *,
    requested_ttl_s: float | None,
    health_refresh_s: float,
    rng: random.Random,
    max_refresh_s: float | None = None,
) -> float:
    """Seconds until the next refresh: well before the grant ends, jittered; occasional without expiry.

    Times come from two clocks. A clock here behind the server's makes the grant look longer than it
    is, so the plan never reaches past the TTL asked for; one ahead can make a fresh grant look over
    already, and then the TTL asked for (or EXPIRED_GRANT_REFRESH_S) sets the pace, not "at once",
    which a steady skew would turn into a tight loop.

    ``max_refresh_s`` bounds it whatever the grant: a refresh is how we find out that the server lost
    the subscription (a restart with a fresh store answers our pings all the same), so a long grant
    must not leave that unnoticed for most of an hour.
    """
    delay = _grant_delay(refresh_before, now, requested_ttl_s, health_refresh_s, rng)
    if max_refresh_s is not None and delay > max_refresh_s:
        delay = max_refresh_s * rng.uniform(*HEALTH_REFRESH_JITTER)
    return delay


def _grant_delay(
    refresh_before: datetime | None,
    now: datetime,
    requested_ttl_s: float | None,
    health_refresh_s: float,
    rng: random.Random,
) -> float:
    if refresh_before is None:
        return health_refresh_s * rng.uniform(*HEALTH_REFRESH_JITTER)
    remaining = (refresh_before - now).total_seconds()
    if requested_ttl_s is not None:
        remaining = min(remaining, requested_ttl_s)
    if remaining <= 0:
        remaining = requested_ttl_s if requested_ttl_s is not None else EXPIRED_GRANT_REFRESH_S
    return max(MIN_REFRESH_S, remaining * rng.uniform(*REFRESH_FRACTION))


def describe_subscribe_error(exc: EventsCallError, sub: SubscriptionConfig, config: WebhookConfig) -> str:
    """One clear sentence per events/subscribe error code, naming the subscription and what to do."""
    data = exc.data if isinstance(exc.data, dict) else {}
    where = f"subscription {sub.name!r} (event {sub.event!r} on server {sub.server!r})"
    code = exc.code
    if code == protocol.INVALID_PARAMS:
        return (
            f"{where}: the server rejected the webhook subscribe as invalid: {exc.error_message}"
            " (check 'arguments' and [webhook] public_url, which must be https)"
        )
    if code == protocol.FORBIDDEN:
        reason = data.get("reason")
        return (
            f"{where}: the server refused the webhook subscription (Forbidden"
            + (f": {reason}" if reason else "")
            + "); webhook delivery needs an authenticated connection (an Authorization header in"
            f" [servers.{sub.server}] headers) whose principal may subscribe to this event"
        )
    if code == protocol.RESOURCE_EXHAUSTED:
        limit = data.get("limit", "a limit")
        ceiling = f" (at most {data['max']})" if "max" in data else ""
        return f"{where}: the server's {limit} limit is reached{ceiling}; retrying with backoff"
    if code == protocol.UNSUPPORTED:
        value = data.get("value", "webhook")
        return (
            f"{where}: the server does not support {data.get('feature', 'this option')} {value!r} here;"
            ' set delivery = "auto", "push" or "poll"'
        )
    if code == protocol.CALLBACK_ENDPOINT_ERROR:
        reason = data.get("reason")
        category = reason if reason in protocol.DELIVERY_ERROR_CATEGORIES else "unknown"
        return (
            f"{where}: the server could not verify our webhook endpoint {config.callback_url(sub.name)}"
            f" ({category}); check that [webhook] public_url reaches this receiver (listening on"
            f" {config.listen}); retrying with backoff"
        )
    if code == protocol.NOT_FOUND:
        return f"{where}: the server does not know this event (NotFound); fix 'event'"
    return str(exc)


def bind_route(
    routes: WebhookRoutes, key: SubscriptionKey, record: WebhookRecord, *, changed_only: bool = False
) -> None:
    """Tell the receiver which secrets this subscription's deliveries may carry (current, pending, previous).

    ``changed_only``: leave the route alone if it is bound with the same id and secrets already.
    """
    if record.webhook_id is None:
        return
    secrets: list[tuple[str, float | None]] = [(record.secret, None)]
    if record.pending_secret:
        secrets.append((record.pending_secret, None))
    if record.previous_secret and record.previous_until:
        secrets.append((record.previous_secret, parse_time(record.previous_until).timestamp()))
    routes.bind(record.webhook_id, key, secrets, changed_only=changed_only)


async def load_routes(store: Store, routes: WebhookRoutes, *, changed_only: bool = False) -> None:
    """Route every webhook subscription in the store; ``changed_only``: also unroute those no longer
    there, and leave alone the ones whose id and secrets are the same."""
    records = await store.webhooks()
    unbound: dict[str, tuple[SubscriptionKey, list[str]]] = {}
    for record in records:
        key = SubscriptionKey(record.subscription, record.server, record.event, record.arguments)
        bind_route(routes, key, record, changed_only=changed_only)
        if record.webhook_id is None:
            unbound[record.subscription] = (key, [s for s in (record.secret, record.pending_secret) if s])
    routes.expect_elsewhere(unbound)
    if changed_only:
        stored = {record.subscription for record in records}
        for name in routes.bound_names() - stored:
            routes.unbind(name)
    for webhook_id in await store.retired_webhook_ids():
        routes.retire(webhook_id)


async def reload_routes(store: Store, routes: WebhookRoutes, interval_s: float) -> None:
    """For a store several processes share, where a load balancer may send any delivery to any of
    them: read the webhook subscriptions again every ``interval_s``, so what another process
    subscribed, rotated or retired is routed here too."""
    failing = False
    while True:
        await anyio.sleep(interval_s)
        try:
            await load_routes(store, routes, changed_only=True)
        except StoreError as exc:
            if not failing:
                logger.warning("could not read the webhook subscriptions again: %s", exc)
            failing = True
        else:
            failing = False


def _describe_status(status: protocol.DeliveryStatus | None) -> str:
    if status is None:
        return "no delivery status"
    text = "active" if status.active else "suspended"
    if status.last_error:
        text += f", last error {status.last_error}"
        if status.failed_since:
            text += f" since {status.failed_since}"
    if status.throttled:
        text += ", throttled" + (f" for about {status.retry_after_ms} ms" if status.retry_after_ms else "")
    return text


@dataclass
class WebhookLoop:
    subscription: SubscriptionConfig
    connection: ServerConnection
    store: Store
    routes: WebhookRoutes
    config: WebhookConfig
    on_new_events: Callable[[int], None] = lambda count: None
    retry_initial_s: float = RETRY_INITIAL_S
    retry_max_s: float = RETRY_MAX_S
    rotation_check_s: float = ROTATION_CHECK_S
    rng: random.Random = field(default_factory=random.Random)
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    # The lease this process drives the subscription under (agentwake.ownership); None: unfenced.
    fence: int | None = None
    subscribes: int = field(default=0, init=False)
    _status: str | None = field(default=None, init=False)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Subscribe and refresh until cancelled. SubscriptionEnded and ConnectionLost propagate."""
        sub = self.subscription
        key = subscription_key(sub)
        cursor = await self.store.register(key, fence=self.fence)
        url = self.config.callback_url(sub.name)
        record = await self.store.prepare_webhook(key, url, signing.generate_secret())
        self._bind(key, record)
        await self.store.set_state(sub.name, status="active", mode="webhook")
        logger.info(
            "subscription %s: webhook delivery of %s on %s to %s, from %s",
            sub.name,
            sub.event,
            sub.server,
            url,
            f"cursor {peer(cursor, CURSOR_SHOWN)}" if cursor is not None else "now",
            extra=event_fields(subscription=sub.name, server=sub.server),
        )
        task_status.started()
        ended = self.routes.ended(sub.name)
        resuming = cursor is not None
        failures = 0
        while True:
            current = await self.store.webhook(sub.name)
            if current is None or ended.is_set():
                raise self._terminated()
            try:
                record = await self._subscribe(key, current, resuming=resuming)
                resuming = False
                failures = 0
                delay = refresh_delay(
                    self._grant_end(record.refresh_before),
                    self.clock(),
                    requested_ttl_s=self._requested_ttl_s(),
                    health_refresh_s=self.config.health_refresh_s,
                    rng=self.rng,
                    max_refresh_s=self.config.max_refresh_s,
                )
            except EventsCallError as exc:
                if exc.code in ENDING_SUBSCRIBE_CODES and not isinstance(exc, TransientEventsError):
                    message = describe_subscribe_error(exc, sub, self.config)
                    raise SubscriptionEnded(
                        exc.method, exc.code, message, exc.data, server=sub.server, subscription=sub.name
                    ) from None
                failures += 1
                delay = self._backoff(failures)
                message = describe_subscribe_error(exc, sub, self.config)
                logger.warning("%s; next try in %.1fs", message, delay)
                await self.store.record_error(sub.name, message)
            await self._wait(delay, ended)

    def _grant_end(self, refresh_before: str | None) -> datetime | None:
        """When the grant ends; a time that is not one, or already past here, is said and planned around."""
        if refresh_before is None:
            return None
        now = self.clock()
        try:
            end = parse_time(refresh_before)
        except ValueError:
            logger.warning(
                "subscription %s: the server's refreshBefore %r is not a time; refreshing on the TTL asked for",
                self.subscription.name,
                refresh_before[:60],
                extra=event_fields(subscription=self.subscription.name, server=self.subscription.server),
            )
            return now
        if end <= now:
            logger.warning(
                "subscription %s: refreshBefore %s is already past by this machine's clock (is it right?);"
                " refreshing on the TTL asked for",
                self.subscription.name,
                refresh_before,
                extra=event_fields(subscription=self.subscription.name, server=self.subscription.server),
            )
        return end

    def _requested_ttl_s(self) -> float | None:
        ttl = self._params_ttl_ms()
        return None if ttl is None else ttl / 1000

    def _params_ttl_ms(self) -> int | None:
        """The ttlMs a subscribe asks for; None for no expiry or the server's default."""
        if self.config.no_expiry:
            return None
        sub = self.subscription
        return sub.ttl_ms if sub.ttl_ms is not None else self.config.ttl_ms

    def _backoff(self, failures: int) -> float:
        return backoff_s(failures, initial_s=self.retry_initial_s, max_s=self.retry_max_s, rng=self.rng)

    def _terminated(self) -> SubscriptionEnded:
        sub = self.subscription
        reason = self.routes.end_reasons.get(sub.name, "the subscription was retired")
        return SubscriptionEnded(
            "webhook terminated",
            protocol.FORBIDDEN,
            f"the server ended the webhook subscription: {reason}",
            server=sub.server,
            subscription=sub.name,
        )

    def _bind(self, key: SubscriptionKey, record: WebhookRecord) -> None:
        bind_route(self.routes, key, record)

    def _params(
        self, record: WebhookRecord, secret: str, cursor: str | None, *, resuming: bool
    ) -> dict[str, Any]:
        sub = self.subscription
        params: dict[str, Any] = {
            "name": sub.event,
            "arguments": dict(sub.arguments),
            "delivery": {"mode": "webhook", "url": record.url, "secret": secret},
            "cursor": cursor,
        }
        if resuming and sub.max_age_ms is not None:
            params["maxAgeMs"] = sub.max_age_ms
        if self.config.no_expiry:
            params["ttlMs"] = None
        elif (ttl := self._params_ttl_ms()) is not None:
            params["ttlMs"] = ttl
        return params

    async def _subscribe(
        self, key: SubscriptionKey, record: WebhookRecord, *, resuming: bool
    ) -> WebhookRecord:
        sub = self.subscription
        secret = record.pending_secret or record.secret
        rotating = secret != record.secret
        cursor = await self.store.cursor(sub.name)
        params = self._params(record, secret, cursor, resuming=resuming)
        # Routed deliveries may be signed with the new secret as soon as the server has it.
        self._bind(key, record)
        self.routes.begin_subscribe(key, [secret])
        try:
            result = await self.connection.subscribe(params, subscription=sub.name)
        finally:
            self.routes.end_subscribe(sub.name)
        self.subscribes += 1
        status = result.delivery_status
        updated = await self.store.webhook_subscribed(
            sub.name,
            webhook_id=result.id,
            sent_secret=secret,
            refresh_before=result.refresh_before,
            delivery_status=status.model_dump(by_alias=True, exclude_none=True) if status else None,
            previous_until=iso(self.clock() + timedelta(seconds=self.config.rotation_grace_s)),
            fence=self.fence,
        )
        if updated is None:  # a terminated envelope retired it while this refresh was in flight
            raise self._terminated()
        # Unless a delivery stored a cursor meanwhile: this watermark may be older (the server had not
        # yet seen that delivery acknowledged), and a cursor never goes back.
        await self.store.ingest(
            key,
            [],
            result.cursor,
            truncated=result.truncated,
            cursor_before=cursor,
            fence=self.fence,
            unless_moved=True,
        )
        # A terminated envelope may have retired it during that write; binding now would route it again.
        if self.routes.ended(sub.name).is_set() or await self.store.webhook(sub.name) is None:
            raise self._terminated()
        # Last: binding is what marks a refresh as complete (WebhookRoutes.wait_binds).
        self._bind(key, updated)
        if result.truncated:
            metrics.observe_gap(sub.name)
            logger.warning(
                "subscription %s: gap: the server starts delivery after our cursor (truncated); now at %s",
                sub.name,
                shown_cursor(result.cursor),
                extra=event_fields(subscription=sub.name, server=sub.server),
            )
        expiry = "no expiry" if result.refresh_before is None else f"refresh before {result.refresh_before}"
        described = _describe_status(status)
        if self.subscribes == 1:
            logger.info(
                "subscription %s: webhook subscribed as %s (%s)",
                sub.name,
                result.id,
                expiry,
                extra=event_fields(subscription=sub.name, server=sub.server),
            )
        elif rotating:
            logger.info(
                "subscription %s: webhook secret rotated; the old one is accepted for %gs more",
                sub.name,
                self.config.rotation_grace_s,
                extra=event_fields(subscription=sub.name, server=sub.server),
            )
        else:
            logger.debug(
                "subscription %s: webhook refreshed (%s; %s)",
                sub.name,
                expiry,
                described,
                extra=event_fields(subscription=sub.name, server=sub.server),
            )
        await self._note_status(status, result.truncated)
        return updated

    async def _note_status(self, status: protocol.DeliveryStatus | None, truncated: bool) -> None:
        """A refresh's deliveryStatus into the metrics, the log and, when it says deliveries fail or
        stopped, the subscription's last error (what `status` shows)."""
        sub = self.subscription
        if status is None:
            if self._status is not None and self.subscribes > 1:
                # Our own server answers a refresh of a subscription it holds with a status; none
                # means it took the refresh as a fresh subscribe: it had lost ours (a restart).
                logger.warning(
                    "subscription %s: the server answered the refresh as a new subscription (no"
                    " deliveryStatus): it had lost ours; deliveries since then come again from our"
                    " cursor%s",
                    sub.name,
                    " or are a gap (truncated)" if truncated else "",
                    extra=event_fields(subscription=sub.name, server=sub.server),
                )
            self._status = None
            metrics.observe_delivery_status(sub.name, None)
            return
        described = _describe_status(status)
        metrics.observe_delivery_status(
            sub.name,
            {
                "active": status.active,
                "lastError": status.last_error
                if status.last_error in protocol.DELIVERY_ERROR_CATEGORIES
                else ("unknown" if status.last_error else None),
                "throttled": bool(status.throttled),
                "retryAfterMs": status.retry_after_ms,
            },
        )
        failing = not status.active or bool(status.last_error)
        if described != self._status:
            level = logging.WARNING if failing else logging.INFO
            logger.log(level, "subscription %s: the server reports webhook delivery %s", sub.name, described)
            if failing:
                await self.store.record_error(sub.name, f"the server reports webhook delivery {described}")
        self._status = described

    async def _wait(self, delay: float, ended: anyio.Event) -> None:
        """Wait ``delay`` seconds; return early when the server ended us or a rotation is asked for."""
        deadline = anyio.current_time() + delay
        while True:
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                return
            with anyio.move_on_after(min(remaining, self.rotation_check_s)):
                await ended.wait()
            if ended.is_set():
                return
            record = await self.store.webhook(self.subscription.name)
            if record is None or record.pending_secret:
                return
