"""The inbox: events and the cursor after them, stored in one transaction; duplicates counted once."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Sequence
from typing import Any, Final

from agentwake.clock import now_iso
from agentwake.errors import FencedOut
from agentwake.faults import crash_point
from agentwake.jsontext import encode_json
from agentwake.store.records import (
    DUPLICATE,
    INSERTED,
    HeldBatch,
    IncomingEvent,
    IngestResult,
    RejectedEvent,
    SubscriptionKey,
    WebhookDelivery,
)
from agentwake.store.rows import DeliveryTally, event_values, first_sight, rejected_data
from agentwake.store.sqlite.base import SqliteBase
from agentwake.store.sqlite.owners import check_fence

INSERT_EVENT_SQL: Final = (
    "INSERT OR IGNORE INTO events (server, subscription, name, event_id, timestamp, data, meta,"
    " received_at, state_changed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# A batch's effect on its subscription: the cursor (a null one keeps the stored one), counters, status.
ADVANCE_SQL: Final = (
    "UPDATE subscriptions SET"
    " cursor = coalesce(?, cursor),"
    " cursor_updated_at = CASE WHEN ? IS NULL THEN cursor_updated_at ELSE ? END,"
    " last_poll_at = ?, events_received = events_received + ?, duplicates = duplicates + ?,"
    " gaps = gaps + ?, rejected = rejected + ?, status = 'active', last_error = NULL, updated_at = ?"
    " WHERE name = ?"
)
INSERT_REJECTED_SQL: Final = (
    "INSERT OR IGNORE INTO events (server, subscription, name, event_id, timestamp, data, received_at,"
    " state_changed_at, state, last_error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'rejected', ?)"
)
# Ids per SELECT ... IN (...): well under SQLite's limit on bound parameters.
IN_CHUNK: Final = 500
# Rows per INSERT, as far as the connection's limit on bound parameters allows (32,766 by default
# since SQLite 3.32): a push stream's batch is one statement.
ROWS_PER_INSERT: Final = 2000
EVENT_COLUMNS: Final = INSERT_EVENT_SQL.count("?")


@functools.lru_cache(maxsize=64)
def insert_events_sql(rows: int) -> str:
    head, _, values = INSERT_EVENT_SQL.partition(" VALUES ")
    return f"{head} VALUES " + ", ".join([values] * rows)


def _event_row(key: SubscriptionKey, event: IncomingEvent, now: str) -> tuple[Any, ...]:
    """One event's values for INSERT_EVENT_SQL."""
    return (*event_values(key, event), now, now)


def _batch_values(key: SubscriptionKey, events: Sequence[IncomingEvent], now: str) -> list[Any]:
    """The values of ``_event_row`` for each of one subscription's events, in one flat list.

    Built in one pass, without a tuple an event: the store's thread needs the GIL for this while
    the event loop's thread reads the next batch, so every microsecond here is waited for twice.
    """
    values: list[Any] = []
    extend = values.extend
    server, subscription = key.server, key.name
    for event in events:
        data_json, meta = event.data_json, event.meta
        # event_values' columns, inline.
        extend(
            (
                server,
                subscription,
                event.name,
                event.event_id,
                event.timestamp,
                data_json if data_json is not None else encode_json(event.data),
                encode_json(meta) if meta else None,
                now,
                now,
            )
        )
    return values


