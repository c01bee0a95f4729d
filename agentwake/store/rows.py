"""What both store backends write and read back besides their SQL: the values a statement is given,
the records its rows become, the bookkeeping between the two, and the errors they raise.

Each backend keeps its own SQL (the dialects differ: placeholders, locking, arrays) and calls these,
so the SQLite and PostgreSQL stores store the same values and hand back the same records.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from agentwake.errors import StoreError
from agentwake.jsontext import encode_json
from agentwake.logs import event_fields
from agentwake.store.records import (
    DUPLICATE,
    INSERTED,
    NEITHER,
    EventVerdict,
    InboxEvent,
    IncomingEvent,
    IngestResult,
    JournaledCall,
    RejectedEvent,
    ResumePoint,
    RetiredWebhook,
    RunProgress,
    Settlement,
    SubscriptionKey,
    ToolCallRecord,
    WebhookDelivery,
    WebhookRecord,
    canonical_arguments,
    journal_of_event,
)

# ---- subscriptions ---------------------------------------------------------------------------------

# Errors kept per subscription for `status`: a transient one cleared by the next success stays visible.
RECENT_ERRORS: Final = 5


def with_recent_error(stored: str | None, error: str, at: str) -> str:
    """A subscription's stored recent errors (JSON) with ``error`` appended; the oldest go."""
    recent = json.loads(stored) if stored else []
    if recent and recent[-1]["error"] == error:
        # The same failure again (a reconnect loop): one entry, its time and count updated.
        recent[-1] = {**recent[-1], "at": at, "count": recent[-1].get("count", 1) + 1}
    else:
        recent.append({"at": at, "error": error})
    return json.dumps(recent[-RECENT_ERRORS:])


def warn_cursor_dropped(logger: logging.Logger, key: SubscriptionKey) -> None:
    """Say (on the backend's logger) that a subscription's stored cursor goes: its key changed."""
    logger.warning(
        "subscription %s changed (server, event or arguments): its stored cursor is dropped",
        key.name,
        extra=event_fields(subscription=key.name, server=key.server),
        stacklevel=2,  # the record names the backend's line, as when each logged it itself
    )


# ---- the inbox -------------------------------------------------------------------------------------


def event_values(key: SubscriptionKey, event: IncomingEvent) -> tuple[Any, ...]:
    """An incoming event's columns: server, subscription, name, event_id, timestamp, data, meta."""
    return (
        key.server,
        key.name,
        event.name,
        event.event_id,
        event.timestamp,
        event.data_json if event.data_json is not None else encode_json(event.data),
        encode_json(event.meta) if event.meta else None,
    )


def rejected_data(rejected: RejectedEvent) -> str:
    """What a refused event stores as its data: why, and a preview."""
    return encode_json({"rejected": rejected.reason, "preview": rejected.preview})


@dataclass(slots=True)
class DeliveryTally:
    """One subscription's share of a group commit of webhook deliveries (``ingest_deliveries``)."""

    key: SubscriptionKey
    inserted: int = 0
    duplicates: int = 0
    cursor: str | None = None
    cursor_known: bool = False
    last_cursor: str | None = None
    gaps: list[tuple[str | None, str | None, str | None]] = field(default_factory=list)
    rejected: list[RejectedEvent] = field(default_factory=list)

    def has_gap(self, delivery_id: str) -> bool:
        """Whether this batch recorded that gap envelope already."""
        return any(gap[2] == delivery_id for gap in self.gaps)

    def wants_stored_cursor(self, delivery: WebhookDelivery) -> bool:
        """Whether ``add`` needs the subscription's stored cursor first (``know_cursor``): the
        delivery makes a gap, which starts where the subscription's cursor stands."""
        return (delivery.truncated or delivery.rejected is not None) and not self.cursor_known

    def know_cursor(self, stored: str | None) -> None:
        self.cursor, self.cursor_known = stored, True

    def add(self, delivery: WebhookDelivery, result: IngestResult) -> None:
        """Count one delivery: its refused event, its gap, the cursor after it, its event."""
        if delivery.rejected is not None:
            self.rejected.append(delivery.rejected)
        if delivery.truncated or delivery.rejected is not None:
            self.gaps.append((self.cursor, delivery.cursor, delivery.control_id))
        if delivery.cursor is not None:
            self.cursor, self.cursor_known, self.last_cursor = delivery.cursor, True, delivery.cursor
        self.inserted += result.inserted
        self.duplicates += result.duplicates

    def gap_rows(self, now: str) -> list[tuple[Any, ...]]:
        """The gaps' rows: subscription, server, event, detected_at, cursor_before, cursor_after, delivery_id."""
        key = self.key
        return [
            (key.name, key.server, key.event, now, before, after, delivery_id)
            for before, after, delivery_id in self.gaps
        ]


