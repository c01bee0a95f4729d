"""The SQLite store: subscriptions with their cursors, the event inbox, gaps.

This is the only module that writes SQL. sqlite-utils is synchronous, so every
public coroutine runs its work in one worker thread at a time (one writer);
the event loop never blocks on disk. A batch of events and the cursor that
follows it are written in one transaction, so a crash either keeps both or
neither, and the upstream replays what was not kept.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sqlite3
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Final, Literal, NamedTuple, ParamSpec, TypeVar

import anyio
import sqlite_utils
from pydantic_core import PydanticSerializationError, to_json
from sqlite_utils.migrations import Migrations

from agentwake.errors import StoreError
from agentwake.sanitize import redact

logger = logging.getLogger(__name__)

BUSY_TIMEOUT_MS: Final = 10_000
EventState = Literal["pending", "processing", "done", "failed", "ignored", "held", "denied", "batched"]
EVENT_STATES: Final[tuple[EventState, ...]] = (
    "pending",
    "processing",
    "done",
    "failed",
    "ignored",
    "held",
    "denied",
    "batched",
)

P = ParamSpec("P")
T = TypeVar("T")

migrations = Migrations("agentwake")

INSERT_EVENT_SQL: Final = (
    "INSERT OR IGNORE INTO events (server, subscription, name, event_id, timestamp, data, meta,"
    " received_at, state_changed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


@migrations(name="0001_initial")
def _initial(db: sqlite_utils.Database) -> None:
    db.execute(
        """
        CREATE TABLE subscriptions (
            name TEXT PRIMARY KEY,
            server TEXT NOT NULL,
            event TEXT NOT NULL,
            arguments TEXT NOT NULL,
            mode TEXT,
            cursor TEXT,
            cursor_updated_at TEXT,
            last_poll_at TEXT,
            events_received INTEGER NOT NULL DEFAULT 0,
            duplicates INTEGER NOT NULL DEFAULT 0,
            gaps INTEGER NOT NULL DEFAULT 0,
            status TEXT NOT NULL DEFAULT 'new',
            last_error TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )
        """
    )
    db.execute(
        """
        CREATE TABLE events (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            server TEXT NOT NULL,
            subscription TEXT NOT NULL,
            name TEXT NOT NULL,
            event_id TEXT NOT NULL,
            timestamp TEXT NOT NULL,
            data TEXT NOT NULL,
            meta TEXT,
            received_at TEXT NOT NULL,
            state TEXT NOT NULL DEFAULT 'pending',
            attempts INTEGER NOT NULL DEFAULT 0,
            priority INTEGER NOT NULL DEFAULT 0,
            state_changed_at TEXT NOT NULL,
            last_error TEXT
        )
        """
    )
    db.execute("CREATE UNIQUE INDEX events_dedup ON events (server, name, event_id)")
    db.execute("CREATE INDEX events_pending ON events (state, priority, id)")
    db.execute(
        """
        CREATE TABLE gaps (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            subscription TEXT NOT NULL,
            server TEXT NOT NULL,
            event TEXT NOT NULL,
            detected_at TEXT NOT NULL,
            cursor_before TEXT,
            cursor_after TEXT
        )
        """
    )


@migrations(name="0002_agent_runs")
def _agent_runs(db: sqlite_utils.Database) -> None:
    # A pending event is not claimed again before available_at (backoff between attempts).
    db.execute("ALTER TABLE events ADD COLUMN available_at TEXT")
    db.execute(
        """
        CREATE TABLE runs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            event_row INTEGER NOT NULL REFERENCES events(id),
            kind TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            model TEXT NOT NULL,
            status TEXT NOT NULL,
            reason TEXT,
            decision TEXT NOT NULL,
            system_prompt TEXT,
            user_prompt TEXT,
            messages TEXT NOT NULL DEFAULT '[]',
            steps INTEGER NOT NULL DEFAULT 0,
            prompt_tokens INTEGER NOT NULL DEFAULT 0,
            completion_tokens INTEGER NOT NULL DEFAULT 0,
            cost_usd REAL,
            started_at TEXT NOT NULL,
            finished_at TEXT,
            duration_ms INTEGER
        )
        """
    )
    db.execute("CREATE INDEX runs_event ON runs (event_row, id)")
    db.execute("CREATE INDEX runs_status ON runs (status)")
    db.execute(
        """
        CREATE TABLE tool_calls (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id INTEGER NOT NULL REFERENCES runs(id),
            step INTEGER NOT NULL,
            call_id TEXT NOT NULL,
            tool TEXT NOT NULL,
            server TEXT,
            name TEXT,
            arguments TEXT,
            status TEXT NOT NULL,
            result TEXT,
            duration_ms INTEGER,
            at TEXT NOT NULL
        )
        """
    )
    db.execute("CREATE INDEX tool_calls_run ON tool_calls (run_id, id)")


@migrations(name="0003_sanitize_and_policy")
def _sanitize_and_policy(db: sqlite_utils.Database) -> None:
    # What sanitizing the payload found (cuts, redactions, injection signals); the score is a policy input.
    db.execute("ALTER TABLE events ADD COLUMN injection_score REAL")
    db.execute("ALTER TABLE events ADD COLUMN sanitize_report TEXT")
    # The policy decision (rule, why) and, for held events, the person's answer.
    db.execute("ALTER TABLE events ADD COLUMN decision TEXT")
    db.execute("ALTER TABLE events ADD COLUMN approved_at TEXT")
    db.execute("ALTER TABLE events ADD COLUMN approval_note TEXT")


@migrations(name="0004_flow_control")
def _flow_control(db: sqlite_utils.Database) -> None:
    # Marks of policy flow control (dedup, rate, batch) per rule and key, with the time they were made:
    # the windows survive restarts because they are rows, not memory.
    db.execute(
        """
        CREATE TABLE flow_marks (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            rule TEXT NOT NULL,
            kind TEXT NOT NULL,
            key TEXT NOT NULL,
            event_row INTEGER NOT NULL REFERENCES events(id),
            at TEXT NOT NULL
        )
        """
    )
    db.execute("CREATE INDEX flow_marks_lookup ON flow_marks (rule, kind, key, at)")
    # A debounced event waits in state 'batched' for its leader's run, which sees them all.
    db.execute("ALTER TABLE events ADD COLUMN batch_leader INTEGER")
    db.execute("CREATE INDEX events_batch ON events (batch_leader) WHERE batch_leader IS NOT NULL")


@migrations(name="0005_stream_errors")
def _stream_errors(db: sqlite_utils.Database) -> None:
    # notifications/events/error on a push stream: counted, the stream goes on.
    db.execute("ALTER TABLE subscriptions ADD COLUMN stream_errors INTEGER NOT NULL DEFAULT 0")


@migrations(name="0006_webhooks")
def _webhooks(db: sqlite_utils.Database) -> None:
    # One row per webhook subscription: the key it was subscribed under (server, event, arguments, url),
    # its secrets (the receiver must hold them in clear to verify HMACs; the file is 0600), the
    # server-derived id the receiver routes by, and what the last refresh said.
    db.execute(
        """
        CREATE TABLE webhooks (
            subscription TEXT PRIMARY KEY,
            server TEXT NOT NULL,
            event TEXT NOT NULL,
            arguments TEXT NOT NULL,
            url TEXT NOT NULL,
            secret TEXT NOT NULL,
            pending_secret TEXT,
            previous_secret TEXT,
            previous_until TEXT,
            webhook_id TEXT,
            refresh_before TEXT,
            no_expiry INTEGER NOT NULL DEFAULT 0,
            delivery_status TEXT,
            refreshes INTEGER NOT NULL DEFAULT 0,
            last_refresh_at TEXT,
            created_at TEXT NOT NULL
        )
        """
    )
    # Server-side subscriptions we gave up (removed from the config, key changed, ended): the receiver
    # answers 410 to their ids, and those not yet unsubscribed are, at the next connect to their server.
    db.execute(
        """
        CREATE TABLE webhooks_retired (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            subscription TEXT NOT NULL,
            server TEXT NOT NULL,
            event TEXT NOT NULL,
            arguments TEXT NOT NULL,
            url TEXT NOT NULL,
            webhook_id TEXT,
            reason TEXT NOT NULL,
            retired_at TEXT NOT NULL,
            unsubscribed_at TEXT
        )
        """
    )
    db.execute("CREATE INDEX webhooks_retired_id ON webhooks_retired (webhook_id)")


@migrations(name="0007_gap_deliveries")
def _gap_deliveries(db: sqlite_utils.Database) -> None:
    # A webhook gap envelope's webhook-id: its retry, before or after a restart, is recorded once.
    db.execute("ALTER TABLE gaps ADD COLUMN delivery_id TEXT")
    db.execute(
        "CREATE UNIQUE INDEX gaps_delivery ON gaps (subscription, delivery_id) WHERE delivery_id IS NOT NULL"
    )


def _redacted(error: str | None) -> str | None:
    """A subscription's error as stored: a server's message may quote what it was sent (a secret)."""
    return None if error is None else redact(error)[0]


# The ASCII encoder is the fallback for text pydantic-core's faster one refuses (lone surrogates).
_encode_json_ascii = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode


def _encode_json(value: Any) -> str:
    """Compact JSON text, by pydantic-core (about five times json.dumps on event payloads).

    A lone UTF-16 surrogate (a valid JSON escape, but not Unicode, which SQLite cannot
    store as text) is kept as its escape instead, so one odd payload never fails a batch.
    """
    try:
        return to_json(value).decode("utf-8")
    except PydanticSerializationError:
        return _encode_json_ascii(value)


def _canonical(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"))


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class SubscriptionKey:
    name: str
    server: str
    event: str
    arguments: dict[str, Any]

    @property
    def arguments_json(self) -> str:
        return _canonical(self.arguments)


class IncomingEvent(NamedTuple):
    """An event as a delivery brought it. A NamedTuple: immutable, and one is built per delivery."""

    event_id: str
    name: str
    timestamp: str
    data: dict[str, Any]
    meta: dict[str, Any] | None = None


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
        return (self.server, self.event, _canonical(self.arguments), self.url) == (
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


@dataclass(slots=True)
class _Tally:
    """One subscription's share of a group commit."""

    key: SubscriptionKey
    inserted: int = 0
    duplicates: int = 0
    cursor: str | None = None
    cursor_known: bool = False
    last_cursor: str | None = None
    gaps: list[tuple[str | None, str | None, str | None]] = field(default_factory=list)


