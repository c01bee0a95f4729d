"""The values that cross the store's seam: what delivery brings in, what the worker claims, what a run records.

Plain frozen dataclasses and NamedTuples, with no SQL and no backend in them: every
store backend takes and returns exactly these.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple

EventState = Literal[
    "pending", "processing", "done", "failed", "ignored", "held", "denied", "batched", "rejected", "dead"
]
EVENT_STATES: Final[tuple[EventState, ...]] = (
    "pending",
    "processing",
    "done",
    "failed",
    "ignored",
    "held",
    "denied",
    "batched",
    "rejected",
    "dead",
)
RunKind = Literal["agent", "replay", "dry_run"]
RunStatus = Literal["running", "completed", "failed", "interrupted"]
# 'sent': written before the call went out and never settled, so its outcome is unknown; 'resend':
# a person allowed sending it again (agentwake retry --resend-unknown), with the same idempotency key;
# 'reused': made by an earlier run of the event, whose reply a resumed run gave the model again.
ToolCallStatus = Literal["ok", "error", "refused", "planned", "sent", "resend", "reused"]


def canonical_arguments(arguments: dict[str, Any]) -> str:
    """Subscription arguments as text that is equal for equal arguments (keys sorted, compact)."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"))


# ---- delivery -> inbox ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SubscriptionKey:
    """A configured subscription: its name, and the server-side key its cursor belongs to."""

    name: str
    server: str
    event: str
    arguments: dict[str, Any]

    @property
    def arguments_json(self) -> str:
        return canonical_arguments(self.arguments)


class IncomingEvent(NamedTuple):
    """An event as a delivery brought it. A NamedTuple: immutable, and one is built per delivery."""

    event_id: str
    name: str
    timestamp: str
    data: dict[str, Any]
    meta: dict[str, Any] | None = None
    # ``data`` as the store writes it (jsontext.encode_json), when admitting the event already
    # encoded it to measure it: the store then does not encode it a second time.
    data_json: str | None = None


class RejectedEvent(NamedTuple):
    """An event a server sent that agentwake refused (over a bound, malformed, another type's name).

    Stored in state 'rejected' with this bounded summary instead of what was sent, so it is
    visible (``inbox --state rejected``) and counted, and never reaches the decision stage.
    """

    event_id: str
    name: str
    timestamp: str
    reason: str
    preview: str


class WebhookDelivery(NamedTuple):
    """One accepted webhook body for the inbox: an event with its cursor, or a gap (cursor only).

    A NamedTuple rather than a frozen dataclass: the receiver builds one per request.
    """

    key: SubscriptionKey
    event: IncomingEvent | None
    cursor: str | None
    truncated: bool = False
    # A gap envelope's webhook-id: a retry of a recorded gap is a duplicate, and moves no cursor.
    control_id: str | None = None
    rejected: RejectedEvent | None = None


# Why a run found 'running' when its event is claimed again ended.
ABANDONED_RUN: Final = "its process stopped during the run (the event's lease lapsed)"


class HeldBatch(NamedTuple):
    """What a delivery loop held back (agentwake.delivery.common.DeferredWrites): batches that
    brought nothing new, so only their cursor and known events, written later with others'."""

    key: SubscriptionKey
    events: Sequence[IncomingEvent]
    cursor: str | None
    # The lease the loop drove the subscription under; None: unfenced.
    fence: int | None = None


@dataclass(frozen=True, slots=True)
class IngestResult:
    inserted: int
    duplicates: int


# One delivery's result, shared (frozen) rather than built per delivery.
INSERTED: Final = IngestResult(1, 0)
DUPLICATE: Final = IngestResult(0, 1)
NEITHER: Final = IngestResult(0, 0)