def first_sight(delivery: WebhookDelivery, seen: set[tuple[str, str, str]]) -> IngestResult:
    """Whether a delivery's event is new (then added to ``seen``), a duplicate, or absent."""
    event = delivery.event
    if event is None:
        return NEITHER
    ident = (delivery.key.server, event.name, event.event_id)
    if ident in seen:
        return DUPLICATE
    seen.add(ident)
    return INSERTED


# ---- webhook subscriptions ---------------------------------------------------------------------------

WEBHOOK_COLUMNS: Final = (
    "subscription, server, event, arguments, url, secret, pending_secret, previous_secret, previous_until,"
    " webhook_id, refresh_before, no_expiry, delivery_status, refreshes, last_refresh_at"
)


def webhook_record(row: Sequence[Any]) -> WebhookRecord:
    """One row of WEBHOOK_COLUMNS."""
    return WebhookRecord(
        row[0],
        row[1],
        row[2],
        json.loads(row[3]),
        row[4],
        row[5],
        row[6],
        row[7],
        row[8],
        row[9],
        row[10],
        bool(row[11]),
        json.loads(row[12]) if row[12] else None,
        row[13],
        row[14],
    )


def subscribed_params(
    name: str,
    webhook_id: str,
    sent_secret: str,
    refresh_before: str | None,
    delivery_status: dict[str, Any] | None,
    previous_until: str,
    now: str,
) -> dict[str, Any]:
    """The named parameters of a backend's ``webhook_subscribed`` update (its arguments, in order)."""
    return {
        "sent": sent_secret,
        "until": previous_until,
        "id": webhook_id,
        "refresh": refresh_before,
        "no_expiry": refresh_before is None,
        "status": encode_json(delivery_status) if delivery_status is not None else None,
        "now": now,
        "name": name,
    }


def retired_values(record: WebhookRecord, reason: str, now: str, *, unsubscribed: bool) -> list[Any]:
    """A retired webhook's row: subscription, server, event, arguments, url, webhook_id, reason,
    retired_at, unsubscribed_at."""
    return [
        record.subscription,
        record.server,
        record.event,
        canonical_arguments(record.arguments),
        record.url,
        record.webhook_id,
        reason,
        now,
        now if unsubscribed else None,
    ]


def retired_webhook(r: Sequence[Any]) -> RetiredWebhook:
    """A row of id, subscription, server, event, arguments, url, webhook_id."""
    return RetiredWebhook(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6])


# ---- the work queue ----------------------------------------------------------------------------------


def no_event(event_row: int) -> StoreError:
    return StoreError(f"no stored event with row id {event_row}")


def check_held(state: str) -> None:
    """Only a held event is answered."""
    if state != "held":
        raise StoreError(f"the event is {state!r}, not held for approval")


def check_retryable(state: str) -> None:
    """Only a failed or dead event is retried."""
    if state not in ("failed", "dead"):
        raise StoreError(f"the event is {state!r}; only failed or dead events are retried")


def check_no_unknown_calls(unknown: Sequence[Sequence[Any]], *, resend_unknown: bool) -> None:
    """A retry is refused while the last run's calls (id, tool, idempotency key) have no known
    outcome, unless they are to be resent."""
    if unknown and not resend_unknown:
        calls = ", ".join(f"{tool} (idempotency key {key})" for _, tool, key in unknown)
        raise StoreError(
            f"the last run sent {len(unknown)} tool call(s) whose outcome is unknown: {calls}; check on"
            " the server whether they happened, then retry with --resend-unknown to send them again"
            " with the same idempotency key"
        )


