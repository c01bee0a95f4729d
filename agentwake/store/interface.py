"""The store's interface: what every stage may ask of it, and what a backend must implement.

A ``typing.Protocol``, so a backend is any class with these coroutines (the SQLite
one, ``agentwake.store.sqlite.SqliteStore``, is checked against it by mypy). Callers
see records and opaque event handles (``InboxEvent.id``), never SQL, row ids of a
particular engine, or a connection. Every failure is a ``StoreError``.

Guarantees a backend keeps:

- ``ingest``/``ingest_deliveries`` store a batch and the cursor after it in one
  transaction; a duplicate (server, event name, eventId) is counted, never stored twice.
- ``claim`` hands an event to one caller only; ``finish_run`` completes a run and moves
  its event in one transaction (an event is done iff a run completed).
- ``flow_gate`` checks and marks flow control atomically, so it holds across workers.
- ``hold_subscriptions`` gives each subscription to one owner at a time (a lease with an
  expiry); a fenced ``ingest``, ``register`` or ``webhook_subscribed`` of a former owner writes
  nothing (``FencedOut``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from agentwake.store.browse import EventFilter, RunFilter
from agentwake.store.pauses import Pause, PauseScope
from agentwake.store.quotas import ClaimLimits
from agentwake.store.records import (
    Answerer,
    EventState,
    EventVerdict,
    FlowGate,
    FlowOutcome,
    HeldBatch,
    InboxEvent,
    IncomingEvent,
    IngestResult,
    RejectedEvent,
    ResumePoint,
    RetiredWebhook,
    RunKind,
    RunProgress,
    RunStatus,
    Settlement,
    SubscriptionKey,
    ToolCallRecord,
    ToolCallStatus,
    WebhookDelivery,
    WebhookRecord,
)
from agentwake.store.sessions import StoredSession


class Store(Protocol):
    """The async store every stage writes through. See the module docstring for its guarantees."""

    async def close(self) -> None: ...

    # ---- subscriptions and their cursors (delivery) ----------------------------------------

    async def register(self, key: SubscriptionKey, *, fence: int | None = None) -> str | None:
        """Record a configured subscription; its stored cursor, or None.

        A changed server, event or arguments means the cursor belongs to another
        subscription: it is dropped. With a ``fence`` (a delivery loop's), checked as ``ingest``
        checks it: a stale one writes nothing and raises ``FencedOut``. None: unfenced (one process
        per store, the service's start, the cli).
        """
        ...

    async def cursor(self, name: str) -> str | None: ...

    async def set_state(
        self, name: str, *, status: str, mode: str | None = None, error: str | None = None
    ) -> None: ...

    async def record_error(self, name: str, error: str) -> None:
        """The subscription's last error (stored redacted: a server's message may quote a secret)."""
        ...

    async def count_stream_error(self, name: str, error: str) -> None: ...

    # ---- the inbox (delivery) ------------------------------------------------------------------

    async def ingest(
        self,
        key: SubscriptionKey,
        events: Sequence[IncomingEvent],
        cursor: str | None,
        *,
        truncated: bool = False,
        cursor_before: str | None = None,
        rejected: Sequence[RejectedEvent] = (),
        fence: int | None = None,
        unless_moved: bool = False,
    ) -> IngestResult:
        """A batch and the cursor after it, in one transaction. A null cursor is never stored.

        ``unless_moved``: the cursor is written only if the stored one is still ``cursor_before``
        (a webhook subscribe's watermark must not overwrite a newer cursor a delivery stored while
        the subscribe was under way).

        ``rejected`` events are stored as their summaries in state 'rejected', counted, with a gap.
        With a ``fence`` (from ``hold_subscriptions``), the same transaction first checks it is the
        subscription's current one; if not, nothing is written and ``FencedOut`` is raised.
        None writes unfenced (one process per store, or webhook deliveries).
        """
        ...

    async def ingest_deliveries(self, deliveries: Sequence[WebhookDelivery]) -> list[IngestResult]:
        """Webhook bodies accepted together (group commit), one result each, in one transaction."""
        ...

    async def ingest_held(self, batches: Sequence[HeldBatch]) -> list[IngestResult | None]:
        """What delivery loops held back (batches with nothing new: no gap, no refused event), each
        written as ``ingest`` would, all in one transaction: one result each, None for a batch
        whose fence is not its subscription's (that one writes nothing; the others still do)."""
        ...

    # ---- who drives each subscription's delivery loop (ownership) ------------------------------

    async def hold_subscriptions(
        self, owner: str, names: Sequence[str], until: str, now: str
    ) -> dict[str, int]:
        """One round of leases, in one transaction: renew every lease ``owner`` still holds among
        ``names`` and take each of ``names`` that has no owner or whose lease lapsed
        (``lease_until < now``), all until ``until`` (ISO times). A take by another owner than the
        last raises the subscription's fence (the first is 1). Two owners racing never both hold one.
        Returns {name: fence} of the ``names`` this owner holds after the call.
        """
        ...

    async def release_subscriptions(self, owner: str, names: Sequence[str] | None = None) -> None:
        """A clean stop: ``owner`` gives up its leases (of ``names``; all with None), so another
        owner takes them at its next round. The fences are kept (the next take raises them)."""
        ...

    async def subscription_owners(self, *, processes: bool = False) -> list[dict[str, Any]]:
        """Each subscription's lease, for ``status``: subscription, owner, fence, lease_until. With
        ``processes``, the processes' own rows too (``@owner``: alive until lease_until; ``!owner
        server since``: cannot reach that server; ``?owner server``: not reached it yet), which
        ``agentwake.ownership`` shares the subscriptions by."""
        ...

    # ---- webhook subscriptions and their secrets (delivery) ------------------------------------

    async def webhook(self, name: str) -> WebhookRecord | None: ...

    async def webhooks(self) -> list[WebhookRecord]: ...

    async def prepare_webhook(self, key: SubscriptionKey, url: str, new_secret: str) -> WebhookRecord:
        """The stored webhook of this subscription, or a new one with ``new_secret``; one stored
        under another key is retired (to be unsubscribed) first."""
        ...

    async def webhook_subscribed(
        self,
        name: str,
        *,
        webhook_id: str,
        sent_secret: str,
        refresh_before: str | None,
        delivery_status: dict[str, Any] | None,
        previous_until: str,
        fence: int | None = None,
    ) -> WebhookRecord | None:
        """Record a successful subscribe or refresh; None if the subscription was retired meanwhile.
        With a ``fence`` (the webhook loop's), checked as ``ingest`` checks it: a stale one writes
        nothing and raises ``FencedOut``."""
        ...

    async def request_rotation(
        self, names: Sequence[str] | None, make_secret: Callable[[], str]
    ) -> list[str]:
        """A pending secret for each named webhook subscription (all, with None); their names."""
        ...

    async def retire_webhook(self, name: str, reason: str, *, unsubscribed: bool) -> WebhookRecord | None: ...

    async def to_unsubscribe(self, server: str | None = None) -> list[RetiredWebhook]: ...

    async def mark_unsubscribed(self, retired_id: int) -> None: ...

    async def retired_webhook_ids(self) -> set[str]: ...

    # ---- the work queue (worker and decision) --------------------------------------------------

    async def requeue_interrupted(self, max_attempts: int | None = None) -> int:
        """Events a stop left 'processing' go back to 'pending' (dead after ``max_attempts``); their
        runs are marked interrupted."""
        ...

    async def claim(
        self,
        limit: int,
        now: str | None = None,
        *,
        lease_until: str | None = None,
        exclude_servers: Sequence[str] = (),
        limits: ClaimLimits | None = None,
    ) -> list[InboxEvent]:
        """Up to ``limit`` due pending events (or abandoned ones: their lease lapsed), moved to
        'processing' with a lease until ``lease_until``; none of ``exclude_servers``. ``limits``
        (per-server caps, the agent's hourly runs and daily spend) count the events being handled
        by every process on the store, in the claim's transaction: two processes claiming at once
        never take more between them than the limits allow."""
        ...

    async def take_rule_slot(self, event_row: int, rule: str, limit: int, now: str) -> bool:
        """One of ``rule``'s ``limit`` run slots (``max_concurrent``) for this claimed event, counted
        over every process in one transaction: the events being handled ('processing', lease not
        lapsed at ``now``, or claimed without one) that hold one. False: all are taken. A slot is given back with
        ``give_rule_slot``, or lapses with its event's lease or when the event leaves 'processing'."""
        ...

    async def give_rule_slot(self, event_row: int) -> None:
        """The slot this event's run held (if any) is free again."""
        ...

    async def renew_leases(self, leases: Sequence[tuple[int, int]], until: str) -> list[int]:
        """Extend the leases (event row, attempts at the claim) still held; the rows whose lease was lost."""
        ...

    async def retry(self, event_row: int, *, resend_unknown: bool = False) -> int:
        """A failed or dead event goes back to pending with fresh attempts (refused while the last
        run has a tool call of unknown outcome, unless ``resend_unknown``); the calls to resend."""
        ...

    async def release(self, event_row: int, retry_at: str) -> None:
        """A claimed event goes back untouched (not an attempt), not to be claimed before ``retry_at``."""
        ...

    async def settle(self, settlements: Sequence[Settlement]) -> None:
        """Store decisions that end their events here (ignored, done, held), in one transaction."""
        ...

    async def record_decision(self, event_row: int, record: dict[str, Any]) -> None:
        """Store the decision of an event that goes on (to a run); its state is left alone."""
        ...

    async def flow_gate(
        self, event_row: int, rule: str, record: dict[str, Any], gate: FlowGate
    ) -> FlowOutcome:
        """Apply a rule's flow control to one event atomically: dedup, then debounce, then rate."""
        ...

    async def batch_members(self, leader_row: int) -> list[InboxEvent]: ...

    async def finish(self, ids: Iterable[int], state: EventState, error: str | None = None) -> None: ...

    async def event(self, event_row: int) -> InboxEvent:
        """One stored event, with its stored decision and approval, whatever its state."""
        ...

    async def answer(
        self,
        event_row: int,
        *,
        approve: bool,
        note: str | None,
        by: Answerer | None = None,
        tools: Sequence[str] | None = None,
    ) -> None:
        """A person's answer to a held event: approved goes back to pending, denied ends it.

        Recorded in the audit trail (``answers``) with ``by``, the time, the rule and ``tools``
        (the tools approving grants, as the answerer was shown them; default: the rule's).
        """
        ...

    # ---- the action log (agent) --------------------------------------------------------------------

    async def start_run(
        self,
        event_row: int,
        *,
        kind: RunKind,
        attempt: int,
        model: str,
        decision: dict[str, Any],
        system_prompt: str | None,
        user_prompt: str | None,
        sanitize_report: dict[str, Any] | None = None,
    ) -> int: ...

    async def record_progress(
        self, run_id: int, progress: RunProgress, calls: Sequence[ToolCallRecord]
    ) -> None: ...

    async def finish_run(
        self,
        run_id: int,
        *,
        status: RunStatus,
        reason: str | None,
        progress: RunProgress,
        duration_ms: int,
        verdict: EventVerdict | None,
    ) -> bool:
        """Close a run and, in the same transaction, move its event (exactly once: done iff completed).

        False when the run's lease had lapsed and its event was claimed again: nothing moved."""
        ...

    async def journal_tool_call(
        self, run_id: int, call: ToolCallRecord, idempotency_key: str, *, now: str | None = None
    ) -> int:
        """Write a tool call as 'sent' before it goes out; its journal row id.

        Fenced on the run's claim in the same transaction (``records.claim_lost``): an agent run whose
        event is no longer 'processing' under the claim that started it, or whose lease lapsed before
        ``now`` (the caller's clock; None: not judged), journals nothing and gets ``LeaseLost``."""
        ...

    async def settle_tool_call(
        self, call_row: int, *, status: ToolCallStatus, result: str | None, reply: str, duration_ms: int
    ) -> None:
        """What a journaled call returned, and the reply the model was given."""
        ...

    async def adopt_run(
        self, run_id: int, from_run: int, call_ids: Sequence[str], progress: RunProgress
    ) -> None:
        """A resumed run takes over ``from_run``'s transcript and the journal of ``call_ids``, each as the best
        row any agent run of the event has for it (settled: 'reused')."""
        ...

    async def resume_point(self, event_row: int) -> ResumePoint | None:
        """The event's newest agent run that got past a first LLM answer (where a rerun goes on from), with
        the journal of every agent run of the event by call id, settled calls first."""
        ...

    async def agent_usage(self, since_hour: str, since_day: str) -> tuple[int, float]:
        """Agent runs started since ``since_hour``; LLM spend in USD of runs started since ``since_day``."""
        ...

    # ---- the service's own record (service) ------------------------------------------------------

    async def service_started(self, *, pid: int, host: str, version: str | None, heartbeat_s: float) -> int:
        """Record a start of ``agentwake run`` (its first heartbeat is now); an id for the calls below."""
        ...

    async def service_heartbeat(self, service_id: int) -> None:
        """The service is alive now; it calls this every ``heartbeat_s``."""
        ...

    async def service_paused(self, reason: str | None) -> None:
        """Why the running service's agent waits (a cost or run limit); None when it no longer does."""
        ...

    async def service_stopped(self, service_id: int) -> None:
        """The service stopped cleanly."""
        ...

    # ---- the kill switch (pauses) ------------------------------------------------------------------------

    async def pause(
        self, scope: PauseScope, name: str, *, reason: str | None, by: str, cut_short: bool
    ) -> Pause:
        """Pause everything, a server, a subscription or a rule: no run starts for it, on any process
        sharing the store, until it is resumed (again: the reason, who and cut_short are replaced)."""
        ...

    async def resume(self, scope: PauseScope, name: str) -> Pause | None:
        """Lift a pause; the pause lifted, or None when that was not paused."""
        ...

    async def pauses(self) -> list[Pause]:
        """Everything paused, oldest first."""
        ...

    async def limit_use(
        self, since_hour: str, since_day: str, rate_since: Mapping[str, str]
    ) -> dict[str, Any]:
        """What counts against the limits now: runs since ``since_hour``, spend since ``since_day``,
        events being handled (in all, per server), rule slots taken, and each rate-limited rule's
        busiest key since its window start in ``rate_since`` (agentwake.store.limits)."""
        ...

    # ---- the operator page (agentwake.web) ------------------------------------------------------------

    async def event_page(
        self, filters: EventFilter, offset: int, limit: int
    ) -> tuple[list[dict[str, Any]], int]:
        """One page of events matching ``filters``, newest first, and how many match in all."""
        ...

    async def run_page(self, filters: RunFilter, offset: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        """One page of runs matching ``filters``, newest first, and how many match in all."""
        ...

    async def run_event(self, run_id: int) -> int | None:
        """The row of the event a run was for; None: no such run."""
        ...

    async def session_save(self, session: StoredSession, now: str) -> None:
        """Store a new operator session; those expired by ``now`` (ISO) are deleted."""
        ...

    async def session_get(self, id_hash: str) -> StoredSession | None: ...

    async def session_touch(self, id_hash: str, idle_until: str) -> None: ...

    async def session_end(self, id_hash: str) -> None: ...

    # ---- read-only views (CLI) ------------------------------------------------------------------------

    async def subscriptions(self) -> list[dict[str, Any]]:
        """Every stored subscription with its counters and webhook state (never a secret)."""
        ...

    async def run_counts(self) -> dict[str, dict[str, Any]]: ...

    async def inbox(self, limit: int, *, state: str | None = None) -> list[dict[str, Any]]: ...

    async def actions(self, limit: int) -> list[dict[str, Any]]: ...

    async def find_events(self, event_id: str, server: str | None = None) -> list[dict[str, Any]]:
        """Stored events with this eventId (one per server at most), with their runs and tool calls."""
        ...

    async def event_detail(self, event_row: int) -> dict[str, Any] | None:
        """One stored event as ``find_events`` shows it."""
        ...

    async def approvals(self) -> list[dict[str, Any]]: ...

    async def answers(self, limit: int = 50, event_row: int | None = None) -> list[dict[str, Any]]:
        """The approvals' audit trail, newest first: who answered what, from where, when, granting what."""
        ...

    async def gaps(self, subscription: str | None = None) -> list[dict[str, Any]]: ...

    async def event_ids(self, subscription: str | None = None) -> list[str]: ...

    async def state_counts(self) -> dict[str, int]: ...

    async def undecided(self, subscription: str, up_to: int) -> int:
        """How many of ``subscription``'s events wait for a decision (pending or being handled),
        counted no further than ``up_to``: the bound on what a subscription may hold undecided."""
        ...

    async def oldest_pending_at(self) -> str | None:
        """When the oldest event still pending was stored (ISO), or None."""
        ...

    async def services(self, limit: int = 5) -> list[dict[str, Any]]:
        """The most recent starts of the service, newest first: pid, host, version, started_at,
        heartbeat_at, heartbeat_s, stopped_at (None until a clean stop)."""
        ...


class StoreReader(Protocol):
    """The read-only views, synchronous: for quick readers (the CLI's ``status``, ``inbox``, ...)
    that should not start an event loop to read a few rows. The same views as ``Store``'s."""

    def close(self) -> None: ...

    def subscriptions(self) -> list[dict[str, Any]]: ...

    def run_counts(self) -> dict[str, dict[str, Any]]: ...

    def inbox(self, limit: int, *, state: str | None = None) -> list[dict[str, Any]]: ...

    def actions(self, limit: int) -> list[dict[str, Any]]: ...

    def find_events(self, event_id: str, server: str | None = None) -> list[dict[str, Any]]: ...

    def event_detail(self, event_row: int) -> dict[str, Any] | None: ...

    def approvals(self) -> list[dict[str, Any]]: ...

    def answers(self, limit: int = 50, event_row: int | None = None) -> list[dict[str, Any]]: ...

    def gaps(self, subscription: str | None = None) -> list[dict[str, Any]]: ...

    def event_ids(self, subscription: str | None = None) -> list[str]: ...

    def state_counts(self) -> dict[str, int]: ...

    def oldest_pending_at(self) -> str | None: ...

    def services(self, limit: int = 5) -> list[dict[str, Any]]: ...

    def subscription_owners(self) -> list[dict[str, Any]]: ...

    def pauses(self) -> list[Pause]: ...

    def storage(self) -> dict[str, Any]:
        """The store's size in bytes (``size_bytes``; SQLite: the file and its WAL) and its oldest kept
        event's receipt time (``oldest_event_at``), with the backend's details."""
        ...

    def limit_use(self, since_hour: str, since_day: str, rate_since: Mapping[str, str]) -> dict[str, Any]: ...