@dataclass(frozen=True, slots=True)
class WebhookRecord:
    """A stored webhook subscription. Secrets stay out of reprs (and so out of logs and tracebacks)."""

    subscription: str
    server: str
    event: str
    arguments: dict[str, Any]
    url: str
    secret: str = field(repr=False)
    pending_secret: str | None = field(default=None, repr=False)
    previous_secret: str | None = field(default=None, repr=False)
    previous_until: str | None = None
    webhook_id: str | None = None
    refresh_before: str | None = None
    no_expiry: bool = False
    delivery_status: dict[str, Any] | None = None
    refreshes: int = 0
    last_refresh_at: str | None = None

    def same_key(self, key: SubscriptionKey, url: str) -> bool:
        """Whether this row was subscribed under the same server-side key."""
        return (self.server, self.event, canonical_arguments(self.arguments), self.url) == (
            key.server,
            key.event,
            key.arguments_json,
            url,
        )


@dataclass(frozen=True, slots=True)
class RetiredWebhook:
    """A server-side webhook subscription still to be unsubscribed."""

    id: int
    subscription: str
    server: str
    event: str
    arguments: dict[str, Any]
    url: str
    webhook_id: str | None


# ---- inbox -> decision -> agent ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InboxEvent:
    """A stored event as the worker claims it. ``id`` is the store's handle for it (not the eventId)."""

    id: int
    server: str
    subscription: str
    name: str
    event_id: str
    timestamp: str
    data: dict[str, Any]
    attempts: int
    decision: dict[str, Any] | None = None
    approved: bool = False
    # The approving person's note: the run's prompt carries it as the operator's instruction.
    approval_note: str | None = None


@dataclass(frozen=True, slots=True)
class Answerer:
    """Who answered a held event, as the endpoint or the CLI authenticated them, and from where.

    ``who`` is a token's name (``operator``), an identity a token with the approve scope relayed
    (``slack:U0123ABCD``) or ``cli:<user>``; ``via`` is how it was let in; ``address`` the client's.
    """

    who: str
    via: str
    address: str | None = None


@dataclass(frozen=True, slots=True)
class FlowGate:
    """The flow-control checks one event faces, with window starts already computed (ISO times)."""

    now: str
    dedup_key: str | None = None
    dedup_since: str | None = None
    rate_key: str | None = None
    rate_since: str | None = None
    rate_max: int = 0
    batch_key: str | None = None
    batch_since: str | None = None
    batch_due: str | None = None
    batch_max: int = 50

    @property
    def empty(self) -> bool:
        return self.dedup_key is None and self.rate_key is None and self.batch_key is None


@dataclass(frozen=True, slots=True)
class FlowOutcome:
    """What the store found: run now; a duplicate or over the limit (only the check's mark is kept);
    or the event joined (``batched``) or opened (``leader``) a debounce batch, stored as such."""

    verdict: Literal["run", "duplicate", "over_limit", "batched", "leader"]
    other: int | None = None  # the earlier event (duplicate) or the batch's leader
    other_event_id: str | None = None
    oldest: str | None = None  # over_limit: when the oldest run in the window happened


@dataclass(frozen=True, slots=True)
class Settlement:
    """A decision that ends here for one claimed event: the record stored with it and its new state."""

    event_row: int
    record: dict[str, Any]
    state: EventState


# ---- the action log ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolCallRecord:
    step: int
    call_id: str
    tool: str
    server: str | None
    name: str | None
    arguments: Any
    status: ToolCallStatus
    result: str | None
    duration_ms: int | None


@dataclass(frozen=True, slots=True)
class RunProgress:
    """A run's transcript and counters so far; stored after every step."""

    messages: list[dict[str, Any]]
    steps: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None
    # Of prompt_tokens, those the provider read from its prompt cache (billed at its cached rate).
    cached_tokens: int = 0


# A run's summary (its final answer) as the action log and the service's log show it, at most.
SUMMARY_CHARS: Final = 200
_BLANKS: Final = re.compile(r"\s+")


def final_answer(messages: list[dict[str, Any]]) -> str | None:
    """The model's final answer in a run's transcript: the last message, if it is the assistant's
    text with no tool call (a run cut short has none)."""
    if not messages:
        return None
    last = messages[-1]
    if last.get("role") != "assistant" or last.get("tool_calls"):
        return None
    content = last.get("content")
    return content if isinstance(content, str) and content.strip() else None


