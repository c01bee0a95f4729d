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
event at or before it was acknowledged (2xx) or abandoned, so a client may
persist any cursor it receives. Sustained failure suspends delivery until the
next refresh. A read that skipped events sends a ``gap`` envelope; the server
ending a subscription sends ``terminated``.

A subscription past its ``refreshBefore`` is reclaimed (on_unsubscribe) by a
sweeper every ``sweep_interval``; a late refresh that comes before that still
finds it held and renews it. State is in memory unless ``WebhookSettings.store`` is set; then subscriptions
(with their verification and watermark) survive a restart, and ``ttlMs: null``
may be granted as no expiry.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import itertools
import json
import logging
import math
import random
import re
import secrets
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

import anyio
import anyio.abc
import anyio.to_thread
from mcp.shared.exceptions import MCPError
from yarl import URL

from agentwake import signing
from agentwake.server._errors import (
    callback_endpoint_error,
    internal_error,
    invalid_params,
    not_found,
    resource_exhausted,
    subscription_not_found,
    unsupported_mode,
)
from agentwake.server._leases import Lease
from agentwake.server._ssrf import AddressPolicy, IPNetwork, Resolve, parse_networks
from agentwake.server._stream import (
    HOOK_TIMEOUT_S,
    TERMINAL_CODES,
    error_object,
    idle_delay,
    retry_delay,
    start_cursor,
)
from agentwake.server._types import Event, EventContext, EventResult, canonical_json, isoformat
from agentwake.server._webhook_http import (
    CATEGORIES,
    CHALLENGE_FAILED,
    CONNECTION_REFUSED,
    Outcome,
    WebhookSender,
)
from agentwake.server._webhook_store import StoredWebhook, WebhookStore

if TYPE_CHECKING:
    from agentwake.server._extension import EventsExtension, EventType

logger = logging.getLogger(__name__)