# Ids per SELECT ... IN (...) and rows per INSERT: well under SQLite's limit on bound parameters.
_IN_CHUNK: Final = 500
_ROWS_PER_INSERT: Final = 500


@functools.lru_cache(maxsize=64)
def _insert_events_sql(rows: int) -> str:
    head, _, values = INSERT_EVENT_SQL.partition(" VALUES ")
    return f"{head} VALUES " + ", ".join([values] * rows)


@dataclass(frozen=True, slots=True)
class IngestResult:
    inserted: int
    duplicates: int


# One delivery's result, shared (frozen) rather than built per delivery.
_INSERTED: Final = IngestResult(1, 0)
_DUPLICATE: Final = IngestResult(0, 1)
_NEITHER: Final = IngestResult(0, 0)


@dataclass(frozen=True, slots=True)
class InboxEvent:
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


RunKind = Literal["agent", "replay", "dry_run"]
RunStatus = Literal["running", "completed", "failed", "interrupted"]
ToolCallStatus = Literal["ok", "error", "refused", "planned"]


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


@dataclass(frozen=True, slots=True)
class EventVerdict:
    """What a finished run does to its event: done, failed, or pending again after ``retry_at``."""

    state: EventState
    error: str | None = None
    retry_at: str | None = None


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


@dataclass(frozen=True, slots=True)
class FlowOutcome:
    verdict: Literal["run", "duplicate", "over_limit", "batched", "leader"]
    other: int | None = None  # the earlier event (duplicate) or the batch's leader
    other_event_id: str | None = None
    oldest: str | None = None  # over_limit: when the oldest run in the window happened