def summary_line(text: str | None, limit: int = SUMMARY_CHARS) -> str | None:
    """A model's text as one printable line of at most ``limit`` characters: control, format
    (bidi, zero-width) and other invisible characters and every run of whitespace become one space."""
    if text is None:
        return None
    head = text[: 8 * limit]  # do not scan a long answer to show its start
    visible = "".join(" " if unicodedata.category(ch)[0] == "C" else ch for ch in head)
    line = _BLANKS.sub(" ", visible).strip()
    if len(line) > limit or len(text) > len(head):
        line = line[: limit - 1].rstrip() + "…"
    return line


@dataclass(frozen=True, slots=True)
class EventVerdict:
    """What a finished run does to its event: done, failed, or pending again after ``retry_at``."""

    state: EventState
    error: str | None = None
    retry_at: str | None = None
    # The attempt does not count (the service stopped during the run: not the event's fault).
    refund_attempt: bool = False


@dataclass(frozen=True, slots=True)
class JournaledCall:
    """A tool call as the journal has it: 'sent' (outcome unknown), 'resend', or settled with its reply."""

    call_id: str
    tool: str
    status: ToolCallStatus
    arguments: Any
    result: str | None
    reply: str | None
    idempotency_key: str | None


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """An unfinished agent run of an event: its transcript so far and the calls it journaled, by call id."""

    run_id: int
    messages: list[dict[str, Any]]
    steps: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None
    calls: dict[str, JournaledCall]
    cached_tokens: int = 0


# Journal states whose reply the model already got: a rerun gives it the same reply, sends nothing.
SETTLED_CALLS: Final = frozenset({"ok", "error", "reused"})


def journal_of_event(calls: Sequence[JournaledCall]) -> dict[str, JournaledCall]:
    """Every run's journal of one event (rows oldest first) as one, by call id: a settled row wins
    over one whose outcome is unknown, whatever their order, and among equals the newest wins.

    So a call settled by an earlier run (one whose lease lapsed after it sent the call, say) is
    reused by a rerun even when a later run copied it while it was still only 'sent'.
    """
    merged: dict[str, JournaledCall] = {}
    for call in calls:
        known = merged.get(call.call_id)
        if known is None or call.status in SETTLED_CALLS or known.status not in SETTLED_CALLS:
            merged[call.call_id] = call
    return merged


# What the journal's fence reads of a run and its event, in this order, on both backends.
CLAIM_HELD_SQL: Final = (
    "SELECT r.kind, r.attempt, e.state, e.attempts, e.lease_until, r.status FROM runs r"
    " JOIN events e ON e.id = r.event_row WHERE r.id = "
)


def claim_lost_row(row: Sequence[Any], now: str | None) -> str | None:
    """``claim_lost`` of a row read with ``CLAIM_HELD_SQL``."""
    kind, attempt, state, attempts, lease_until, run_status = row
    return claim_lost(
        kind=kind,
        attempt=attempt,
        state=state,
        attempts=attempts,
        lease_until=lease_until,
        now=now,
        run_status=run_status,
    )


def claim_lost(
    *,
    kind: str,
    state: str,
    attempts: int,
    lease_until: str | None,
    attempt: int,
    now: str | None,
    run_status: str = "running",
) -> str | None:
    """Why a run no longer holds its event (None while it does), as the journal's fence decides.

    A run holds its event while the claim that started it is the event's current one: the event is
    still 'processing' with the run's attempt as its count of claims (as ``finish_run`` and
    ``renew_leases`` decide), and, judged at ``now`` (the caller's clock, as claims are), the lease
    has not lapsed: from then on another process may claim the event at any moment. A claim made
    without a lease never lapses. Only agent runs hold their event; a replay holds nothing.

    The run itself must still be running: a claim of its event ends (interrupts) a run left running
    in the same transaction, so a newer claim fences it out even where the count of claims came back to
    the same number (a release or ``retry`` lowers it).
    """
    if kind != "agent":
        return None
    if state != "processing":
        return f"its event is {state} now"
    if attempts != attempt:
        return f"its event was claimed again (claim {attempts}; this run's is {attempt})"
    if run_status != "running":
        return f"this run was ended ({run_status}): its event was claimed again"
    if now is not None and lease_until is not None and lease_until < now:
        return f"its lease lapsed at {lease_until}"
    return None