DEFAULT_MIN_TTL: Final = timedelta(minutes=1)
# A cap above this without a store draws a warning (see WebhookSettings).
LONG_TTL_WITHOUT_STORE: Final = timedelta(days=1)
DEFAULT_VERIFICATION_TTL: Final = timedelta(hours=24)
DEFAULT_VERIFICATIONS_PER_HOST: Final = 10
DEFAULT_VERIFICATION_WINDOW: Final = timedelta(minutes=1)
DEFAULT_ROTATION_GRACE: Final = timedelta(hours=1)
DEFAULT_MAX_IN_FLIGHT: Final = 16
DEFAULT_MAX_ATTEMPTS: Final = 5
DEFAULT_RETRY_INITIAL: Final = timedelta(seconds=5)
DEFAULT_RETRY_MAX: Final = timedelta(minutes=5)
DEFAULT_RETRY_WINDOW: Final = timedelta(minutes=15)
DEFAULT_ATTEMPT_TIMEOUT: Final = timedelta(seconds=5)
MAX_BODY_BYTES: Final = 256 * 1024
DEFAULT_SUSPEND_FAILURE_RATE: Final = 0.95
DEFAULT_SUSPEND_WINDOW: Final = timedelta(minutes=60)
DEFAULT_SUSPEND_MIN_ATTEMPTS: Final = 100
DEFAULT_DROP_AFTER: Final = timedelta(days=3)
# Each retry waits its backoff times a random factor in [1, 1 + RETRY_JITTER).
RETRY_JITTER: Final = 0.2
# How often expiry, no-expiry GC and the store flush run.
DEFAULT_SWEEP_INTERVAL: Final = timedelta(milliseconds=500)
MAX_URL_LENGTH: Final = 2048
CHALLENGE_BYTES: Final = 32
# How much of a verification response we read looking for the echoed challenge.
MAX_CHALLENGE_RESPONSE_BYTES: Final = 4096
# Statuses that end one delivery at once, without retrying (the spec: 410 Gone, 413 Too Large).
NON_RETRYABLE: Final = frozenset({410, 413})
GONE: Final = 410
WEBHOOK: Final = "webhook"


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    """Webhook delivery for ``EventsExtension(webhook=...)``; every limit has a named default.

    ``max_ttl`` is the cap on granted TTLs (the spec's ``webhook_ttl``); client
    suggestions are clamped into [``min_ttl``, ``max_ttl``]. With a durable
    ``store`` a client's ``ttlMs: null`` is granted as no expiry; without one every
    grant is finite and all state is in memory.

    ``allow_networks`` exempts CIDR blocks from the SSRF guard (say ``127.0.0.0/8``
    for development); ``resolve`` replaces DNS (tests); ``ssl_context`` is the
    trust for callback TLS (default: the system store).
    """

    max_ttl: timedelta
    min_ttl: timedelta = DEFAULT_MIN_TTL
    store: WebhookStore | None = None
    allow_networks: Sequence[str | IPNetwork] = ()
    resolve: Resolve | None = None
    ssl_context: ssl.SSLContext | None = None
    max_subscriptions: int | None = None
    verification_ttl: timedelta = DEFAULT_VERIFICATION_TTL
    verifications_per_host: int = DEFAULT_VERIFICATIONS_PER_HOST
    verification_window: timedelta = DEFAULT_VERIFICATION_WINDOW
    rotation_grace: timedelta = DEFAULT_ROTATION_GRACE
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry_initial: timedelta = DEFAULT_RETRY_INITIAL
    retry_max: timedelta = DEFAULT_RETRY_MAX
    retry_window: timedelta = DEFAULT_RETRY_WINDOW
    attempt_timeout: timedelta = DEFAULT_ATTEMPT_TIMEOUT
    max_body_bytes: int = MAX_BODY_BYTES
    suspend_failure_rate: float = DEFAULT_SUSPEND_FAILURE_RATE
    suspend_window: timedelta = DEFAULT_SUSPEND_WINDOW
    suspend_min_attempts: int = DEFAULT_SUSPEND_MIN_ATTEMPTS
    drop_after: timedelta = DEFAULT_DROP_AFTER
    sweep_interval: timedelta = DEFAULT_SWEEP_INTERVAL

    def __post_init__(self) -> None:
        positive = {
            "max_ttl": self.max_ttl,
            "min_ttl": self.min_ttl,
            "verification_ttl": self.verification_ttl,
            "verification_window": self.verification_window,
            "retry_initial": self.retry_initial,
            "retry_max": self.retry_max,
            "retry_window": self.retry_window,
            "attempt_timeout": self.attempt_timeout,
            "suspend_window": self.suspend_window,
            "drop_after": self.drop_after,
            "sweep_interval": self.sweep_interval,
        }
        for name, value in positive.items():
            if value <= timedelta(0):
                raise ValueError(f"WebhookSettings.{name} must be positive")
        if self.rotation_grace < timedelta(0):
            raise ValueError("WebhookSettings.rotation_grace must not be negative")
        if self.min_ttl > self.max_ttl:
            raise ValueError("WebhookSettings.min_ttl must not exceed max_ttl")
        counts = {
            "verifications_per_host": self.verifications_per_host,
            "max_in_flight": self.max_in_flight,
            "max_attempts": self.max_attempts,
            "max_body_bytes": self.max_body_bytes,
            "suspend_min_attempts": self.suspend_min_attempts,
        }
        for name, count in counts.items():
            if count < 1:
                raise ValueError(f"WebhookSettings.{name} must be at least 1")
        if self.max_subscriptions is not None and self.max_subscriptions < 1:
            raise ValueError("WebhookSettings.max_subscriptions must be at least 1 (or None for no cap)")
        if not 0.0 < self.suspend_failure_rate <= 1.0:
            raise ValueError("WebhookSettings.suspend_failure_rate must be in (0, 1]")
        if self.store is None and self.max_ttl > LONG_TTL_WITHOUT_STORE:
            # The spec: a server granting long TTLs must hold its subscriptions that long, restarts
            # included; without a store a restart loses them, and a client refreshing rarely notices late.
            logger.warning(
                "WebhookSettings: max_ttl %s without a store: a restart loses subscriptions granted that long",
                self.max_ttl,
            )
        # Malformed CIDR blocks fail here, at configuration time.
        object.__setattr__(self, "allow_networks", parse_networks(self.allow_networks))


# ---- pure rules ---------------------------------------------------------------------------


