"""The inbox: events and the cursor after them, stored in one transaction; duplicates counted once.

Several processes may ingest at once: a duplicate is whatever the unique (server, name, eventId)
constraint kept out (``INSERT ... ON CONFLICT DO NOTHING``), so a race between two receivers
stores the event once and counts the other copy as a duplicate. The subscriptions a transaction
advances are locked first, in name order, so two ingests never wait on each other in a circle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import psycopg

from agentwake.clock import now_iso
from agentwake.faults import crash_point
from agentwake.store.postgres.base import PostgresBase
from agentwake.store.postgres.owners import check_fence
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

# One statement for a whole batch: its columns as arrays, in order (ids follow the batch's order).
_INSERT_EVENTS_SQL: Final = (
    "INSERT INTO events (server, subscription, name, event_id, timestamp, data, meta, received_at,"
    " state_changed_at)"
    " SELECT u.server, u.subscription, u.name, u.event_id, u.ts, u.data, u.meta, %(now)s, %(now)s"
    " FROM unnest(%(server)s::text[], %(subscription)s::text[], %(name)s::text[], %(event_id)s::text[],"
    " %(ts)s::text[], %(data)s::text[], %(meta)s::text[])"
    " WITH ORDINALITY AS u(server, subscription, name, event_id, ts, data, meta, ord)"
    " ORDER BY u.ord ON CONFLICT ON CONSTRAINT events_dedup DO NOTHING RETURNING server, name, event_id"
)
_INSERT_REJECTED_SQL: Final = (
    "INSERT INTO events (server, subscription, name, event_id, timestamp, data, received_at,"
    " state_changed_at, state, last_error)"
    " SELECT %(server)s, %(subscription)s, u.name, u.event_id, u.ts, u.data, %(now)s, %(now)s, 'rejected',"
    " u.reason FROM unnest(%(name)s::text[], %(event_id)s::text[], %(ts)s::text[], %(data)s::text[],"
    " %(reason)s::text[]) WITH ORDINALITY AS u(name, event_id, ts, data, reason, ord)"
    " ORDER BY u.ord ON CONFLICT ON CONSTRAINT events_dedup DO NOTHING"
)
# A batch's effect on its subscription: the cursor (a null one keeps the stored one), counters, status.
# The arrays _INSERT_EVENTS_SQL takes, in the order of rows.event_values.
_EVENT_ARRAYS: Final = ("server", "subscription", "name", "event_id", "ts", "data", "meta")
_ADVANCE_SQL: Final = (
    "UPDATE subscriptions SET"
    " cursor = coalesce(%(cursor)s::text, cursor),"
    " cursor_updated_at = CASE WHEN %(cursor)s::text IS NULL THEN cursor_updated_at ELSE %(now)s END,"
    " last_poll_at = %(now)s, events_received = events_received + %(inserted)s,"
    " duplicates = duplicates + %(duplicates)s, gaps = gaps + %(gaps)s, rejected = rejected + %(rejected)s,"
    " status = 'active', last_error = NULL, updated_at = %(now)s WHERE name = %(name)s"
)
_INSERT_GAP_SQL: Final = (
    "INSERT INTO gaps (subscription, server, event, detected_at, cursor_before, cursor_after, delivery_id)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s)"
)

Ident = tuple[str, str, str]


async def _lock_subscriptions(conn: psycopg.AsyncConnection[Any], names: Sequence[str]) -> None:
    await conn.execute(
        "SELECT name FROM subscriptions WHERE name = ANY(%s) ORDER BY name FOR UPDATE", [sorted(set(names))]
    )


async def _insert_events(
    conn: psycopg.AsyncConnection[Any], rows: Sequence[tuple[SubscriptionKey, IncomingEvent]], now: str
) -> set[Ident]:
    """Insert the events not stored yet; the (server, name, eventId) of those this inserted."""
    if not rows:
        return set()
    values = zip(*(event_values(key, event) for key, event in rows), strict=True)
    columns = dict(zip(_EVENT_ARRAYS, map(list, values), strict=True))
    cur = await conn.execute(_INSERT_EVENTS_SQL, {"now": now, **columns})
    return {(r[0], r[1], r[2]) for r in await cur.fetchall()}


async def _insert_rejected(
    conn: psycopg.AsyncConnection[Any], key: SubscriptionKey, rejected: Sequence[RejectedEvent], now: str
) -> int:
    """Store each refused event's summary (a retry of one is a duplicate); how many were new."""
    if not rejected:
        return 0
    cur = await conn.execute(
        _INSERT_REJECTED_SQL,
        {
            "server": key.server,
            "subscription": key.name,
            "now": now,
            "name": [r.name for r in rejected],
            "event_id": [r.event_id for r in rejected],
            "ts": [r.timestamp for r in rejected],
            "data": [rejected_data(r) for r in rejected],
            "reason": [r.reason for r in rejected],
        },
    )
    return max(cur.rowcount, 0)


