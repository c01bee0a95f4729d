"""Webhook delivery: ``events/subscribe``, ``events/unsubscribe`` and the sender behind them.

    events = EventsExtension(webhook=WebhookSettings(max_ttl=timedelta(minutes=30)))

A webhook subscription is keyed on (principal, delivery.url, name, arguments)
and named by ``subscription_id`` over that key: deterministic, so it is the same
after a restart, and a routing handle only (no method takes it as input).
Subscribe is an idempotent upsert: a second call with the same key re-grants the
TTL, replaces the secret (signing with the old one too for ``rotation_grace``)
and reactivates a suspended subscription.

Before the first delivery to a (principal, url) the endpoint proves it wants
deliveries: a signed ``verification`` envelope whose challenge it must echo,
sent while events/subscribe waits. Success is remembered per (principal, url)
for ``verification_ttl``; verification POSTs are rate-limited per host.

Each subscription runs one task inside ``EventsExtension.running()``: it reads
with the same ``EventsExtension.read`` as push (a check-function type every
nextPollMs or on ``wake``; an emit-only type on ``emit``), and POSTs every event
with up to ``max_in_flight`` deliveries in flight, each retried on its own with
exponential backoff and jitter until ``max_attempts`` or ``retry_window`` (410
and 413 are never retried). The ``cursor`` in each body is the watermark: every
event at or before it was acknowledged (2xx), or abandoned and reported (a
``gap`` envelope acknowledged, or ``truncated: true`` on the refresh that came
first), so a client may persist any cursor it receives and never skips silently. Sustained failure suspends delivery until the
next refresh. A read that skipped events sends a ``gap`` envelope; the server
ending a subscription sends ``terminated``.

A subscription past its ``refreshBefore`` is reclaimed (on_unsubscribe) by a
sweeper every ``sweep_interval``; a late refresh that comes before that still
finds it held and renews it. State is in memory unless ``WebhookSettings.store`` is set; then subscriptions
(with their verification and watermark) survive a restart, and ``ttlMs: null``
may be granted as no expiry.

This module is the registry of all subscriptions (``Webhooks``): subscribe and
unsubscribe, endpoint verification, termination, the sweeper and the store.
``_webhook_settings`` has the settings and the request rules, ``_webhook_delivery``
one subscription's delivery task and its watermark, ``_webhook_http`` the sender.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, Final

import anyio
import anyio.abc
import anyio.to_thread
from mcp.shared.exceptions import MCPError
from yarl import URL

from agentwake.server._errors import (
    callback_endpoint_error,
    internal_error,
    invalid_params,
    resource_exhausted,
    subscription_not_found,
)
from agentwake.server._shared import HOOK_TIMEOUT_S, EventSource, EventType, error_object
from agentwake.server._ssrf import AddressPolicy, parse_networks
from agentwake.server._types import EventResult, canonical_json, isoformat
from agentwake.server._webhook_delivery import WebhookSubscription, control_id, encode
from agentwake.server._webhook_http import (
    CATEGORIES,
    CHALLENGE_FAILED,
    CONNECTION_REFUSED,
    Outcome,
    WebhookSender,
)
from agentwake.server._webhook_settings import WEBHOOK, WebhookSettings, grant_ttl, subscription_id

logger = logging.getLogger(__name__)

CHALLENGE_BYTES: Final = 32
# How much of a verification response we read looking for the echoed challenge.
MAX_CHALLENGE_RESPONSE_BYTES: Final = 4096


def echoed_challenge(body: bytes) -> str | None:
    """The challenge an endpoint echoed, or None for anything else (its body is untrusted)."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return None
    challenge = document.get("challenge") if isinstance(document, dict) else None
    # Our nonces are ASCII; a lone surrogate or other non-ASCII echo cannot match (nor be encoded).
    return challenge if isinstance(challenge, str) and challenge.isascii() else None


class TokenBuckets:
    """Per-key token buckets: ``capacity`` tokens, refilled evenly over ``window_s``."""

    def __init__(self, capacity: int, window_s: float) -> None:
        self._capacity = capacity
        self._rate = capacity / window_s
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, key: str, now: float) -> bool:
        tokens, last = self._buckets.get(key, (float(self._capacity), now))
        tokens = min(float(self._capacity), tokens + (now - last) * self._rate)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return False
        self._buckets[key] = (tokens - 1.0, now)
        return True

    def forget_full(self, now: float) -> None:
        full = [
            key
            for key, (tokens, last) in self._buckets.items()
            if tokens + (now - last) * self._rate >= self._capacity
        ]
        for key in full:
            del self._buckets[key]