def subscription_id(principal: str, url: str, name: str, arguments: dict[str, Any]) -> str:
    """The derived id: ``sub_`` and 16 hex digits of SHA-256 over the canonical key."""
    key = canonical_json([principal, url, name, arguments])
    return "sub_" + hashlib.sha256(key.encode()).hexdigest()[:16]


def grant_ttl(settings: WebhookSettings, ttl_ms: int | None, *, given: bool) -> timedelta | None:
    """The granted lifetime; None is no expiry, only for an explicit ``ttlMs: null`` with a store."""
    if not given:
        return settings.max_ttl
    if ttl_ms is None:
        return None if settings.store is not None else settings.max_ttl
    cap_ms = settings.max_ttl // timedelta(milliseconds=1)
    return max(settings.min_ttl, timedelta(milliseconds=min(max(ttl_ms, 0), cap_ms)))


def check_url(value: Any) -> str:
    """``delivery.url`` as given, if it is an absolute https URL; InvalidParams otherwise."""
    if not isinstance(value, str) or not value:
        raise invalid_params("delivery.url is required: the https URL deliveries are POSTed to")
    if len(value) > MAX_URL_LENGTH:
        raise invalid_params(f"delivery.url is longer than {MAX_URL_LENGTH} characters")
    try:
        url = URL(value)
        port = url.port
    except (ValueError, TypeError):
        raise invalid_params("delivery.url is not a valid URL") from None
    if url.scheme != "https":
        raise invalid_params("delivery.url must be an https URL")
    if not url.absolute or not url.raw_host or port is None:
        raise invalid_params("delivery.url is not a valid URL")
    if url.raw_user is not None or url.raw_password is not None:
        raise invalid_params("delivery.url must not carry credentials")
    if port == 0:
        raise invalid_params("delivery.url port must be 1 to 65535")
    if _numeric_name(url.raw_host):
        # 2130706433 or 127.1 is an address to some parsers and a name to others: say which.
        raise invalid_params("delivery.url host must be a DNS name or a plain IP address")
    return value


def _numeric_name(host: str) -> bool:
    """A host that is no IP literal but whose last label is a number (no DNS name ends so)."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return re.fullmatch(r"(0x[0-9a-f]*|[0-9]+)", host.rstrip(".").rsplit(".", 1)[-1], re.I) is not None
    return False


def check_secret(value: Any) -> bytes:
    """The key of ``delivery.secret``; InvalidParams (never quoting the value) if it is not a whsec_ secret."""
    if not isinstance(value, str):
        raise invalid_params("delivery.secret is required: whsec_ followed by base64 of 24 to 64 bytes")
    try:
        return signing.decode_secret(value)
    except signing.SecretError as exc:
        raise invalid_params(f"delivery.secret is not a Standard Webhooks secret: {exc}") from None


def check_delivery(delivery: Any) -> tuple[str, str, bytes]:
    """events/subscribe's ``delivery``: (url, secret, key) or the error the spec names."""
    if not isinstance(delivery, dict):
        raise invalid_params("delivery is required: {mode: 'webhook', url, secret}")
    mode = delivery.get("mode")
    if not isinstance(mode, str):
        raise invalid_params("delivery.mode is required")
    if mode != WEBHOOK:
        raise unsupported_mode(mode)
    url = check_url(delivery.get("url"))
    key = check_secret(delivery.get("secret"))
    return url, delivery["secret"], key


def retry_delay_s(settings: WebhookSettings, attempt: int, jitter: float) -> float:
    """The wait after failed attempt ``attempt`` (1-based); ``jitter`` in [0, 1)."""
    doubled = settings.retry_initial.total_seconds() * float(1 << min(attempt - 1, 62))
    base = min(doubled, settings.retry_max.total_seconds())
    return base * (1.0 + RETRY_JITTER * jitter)


def _header_safe(value: str) -> bool:
    return bool(value) and all("!" <= char <= "~" for char in value)


