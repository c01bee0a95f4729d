"""One webhook subscription's delivery worker and the watermark that makes its cursors safe.

``WebhookSubscription`` is one subscription and its task: it reads with
``EventsExtension.read`` (a check-function type every nextPollMs or on ``wake``;
an emit-only type on ``emit``) and POSTs every event with up to ``max_in_flight``
deliveries in flight, each retried on its own with backoff and jitter until
``max_attempts`` or ``retry_window`` (410 and 413 are never retried). The
``cursor`` in each body comes from its ``Watermark``: every event at or before it
was acknowledged (2xx) or refused with 410, or was abandoned and that skip
reported: a delivery given up on (retries spent, over ``max_body_bytes``, 413)
holds the watermark until a ``gap`` envelope about it is acknowledged or the
next refresh answers ``truncated: true``, so no cursor the client persists
passes an event it neither received nor was told it missed. ``HealthWindow``
decides when sustained failure suspends delivery until the next refresh.

The subscription sees the registry that owns it (``Webhooks``) only through the
``SubscriptionOwner`` protocol, so this module does not import ``_webhook``.
"""

from __future__ import annotations

import hmac
import itertools
import json
import logging
import math
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Protocol

import anyio
import anyio.abc
from mcp.shared.exceptions import MCPError

from agentwake import signing
from agentwake.server._errors import internal_error, not_found
from agentwake.server._leases import Lease
from agentwake.server._shared import (
    TERMINAL_CODES,
    EventSource,
    EventType,
    idle_delay,
    retry_delay,
    start_cursor,
)
from agentwake.server._types import Event, EventContext, EventResult, isoformat
from agentwake.server._webhook_http import Outcome
from agentwake.server._webhook_settings import WEBHOOK, WebhookSettings, retry_delay_s
from agentwake.server._webhook_store import StoredWebhook

logger = logging.getLogger(__name__)

# Statuses that end one delivery at once, without retrying (the spec: 410 Gone, 413 Too Large).
NON_RETRYABLE: Final = frozenset({410, 413})
GONE: Final = 410

# How one delivery ended: acknowledged (2xx), refused by the endpoint on purpose (410: it does not
# want it, so nothing was missed), or abandoned (the endpoint never took it: a skip to report).
ACKNOWLEDGED: Final = "acknowledged"
REFUSED: Final = "refused"
ABANDONED: Final = "abandoned"
# A gap envelope no longer needed: a refresh reported its skips meanwhile (truncated: true).
SUPERSEDED: Final = "superseded"


def _header_safe(value: str) -> bool:
    return bool(value) and all("!" <= char <= "~" for char in value)


def control_id(kind: str) -> str:
    """webhook-id of a control envelope: ``msg_<type>_<random>``."""
    return f"msg_{kind}_{secrets.token_hex(8)}"


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


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

    def value_with(self, *seqs: int) -> str | None:
        """The value if deliveries ``seqs`` were done too."""
        value = self.value
        for entry in self._entries:
            if not (entry.done or entry.seq in seqs):
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


class SubscriptionOwner(Protocol):
    """What a subscription needs of the registry that owns it (``Webhooks``)."""

    @property
    def extension(self) -> EventSource: ...

    @property
    def settings(self) -> WebhookSettings: ...

    def terminate_soon(self, sub: WebhookSubscription, error: MCPError) -> None: ...

    async def post(self, sub: WebhookSubscription, msg_id: str, payload: bytes) -> Outcome: ...


