"""The work queue: claiming events, giving them back, settling decisions, approvals.

Several processes may claim from one inbox: a claim locks the events it looks at with
``FOR UPDATE SKIP LOCKED`` and moves them in the same transaction, so an event another
process is claiming is skipped, never handed out twice. Writes that lock several rows lock
them in id order, so two processes never wait on each other in a circle. A claim is a lease:
a process starting up takes back only the events whose lease lapsed (``requeue_interrupted``),
never those another live process is handling.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Final

import psycopg

from agentwake.clock import now_iso
from agentwake.jsontext import encode_json
from agentwake.store.pauses import NOT_PAUSED_SQL
from agentwake.store.postgres.base import PostgresBase, lock_key
from agentwake.store.postgres.runs import agent_usage
from agentwake.store.quotas import ClaimLimits, Quota, quota
from agentwake.store.records import ABANDONED_RUN, Answerer, EventState, InboxEvent, Settlement
from agentwake.store.rows import (
    answered_state,
    batch_member,
    check_held,
    check_no_unknown_calls,
    check_retryable,
    injection_score,
    no_event,
    served_in_order,
    settle_values,
)
from agentwake.store.shapes import ANY_CLAIMABLE_SQL, CLAIMED_COLUMNS, answer_values, inbox_event

# Held by every claim with limits (ClaimLimits), so each counts the claims committed before it.
CLAIM_LIMITS_LOCK: Final = lock_key("claim-limits")

# Each subscription's next due events (by priority, then age), locked; then the subscriptions take
# turns, the one served longest ago first. Rows locked by another claim are skipped.
_CLAIM_SQL: Final = (
    "WITH due AS (SELECT e.id, e.subscription, e.server, e.priority, s.claimed_seq, row_number() OVER"
    " (PARTITION BY e.subscription ORDER BY e.priority DESC, e.id) AS turn"
    " FROM subscriptions s CROSS JOIN LATERAL (SELECT id, subscription, server, priority FROM events"
    " WHERE subscription = s.name AND ((state = 'pending' AND (available_at IS NULL OR available_at <= %(now)s))"
    " OR (state = 'processing' AND lease_until IS NOT NULL AND lease_until < %(now)s))"
    " AND server <> ALL(%(excluded)s::text[])"
    " ORDER BY priority DESC, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) e"
    f" WHERE {NOT_PAUSED_SQL})"
    " SELECT id, subscription, server FROM due ORDER BY turn, claimed_seq, priority DESC, id LIMIT %(limit)s"
)


async def _quota(
    conn: psycopg.AsyncConnection[Any],
    limit: int,
    now: str,
    limits: ClaimLimits | None,
    excluded: Sequence[str],
) -> Quota:
    """What this claim may take under ``limits``, counted inside its transaction after taking the
    claims' lock: every claim committed before it is counted, and none commits meanwhile."""
    if limits is None or not (limits.server_caps or limits.counts_usage):
        # No limit set: nothing to count, no lock to take, so this claim never waits for
        # another process's (nor for one frozen mid-claim).
        return Quota(limit, tuple(excluded))
    await conn.execute("SELECT pg_advisory_xact_lock(%s)", [CLAIM_LIMITS_LOCK])
    handled: dict[str, int] = {}
    if limits.server_caps or limits.max_runs_per_hour is not None:
        cur = await conn.execute(
            "SELECT server, count(*) FROM events WHERE state = 'processing' AND coalesce(lease_until >= %s, true)"
            " GROUP BY server",
            [now],
        )
        handled = {str(server): int(count) for server, count in await cur.fetchall()}
    runs, spend = (0, 0.0)
    if limits.counts_usage:
        runs, spend = await agent_usage(conn, limits.hour_ago, limits.day_ago)
    return quota(limit, limits, handled=handled, runs_last_hour=runs, spend_last_day=spend, excluded=excluded)


async def lock_events(conn: psycopg.AsyncConnection[Any], rows: Iterable[int]) -> None:
    """Lock these events, in id order (inside the caller's transaction)."""
    await conn.execute("SELECT id FROM events WHERE id = ANY(%s) ORDER BY id FOR UPDATE", [sorted(set(rows))])