def control_id(kind: str) -> str:
    """webhook-id of a control envelope: ``msg_<type>_<random>``."""
    return f"msg_{kind}_{secrets.token_hex(8)}"


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def echoed_challenge(body: bytes) -> str | None:
    """The challenge an endpoint echoed, or None for anything else (its body is untrusted)."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return None
    challenge = document.get("challenge") if isinstance(document, dict) else None
    # Our nonces are ASCII; a lone surrogate or other non-ASCII echo cannot match (nor be encoded).
    return challenge if isinstance(challenge, str) and challenge.isascii() else None


@dataclass(slots=True)
class _Entry:
    seq: int
    cursor: str | None
    done: bool


class Watermark:
    """The safe cursor of one subscription, from the positions of deliveries in read order.

    ``add`` a delivery with the position just after it, ``mark`` a position reached
    with nothing new to deliver, ``done`` a delivery acknowledged or abandoned.
    ``value`` never passes a delivery that is not done; ``value_with(seq)`` is the
    cursor for delivery ``seq``'s own body, which may count ``seq`` as done because
    the receiver stores that event together with the cursor.
    """

    def __init__(self, base: str | None) -> None:
        self.value = base
        self._entries: deque[_Entry] = deque()
        self._open: dict[int, _Entry] = {}
        self._serial = itertools.count(1)

    def add(self, cursor: str | None) -> int:
        entry = _Entry(next(self._serial), cursor, False)
        self._entries.append(entry)
        self._open[entry.seq] = entry
        return entry.seq

    def mark(self, cursor: str | None) -> None:
        if self._entries:
            self._entries.append(_Entry(next(self._serial), cursor, True))
        else:
            self.value = cursor

    def done(self, seq: int) -> None:
        entry = self._open.pop(seq, None)
        if entry is None:
            return
        entry.done = True
        while self._entries and self._entries[0].done:
            self.value = self._entries.popleft().cursor

    def value_with(self, seq: int) -> str | None:
        value = self.value
        for entry in self._entries:
            if not (entry.done or entry.seq == seq):
                break
            value = entry.cursor
        return value

    def is_front(self, seq: int) -> bool:
        return bool(self._entries) and self._entries[0].seq == seq

    @property
    def pending(self) -> int:
        return len(self._open)


class HealthWindow:
    """Delivery attempts over a rolling window; says when the failure rate calls for suspension."""

    def __init__(self, window_s: float, min_attempts: int, failure_rate: float) -> None:
        self._window_s = window_s
        self._min_attempts = min_attempts
        self._failure_rate = failure_rate
        self._attempts: deque[tuple[float, bool]] = deque()
        self._failures = 0

    def record(self, ok: bool, at: float) -> bool:
        """Count one attempt; True if the window now says "suspend"."""
        self._attempts.append((at, ok))
        self._failures += not ok
        while self._attempts and self._attempts[0][0] < at - self._window_s:
            _, was_ok = self._attempts.popleft()
            self._failures -= not was_ok
        total = len(self._attempts)
        return total >= self._min_attempts and self._failures / total > self._failure_rate

    def clear(self) -> None:
        self._attempts.clear()
        self._failures = 0


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


# ---- one subscription ----------------------------------------------------------------------


class WebhookSubscription:
    """One webhook subscription and its delivery task. Built by ``Webhooks``; not for direct use."""

    def __init__(
        self,
        webhooks: Webhooks,
        event_type: EventType,
        *,
        subscription_id: str,
        principal: str,
        url: str,
        arguments: dict[str, Any],
        secret: str,
        expires_at: datetime | None,
        verified_at: datetime | None,
    ) -> None:
        self.webhooks = webhooks
        self.extension = webhooks.extension
        self.settings = webhooks.settings
        self.event_type = event_type
        self.id = subscription_id
        self.principal = principal
        self.url = url
        self.arguments = arguments
        self.secret = secret
        self.previous_secret: str | None = None
        self.previous_until: datetime | None = None
        self.expires_at = expires_at
        self.verified_at = verified_at
        self.lease = Lease(
            principal, event_type.name, dict(arguments), math.inf, subscription_id=subscription_id
        )
        self.watermark = Watermark(None)
        self.read_cursor: str | None = None
        self.active = True
        self.last_delivery_at: datetime | None = None
        self.last_error: str | None = None
        self.failed_since: datetime | None = None
        # Changed since last written to the store (the watermark is compared on its own).
        self.dirty = False
        self.saved_cursor: str | None = None
        self.scope = anyio.CancelScope()
        self._health = HealthWindow(
            self.settings.suspend_window.total_seconds(),
            self.settings.suspend_min_attempts,
            self.settings.suspend_failure_rate,
        )
        self._slots = anyio.Semaphore(self.settings.max_in_flight)
        self._wake = anyio.Event()
        self._resumed = anyio.Event()
        self._progress = anyio.Event()
        self._live_ctx = EventContext(
            event_name=event_type.name,
            principal=principal,
            mode=WEBHOOK,
            max_events=self.extension.default_max_events,
        )

    # ---- state -------------------------------------------------------------------------

    @property
    def replay(self) -> bool:
        return self.event_type.replay

    def wire(self, cursor: str | None) -> str | None:
        return cursor if self.replay else None

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def keys(self) -> list[bytes]:
        """The signing keys now: the current secret, and the replaced one during its grace window."""
        secrets_now = [self.secret]
        if self.previous_secret is not None and self.previous_until is not None:
            if self.extension.now() < self.previous_until:
                secrets_now.append(self.previous_secret)
            else:
                self.previous_secret = self.previous_until = None
        return [signing.decode_secret(secret) for secret in secrets_now]

    def delivery_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "active": self.active,
            "lastDeliveryAt": None if self.last_delivery_at is None else isoformat(self.last_delivery_at),
            "lastError": self.last_error,
        }
        if self.failed_since is not None:
            status["failedSince"] = isoformat(self.failed_since)
        return status

    def grant(self, *, truncated: bool) -> dict[str, Any]:
        return {
            "id": self.id,
            "refreshBefore": None if self.expires_at is None else isoformat(self.expires_at),
            "cursor": self.wire(self.watermark.value),
            "truncated": truncated,
        }

    def refresh(self, secret: str, expires_at: datetime | None, verified_at: datetime) -> dict[str, Any]:
        """The idempotent upsert of an existing subscription; returns the subscribe result."""
        status = self.delivery_status()
        if not hmac.compare_digest(secret.encode(), self.secret.encode()):
            self.previous_secret = self.secret
            self.previous_until = self.extension.now() + self.settings.rotation_grace
            self.secret = secret
            logger.info(
                "webhook subscription %s: secret replaced (both signed for the grace window)", self.id
            )
        self.expires_at = expires_at
        self.verified_at = verified_at
        self.reactivate()
        self.dirty = True
        return {**self.grant(truncated=False), "deliveryStatus": status}

    def reactivate(self) -> None:
        if not self.active:
            logger.info("webhook subscription %s: delivery resumed by a refresh", self.id)
            self.active = True
            self._health.clear()
            self._resumed.set()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self.scope.cancel()

    def record(self) -> StoredWebhook:
        return StoredWebhook(
            id=self.id,
            principal=self.principal,
            url=self.url,
            name=self.event_type.name,
            arguments=self.arguments,
            secret=self.secret,
            previous_secret=self.previous_secret,
            previous_until=self.previous_until,
            expires_at=self.expires_at,
            verified_at=self.verified_at,
            cursor=self.watermark.value if self.replay else None,
        )

    # ---- reading -----------------------------------------------------------------------

    async def read(self, ctx: EventContext, cursor: str | None) -> EventResult:
        try:
            return await self.extension.read(self.event_type, ctx, self.arguments, cursor, self.lease)
        except MCPError:
            raise
        except Exception as exc:  # a match/transform hook; read() already wraps check failures
            logger.exception("reading %s for webhook subscription %s failed", self.event_type.name, self.id)
            raise internal_error("UpstreamError", type(exc).__name__) from exc

    async def open(self, request: Any, cursor: str | None, max_age_ms: int | None) -> EventResult:
        """The opening read of a new subscription, from the client's cursor (bounded by maxAgeMs)."""
        requested = cursor if self.replay else None
        not_before = None
        if max_age_ms is not None and requested is not None:
            not_before = self.extension.now() - timedelta(milliseconds=max_age_ms)
        ctx = EventContext(
            event_name=self.event_type.name,
            principal=self.principal,
            mode=WEBHOOK,
            max_events=self.extension.default_max_events,
            max_age_ms=max_age_ms if self.replay else None,
            not_before=not_before,
            request=request,
        )
        first = await self.read(ctx, requested)
        self.watermark = Watermark(start_cursor(self.event_type, first, fallback=requested))
        self.read_cursor = requested
        return first

    def resume_from(self, cursor: str | None) -> None:
        """A subscription loaded from the store: delivery resumes at its stored watermark."""
        self.watermark = Watermark(cursor)
        self.read_cursor = cursor

    # ---- the delivery task -------------------------------------------------------------

    async def run(self, first: EventResult | None) -> None:
        """Read and deliver until stopped. ``first`` is the opening read; None reads from the watermark."""
        with self.scope:
            async with anyio.create_task_group() as deliveries:
                await self._loop(first, deliveries)

    async def _loop(self, first: EventResult | None, deliveries: anyio.abc.TaskGroup) -> None:
        batch, failures = first, 0
        # A subscribe response already said truncated; a subscription loaded from the store has no
        # response, so a skip at its first read is reported like any later one, as a gap.
        read_now = first is None
        while True:
            if read_now:
                if not self.extension.serves(self.event_type):
                    # The type was removed (events/list_changed): this subscription cannot go on.
                    self.webhooks.terminate_soon(self, not_found(self.event_type.name))
                    return
                self._wake = anyio.Event()
                try:
                    batch = await self.read(self._live_ctx, self.read_cursor)
                    failures = 0
                except MCPError as exc:
                    if exc.error.code in TERMINAL_CODES:
                        self.webhooks.terminate_soon(self, exc)
                        return
                    failures += 1
                    batch = None
                    logger.warning(
                        "webhook subscription %s: reading %s failed (%s); retrying",
                        self.id,
                        self.event_type.name,
                        exc.error.message,
                    )
                if batch is not None and batch.truncated and self.replay:
                    await self._gap(
                        start_cursor(self.event_type, batch, fallback=self.read_cursor), deliveries
                    )
            if batch is not None:
                await self._enqueue(batch, deliveries)
                delay = 0.0 if batch.has_more else idle_delay(self.extension, self.event_type, batch)
            else:
                delay = retry_delay(self.extension, self.event_type, failures)
            read_now = True
            await self._pause(delay)

    async def _enqueue(self, batch: EventResult, deliveries: anyio.abc.TaskGroup) -> None:
        events, last = batch.events, len(batch.events) - 1
        for index, event in enumerate(events):
            # An event without its own cursor gets a safe one: the batch's end for the last
            # event, else the position before the batch (persisting it replays, never skips).
            position = (
                event.cursor
                if event.cursor is not None
                else (batch.cursor if index == last else self.read_cursor)
            )
            seq = self.watermark.add(position)
            await self._slots.acquire()
            deliveries.start_soon(self._deliver_event, seq, event)
        self.watermark.mark(batch.cursor)
        self.read_cursor = batch.cursor

    async def _gap(self, fresh: str | None, deliveries: anyio.abc.TaskGroup) -> None:
        logger.warning("webhook subscription %s: events were skipped (gap); telling the endpoint", self.id)
        seq = self.watermark.add(fresh)
        await self._slots.acquire()
        deliveries.start_soon(self._deliver_gap, seq, fresh)

    async def _pause(self, delay: float | None) -> None:
        await self._until_active()
        if delay != 0.0:
            with anyio.move_on_after(math.inf if delay is None else delay):
                await self._wake.wait()
        await self._until_active()

    async def _until_active(self) -> None:
        while not self.active:
            await self._resumed.wait()

    # ---- one delivery ------------------------------------------------------------------

    async def _deliver_event(self, seq: int, event: Event) -> None:
        if not _header_safe(event.event_id):
            # It goes out as the webhook-id header, so it must be one.
            logger.warning("webhook subscription %s: an eventId is not header-safe; abandoned", self.id)
            self._slots.release()
            self._finished(seq)
            return
        wire = event.to_wire()

        def body() -> dict[str, Any]:
            # Recomputed per attempt: the watermark may have moved since the last one.
            return {**wire, "cursor": self.wire(self.watermark.value_with(seq))}

        await self._deliver(seq, event.event_id, body)

    async def _deliver_gap(self, seq: int, fresh: str | None) -> None:
        try:
            # Sent once everything read before the gap is done, so its cursor skips nothing unacknowledged.
            while True:
                progress = self._progress
                if self.watermark.is_front(seq):
                    break
                await progress.wait()
        except BaseException:
            self._slots.release()
            raise
        await self._deliver(seq, control_id("gap"), lambda: {"type": "gap", "cursor": self.wire(fresh)})

    async def _deliver(self, seq: int, msg_id: str, body: Callable[[], dict[str, Any]]) -> None:
        try:
            acknowledged = await self._attempts(msg_id, body)
        finally:
            self._slots.release()
        self._finished(seq)
        logger.debug(
            "webhook subscription %s: %s %s; watermark %s",
            self.id,
            msg_id,
            "acknowledged" if acknowledged else "abandoned",
            self.watermark.value,
        )

    def _finished(self, seq: int) -> None:
        self.watermark.done(seq)
        progress, self._progress = self._progress, anyio.Event()
        progress.set()

    async def _attempts(self, msg_id: str, body: Callable[[], dict[str, Any]]) -> bool:
        """Attempt until acknowledged (True) or given up on (False)."""
        settings = self.settings
        attempts, started = 0, anyio.current_time()
        while True:
            if not self.active:
                await self._until_active()
                attempts, started = 0, anyio.current_time()  # a refresh resumed us: a fresh budget
            try:
                payload = encode(body())
            except (TypeError, ValueError, RecursionError):  # RecursionError: data nested too deep
                logger.exception(
                    "webhook subscription %s: delivery %s is not JSON; abandoned", self.id, msg_id
                )
                return False
            if len(payload) > settings.max_body_bytes:
                logger.warning(
                    "webhook subscription %s: delivery %s is %d bytes (over %d); abandoned",
                    self.id,
                    msg_id,
                    len(payload),
                    settings.max_body_bytes,
                )
                return False
            try:
                outcome = await self.webhooks.post(self, msg_id, payload)
            except Exception:  # a bug, not the endpoint: drop this delivery, keep the subscription
                logger.exception("webhook subscription %s: delivery %s could not be sent", self.id, msg_id)
                return False
            attempts += 1
            self._note(outcome)
            if outcome.ok:
                return True
            if outcome.status in NON_RETRYABLE:
                logger.info(
                    "webhook subscription %s: delivery %s refused with %d; not retried",
                    self.id,
                    msg_id,
                    outcome.status,
                )
                return False
            delay = retry_delay_s(settings, attempts, random.random())
            elapsed = anyio.current_time() - started
            if attempts >= settings.max_attempts or elapsed + delay > settings.retry_window.total_seconds():
                logger.warning(
                    "webhook subscription %s: delivery %s abandoned after %d attempts (%s)",
                    self.id,
                    msg_id,
                    attempts,
                    outcome.category,
                )
                return False
            logger.info(
                "webhook subscription %s: delivery %s failed (%s); retry %d in %.2fs",
                self.id,
                msg_id,
                outcome.category,
                attempts,
                delay,
            )
            await anyio.sleep(delay)

    def _note(self, outcome: Outcome) -> None:
        """Fold one attempt into deliveryStatus and the suspension window (a 410 counts as neither)."""
        if outcome.status == GONE:
            return
        now = self.extension.now()
        if outcome.ok:
            self.last_delivery_at, self.last_error, self.failed_since = now, None, None
        else:
            self.last_error = outcome.category
            self.failed_since = self.failed_since or now
        if self._health.record(outcome.ok, anyio.current_time()) and self.active:
            logger.warning(
                "webhook subscription %s: suspended after sustained delivery failure (%s)",
                self.id,
                self.last_error,
            )
            self.active = False
            self._resumed = anyio.Event()


# ---- all subscriptions -----------------------------------------------------------------------


class Webhooks:
    """Every webhook subscription of one ``EventsExtension``, the sender, verification and the sweeper."""

    def __init__(self, extension: EventsExtension, settings: WebhookSettings) -> None:
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