class WebhookSubscription:
    """One webhook subscription and its delivery task. Built by ``Webhooks``; not for direct use."""

    def __init__(
        self,
        webhooks: SubscriptionOwner,
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
        # Deliveries abandoned and not yet reported (a gap envelope acknowledged, or a refresh's
        # truncated: true); the watermark does not pass them until then.
        self._unreported: list[int] = []
        self._reporting = False
        self._deliveries: anyio.abc.TaskGroup | None = None
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
        # Deliveries abandoned since the client last heard of a skip: this response reports them
        # (the spec's webhook gap: the refresh answers truncated: true with the fresh cursor).
        truncated = self.report_skips()
        return {**self.grant(truncated=truncated and self.replay), "deliveryStatus": status}

    def report_skips(self) -> bool:
        """Count the unreported abandoned deliveries as reported (the watermark may pass them now);
        True if there were any."""
        reported, self._unreported = self._unreported, []
        for seq in reported:
            self._finished(seq)
        if reported:
            logger.info(
                "webhook subscription %s: %d abandoned deliveries reported as a gap by a refresh",
                self.id,
                len(reported),
            )
        return bool(reported)

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
                self._deliveries = deliveries
                try:
                    await self._loop(first, deliveries)
                finally:
                    self._deliveries = None

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
            self._abandoned(seq)
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
            outcome = await self._attempts(msg_id, body)
        finally:
            self._slots.release()
        if outcome == ABANDONED:
            self._abandoned(seq)
        else:
            self._finished(seq)
        logger.debug(
            "webhook subscription %s: %s %s; watermark %s",
            self.id,
            msg_id,
            "acknowledged" if outcome == ACKNOWLEDGED else "abandoned",
            self.watermark.value,
        )

    def _abandoned(self, seq: int) -> None:
        """A delivery the endpoint never took: held in the watermark until reported as a gap."""
        if not self.replay:
            # No cursor to hold back, and the spec has no gap for such a type (truncated SHOULD be false).
            self._finished(seq)
            return
        self._unreported.append(seq)
        if self._reporting or self._deliveries is None:
            return
        self._reporting = True
        self._deliveries.start_soon(self._report_gap)

    async def _report_gap(self) -> None:
        """POST one gap envelope for the deliveries abandoned so far; once acknowledged, the watermark
        passes them. Given up on too, they wait for the next abandonment or refresh to report them."""
        try:
            while self._unreported:
                covered = list(self._unreported)

                def body(covered: list[int] = covered) -> dict[str, Any]:
                    # The position after everything covered: safe, it only passes what this reports.
                    return {"type": "gap", "cursor": self.wire(self.watermark.value_with(*covered))}

                logger.warning(
                    "webhook subscription %s: %d deliveries abandoned; telling the endpoint (gap)",
                    self.id,
                    len(covered),
                )
                msg_id = control_id("gap")

                def still_unreported(covered: list[int] = covered) -> bool:
                    return any(seq in self._unreported for seq in covered)

                # Between attempts a refresh may report these skips itself: then the envelope is not
                # sent again (the endpoint would record one skip as two gaps).
                outcome = await self._attempts(msg_id, body, wanted=still_unreported)
                if outcome == SUPERSEDED:
                    logger.debug(
                        "webhook subscription %s: %s superseded by a refresh; watermark %s",
                        self.id,
                        msg_id,
                        self.watermark.value,
                    )
                    continue
                if outcome == ACKNOWLEDGED:
                    self._unreported = [seq for seq in self._unreported if seq not in covered]
                    for seq in covered:
                        self._finished(seq)
                logger.debug(
                    "webhook subscription %s: %s %s; watermark %s",
                    self.id,
                    msg_id,
                    "acknowledged" if outcome == ACKNOWLEDGED else "abandoned",
                    self.watermark.value,
                )
                if outcome != ACKNOWLEDGED:
                    return
        finally:
            self._reporting = False

    def _finished(self, seq: int) -> None:
        self.watermark.done(seq)
        progress, self._progress = self._progress, anyio.Event()
        progress.set()

    async def _attempts(
        self, msg_id: str, body: Callable[[], dict[str, Any]], *, wanted: Callable[[], bool] | None = None
    ) -> str:
        """Attempt until ACKNOWLEDGED, REFUSED (410) or ABANDONED; SUPERSEDED once ``wanted`` says no
        (it is asked before each attempt)."""
        settings = self.settings
        attempts, started = 0, anyio.current_time()
        while True:
            if wanted is not None and not wanted():
                return SUPERSEDED
            if not self.active:
                await self._until_active()
                attempts, started = 0, anyio.current_time()  # a refresh resumed us: a fresh budget
            try:
                payload = encode(body())
            except (TypeError, ValueError, RecursionError):  # RecursionError: data nested too deep
                logger.exception(
                    "webhook subscription %s: delivery %s is not JSON; abandoned", self.id, msg_id
                )
                return ABANDONED
            if len(payload) > settings.max_body_bytes:
                logger.warning(
                    "webhook subscription %s: delivery %s is %d bytes (over %d); abandoned",
                    self.id,
                    msg_id,
                    len(payload),
                    settings.max_body_bytes,
                )
                return ABANDONED
            try:
                outcome = await self.webhooks.post(self, msg_id, payload)
            except Exception:  # a bug, not the endpoint: drop this delivery, keep the subscription
                logger.exception("webhook subscription %s: delivery %s could not be sent", self.id, msg_id)
                return ABANDONED
            attempts += 1
            self._note(outcome)
            asked_s = outcome.retry_after_s
            if outcome.ok:
                return ACKNOWLEDGED
            if outcome.status in NON_RETRYABLE:
                logger.info(
                    "webhook subscription %s: delivery %s refused with %d; not retried",
                    self.id,
                    msg_id,
                    outcome.status,
                )
                return REFUSED if outcome.status == GONE else ABANDONED
            delay = retry_delay_s(settings, attempts)
            if asked_s is not None:
                # The endpoint is alive and said when (e.g. its agent is catching up): wait as asked, up
                # to retry_max, without spending an attempt; the retry window still bounds it.
                delay = max(delay, min(asked_s, settings.retry_max.total_seconds()))
                attempts -= 1
            elapsed = anyio.current_time() - started
            if attempts >= settings.max_attempts or elapsed + delay > settings.retry_window.total_seconds():
                logger.warning(
                    "webhook subscription %s: delivery %s abandoned after %d attempts (%s)",
                    self.id,
                    msg_id,
                    attempts,
                    outcome.category,
                )
                return ABANDONED
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