async def event_state(conn: psycopg.AsyncConnection[Any], event_row: int) -> str:
    cur = await conn.execute("SELECT state FROM events WHERE id = %s FOR UPDATE", [event_row])
    row = await cur.fetchone()
    if row is None:
        raise no_event(event_row)
    return str(row[0])


class WorkQueue(PostgresBase):
    async def requeue_interrupted(self, max_attempts: int | None = None) -> int:
        """Events a stopped process left 'processing' go back to 'pending'; their unfinished runs are marked.

        Several processes share the database, so only events no live process holds are taken:
        those whose lease lapsed (or that were claimed without one). An event a live process
        is handling keeps its lease (renewed while it runs) and is left alone; one held by a
        process that was killed is taken here once its lease lapses, or by ``claim`` after that.

        A run only completes in the same transaction that marks its event done, so
        an event found here never had a completed run, and running it again is the
        one retry the crash costs. An event that has already had ``max_attempts``
        claims is dead instead: an event that kills the service each time it runs
        must not kill it forever. Returns how many events went back to 'pending'.
        """
        now = now_iso()
        async with self.transaction() as conn:
            # Locked in id order; a row another transaction holds is waited for and checked again.
            cur = await conn.execute(
                "SELECT id FROM events WHERE state = 'processing' AND (lease_until IS NULL OR lease_until < %s)"
                " ORDER BY id FOR UPDATE",
                [now],
            )
            rows = [row[0] for row in await cur.fetchall()]
            if not rows:
                return 0
            await conn.execute(
                "UPDATE runs SET status = 'interrupted', reason = 'the service stopped during the run',"
                " finished_at = %s WHERE status = 'running' AND event_row = ANY(%s)",
                [now, rows],
            )
            if max_attempts is not None:
                await conn.execute(
                    "UPDATE events SET state = 'dead', lease_until = NULL, state_changed_at = %s,"
                    " last_error = 'the service stopped during each of its ' || attempts || ' attempt(s)'"
                    " WHERE id = ANY(%s) AND attempts >= %s",
                    [now, rows, max_attempts],
                )
            cur = await conn.execute(
                "UPDATE events SET state = 'pending', lease_until = NULL, state_changed_at = %s"
                " WHERE id = ANY(%s) AND state = 'processing'",
                [now, rows],
            )
            return max(cur.rowcount, 0)

    async def claim(
        self,
        limit: int,
        now: str | None = None,
        *,
        lease_until: str | None = None,
        exclude_servers: Sequence[str] = (),
        limits: ClaimLimits | None = None,
    ) -> list[InboxEvent]:
        """Move up to ``limit`` due pending events to 'processing' and return them, oldest first.

        Subscriptions take turns: each one's next due event (by priority, then age) before any
        one's second, the subscription served longest ago first; so a server that floods its
        subscription cannot starve the others, even when one event is claimed at a time.

        A claim is a lease until ``lease_until`` (renewed while the event is handled): an event
        still 'processing' after its lease lapsed was abandoned and is claimed again, with its
        attempts counted. Events of ``exclude_servers`` are left alone. With ``limits``, claims
        take one advisory lock, so each counts every other process's committed claims.
        """
        now = now or now_iso()
        async with self.transaction() as conn:
            claimable = await (await conn.execute(ANY_CLAIMABLE_SQL)).fetchone()
            if claimable is None or not claimable[0]:
                return []
            allowed = await _quota(conn, limit, now, limits, exclude_servers)
            if allowed.limit <= 0:
                return []
            cur = await conn.execute(
                _CLAIM_SQL, {"now": now, "excluded": list(allowed.excluded), "limit": limit}
            )
            chosen = allowed.trim([(int(row[0]), str(row[2])) for row in await cur.fetchall()])
            if not chosen:
                return []
            cur = await conn.execute(
                "UPDATE events SET state = 'processing', attempts = attempts + 1, state_changed_at = %s,"
                f" lease_until = %s WHERE id = ANY(%s) RETURNING {CLAIMED_COLUMNS}",
                [now, lease_until, chosen],
            )
            rows = await cur.fetchall()
            # A run left 'running' on a reclaimed event (its lease lapsed) was cut off with its process.
            await conn.execute(
                "UPDATE runs SET status = 'interrupted', reason = %s, finished_at = %s"
                " WHERE status = 'running' AND event_row = ANY(%s)",
                [ABANDONED_RUN, now, chosen],
            )
            # Served now: these subscriptions go after the others at the next claim, in the order served.
            served = served_in_order(rows, chosen)
            await conn.execute(
                "SELECT name FROM subscriptions WHERE name = ANY(%s) ORDER BY name FOR UPDATE",
                [sorted(served)],
            )
            await conn.execute(
                "UPDATE subscriptions s SET claimed_seq = m.top + u.turn"
                " FROM (SELECT max(claimed_seq) AS top FROM subscriptions) m,"
                " unnest(%s::text[]) WITH ORDINALITY AS u(name, turn) WHERE s.name = u.name",
                [served],
            )
        rows.sort(key=lambda row: row[0])
        return [inbox_event(row) for row in rows]

    async def take_rule_slot(self, event_row: int, rule: str, limit: int, now: str) -> bool:
        """One of ``rule``'s ``limit`` run slots for this event, if the events being handled by every
        process leave one; takes under the rule's advisory lock, so two takes never both get the last."""
        async with self.transaction() as conn:
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", [lock_key("rule-slot", rule)])
            cur = await conn.execute(
                "SELECT count(*) FROM events WHERE slot_rule = %s AND state = 'processing' AND coalesce(lease_until >= %s, true)"
                " AND id <> %s",
                [rule, now, event_row],
            )
            row = await cur.fetchone()
            assert row is not None
            if int(row[0]) >= limit:
                return False
            await conn.execute("UPDATE events SET slot_rule = %s WHERE id = %s", [rule, event_row])
        return True

    async def give_rule_slot(self, event_row: int) -> None:
        async with self.transaction() as conn:
            await conn.execute("UPDATE events SET slot_rule = NULL WHERE id = %s", [event_row])

    async def renew_leases(self, leases: Sequence[tuple[int, int]], until: str) -> list[int]:
        """Extend the leases of events still held, given as (event row, attempts at the claim).

        Returns the rows whose lease was lost (the event was claimed again or moved on meanwhile).
        """
        if not leases:
            return []
        async with self.transaction() as conn:
            await lock_events(conn, [event_row for event_row, _ in leases])
            cur = await conn.execute(
                "UPDATE events e SET lease_until = %s FROM unnest(%s::bigint[], %s::int[]) AS l(id, attempts)"
                " WHERE e.id = l.id AND e.state = 'processing' AND e.attempts = l.attempts RETURNING l.id, l.attempts",
                [until, [row for row, _ in leases], [attempts for _, attempts in leases]],
            )
            kept = {(r[0], r[1]) for r in await cur.fetchall()}
        return [event_row for event_row, attempts in leases if (event_row, attempts) not in kept]

    async def release(self, event_row: int, retry_at: str) -> None:
        """Give a claimed event back untouched (not an attempt): pending again, not before ``retry_at``."""
        async with self.transaction() as conn:
            await conn.execute(
                "UPDATE events SET state = 'pending', attempts = greatest(0, attempts - 1), available_at = %s,"
                " lease_until = NULL, state_changed_at = %s WHERE id = %s AND state = 'processing'",
                [retry_at, now_iso(), event_row],
            )

    async def settle(self, settlements: Sequence[Settlement]) -> None:
        """Store decisions that end their events here (ignored, done, held), in one transaction."""
        now = now_iso()
        async with self.transaction() as conn:
            await lock_events(conn, [s.event_row for s in settlements])
            async with conn.cursor() as cur:
                await cur.executemany(
                    # Holding is no attempt (as in the SQLite store): an approved event runs even
                    # with [agent] max_attempts = 1.
                    "UPDATE events SET decision = %s, state = %s, state_changed_at = %s,"
                    " injection_score = coalesce(%s, injection_score),"
                    " attempts = CASE WHEN %s = 'held' THEN greatest(0, attempts - 1) ELSE attempts END"
                    " WHERE id = %s",
                    [settle_values(s, now) for s in settlements],
                )

    async def record_decision(self, event_row: int, record: dict[str, Any]) -> None:
        """Store the decision of an event that goes on to a run; its state is left alone."""
        async with self.transaction() as conn:
            await conn.execute(
                "UPDATE events SET decision = %s, injection_score = coalesce(%s, injection_score) WHERE id = %s",
                [encode_json(record), injection_score(record), event_row],
            )

    async def batch_members(self, leader_row: int) -> list[InboxEvent]:
        async with self.transaction() as conn:
            cur = await conn.execute(
                "SELECT id, server, subscription, name, event_id, timestamp, data, attempts FROM events"
                " WHERE batch_leader = %s AND state = 'batched' ORDER BY id",
                [leader_row],
            )
            rows = await cur.fetchall()
        return [batch_member(r) for r in rows]

    async def finish(self, ids: Iterable[int], state: EventState, error: str | None = None) -> None:
        now = now_iso()
        rows = list(ids)
        async with self.transaction() as conn:
            await lock_events(conn, rows)
            await conn.execute(
                "UPDATE events SET state = %s, state_changed_at = %s, last_error = %s WHERE id = ANY(%s)",
                [state, now, error, rows],
            )

    async def event(self, event_row: int) -> InboxEvent:
        """One stored event, with its stored decision and approval, whatever its state."""
        async with self.transaction() as conn:
            cur = await conn.execute(f"SELECT {CLAIMED_COLUMNS} FROM events WHERE id = %s", [event_row])
            row = await cur.fetchone()
        if row is None:
            raise no_event(event_row)
        return inbox_event(row)

    async def answer(
        self,
        event_row: int,
        *,
        approve: bool,
        note: str | None,
        by: Answerer | None = None,
        tools: Sequence[str] | None = None,
    ) -> None:
        """A person's answer to a held event: approved goes back to pending (the agent runs), denied ends it.

        The answer goes into the audit trail (``answers``) in the same transaction.
        """
        now = now_iso()
        async with self.transaction() as conn:
            check_held(await event_state(conn, event_row))
            cur = await conn.execute("SELECT decision FROM events WHERE id = %s", [event_row])
            found = await cur.fetchone()
            decision = json.loads(found[0]) if found and found[0] else None
            await conn.execute(
                "UPDATE events SET state = %s, approved_at = %s, approval_note = %s, state_changed_at = %s"
                " WHERE id = %s",
                [*answered_state(approve, note, now), event_row],
            )
            await conn.execute(
                "INSERT INTO answers (event_row, answer, who, via, address, at, rule, tools, authority, note)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [event_row, *answer_values(decision, approve=approve, note=note, by=by, tools=tools, at=now)],
            )

    async def retry(self, event_row: int, *, resend_unknown: bool = False) -> int:
        """A person requeues a failed or dead event: pending again, with a fresh count of attempts.

        The rerun goes on from the last run's transcript. A tool call that run sent without a
        recorded outcome is not sent again unless ``resend_unknown`` (then with the same
        idempotency key); without it the retry is refused, naming the calls. Returns how many
        calls are to be resent.
        """
        now = now_iso()
        async with self.transaction() as conn:
            check_retryable(await event_state(conn, event_row))
            cur = await conn.execute(
                "SELECT t.id, t.tool, t.idempotency_key FROM tool_calls t WHERE t.status = 'sent'"
                " AND t.run_id = (SELECT max(id) FROM runs WHERE event_row = %s AND kind = 'agent')"
                " ORDER BY t.id",
                [event_row],
            )
            unknown = await cur.fetchall()
            check_no_unknown_calls(unknown, resend_unknown=resend_unknown)
            await conn.execute(
                "UPDATE tool_calls SET status = 'resend' WHERE id = ANY(%s)", [[row[0] for row in unknown]]
            )
            await conn.execute(
                "UPDATE events SET state = 'pending', attempts = 0, available_at = NULL, lease_until = NULL,"
                " last_error = NULL, state_changed_at = %s WHERE id = %s",
                [now, event_row],
            )
            return len(unknown)