async def _stored_ids(conn: psycopg.AsyncConnection[Any], idents: Sequence[Ident]) -> set[Ident]:
    """Which of these (server, event name, eventId) are in the inbox already, or were (seen)."""
    if not idents:
        return set()
    listed = sorted(set(idents))
    columns = [[w[0] for w in listed], [w[1] for w in listed], [w[2] for w in listed]]
    # A pruned event's key is in seen (agentwake.store.retention): still a duplicate.
    cur = await conn.execute(
        "SELECT e.server, e.name, e.event_id FROM events e"
        " JOIN unnest(%s::text[], %s::text[], %s::text[]) AS w(server, name, event_id)"
        " ON e.server = w.server AND e.name = w.name AND e.event_id = w.event_id"
        " UNION SELECT s.server, s.name, s.event_id FROM seen s"
        " JOIN unnest(%s::text[], %s::text[], %s::text[]) AS w(server, name, event_id)"
        " ON s.server = w.server AND s.name = w.name AND s.event_id = w.event_id",
        [*columns, *columns],
    )
    return {(r[0], r[1], r[2]) for r in await cur.fetchall()}


def _advance(key: SubscriptionKey, cursor: str | None, now: str, **counts: int) -> dict[str, Any]:
    return {"cursor": cursor, "now": now, "name": key.name, **counts}