def injection_score(record: dict[str, Any]) -> float | None:
    """The sanitizer's score a decision record carries, if any."""
    score = record.get("injection_score")
    return float(score) if isinstance(score, int | float) and not isinstance(score, bool) else None


def settle_values(settlement: Settlement, now: str) -> tuple[Any, ...]:
    """A settle update's values: decision, state, state_changed_at, injection score, state, event row."""
    record = settlement.record
    return (
        encode_json(record),
        settlement.state,
        now,
        injection_score(record),
        settlement.state,
        settlement.event_row,
    )


def answered_state(approve: bool, note: str | None, now: str) -> list[Any]:
    """An answered event's state, approved_at, approval_note and state_changed_at."""
    return ["pending" if approve else "denied", now if approve else None, note, now]


def served_in_order(rows: Sequence[Sequence[Any]], chosen: Sequence[int]) -> list[str]:
    """The subscriptions of claimed rows (id, _, subscription, ...), once each, in the order served."""
    order = {event_row: position for position, event_row in enumerate(chosen)}
    return list(dict.fromkeys(row[2] for row in sorted(rows, key=lambda row: order[row[0]])))


def batch_member(r: Sequence[Any]) -> InboxEvent:
    """A row of id, server, subscription, name, event_id, timestamp, data, attempts."""
    return InboxEvent(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]), r[7])


# ---- the action log ----------------------------------------------------------------------------------

LEASE_LOST: Final = "its lease lapsed and the event was claimed again; this run's outcome is not applied"


def progress_values(progress: RunProgress) -> list[Any]:
    """A run's progress: messages, steps, prompt_tokens, completion_tokens, cost_usd, cached_tokens."""
    return [
        encode_json(progress.messages),
        progress.steps,
        progress.prompt_tokens,
        progress.completion_tokens,
        progress.cost_usd,
        progress.cached_tokens,
    ]


def tool_call_values(run_id: int, c: ToolCallRecord, now: str) -> tuple[Any, ...]:
    """A finished tool call's row: run_id, step, call_id, tool, server, name, arguments, status, result,
    duration_ms, at."""
    return (
        run_id,
        c.step,
        c.call_id,
        c.tool,
        c.server,
        c.name,
        encode_json(c.arguments),
        c.status,
        c.result,
        c.duration_ms,
        now,
    )


def journal_values(run_id: int, call: ToolCallRecord, idempotency_key: str, now: str) -> list[Any]:
    """A journaled call's row: run_id, step, call_id, tool, server, name, arguments, idempotency_key, at."""
    return [
        run_id,
        call.step,
        call.call_id,
        call.tool,
        call.server,
        call.name,
        encode_json(call.arguments),
        idempotency_key,
        now,
    ]


def verdict_values(verdict: EventVerdict, now: str) -> list[Any]:
    """A finished run's event: state, last_error, available_at, state_changed_at, attempts refunded."""
    return [verdict.state, verdict.error, verdict.retry_at, now, int(verdict.refund_attempt)]


def answered_run(rows: Sequence[Sequence[Any]]) -> tuple[Sequence[Any], list[Any]] | None:
    """Of an event's agent runs (id, messages, ...), newest first: the first that got an LLM answer,
    with its transcript."""
    for row in rows:
        messages = json.loads(row[1])
        if any(m.get("role") == "assistant" for m in messages):
            return row, messages
    return None


def resume_point_of(run: Sequence[Any], messages: list[Any], journal: Sequence[Sequence[Any]]) -> ResumePoint:
    """Where a rerun goes on from: ``answered_run``'s run (id, messages, steps, prompt_tokens,
    completion_tokens, cost_usd, cached_tokens) and the event's journal (call_id, tool, status,
    arguments, result, reply, idempotency_key)."""
    calls = journal_of_event(
        [
            JournaledCall(r[0], r[1], r[2], json.loads(r[3]) if r[3] else None, r[4], r[5], r[6])
            for r in journal
        ]
    )
    return ResumePoint(run[0], messages, run[2], run[3], run[4], run[5], calls, run[6])