class _KeyLocks:
    """One lock per subscription id while anyone holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[anyio.Lock, int]] = {}

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (anyio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


class Webhooks:
    """Every webhook subscription of one ``EventsExtension``, the sender, verification and the sweeper."""

    def __init__(self, extension: EventSource, settings: WebhookSettings) -> None:
        self.extension = extension
        self.settings = settings
        self._policy = AddressPolicy(parse_networks(settings.allow_networks))
        self._subs: dict[str, WebhookSubscription] = {}
        self._locks = _KeyLocks()
        self._creating = 0
        # (principal, url) -> when its endpoint last proved intent
        self._verified: dict[tuple[str, str], datetime] = {}
        self._buckets = TokenBuckets(
            settings.verifications_per_host, settings.verification_window.total_seconds()
        )
        self._sender: WebhookSender | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        # Terminated, out of memory, their store records not deleted yet.
        self._ending: dict[str, WebhookSubscription] = {}

    # ---- running ---------------------------------------------------------------------

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The sender session, the delivery tasks and the sweeper; flushes the store on the way out."""
        sender = WebhookSender(
            policy=self._policy,
            resolve=self.settings.resolve,
            ssl_context=self.settings.ssl_context,
            timeout_s=self.settings.attempt_timeout.total_seconds(),
            clock=lambda: self.extension.now().timestamp(),
            identity=self.settings.identity,
        )
        if self.settings.identity is not None:
            for kid in self.settings.identity.retired(self.extension.now()):
                logger.warning(
                    "identity key %r is past its overlap: it no longer signs and is no longer published;"
                    " remove it from the configuration",
                    kid,
                )
        async with sender:
            self._sender = sender
            try:
                async with anyio.create_task_group() as tg:
                    self._tg = tg
                    await self._load()
                    tg.start_soon(self._sweep_forever)
                    try:
                        yield
                    finally:
                        tg.cancel_scope.cancel()
            finally:
                self._tg = None
                self._sender = None
                with anyio.CancelScope(shield=True):
                    await self._delete_all_ended()
                    await self.flush()
                # Like a restart: in-memory subscriptions are gone; stored ones load on the next run.
                self._subs.clear()

    async def _sweep_forever(self) -> None:
        while True:
            await anyio.sleep(self.settings.sweep_interval.total_seconds())
            try:
                await self.sweep()
                await self._delete_all_ended()
                await self.flush()
            except Exception:  # a store hiccup must not stop expiry
                logger.exception("webhook upkeep failed")

    def _start(self, sub: WebhookSubscription, first: EventResult | None) -> None:
        if self._tg is None:
            raise RuntimeError("webhook delivery runs inside EventsExtension.running()")
        self._tg.start_soon(sub.run, first)

    def _require_running(self) -> WebhookSender:
        if self._sender is None or self._tg is None:
            raise internal_error("InternalError", "webhook delivery is not running")
        return self._sender

    async def post(self, sub: WebhookSubscription, msg_id: str, payload: bytes) -> Outcome:
        return await self._require_running().post(sub.url, msg_id, payload, sub.keys(), sub.id)

    # ---- subscribe / unsubscribe -------------------------------------------------------

    async def subscribe(
        self,
        request: Any,
        event_type: EventType,
        *,
        principal: str,
        url: str,
        secret: str,
        key: bytes,
        arguments: dict[str, Any],
        cursor: str | None,
        max_age_ms: int | None,
        ttl_ms: int | None,
        ttl_given: bool,
    ) -> dict[str, Any]:
        self._require_running()
        host = URL(url).raw_host or ""
        if self._policy.permits_host(host) is False:
            # An IP literal is known bad without a connection: an invalid request, not an
            # unreachable endpoint (a DNS name is checked at connect time, by the guarded resolver).
            raise invalid_params(
                "delivery.url is an IP address deliveries may not go to (private, loopback, link-local"
                " or reserved, and not in the server's allowed networks)"
            )
        ttl = grant_ttl(self.settings, ttl_ms, given=ttl_given)
        sid = subscription_id(principal, url, event_type.name, arguments)
        async with self._locks.hold(sid):
            existing = self._subs.get(sid)
            if existing is not None and existing.expired(self.extension.now()):
                # Past refreshBefore but not reclaimed by the sweeper yet: still held, so renewed
                # in place rather than replayed from the client's cursor.
                logger.info("webhook subscription %s: refreshed after its refreshBefore", sid)
            if existing is not None and existing.event_type is not event_type:
                await self._end(existing, "its event type was declared again")
                existing = None
            if existing is None:
                limit = self.settings.max_subscriptions
                if limit is not None and len(self._subs) + self._creating >= limit:
                    raise resource_exhausted("subscriptions", limit)
            self._creating += existing is None
            try:
                verified_at = await self._ensure_verified(principal, url, key, sid)
                expires_at = None if ttl is None else self.extension.now() + ttl
                if existing is not None:
                    result = existing.refresh(secret, expires_at, verified_at)
                    await self._save(existing)
                    return result
                return await self._create(
                    request,
                    event_type,
                    sid,
                    principal,
                    url,
                    secret,
                    arguments,
                    expires_at,
                    verified_at,
                    cursor,
                    max_age_ms,
                )
            finally:
                self._creating -= existing is None

    async def _create(
        self,
        request: Any,
        event_type: EventType,
        sid: str,
        principal: str,
        url: str,
        secret: str,
        arguments: dict[str, Any],
        expires_at: datetime | None,
        verified_at: datetime,
        cursor: str | None,
        max_age_ms: int | None,
    ) -> dict[str, Any]:
        sub = WebhookSubscription(
            self,
            event_type,
            subscription_id=sid,
            principal=principal,
            url=url,
            arguments=arguments,
            secret=secret,
            expires_at=expires_at,
            verified_at=verified_at,
        )
        await self.extension.fire_hooks("subscribe", sub.lease, request=request, mode=WEBHOOK)
        try:
            first = await sub.open(request, cursor, max_age_ms)
            await self._save(sub)
        except BaseException:
            await self._fire_unsubscribe(sub)
            raise
        self._subs[sid] = sub
        self._start(sub, first)
        logger.info(
            "webhook subscription %s: %s for %s at host %s (%s)",
            sid,
            event_type.name,
            principal,
            URL(url).host,
            "no expiry" if expires_at is None else f"until {isoformat(expires_at)}",
        )
        return sub.grant(truncated=first.truncated and sub.replay)

    async def unsubscribe(self, *, principal: str, name: str, arguments: dict[str, Any], url: str) -> None:
        sid = subscription_id(principal, url, name, arguments)
        async with self._locks.hold(sid):
            sub = self._subs.get(sid)
            if sub is None:
                raise subscription_not_found()
            await self._end(sub, "unsubscribed")

    async def _end(self, sub: WebhookSubscription, reason: str) -> None:
        """Stop deliveries now, forget the subscription, run on_unsubscribe. Caller holds its lock."""
        self._forget(sub)
        await self._delete(sub.id)
        await self._fire_unsubscribe(sub)
        logger.info("webhook subscription %s: ended (%s)", sub.id, reason)

    def _forget(self, sub: WebhookSubscription) -> bool:
        if self._subs.get(sub.id) is not sub:
            return False
        del self._subs[sub.id]
        sub.stop()
        return True

    async def _fire_unsubscribe(self, sub: WebhookSubscription) -> None:
        with anyio.move_on_after(HOOK_TIMEOUT_S, shield=True) as scope:
            try:
                await self.extension.fire_hooks("unsubscribe", sub.lease, request=None, mode=WEBHOOK)
            except Exception:  # the subscription is over either way
                logger.exception("on_unsubscribe for %s failed", sub.event_type.name)
        if scope.cancelled_caught:
            logger.warning("on_unsubscribe for %s took over %gs", sub.event_type.name, HOOK_TIMEOUT_S)

    # ---- verification --------------------------------------------------------------------

    async def _ensure_verified(self, principal: str, url: str, key: bytes, sid: str) -> datetime:
        """When (principal, url) proved intent, verifying it now if that is not on record."""
        # One handshake at a time per (principal, url): concurrent subscribes share its result.
        async with self._locks.hold(canonical_json(["verification", principal, url])):
            verified_at = self._verified.get((principal, url))
            now = self.extension.now()
            # A handshake covers the principal's subscriptions to the URL across refreshes: while any
            # is live, it does not lapse.
            if verified_at is not None and (
                now < verified_at + self.settings.verification_ttl or self._live_at(principal, url)
            ):
                return verified_at
            # One bucket per host however it is spelled (case, a trailing dot).
            host = (URL(url).raw_host or "").lower().rstrip(".")
            if not self._buckets.take(host, anyio.current_time()):
                logger.warning("webhook verification to host %s refused: rate limit", host)
                raise resource_exhausted("verifications")
            await self._verify(url, key, sid)
            self._verified[(principal, url)] = now
            return now

    def _live_at(self, principal: str, url: str) -> bool:
        return any(sub.principal == principal and sub.url == url for sub in self._subs.values())

    async def _verify(self, url: str, key: bytes, sid: str) -> None:
        """POST a verification envelope signed with this request's secret; the endpoint must echo it."""
        nonce = secrets.token_urlsafe(CHALLENGE_BYTES)
        body = encode({"type": "verification", "challenge": nonce})
        outcome = await self._require_running().post(
            url, control_id("verification"), body, [key], sid, read_limit=MAX_CHALLENGE_RESPONSE_BYTES
        )
        category = outcome.category
        if category is None:
            echoed = echoed_challenge(outcome.body)
            if echoed is None or not hmac.compare_digest(echoed.encode(), nonce.encode()):
                category = CHALLENGE_FAILED
        if category is not None:
            assert category in CATEGORIES
            logger.info("webhook subscription %s: endpoint verification failed (%s)", sid, category)
            raise callback_endpoint_error(category)

    # ---- the server ends subscriptions ---------------------------------------------------

    def wake(self, name: str) -> None:
        for sub in list(self._subs.values()):
            if sub.event_type.name == name:
                sub.wake()

    def count(self, name: str | None = None) -> int:
        return sum(1 for sub in self._subs.values() if name is None or sub.event_type.name == name)

    def terminate(
        self,
        name: str | None,
        error: MCPError,
        where: Callable[[dict[str, Any], str | None], bool] | None,
    ) -> int:
        chosen = [
            sub
            for sub in list(self._subs.values())
            if (name is None or sub.event_type.name == name)
            and (where is None or where(sub.arguments, sub.principal))
        ]
        for sub in chosen:
            self.terminate_soon(sub, error)
        return len(chosen)

    def terminate_soon(self, sub: WebhookSubscription, error: MCPError) -> None:
        """End ``sub`` now; the terminated envelope, the store and on_unsubscribe follow in the background.

        Until its store record is deleted it stays in ``_ending``: a shutdown deletes it then, and
        the next start deletes it before resuming anything, so it never comes back.
        """
        if not self._forget(sub):
            return
        self._ending[sub.id] = sub
        if self._tg is None:
            logger.warning("webhook subscription %s: ended outside running(); no terminated envelope", sub.id)
            return
        self._tg.start_soon(self._finish_termination, sub, error)

    async def _finish_termination(self, sub: WebhookSubscription, error: MCPError) -> None:
        try:
            # Out of the store first, so a restart during the envelope's POST cannot bring it back.
            await self._delete_ended(sub)
            body = encode({"type": "terminated", "error": error_object(error)})
            outcome = await self.post(sub, control_id("terminated"), body)
            logger.info(
                "webhook subscription %s: terminated (%s); envelope %s",
                sub.id,
                error.error.message,
                "delivered" if outcome.ok else f"not delivered ({outcome.category})",
            )
        except Exception:  # the others' deliveries go on; the sweeper retries the delete
            logger.exception("webhook subscription %s: ending it failed", sub.id)
        await self._fire_unsubscribe(sub)

    async def _delete_ended(self, sub: WebhookSubscription) -> None:
        """Delete an ended subscription's store record, unless its key was subscribed again since."""
        async with self._locks.hold(sub.id):
            if self._ending.get(sub.id) is not sub:
                return
            if sub.id not in self._subs:
                await self._delete(sub.id)
            del self._ending[sub.id]

    async def _delete_all_ended(self) -> None:
        for sub in list(self._ending.values()):
            try:
                await self._delete_ended(sub)
            except Exception:
                logger.exception("webhook subscription %s: deleting the ended subscription failed", sub.id)

    # ---- upkeep ------------------------------------------------------------------------

    async def sweep(self) -> int:
        """End expired subscriptions (on_unsubscribe) and drop no-expiry ones failing for ``drop_after``."""
        ended = 0
        now = self.extension.now()
        for sub in list(self._subs.values()):
            if sub.expired(now):
                async with self._locks.hold(sub.id):
                    if self._subs.get(sub.id) is sub and sub.expired(self.extension.now()):
                        await self._end(sub, "expired")
                        ended += 1
            elif (
                sub.expires_at is None
                and sub.failed_since is not None
                and now - sub.failed_since >= self.settings.drop_after
            ):
                logger.warning(
                    "webhook subscription %s: no-expiry grant dropped after sustained failure", sub.id
                )
                self.terminate_soon(sub, callback_endpoint_error(sub.last_error or CONNECTION_REFUSED))
                ended += 1
        horizon = now - self.settings.verification_ttl
        live = {(sub.principal, sub.url) for sub in self._subs.values()}
        for pair, verified_at in list(self._verified.items()):
            if verified_at <= horizon and pair not in live:
                del self._verified[pair]
        self._buckets.forget_full(anyio.current_time())
        return ended

    async def flush(self) -> None:
        """Write every subscription whose watermark moved to the store."""
        if self.settings.store is None:
            return
        for sub in list(self._subs.values()):
            if sub.dirty or sub.record().cursor != sub.saved_cursor:
                async with self._locks.hold(sub.id):
                    # Unsubscribed, expired or ended while earlier saves ran: not written back.
                    if self._subs.get(sub.id) is sub:
                        await self._save(sub)

    async def _save(self, sub: WebhookSubscription) -> None:
        store = self.settings.store
        if store is not None:
            record = sub.record()
            sub.dirty, sub.saved_cursor = False, record.cursor
            await anyio.to_thread.run_sync(store.save, record)

    async def _delete(self, sid: str) -> None:
        store = self.settings.store
        if store is not None:
            await anyio.to_thread.run_sync(store.delete, sid)

    async def _load(self) -> None:
        """Resume the stored subscriptions: on_subscribe again, then delivery from the stored watermark."""
        store = self.settings.store
        if store is None:
            return
        await self._delete_all_ended()  # ended outside running(), or a delete that failed before
        records = await anyio.to_thread.run_sync(store.load)
        types = {t.name: t for t in self.extension.event_types()}
        now = self.extension.now()
        for record in records:
            event_type = types.get(record.name)
            if (record.expires_at is not None and record.expires_at <= now) or event_type is None:
                await self._delete(record.id)
                continue
            if WEBHOOK not in event_type.modes():
                await self._delete(record.id)
                continue
            if record.verified_at is None:
                # Delivery must not begin before the endpoint proved intent; a record from another
                # store that never did is not resumed (the client's next subscribe verifies it).
                logger.warning(
                    "webhook subscription %s: stored without a verification; not resumed", record.id
                )
                await self._delete(record.id)
                continue
            sub = WebhookSubscription(
                self,
                event_type,
                subscription_id=record.id,
                principal=record.principal,
                url=record.url,
                arguments=record.arguments,
                secret=record.secret,
                expires_at=record.expires_at,
                verified_at=record.verified_at,
            )
            sub.previous_secret, sub.previous_until = record.previous_secret, record.previous_until
            sub.resume_from(record.cursor)
            if record.verified_at is not None:
                pair = (record.principal, record.url)
                self._verified[pair] = max(self._verified.get(pair, record.verified_at), record.verified_at)
            self._subs[sub.id] = sub
            try:
                await self.extension.fire_hooks("subscribe", sub.lease, request=None, mode=WEBHOOK)
            except Exception as exc:
                logger.exception("on_subscribe for stored webhook subscription %s failed", sub.id)
                self.terminate_soon(
                    sub,
                    exc if isinstance(exc, MCPError) else internal_error("InternalError", type(exc).__name__),
                )
                continue
            self._start(sub, None)
            logger.info("webhook subscription %s: resumed from the store", sub.id)