def _insert_events(conn: sqlite3.Connection, values: list[Any]) -> None:
    """Insert flat ``_event_row`` values, up to ROWS_PER_INSERT rows a statement: sqlite3 lets go of
    the GIL once a statement, not once a row, so the event loop's thread seldom waits on this one."""
    step = min(ROWS_PER_INSERT, conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // EVENT_COLUMNS)
    step *= EVENT_COLUMNS
    for start in range(0, len(values), step):
        chunk = values[start : start + step]
        conn.execute(insert_events_sql(len(chunk) // EVENT_COLUMNS), chunk)


class Inbox(SqliteBase):
    def ingest(
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
        """Insert a batch and advance the cursor in one transaction.

        A null cursor is never persisted (the stored one stays). A duplicate
        (server, event name, eventId) is counted, not stored again. Rejected events
        are stored as their summary in state 'rejected', counted, and make a gap.
        With a ``fence``, nothing is written unless it is the subscription's (FencedOut).
        """
        now = now_iso()
        with self.transaction():
            check_fence(self.conn, key.name, fence)
            if unless_moved and stored_cursor(self.conn, key.name) != cursor_before:
                cursor = None  # a newer one was stored meanwhile: it stays
            result = self._ingest(key, events, cursor, truncated, cursor_before, now, rejected)
        crash_point("after_inbox_commit", result.inserted)
        return result

    def ingest_held(self, batches: Sequence[HeldBatch]) -> list[IngestResult | None]:
        """Batches delivery loops held back, each as ``ingest`` writes it, in one transaction; None
        for one fenced out (it writes nothing, the others do)."""
        now = now_iso()
        results: list[IngestResult | None] = []
        with self.transaction():
            for batch in batches:
                try:
                    check_fence(self.conn, batch.key.name, batch.fence)
                except FencedOut:
                    results.append(None)
                    continue
                results.append(self._ingest(batch.key, batch.events, batch.cursor, False, None, now))
        return results

    def _ingest(
        self,
        key: SubscriptionKey,
        events: Sequence[IncomingEvent],
        cursor: str | None,
        truncated: bool,
        cursor_before: str | None,
        now: str,
        rejected: Sequence[RejectedEvent] = (),
    ) -> IngestResult:
        conn = self.conn
        before = conn.total_changes
        _insert_events(conn, _batch_values(key, events, now))
        inserted = conn.total_changes - before
        duplicates = len(events) - inserted
        crash_point("mid_cursor_write", inserted)
        refused = self._insert_rejected(key, rejected, now)
        gap = truncated or refused > 0
        conn.execute(
            ADVANCE_SQL, [cursor, cursor, now, now, inserted, duplicates, int(gap), refused, now, key.name]
        )
        if gap:
            conn.execute(
                "INSERT INTO gaps (subscription, server, event, detected_at, cursor_before, cursor_after)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [key.name, key.server, key.event, now, cursor_before, cursor],
            )
        return IngestResult(inserted, duplicates)

    def _insert_rejected(self, key: SubscriptionKey, rejected: Sequence[RejectedEvent], now: str) -> int:
        """Store each refused event's summary (a retry of one is a duplicate); how many were new."""
        if not rejected:
            return 0
        before = self.conn.total_changes
        self.conn.executemany(
            INSERT_REJECTED_SQL,
            [
                (key.server, key.name, r.name, r.event_id, r.timestamp, rejected_data(r), now, now, r.reason)
                for r in rejected
            ],
        )
        return self.conn.total_changes - before

    def ingest_deliveries(self, deliveries: Sequence[WebhookDelivery]) -> list[IngestResult]:
        """Webhook bodies accepted together (group commit): every event and its cursor in ONE transaction.

        The receiver answers 2xx to each only after this returns, so an accepted
        delivery is always on disk; a retry of one is a counted duplicate. A batch
        costs a few statements, not a few per delivery: one look-up of the ids
        already stored, one insert of the new rows, one update per subscription.
        Each subscription's cursor ends as the last one in arrival order.
        """
        now = now_iso()
        conn = self.conn
        results: list[IngestResult] = []
        tallies: dict[str, DeliveryTally] = {}
        values: list[Any] = []
        with self.transaction():
            seen = self._stored_ids(deliveries)
            for delivery in deliveries:
                key = delivery.key
                tally = tallies.get(key.name)
                if tally is None:
                    tally = tallies[key.name] = DeliveryTally(key)
                event = delivery.event
                result = first_sight(delivery, seen)
                if event is not None and result is INSERTED:
                    values.extend(_event_row(key, event, now))
                if (
                    delivery.truncated
                    and delivery.control_id is not None
                    and self._gap_recorded(tally, delivery.control_id)
                ):
                    results.append(DUPLICATE)
                    continue
                if tally.wants_stored_cursor(delivery):
                    tally.know_cursor(stored_cursor(conn, key.name))
                tally.add(delivery, result)
                results.append(result)
            _insert_events(conn, values)
            crash_point("mid_cursor_write", values)
            for tally in tallies.values():
                key = tally.key
                conn.execute(
                    ADVANCE_SQL,
                    [
                        tally.last_cursor,
                        tally.last_cursor,
                        now,
                        now,
                        tally.inserted,
                        tally.duplicates,
                        len(tally.gaps),
                        self._insert_rejected(key, tally.rejected, now),
                        now,
                        key.name,
                    ],
                )
                if tally.gaps:
                    conn.executemany(
                        "INSERT INTO gaps"
                        " (subscription, server, event, detected_at, cursor_before, cursor_after, delivery_id)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?)",
                        tally.gap_rows(now),
                    )
        crash_point("after_inbox_commit", values)
        return results

    def _gap_recorded(self, tally: DeliveryTally, delivery_id: str) -> bool:
        """Whether this gap envelope is recorded already, in an earlier commit or earlier in this batch."""
        if tally.has_gap(delivery_id):
            return True
        row = self.conn.execute(
            "SELECT 1 FROM gaps WHERE subscription = ? AND delivery_id = ?", [tally.key.name, delivery_id]
        ).fetchone()
        return row is not None

    def _stored_ids(self, deliveries: Sequence[WebhookDelivery]) -> set[tuple[str, str, str]]:
        """Which of the deliveries' (server, event name, eventId) are in the inbox already, or were (seen)."""
        wanted: dict[tuple[str, str], set[str]] = {}
        for delivery in deliveries:
            if delivery.event is not None:
                wanted.setdefault((delivery.key.server, delivery.event.name), set()).add(
                    delivery.event.event_id
                )
        found: set[tuple[str, str, str]] = set()
        for (server, name), ids in wanted.items():
            listed = sorted(ids)
            for start in range(0, len(listed), IN_CHUNK):
                chunk = listed[start : start + IN_CHUNK]
                marks = ",".join("?" * len(chunk))
                # A pruned event's key is in seen (agentwake.store.retention): still a duplicate.
                for (event_id,) in self.conn.execute(
                    f"SELECT event_id FROM events WHERE server = ? AND name = ? AND event_id IN ({marks})"
                    f" UNION SELECT event_id FROM seen WHERE server = ? AND name = ? AND event_id IN ({marks})",
                    [server, name, *chunk, server, name, *chunk],
                ):
                    found.add((server, name, event_id))
        return found


def stored_cursor(conn: sqlite3.Connection, name: str) -> str | None:
    row = conn.execute("SELECT cursor FROM subscriptions WHERE name = ?", [name]).fetchone()
    return None if row is None else row[0]