class Store:
    """Open with ``await Store.open(path)``; close with ``await store.close()``."""

    def __init__(self, db: sqlite_utils.Database, path: Path) -> None:
        self._db = db
        self.path = path
        self._limiter = anyio.CapacityLimiter(1)

    # ---- opening ---------------------------------------------------------------

    @classmethod
    def open_sync(cls, path: Path, *, synchronous: str = "normal") -> Store:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                # Created private: the store will hold cursors and, later, webhook secrets.
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
            elif stat.S_IMODE(path.stat().st_mode) & 0o077:
                os.chmod(path, 0o600)
            conn = sqlite3.connect(path, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000)
            db = sqlite_utils.Database(conn)
            with db.ensure_autocommit_on():
                db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            db.execute(f"PRAGMA synchronous={synchronous.upper()}")
            db.execute("PRAGMA foreign_keys=ON")
            migrations.apply(db)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot open the store {path}: {exc}") from exc
        except OSError as exc:
            raise StoreError(f"cannot create the store {path}: {exc.strerror}") from exc
        return cls(db, path)

    @classmethod
    async def open(cls, path: Path, *, synchronous: str = "normal") -> Store:
        return await anyio.to_thread.run_sync(partial(cls.open_sync, path, synchronous=synchronous))

    @classmethod
    def open_existing(cls, path: Path) -> Store:
        """Open for reading by the CLI; a missing store is an error, not a new file."""
        if not path.exists():
            raise StoreError(f"no store at {path} yet: run 'agentwake run' first")
        return cls.open_sync(path)

    async def close(self) -> None:
        await self._run(self._db.close)

    def close_sync(self) -> None:
        self._db.close()

    async def _run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await anyio.to_thread.run_sync(partial(fn, *args, **kwargs), limiter=self._limiter)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"store {self.path}: {exc}") from exc

    # ---- subscriptions -----------------------------------------------------------

    def register_sync(self, key: SubscriptionKey) -> str | None:
        """Record a configured subscription; returns its persisted cursor.

        If the server, event or arguments changed since the cursor was stored, that
        cursor belongs to a different subscription and is dropped.
        """
        now = now_iso()
        with self._db.atomic():
            row = self._db.execute(
                "SELECT server, event, arguments, cursor FROM subscriptions WHERE name = ?", [key.name]
            ).fetchone()
            if row is None:
                self._db.execute(
                    "INSERT INTO subscriptions (name, server, event, arguments, created_at, updated_at)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    [key.name, key.server, key.event, key.arguments_json, now, now],
                )
                return None
            if (row[0], row[1], row[2]) != (key.server, key.event, key.arguments_json):
                logger.warning(
                    "subscription %s changed (server, event or arguments): its stored cursor is dropped",
                    key.name,
                )
                self._db.execute(
                    "UPDATE subscriptions SET server = ?, event = ?, arguments = ?, cursor = NULL,"
                    " cursor_updated_at = NULL, updated_at = ? WHERE name = ?",
                    [key.server, key.event, key.arguments_json, now, key.name],
                )
                return None
            return str(row[3]) if row[3] is not None else None

    async def register(self, key: SubscriptionKey) -> str | None:
        return await self._run(self.register_sync, key)

    def cursor_sync(self, name: str) -> str | None:
        row = self._db.execute("SELECT cursor FROM subscriptions WHERE name = ?", [name]).fetchone()
        return None if row is None or row[0] is None else str(row[0])

    async def cursor(self, name: str) -> str | None:
        return await self._run(self.cursor_sync, name)

    def set_state_sync(
        self, name: str, *, status: str, mode: str | None = None, error: str | None = None
    ) -> None:
        with self._db.atomic():
            self._db.execute(
                "UPDATE subscriptions SET status = ?, mode = coalesce(?, mode), last_error = ?, updated_at = ?"
                " WHERE name = ?",
                [status, mode, _redacted(error), now_iso(), name],
            )

    async def set_state(
        self, name: str, *, status: str, mode: str | None = None, error: str | None = None
    ) -> None:
        await self._run(partial(self.set_state_sync, name, status=status, mode=mode, error=error))

    def record_error_sync(self, name: str, error: str) -> None:
        with self._db.atomic():
            self._db.execute(
                "UPDATE subscriptions SET last_error = ?, updated_at = ? WHERE name = ?",
                [_redacted(error), now_iso(), name],
            )

    async def record_error(self, name: str, error: str) -> None:
        await self._run(self.record_error_sync, name, error)

    def count_stream_error_sync(self, name: str, error: str) -> None:
        with self._db.atomic():
            self._db.execute(
                "UPDATE subscriptions SET stream_errors = stream_errors + 1, last_error = ?, updated_at = ?"
                " WHERE name = ?",
                [_redacted(error), now_iso(), name],
            )

    async def count_stream_error(self, name: str, error: str) -> None:
        await self._run(self.count_stream_error_sync, name, error)

    # ---- webhook subscriptions -------------------------------------------------------

    _WEBHOOK_COLUMNS: Final = (
        "subscription, server, event, arguments, url, secret, pending_secret, previous_secret, previous_until,"
        " webhook_id, refresh_before, no_expiry, delivery_status, refreshes, last_refresh_at"
    )

    @staticmethod
    def _webhook_record(row: Sequence[Any]) -> WebhookRecord:
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

    def webhook_sync(self, name: str) -> WebhookRecord | None:
        row = self._db.execute(
            f"SELECT {self._WEBHOOK_COLUMNS} FROM webhooks WHERE subscription = ?", [name]
        ).fetchone()
        return None if row is None else self._webhook_record(row)

    async def webhook(self, name: str) -> WebhookRecord | None:
        return await self._run(self.webhook_sync, name)

    def webhooks_sync(self) -> list[WebhookRecord]:
        rows = self._db.execute(f"SELECT {self._WEBHOOK_COLUMNS} FROM webhooks ORDER BY subscription")
        return [self._webhook_record(row) for row in rows.fetchall()]

    async def webhooks(self) -> list[WebhookRecord]:
        return await self._run(self.webhooks_sync)

    def prepare_webhook_sync(self, key: SubscriptionKey, url: str, new_secret: str) -> WebhookRecord:
        """The stored webhook of this subscription, or a new one with ``new_secret``.

        A row stored under another key (server, event, arguments or url changed) is a
        different server-side subscription: it is retired, to be unsubscribed, and a
        fresh row with a fresh secret takes its place.
        """
        with self._db.atomic():
            current = self.webhook_sync(key.name)
            if current is not None and current.same_key(key, url):
                return current
            if current is not None:
                self._retire(
                    current, "its server, event, arguments or callback url changed", unsubscribed=False
                )
            now = now_iso()
            self._db.execute(
                "INSERT INTO webhooks (subscription, server, event, arguments, url, secret, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [key.name, key.server, key.event, key.arguments_json, url, new_secret, now],
            )
            record = self.webhook_sync(key.name)
            assert record is not None
            return record

    async def prepare_webhook(self, key: SubscriptionKey, url: str, new_secret: str) -> WebhookRecord:
        return await self._run(self.prepare_webhook_sync, key, url, new_secret)

    def webhook_subscribed_sync(
        self,
        name: str,
        *,
        webhook_id: str,
        sent_secret: str,
        refresh_before: str | None,
        delivery_status: dict[str, Any] | None,
        previous_until: str,
    ) -> WebhookRecord | None:
        """Record a successful subscribe or refresh; None if the subscription was retired meanwhile.

        If it carried a new secret (a rotation), that secret becomes current and the
        old one is kept as previous until ``previous_until``; a newer pending secret
        (rotated again meanwhile) stays pending for the next refresh.
        """
        now = now_iso()
        with self._db.atomic():
            self._db.execute(
                "UPDATE webhooks SET"
                " previous_secret = CASE WHEN secret = :sent THEN previous_secret ELSE secret END,"
                " previous_until = CASE WHEN secret = :sent THEN previous_until ELSE :until END,"
                " secret = :sent,"
                " pending_secret = CASE WHEN pending_secret = :sent THEN NULL ELSE pending_secret END,"
                " webhook_id = :id, refresh_before = :refresh, no_expiry = :no_expiry,"
                " delivery_status = :status, refreshes = refreshes + 1, last_refresh_at = :now"
                " WHERE subscription = :name",
                {
                    "sent": sent_secret,
                    "until": previous_until,
                    "id": webhook_id,
                    "refresh": refresh_before,
                    "no_expiry": int(refresh_before is None),
                    "status": _encode_json(delivery_status) if delivery_status is not None else None,
                    "now": now,
                    "name": name,
                },
            )
            record = self.webhook_sync(name)
            if record is not None:
                # The server derives the id from the key: a key subscribed again (removed from the
                # config and added back) gets a retired id back. It is live now: no more 410s for it,
                # and no pending events/unsubscribe, which would end this very subscription.
                self._db.execute(
                    "UPDATE webhooks_retired SET webhook_id = NULL, unsubscribed_at = coalesce(unsubscribed_at, ?)"
                    " WHERE webhook_id = ?",
                    [now, webhook_id],
                )
            return record

    async def webhook_subscribed(self, name: str, **fields: Any) -> WebhookRecord | None:
        """webhook_subscribed_sync in the store's thread; the same keyword arguments."""
        return await self._run(partial(self.webhook_subscribed_sync, name, **fields))

    def request_rotation_sync(self, names: Sequence[str] | None, make_secret: Callable[[], str]) -> list[str]:
        """Give each named webhook subscription (all, with None) a pending secret; returns the names."""
        with self._db.atomic():
            rows = self._db.execute("SELECT subscription FROM webhooks ORDER BY subscription").fetchall()
            chosen = [r[0] for r in rows if names is None or r[0] in names]
            for name in chosen:
                self._db.execute(
                    "UPDATE webhooks SET pending_secret = ? WHERE subscription = ?", [make_secret(), name]
                )
            return chosen

    def _retire(self, record: WebhookRecord, reason: str, *, unsubscribed: bool) -> None:
        now = now_iso()
        self._db.execute(
            "INSERT INTO webhooks_retired (subscription, server, event, arguments, url, webhook_id, reason,"
            " retired_at, unsubscribed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                record.subscription,
                record.server,
                record.event,
                _canonical(record.arguments),
                record.url,
                record.webhook_id,
                reason,
                now,
                now if unsubscribed else None,
            ],
        )
        self._db.execute("DELETE FROM webhooks WHERE subscription = ?", [record.subscription])

    def retire_webhook_sync(self, name: str, reason: str, *, unsubscribed: bool) -> WebhookRecord | None:
        """Stop using a webhook subscription: its id answers 410 from now on.

        ``unsubscribed`` says the server already dropped it (terminated, or it never
        existed); otherwise it waits in the retired table for events/unsubscribe.
        """
        with self._db.atomic():
            record = self.webhook_sync(name)
            if record is not None:
                self._retire(record, reason, unsubscribed=unsubscribed)
            return record

    async def retire_webhook(self, name: str, reason: str, *, unsubscribed: bool) -> WebhookRecord | None:
        return await self._run(partial(self.retire_webhook_sync, name, reason, unsubscribed=unsubscribed))

    def to_unsubscribe_sync(self, server: str | None = None) -> list[RetiredWebhook]:
        """Retired webhook subscriptions not yet unsubscribed (of one server, or all)."""
        where, args = "unsubscribed_at IS NULL", []
        if server is not None:
            where, args = where + " AND server = ?", [server]
        rows = self._db.execute(
            "SELECT id, subscription, server, event, arguments, url, webhook_id FROM webhooks_retired"
            f" WHERE {where} ORDER BY id",
            args,
        ).fetchall()
        return [RetiredWebhook(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6]) for r in rows]

    async def to_unsubscribe(self, server: str | None = None) -> list[RetiredWebhook]:
        return await self._run(self.to_unsubscribe_sync, server)

    def mark_unsubscribed_sync(self, retired_id: int) -> None:
        with self._db.atomic():
            self._db.execute(
                "UPDATE webhooks_retired SET unsubscribed_at = ? WHERE id = ?", [now_iso(), retired_id]
            )

    async def mark_unsubscribed(self, retired_id: int) -> None:
        await self._run(self.mark_unsubscribed_sync, retired_id)

    def retired_webhook_ids_sync(self) -> set[str]:
        rows = self._db.execute("SELECT webhook_id FROM webhooks_retired WHERE webhook_id IS NOT NULL")
        return {r[0] for r in rows.fetchall()}

    async def retired_webhook_ids(self) -> set[str]:
        return await self._run(self.retired_webhook_ids_sync)

    # ---- the inbox ---------------------------------------------------------------

    def ingest_sync(
        self,
        key: SubscriptionKey,
        events: Sequence[IncomingEvent],
        cursor: str | None,
        *,
        truncated: bool = False,
        cursor_before: str | None = None,
    ) -> IngestResult:
        """Insert a batch and advance the cursor in one transaction.

        A null cursor is never persisted (the stored one stays). A duplicate
        (server, event name, eventId) is counted, not stored again.
        """
        now = now_iso()
        with self._db.atomic():
            return self._ingest(key, events, cursor, truncated, cursor_before, now)

    def _ingest(
        self,
        key: SubscriptionKey,
        events: Sequence[IncomingEvent],
        cursor: str | None,
        truncated: bool,
        cursor_before: str | None,
        now: str,
    ) -> IngestResult:
        rows = [
            (
                key.server,
                key.name,
                event.name,
                event.event_id,
                event.timestamp,
                _encode_json(event.data),
                _encode_json(event.meta) if event.meta else None,
                now,
                now,
            )
            for event in events
        ]
        conn = self._db.conn
        before = conn.total_changes
        if rows:
            conn.executemany(INSERT_EVENT_SQL, rows)
        inserted = conn.total_changes - before
        duplicates = len(rows) - inserted
        conn.execute(
            "UPDATE subscriptions SET"
            " cursor = coalesce(?, cursor),"
            " cursor_updated_at = CASE WHEN ? IS NULL THEN cursor_updated_at ELSE ? END,"
            " last_poll_at = ?, events_received = events_received + ?, duplicates = duplicates + ?,"
            " gaps = gaps + ?, status = 'active', last_error = NULL, updated_at = ?"
            " WHERE name = ?",
            [cursor, cursor, now, now, inserted, duplicates, int(truncated), now, key.name],
        )
        if truncated:
            conn.execute(
                "INSERT INTO gaps (subscription, server, event, detected_at, cursor_before, cursor_after)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [key.name, key.server, key.event, now, cursor_before, cursor],
            )
        return IngestResult(inserted, duplicates)

    def ingest_deliveries_sync(self, deliveries: Sequence[WebhookDelivery]) -> list[IngestResult]:
        """Webhook bodies accepted together (group commit): every event and its cursor in ONE transaction.

        The receiver answers 2xx to each only after this returns, so an accepted
        delivery is always on disk; a retry of one is a counted duplicate. A batch
        costs a few statements, not a few per delivery: one look-up of the ids
        already stored, one insert of the new rows, one update per subscription.
        Each subscription's cursor ends as the last one in arrival order.
        """
        now = now_iso()
        conn = self._db.conn
        results: list[IngestResult] = []
        tallies: dict[str, _Tally] = {}
        rows: list[tuple[Any, ...]] = []
        with self._db.atomic():
            seen = self._stored_ids(deliveries)
            for delivery in deliveries:
                key = delivery.key
                tally = tallies.get(key.name)
                if tally is None:
                    tally = tallies[key.name] = _Tally(key)
                result = _NEITHER
                event = delivery.event
                if event is not None:
                    ident = (key.server, event.name, event.event_id)
                    if ident in seen:
                        result = _DUPLICATE
                    else:
                        seen.add(ident)
                        result = _INSERTED
                        rows.append(
                            (
                                key.server,
                                key.name,
                                event.name,
                                event.event_id,
                                event.timestamp,
                                _encode_json(event.data),
                                _encode_json(event.meta) if event.meta else None,
                                now,
                                now,
                            )
                        )
                if (
                    delivery.truncated
                    and delivery.control_id is not None
                    and self._gap_recorded(tally, delivery.control_id)
                ):
                    results.append(_DUPLICATE)
                    continue
                if delivery.truncated:
                    if not tally.cursor_known:
                        row = conn.execute(
                            "SELECT cursor FROM subscriptions WHERE name = ?", [key.name]
                        ).fetchone()
                        tally.cursor, tally.cursor_known = (row[0] if row else None), True
                    tally.gaps.append((tally.cursor, delivery.cursor, delivery.control_id))
                if delivery.cursor is not None:
                    tally.cursor, tally.cursor_known, tally.last_cursor = (
                        delivery.cursor,
                        True,
                        delivery.cursor,
                    )
                tally.inserted += result.inserted
                tally.duplicates += result.duplicates
                results.append(result)
            for start in range(0, len(rows), _ROWS_PER_INSERT):
                # One statement for many rows: sqlite3 lets go of the GIL once, not once per row,
                # which keeps the receiver's event loop from waiting on this thread.
                chunk = rows[start : start + _ROWS_PER_INSERT]
                conn.execute(_insert_events_sql(len(chunk)), [value for row in chunk for value in row])
            for tally in tallies.values():
                key = tally.key
                conn.execute(
                    "UPDATE subscriptions SET"
                    " cursor = coalesce(?, cursor),"
                    " cursor_updated_at = CASE WHEN ? IS NULL THEN cursor_updated_at ELSE ? END,"
                    " last_poll_at = ?, events_received = events_received + ?, duplicates = duplicates + ?,"
                    " gaps = gaps + ?, status = 'active', last_error = NULL, updated_at = ?"
                    " WHERE name = ?",
                    [
                        tally.last_cursor,
                        tally.last_cursor,
                        now,
                        now,
                        tally.inserted,
                        tally.duplicates,
                        len(tally.gaps),
                        now,
                        key.name,
                    ],
                )
                if tally.gaps:
                    conn.executemany(
                        "INSERT INTO gaps"
                        " (subscription, server, event, detected_at, cursor_before, cursor_after, delivery_id)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?)",
                        [
                            (key.name, key.server, key.event, now, before, after, delivery_id)
                            for before, after, delivery_id in tally.gaps
                        ],
                    )
        return results

    def _gap_recorded(self, tally: _Tally, delivery_id: str) -> bool:
        """Whether this gap envelope is recorded already, in an earlier commit or earlier in this batch."""
        if any(gap[2] == delivery_id for gap in tally.gaps):
            return True
        row = self._db.conn.execute(
            "SELECT 1 FROM gaps WHERE subscription = ? AND delivery_id = ?", [tally.key.name, delivery_id]
        ).fetchone()
        return row is not None

    def _stored_ids(self, deliveries: Sequence[WebhookDelivery]) -> set[tuple[str, str, str]]:
        """Which of the deliveries' (server, event name, eventId) are in the inbox already."""
        wanted: dict[tuple[str, str], set[str]] = {}
        for delivery in deliveries:
            if delivery.event is not None:
                wanted.setdefault((delivery.key.server, delivery.event.name), set()).add(
                    delivery.event.event_id
                )
        found: set[tuple[str, str, str]] = set()
        for (server, name), ids in wanted.items():
            listed = sorted(ids)
            for start in range(0, len(listed), _IN_CHUNK):
                chunk = listed[start : start + _IN_CHUNK]
                marks = ",".join("?" * len(chunk))
                for (event_id,) in self._db.conn.execute(
                    f"SELECT event_id FROM events WHERE server = ? AND name = ? AND event_id IN ({marks})",
                    [server, name, *chunk],
                ):
                    found.add((server, name, event_id))
        return found

    async def ingest_deliveries(self, deliveries: Sequence[WebhookDelivery]) -> list[IngestResult]:
        return await self._run(self.ingest_deliveries_sync, list(deliveries))

    async def ingest(
        self,
        key: SubscriptionKey,
        events: Sequence[IncomingEvent],
        cursor: str | None,
        *,
        truncated: bool = False,
        cursor_before: str | None = None,
    ) -> IngestResult:
        return await self._run(
            partial(self.ingest_sync, key, events, cursor, truncated=truncated, cursor_before=cursor_before)
        )

    def requeue_interrupted_sync(self) -> int:
        """Events left 'processing' by a crash go back to 'pending'; their unfinished runs are marked.

        A run only completes in the same transaction that marks its event done, so
        an event found here never had a completed run, and running it again is the
        one retry the crash costs.
        """
        now = now_iso()
        with self._db.atomic():
            self._db.execute(
                "UPDATE runs SET status = 'interrupted', reason = 'the service stopped during the run',"
                " finished_at = ? WHERE status = 'running'",
                [now],
            )
            cur = self._db.execute(
                "UPDATE events SET state = 'pending', state_changed_at = ? WHERE state = 'processing'",
                [now],
            )
            return cur.rowcount

    async def requeue_interrupted(self) -> int:
        return await self._run(self.requeue_interrupted_sync)

    def claim_sync(self, limit: int, now: str | None = None) -> list[InboxEvent]:
        """Move up to ``limit`` pending events to 'processing' and return them, oldest first."""
        now = now or now_iso()
        with self._db.atomic():
            rows = self._db.execute(
                "UPDATE events SET state = 'processing', attempts = attempts + 1, state_changed_at = ?"
                " WHERE id IN (SELECT id FROM events WHERE state = 'pending'"
                " AND (available_at IS NULL OR available_at <= ?) ORDER BY priority DESC, id LIMIT ?)"
                " RETURNING id, server, subscription, name, event_id, timestamp, data, attempts, decision,"
                " approved_at",
                [now, now, limit],
            ).fetchall()
        rows.sort(key=lambda row: row[0])
        return [
            InboxEvent(
                r[0],
                r[1],
                r[2],
                r[3],
                r[4],
                r[5],
                json.loads(r[6]),
                r[7],
                json.loads(r[8]) if r[8] else None,
                bool(r[9]),
            )
            for r in rows
        ]

    def release_sync(self, event_row: int, retry_at: str) -> None:
        """Give a claimed event back untouched (not an attempt): pending again, not before ``retry_at``."""
        with self._db.atomic():
            self._db.execute(
                "UPDATE events SET state = 'pending', attempts = max(0, attempts - 1), available_at = ?,"
                " state_changed_at = ? WHERE id = ? AND state = 'processing'",
                [retry_at, now_iso(), event_row],
            )

    async def release(self, event_row: int, retry_at: str) -> None:
        await self._run(self.release_sync, event_row, retry_at)

    def decide_sync(self, event_row: int, decision: dict[str, Any], state: EventState | None) -> None:
        """Store the policy decision; with a state (ignored, done, held) the event ends there, in one transaction."""
        with self._db.atomic():
            score = decision.get("injection_score")
            self._db.execute(
                "UPDATE events SET decision = ?, state = coalesce(?, state), state_changed_at = ?,"
                " injection_score = coalesce(?, injection_score) WHERE id = ?",
                [
                    _encode_json(decision),
                    state,
                    now_iso(),
                    score if isinstance(score, int | float) else None,
                    event_row,
                ],
            )

    async def decide(self, event_row: int, decision: dict[str, Any], state: EventState | None) -> None:
        await self._run(self.decide_sync, event_row, decision, state)

    def flow_gate_sync(
        self, event_row: int, rule: str, decision: dict[str, Any], gate: FlowGate
    ) -> FlowOutcome:
        """Apply a rule's flow control to one event, atomically: dedup, then rate limit, then debounce.

        Returns what to do: run it now, or it was a duplicate / over the limit (nothing
        stored but the mark of the check), or it joined or opened a batch (stored here).
        """
        with self._db.atomic():
            execute = self._db.execute
            if gate.dedup_key is not None and gate.dedup_since is not None:
                row = execute(
                    "SELECT m.event_row, e.event_id FROM flow_marks m JOIN events e ON e.id = m.event_row"
                    " WHERE m.rule = ? AND m.kind = 'dedup' AND m.key = ? AND m.at >= ? AND m.event_row != ?"
                    " ORDER BY m.at LIMIT 1",
                    [rule, gate.dedup_key, gate.dedup_since, event_row],
                ).fetchone()
                if row is not None:
                    return FlowOutcome("duplicate", other=int(row[0]), other_event_id=str(row[1]))
                execute(
                    "INSERT INTO flow_marks (rule, kind, key, event_row, at) VALUES (?, 'dedup', ?, ?, ?)",
                    [rule, gate.dedup_key, event_row, gate.now],
                )
            if gate.batch_key is not None and gate.batch_since is not None:
                leader = execute(
                    "SELECT m.event_row FROM flow_marks m JOIN events e ON e.id = m.event_row"
                    " WHERE m.rule = ? AND m.kind = 'batch' AND m.key = ? AND m.at >= ? AND e.state = 'pending'"
                    " AND (SELECT count(*) FROM events f WHERE f.batch_leader = m.event_row) < ?"
                    " ORDER BY m.at DESC LIMIT 1",
                    [rule, gate.batch_key, gate.batch_since, gate.batch_max - 1],
                ).fetchone()
                if leader is not None:
                    execute(
                        "UPDATE events SET state = 'batched', batch_leader = ?, decision = ?, state_changed_at = ?"
                        " WHERE id = ?",
                        [leader[0], _encode_json(decision), gate.now, event_row],
                    )
                    return FlowOutcome("batched", other=int(leader[0]))
            if gate.rate_key is not None and gate.rate_since is not None:
                oldest, count = execute(
                    # Strictly after the window start: an event delayed to the window's end is then in.
                    "SELECT min(at), count(*) FROM flow_marks WHERE rule = ? AND kind = 'rate' AND key = ? AND at > ?",
                    [rule, gate.rate_key, gate.rate_since],
                ).fetchone()
                if count >= gate.rate_max:
                    return FlowOutcome("over_limit", oldest=oldest)
                execute(
                    "INSERT INTO flow_marks (rule, kind, key, event_row, at) VALUES (?, 'rate', ?, ?, ?)",
                    [rule, gate.rate_key, event_row, gate.now],
                )
            if gate.batch_key is not None and gate.batch_due is not None:
                execute(
                    "INSERT INTO flow_marks (rule, kind, key, event_row, at) VALUES (?, 'batch', ?, ?, ?)",
                    [rule, gate.batch_key, event_row, gate.now],
                )
                execute(
                    "UPDATE events SET state = 'pending', attempts = max(0, attempts - 1), available_at = ?,"
                    " decision = ?, state_changed_at = ? WHERE id = ?",
                    [gate.batch_due, _encode_json({**decision, "batch_leader": True}), gate.now, event_row],
                )
                return FlowOutcome("leader")
            return FlowOutcome("run")

    async def flow_gate(
        self, event_row: int, rule: str, decision: dict[str, Any], gate: FlowGate
    ) -> FlowOutcome:
        return await self._run(self.flow_gate_sync, event_row, rule, decision, gate)

    def batch_members_sync(self, leader_row: int) -> list[InboxEvent]:
        rows = self._db.execute(
            "SELECT id, server, subscription, name, event_id, timestamp, data, attempts FROM events"
            " WHERE batch_leader = ? AND state = 'batched' ORDER BY id",
            [leader_row],
        ).fetchall()
        return [InboxEvent(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]), r[7]) for r in rows]

    async def batch_members(self, leader_row: int) -> list[InboxEvent]:
        return await self._run(self.batch_members_sync, leader_row)

    def approvals_sync(self) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT id, server, subscription, name, event_id, timestamp, received_at, decision, data, injection_score"
            " FROM events WHERE state = 'held' ORDER BY id"
        ).fetchall()
        keys = (
            "id",
            "server",
            "subscription",
            "event",
            "event_id",
            "timestamp",
            "received_at",
            "decision",
            "data",
            "injection_score",
        )
        held = [dict(zip(keys, r, strict=True)) for r in rows]
        for event in held:
            event["decision"] = json.loads(event["decision"]) if event["decision"] else None
            event["data"] = json.loads(event["data"])
        return held

    def answer_sync(self, event_row: int, *, approve: bool, note: str | None) -> None:
        """A person's answer to a held event: approved goes back to pending (the agent runs), denied ends it."""
        now = now_iso()
        with self._db.atomic():
            row = self._db.execute("SELECT state FROM events WHERE id = ?", [event_row]).fetchone()
            if row is None:
                raise StoreError(f"no stored event with row id {event_row}")
            if row[0] != "held":
                raise StoreError(f"the event is {row[0]!r}, not held for approval")
            self._db.execute(
                "UPDATE events SET state = ?, approved_at = ?, approval_note = ?, state_changed_at = ? WHERE id = ?",
                ["pending" if approve else "denied", now if approve else None, note, now, event_row],
            )

    async def claim(self, limit: int, now: str | None = None) -> list[InboxEvent]:
        return await self._run(self.claim_sync, limit, now)

    def finish_sync(self, ids: Iterable[int], state: EventState, error: str | None = None) -> None:
        now = now_iso()
        with self._db.atomic():
            self._db.conn.executemany(
                "UPDATE events SET state = ?, state_changed_at = ?, last_error = ? WHERE id = ?",
                [(state, now, error, event_id) for event_id in ids],
            )

    async def finish(self, ids: Iterable[int], state: EventState, error: str | None = None) -> None:
        await self._run(self.finish_sync, list(ids), state, error)

    # ---- agent runs (the action log) -------------------------------------------------

    def start_run_sync(
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
    ) -> int:
        with self._db.atomic():
            if sanitize_report is not None and kind == "agent":
                self._db.execute(
                    # The policy's record (the rule's tools, prompt, batch) stays: a retry resumes from it.
                    "UPDATE events SET injection_score = :score, sanitize_report = :report,"
                    " decision = CASE WHEN decision IS NULL THEN :decision ELSE json_patch(:decision, decision) END"
                    " WHERE id = :row",
                    {
                        "score": sanitize_report.get("injection_score"),
                        "report": _encode_json(sanitize_report),
                        "decision": _encode_json(decision),
                        "row": event_row,
                    },
                )
            cur = self._db.execute(
                "INSERT INTO runs (event_row, kind, attempt, model, status, decision, system_prompt, user_prompt,"
                " started_at) VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?)",
                [
                    event_row,
                    kind,
                    attempt,
                    model,
                    _encode_json(decision),
                    system_prompt,
                    user_prompt,
                    now_iso(),
                ],
            )
            return int(cur.lastrowid or 0)

    async def start_run(self, event_row: int, **options: Any) -> int:
        """start_run_sync in the store's thread; the same keyword arguments."""
        return await self._run(partial(self.start_run_sync, event_row, **options))

    def _write_progress(self, run_id: int, progress: RunProgress) -> None:
        self._db.execute(
            "UPDATE runs SET messages = ?, steps = ?, prompt_tokens = ?, completion_tokens = ?, cost_usd = ?"
            " WHERE id = ?",
            [
                _encode_json(progress.messages),
                progress.steps,
                progress.prompt_tokens,
                progress.completion_tokens,
                progress.cost_usd,
                run_id,
            ],
        )

    def record_progress_sync(
        self, run_id: int, progress: RunProgress, calls: Sequence[ToolCallRecord]
    ) -> None:
        with self._db.atomic():
            self._write_progress(run_id, progress)
            now = now_iso()
            self._db.conn.executemany(
                "INSERT INTO tool_calls (run_id, step, call_id, tool, server, name, arguments, status, result,"
                " duration_ms, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        run_id,
                        c.step,
                        c.call_id,
                        c.tool,
                        c.server,
                        c.name,
                        _encode_json(c.arguments),
                        c.status,
                        c.result,
                        c.duration_ms,
                        now,
                    )
                    for c in calls
                ],
            )

    async def record_progress(
        self, run_id: int, progress: RunProgress, calls: Sequence[ToolCallRecord]
    ) -> None:
        await self._run(self.record_progress_sync, run_id, progress, list(calls))

    def finish_run_sync(
        self,
        run_id: int,
        *,
        status: RunStatus,
        reason: str | None,
        progress: RunProgress,
        duration_ms: int,
        verdict: EventVerdict | None,
    ) -> None:
        """Close a run and, in the same transaction, move its event (exactly-once: done iff completed)."""
        now = now_iso()
        with self._db.atomic():
            self._write_progress(run_id, progress)
            self._db.execute(
                "UPDATE runs SET status = ?, reason = ?, finished_at = ?, duration_ms = ? WHERE id = ?",
                [status, reason, now, duration_ms, run_id],
            )
            if verdict is not None:
                self._db.execute(
                    "UPDATE events SET state = ?, last_error = ?, available_at = ?, state_changed_at = ?"
                    " WHERE id = (SELECT event_row FROM runs WHERE id = ?)",
                    [verdict.state, verdict.error, verdict.retry_at, now, run_id],
                )
                if verdict.state != "pending":
                    # The events batched behind this one end with it (they stay batched if it goes again).
                    self._db.execute(
                        "UPDATE events SET state = ?, last_error = ?, state_changed_at = ?"
                        " WHERE state = 'batched' AND batch_leader = (SELECT event_row FROM runs WHERE id = ?)",
                        [verdict.state, verdict.error, now, run_id],
                    )

    async def finish_run(self, run_id: int, **options: Any) -> None:
        """finish_run_sync in the store's thread; the same keyword arguments."""
        await self._run(partial(self.finish_run_sync, run_id, **options))

    def actions_sync(self, limit: int) -> list[dict[str, Any]]:
        """The most recent runs, newest first, one summary each."""
        rows = self._db.execute(
            "SELECT r.id, e.event_id, e.server, e.subscription, e.name, r.kind, r.attempt, r.model, r.status,"
            " r.reason, r.steps, r.prompt_tokens, r.completion_tokens, r.cost_usd, r.started_at, r.duration_ms,"
            " (SELECT count(*) FROM tool_calls t WHERE t.run_id = r.id),"
            " (SELECT count(*) FROM tool_calls t WHERE t.run_id = r.id AND t.status = 'refused'),"
            " (SELECT json_group_array(tool) FROM (SELECT t.tool FROM tool_calls t WHERE t.run_id = r.id"
            " ORDER BY t.id))"
            " FROM runs r JOIN events e ON e.id = r.event_row ORDER BY r.id DESC LIMIT ?",
            [limit],
        ).fetchall()
        keys = (
            "run_id",
            "event_id",
            "server",
            "subscription",
            "event",
            "kind",
            "attempt",
            "model",
            "status",
            "reason",
            "steps",
            "prompt_tokens",
            "completion_tokens",
            "cost_usd",
            "started_at",
            "duration_ms",
            "tool_calls",
            "refused",
            "tools",
        )
        actions = [dict(zip(keys, r, strict=True)) for r in rows]
        for action in actions:
            action["tools"] = json.loads(action["tools"]) if action["tools"] else []
        return actions

    def find_events_sync_by_row(self, row_id: int) -> list[dict[str, Any]]:
        return self._find_events("id = ?", [row_id])

    def find_events_sync(self, event_id: str, server: str | None = None) -> list[dict[str, Any]]:
        """Stored events with this eventId (one per server at most), with their runs and tool calls."""
        where, args = "event_id = ?", [event_id]
        if server is not None:
            where, args = where + " AND server = ?", [*args, server]
        return self._find_events(where, args)

    def _find_events(self, where: str, args: list[Any]) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT id, server, subscription, name, event_id, timestamp, received_at, state, attempts, data,"
            f" meta, last_error, injection_score, sanitize_report, decision, approved_at, approval_note"
            f" FROM events WHERE {where} ORDER BY id",
            args,
        ).fetchall()
        keys = (
            "id",
            "server",
            "subscription",
            "event",
            "event_id",
            "timestamp",
            "received_at",
            "state",
            "attempts",
            "data",
            "meta",
            "last_error",
            "injection_score",
            "sanitize_report",
            "decision",
            "approved_at",
            "approval_note",
        )
        events = [dict(zip(keys, r, strict=True)) for r in rows]
        for event in events:
            event["data"] = json.loads(event["data"])
            event["sanitize_report"] = (
                json.loads(event["sanitize_report"]) if event["sanitize_report"] else None
            )
            event["meta"] = json.loads(event["meta"]) if event["meta"] else None
            event["runs"] = self._runs_of(event["id"])
        return events

    def _runs_of(self, event_row: int) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT id, kind, attempt, model, status, reason, decision, system_prompt, user_prompt, messages, steps,"
            " prompt_tokens, completion_tokens, cost_usd, started_at, finished_at, duration_ms"
            " FROM runs WHERE event_row = ? ORDER BY id",
            [event_row],
        ).fetchall()
        keys = (
            "run_id",
            "kind",
            "attempt",
            "model",
            "status",
            "reason",
            "decision",
            "system_prompt",
            "user_prompt",
            "messages",
            "steps",
            "prompt_tokens",
            "completion_tokens",
            "cost_usd",
            "started_at",
            "finished_at",
            "duration_ms",
        )
        runs = [dict(zip(keys, r, strict=True)) for r in rows]
        call_keys = (
            "step",
            "call_id",
            "tool",
            "server",
            "name",
            "arguments",
            "status",
            "result",
            "duration_ms",
        )
        for run in runs:
            run["decision"] = json.loads(run["decision"])
            run["messages"] = json.loads(run["messages"])
            calls = self._db.execute(
                "SELECT step, call_id, tool, server, name, arguments, status, result, duration_ms"
                " FROM tool_calls WHERE run_id = ? ORDER BY id",
                [run["run_id"]],
            ).fetchall()
            run["tool_calls"] = [dict(zip(call_keys, c, strict=True)) for c in calls]
            for call in run["tool_calls"]:
                call["arguments"] = json.loads(call["arguments"]) if call["arguments"] else None
        return runs

    def event_for_replay_sync(self, row_id: int) -> InboxEvent:
        row = self._db.execute(
            "SELECT id, server, subscription, name, event_id, timestamp, data, attempts FROM events WHERE id = ?",
            [row_id],
        ).fetchone()
        if row is None:
            raise StoreError(f"no stored event with row id {row_id}")
        return InboxEvent(row[0], row[1], row[2], row[3], row[4], row[5], json.loads(row[6]), row[7])

    async def event_for_replay(self, row_id: int) -> InboxEvent:
        return await self._run(self.event_for_replay_sync, row_id)

    def run_counts_sync(self) -> dict[str, dict[str, Any]]:
        """Per subscription: agent runs by status, failed events and the last failure."""
        counts: dict[str, dict[str, Any]] = {}
        for sub, status, count in self._db.execute(
            "SELECT e.subscription, r.status, count(*) FROM runs r JOIN events e ON e.id = r.event_row"
            " WHERE r.kind = 'agent' GROUP BY e.subscription, r.status"
        ).fetchall():
            counts.setdefault(sub, {})[f"runs_{status}"] = count
        for sub, state, count in self._db.execute(
            "SELECT subscription, state, count(*) FROM events GROUP BY subscription, state"
        ).fetchall():
            counts.setdefault(sub, {})[f"events_{state}"] = count
        for sub, error in self._db.execute(
            "SELECT subscription, last_error FROM events WHERE id IN"
            " (SELECT max(id) FROM events WHERE state = 'failed' GROUP BY subscription)"
        ).fetchall():
            counts.setdefault(sub, {})["last_failure"] = error
        return counts

    # ---- reading, for the CLI and tests -------------------------------------------

    def subscriptions_sync(self) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT s.name, s.server, s.event, s.arguments, s.mode, s.cursor, s.last_poll_at, s.events_received,"
            " s.duplicates, s.gaps, s.status, s.last_error, s.cursor_updated_at, s.stream_errors,"
            " w.webhook_id, w.url, w.refresh_before, w.no_expiry, w.delivery_status, w.refreshes,"
            " w.last_refresh_at, w.pending_secret IS NOT NULL, w.previous_until"
            " FROM subscriptions s LEFT JOIN webhooks w ON w.subscription = s.name ORDER BY s.name"
        ).fetchall()
        return [
            {
                "subscription": r[0],
                "server": r[1],
                "event": r[2],
                "arguments": json.loads(r[3]),
                "mode": r[4],
                "cursor": r[5],
                "last_poll_at": r[6],
                "events_received": r[7],
                "duplicates": r[8],
                "gaps": r[9],
                "status": r[10],
                "last_error": r[11],
                "cursor_updated_at": r[12],
                "stream_errors": r[13],
                # No secret here: this is what `status --json` prints.
                "webhook": None
                if r[15] is None
                else {
                    "id": r[14],
                    "url": r[15],
                    "refresh_before": r[16],
                    "no_expiry": bool(r[17]),
                    "delivery_status": json.loads(r[18]) if r[18] else None,
                    "refreshes": r[19],
                    "last_refresh_at": r[20],
                    "rotation_pending": bool(r[21]),
                    "previous_secret_until": r[22],
                },
            }
            for r in rows
        ]

    def inbox_sync(self, limit: int, *, state: str | None = None) -> list[dict[str, Any]]:
        where, args = "", []
        if state is not None:
            where, args = "WHERE state = ?", [state]
        rows = self._db.execute(
            "SELECT id, server, subscription, name, event_id, timestamp, received_at, state, attempts, data,"
            f" last_error FROM events {where} ORDER BY id DESC LIMIT ?",
            [*args, limit],
        ).fetchall()
        return [
            {
                "id": r[0],
                "server": r[1],
                "subscription": r[2],
                "event": r[3],
                "event_id": r[4],
                "timestamp": r[5],
                "received_at": r[6],
                "state": r[7],
                "attempts": r[8],
                "data": json.loads(r[9]),
                "last_error": r[10],
            }
            for r in rows
        ]

    def gaps_sync(self, subscription: str | None = None) -> list[dict[str, Any]]:
        where, args = "", []
        if subscription is not None:
            where, args = "WHERE subscription = ?", [subscription]
        rows = self._db.execute(
            f"SELECT subscription, server, event, detected_at, cursor_before, cursor_after FROM gaps {where}"
            " ORDER BY id",
            args,
        ).fetchall()
        keys = ("subscription", "server", "event", "detected_at", "cursor_before", "cursor_after")
        return [dict(zip(keys, r, strict=True)) for r in rows]

    def event_ids_sync(self, subscription: str | None = None) -> list[str]:
        where, args = "", []
        if subscription is not None:
            where, args = "WHERE subscription = ?", [subscription]
        return [
            r[0]
            for r in self._db.execute(f"SELECT event_id FROM events {where} ORDER BY id", args).fetchall()
        ]

    def state_counts_sync(self) -> dict[str, int]:
        counts: dict[str, int] = dict.fromkeys(EVENT_STATES, 0)
        for state, count in self._db.execute("SELECT state, count(*) FROM events GROUP BY state").fetchall():
            counts[state] = count
        return counts
