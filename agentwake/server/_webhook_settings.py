"""Webhook settings and the rules of an events/subscribe request.

``WebhookSettings`` holds every limit of webhook delivery with its named default.
The functions are pure: the subscription id derived from its key, the granted
TTL, the checks of ``delivery`` (url, secret, mode) and the retry backoff of one
delivery. Nothing here touches the network or the event loop.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import random
import re
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

from yarl import URL

from agentwake import signing
from agentwake.backoff import backoff_s
from agentwake.identity import ServerIdentity
from agentwake.server._errors import invalid_params, unsupported_mode
from agentwake.server._ssrf import IPNetwork, Resolve, parse_networks
from agentwake.server._types import canonical_json
from agentwake.server._webhook_store import WebhookStore

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
# How often expiry, no-expiry GC and the store flush run.
DEFAULT_SWEEP_INTERVAL: Final = timedelta(milliseconds=500)
MAX_URL_LENGTH: Final = 2048
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

    ``identity`` (agentwake.identity) signs every delivery and verification POST with
    the newest ed25519 key as well (a ``v1a,`` entry after the HMAC ``v1,`` ones), and
    ``EventsExtension.install`` serves its JWKS at ``/.well-known/mcp-webhook-jwks.json``.
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
    identity: ServerIdentity | None = None

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


def retry_delay_s(settings: WebhookSettings, attempt: int, *, rng: random.Random | None = None) -> float:
    """The wait after failed attempt ``attempt`` (1-based): ``retry_initial`` doubling up to
    ``retry_max``, plus up to ``retry_initial`` of jitter."""
    initial_s = settings.retry_initial.total_seconds()
    return backoff_s(
        attempt, initial_s=initial_s, max_s=settings.retry_max.total_seconds(), jitter_s=initial_s, rng=rng
    )