class Inbox(PostgresBase):
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
        """Insert a batch and advance the cursor in one transaction.

        A null cursor is never persisted (the stored one stays). A duplicate
        (server, event name, eventId) is counted, not stored again. Rejected events
        are stored as their summary in state 'rejected', counted, and make a gap.
        With a ``fence``, nothing is written unless it is the subscription's (FencedOut).
        """
        now = now_iso()
        async with self.transaction() as conn:
            await check_fence(conn, key.name, fence)
            await _lock_subscriptions(conn, [key.name])
            if unless_moved:
                cur = await conn.execute("SELECT cursor FROM subscriptions WHERE name = %s", [key.name])
                row = await cur.fetchone()
                if (None if row is None else row[0]) != cursor_before:
                    cursor = None  # a newer one was stored meanwhile: it stays
            # Every row is tried, duplicates too: each uses up an id, as SQLite's INSERT OR IGNORE does.
            stored = await _insert_events(conn, [(key, event) for event in events], now)
            inserted = len(stored)
            duplicates = len(events) - inserted
            crash_point("mid_cursor_write", inserted)
            refused = await _insert_rejected(conn, key, rejected, now)
            gap = truncated or refused > 0
            await conn.execute(
                _ADVANCE_SQL,
                _advance(
                    key,
                    cursor,
                    now,
                    inserted=inserted,
                    duplicates=duplicates,
                    gaps=int(gap),
                    rejected=refused,
                ),
            )
            if gap:
                await conn.execute(
                    _INSERT_GAP_SQL, [key.name, key.server, key.event, now, cursor_before, cursor, None]
                )
            result = IngestResult(inserted, duplicates)
        crash_point("after_inbox_commit", result.inserted)
        return result

    async def ingest_held(self, batches: Sequence[HeldBatch]) -> list[IngestResult | None]:
        """Batches delivery loops held back, each as ``ingest`` writes it, in one transaction; None
        for one fenced out (it writes nothing, the others do). A few statements however many
        batches: one fence check, one lock, one insert, and the cursor updates pipelined."""
        now = now_iso()
        async with self.transaction() as conn:
            fenced = sorted({b.key.name for b in batches if b.fence is not None})
            cur = await conn.execute(
                "SELECT subscription, fence FROM subscription_owners WHERE subscription = ANY(%s)"
                " ORDER BY subscription FOR SHARE",
                [fenced],
            )
            fences = {str(name): int(fence) for name, fence in await cur.fetchall()}
            kept = [b for b in batches if b.fence is None or fences.get(b.key.name) == b.fence]
            await _lock_subscriptions(conn, [b.key.name for b in kept])
            # Every row is tried, as ``ingest`` tries them; an event in two batches is the first one's.
            stored = await _insert_events(conn, [(b.key, e) for b in kept for e in b.events], now)
            written: dict[int, IngestResult] = {}
            for batch in kept:
                idents = [(batch.key.server, e.name, e.event_id) for e in batch.events]
                inserted = sum(1 for ident in idents if ident in stored)
                stored.difference_update(idents)
                written[id(batch)] = IngestResult(inserted, len(idents) - inserted)
            async with conn.cursor() as advance:
                await advance.executemany(
                    _ADVANCE_SQL,
                    [
                        _advance(
                            b.key,
                            b.cursor,
                            now,
                            inserted=written[id(b)].inserted,
                            duplicates=written[id(b)].duplicates,
                            gaps=0,
                            rejected=0,
                        )
                        for b in kept
                    ],
                )
        return [written.get(id(batch)) for batch in batches]

    async def ingest_deliveries(self, deliveries: Sequence[WebhookDelivery]) -> list[IngestResult]:
        """Webhook bodies accepted together (group commit): every event and its cursor in ONE transaction.

        The receiver answers 2xx to each only after this returns, so an accepted
        delivery is always stored; a retry of one is a counted duplicate. A batch
        costs a few statements: one look-up of the ids already stored, one insert of
        the new rows, one update per subscription. Each subscription's cursor ends as
        the last one in arrival order. An event another process stored between the
        look-up and the insert is a duplicate too.
        """
        now = now_iso()
        results: list[IngestResult] = []
        tallies: dict[str, DeliveryTally] = {}
        rows: list[tuple[SubscriptionKey, IncomingEvent]] = []
        placed: dict[Ident, int] = {}  # a new event's delivery, by its identity
        async with self.transaction() as conn:
            await _lock_subscriptions(conn, [delivery.key.name for delivery in deliveries])
            seen = await _stored_ids(
                conn,
                [(d.key.server, d.event.name, d.event.event_id) for d in deliveries if d.event is not None],
            )
            for delivery in deliveries:
                key = delivery.key
                tally = tallies.get(key.name)
                if tally is None:
                    tally = tallies[key.name] = DeliveryTally(key)
                event = delivery.event
                result = first_sight(delivery, seen)
                if event is not None and result is INSERTED:
                    placed[(key.server, event.name, event.event_id)] = len(results)
                    rows.append((key, event))
                if (
                    delivery.truncated
                    and delivery.control_id is not None
                    and await self._gap_recorded(conn, tally, delivery.control_id)
                ):
                    results.append(DUPLICATE)
                    continue
                if tally.wants_stored_cursor(delivery):
                    cur = await conn.execute("SELECT cursor FROM subscriptions WHERE name = %s", [key.name])
                    row = await cur.fetchone()
                    tally.know_cursor(row[0] if row else None)
                tally.add(delivery, result)
                results.append(result)
            stored = await _insert_events(conn, rows, now)
            for key, event in rows:
                ident = (key.server, event.name, event.event_id)
                if ident not in stored and results[placed[ident]] is INSERTED:
                    # Another process stored it since the look-up.
                    results[placed[ident]] = DUPLICATE
                    tally = tallies[key.name]
                    tally.inserted -= 1
                    tally.duplicates += 1
            crash_point("mid_cursor_write", rows)
            for tally in tallies.values():
                key = tally.key
                refused = await _insert_rejected(conn, key, tally.rejected, now)
                await conn.execute(
                    _ADVANCE_SQL,
                    _advance(
                        key,
                        tally.last_cursor,
                        now,
                        inserted=tally.inserted,
                        duplicates=tally.duplicates,
                        gaps=len(tally.gaps),
                        rejected=refused,
                    ),
                )
                if tally.gaps:
                    async with conn.cursor() as cur:
                        await cur.executemany(_INSERT_GAP_SQL, tally.gap_rows(now))
        crash_point("after_inbox_commit", rows)
        return results

    @staticmethod
    async def _gap_recorded(
        conn: psycopg.AsyncConnection[Any], tally: DeliveryTally, delivery_id: str
    ) -> bool:
        """Whether this gap envelope is recorded already, in an earlier commit or earlier in this batch."""
        if tally.has_gap(delivery_id):
            return True
        cur = await conn.execute(
            "SELECT 1 FROM gaps WHERE subscription = %s AND delivery_id = %s", [tally.key.name, delivery_id]
        )
        return await cur.fetchone() is not None
