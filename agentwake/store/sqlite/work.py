"""The work queue: claiming events, giving them back, settling decisions, flow control, approvals."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Final

from agentwake.clock import now_iso
from agentwake.jsontext import encode_json
from agentwake.store.pauses import NOT_PAUSED_SQL
from agentwake.store.quotas import ClaimLimits, Quota, quota
from agentwake.store.records import (
    ABANDONED_RUN,
    Answerer,
    EventState,
    FlowGate,
    FlowOutcome,
    InboxEvent,
    Settlement,
)
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
from agentwake.store.sqlite.base import SqliteBase
from agentwake.store.sqlite.runs import agent_usage

# Each subscription's next due events (by priority, then age), then the subscriptions take turns, the
# one served longest ago first. Pending and lapsed events are sought apart, each on the claim index
# (subscription, state, priority, id) and each no further than the limit: one condition with an OR
# of the two states would walk every event the subscription ever had, done ones included.
_CLAIM_SQL: Final = (
    "WITH due AS (SELECT e.id, e.server, e.priority, s.claimed_seq, row_number() OVER"
    " (PARTITION BY e.subscription ORDER BY e.priority DESC, e.id) AS turn"
    " FROM subscriptions s JOIN events e ON e.id IN (SELECT id FROM ("
    "SELECT id, priority FROM (SELECT id, priority FROM events WHERE subscription = s.name"
    " AND state = 'pending' AND (available_at IS NULL OR available_at <= ?)"
    " AND server NOT IN (SELECT value FROM json_each(?)) ORDER BY priority DESC, id LIMIT ?)"
    " UNION ALL SELECT id, priority FROM (SELECT id, priority FROM events WHERE subscription = s.name"
    " AND state = 'processing' AND lease_until IS NOT NULL AND lease_until < ?"
    " AND server NOT IN (SELECT value FROM json_each(?)) ORDER BY priority DESC, id LIMIT ?))"
    f" ORDER BY priority DESC, id LIMIT ?) WHERE {NOT_PAUSED_SQL})"
    " SELECT id, server FROM due ORDER BY turn, claimed_seq, priority DESC, id LIMIT ?"
)


class WorkQueue(SqliteBase):
    def requeue_interrupted(self, max_attempts: int | None = None) -> int:
        """Events left 'processing' by a crash go back to 'pending'; their unfinished runs are marked.

        A run only completes in the same transaction that marks its event done, so
        an event found here never had a completed run, and running it again is the
        one retry the crash costs. An event that has already had ``max_attempts``
        claims is dead instead: an event that kills the service each time it runs
        must not kill it forever.

        Every 'processing' event is taken, leased or not: one process uses a SQLite file, so at
        its start none is held by a live one, and a crash's events go again at once rather than
        when their leases lapse. (The PostgreSQL store, shared by processes, takes only lapsed ones.)
        """
        now = now_iso()
        with self.transaction():
            self.conn.execute(
                "UPDATE runs SET status = 'interrupted', reason = 'the service stopped during the run',"
                " finished_at = ? WHERE status = 'running'",
                [now],
            )
            if max_attempts is not None:
                self.conn.execute(
                    "UPDATE events SET state = 'dead', lease_until = NULL, state_changed_at = ?,"
                    " last_error = 'the service stopped during each of its ' || attempts || ' attempt(s)'"
                    " WHERE state = 'processing' AND attempts >= ?",
                    [now, max_attempts],
                )
            cur = self.conn.execute(
                "UPDATE events SET state = 'pending', lease_until = NULL, state_changed_at = ?"
                " WHERE state = 'processing'",
                [now],
            )
            return cur.rowcount

    def claim(
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
        attempts counted. Events of ``exclude_servers`` are left alone, and ``limits`` (per-server
        caps, the agent's hourly runs and daily spend) are counted in the same transaction.
        """
        now = now or now_iso()
        with self.transaction():
            if not self.conn.execute(ANY_CLAIMABLE_SQL).fetchone()[0]:
                return []
            allowed = self._quota(limit, now, limits, exclude_servers)
            if allowed.limit <= 0:
                return []
            excluded = encode_json(list(allowed.excluded))
            due = self.conn.execute(
                _CLAIM_SQL, [now, excluded, limit, now, excluded, limit, limit, limit]
            ).fetchall()
            chosen = allowed.trim([(int(row[0]), str(row[1])) for row in due])
            if not chosen:
                return []
            rows = self.conn.execute(
                "UPDATE events SET state = 'processing', attempts = attempts + 1, state_changed_at = ?,"
                " lease_until = ? WHERE id IN (SELECT value FROM json_each(?))"
                f" RETURNING {CLAIMED_COLUMNS}",
                [now, lease_until, encode_json(chosen)],
            ).fetchall()
            # A run left 'running' on a reclaimed event (its lease lapsed) was cut off with its process.
            self.conn.execute(
                "UPDATE runs SET status = 'interrupted', reason = ?, finished_at = ?"
                " WHERE status = 'running' AND event_row IN (SELECT value FROM json_each(?))",
                [ABANDONED_RUN, now, encode_json(chosen)],
            )
            # Served now: these subscriptions go after the others at the next claim, in the order served.
            self.conn.executemany(
                "UPDATE subscriptions SET claimed_seq = (SELECT max(claimed_seq) FROM subscriptions) + 1"
                " WHERE name = ?",
                [(name,) for name in served_in_order(rows, chosen)],
            )
        rows.sort(key=lambda row: row[0])
        return [inbox_event(row) for row in rows]

    def _quota(self, limit: int, now: str, limits: ClaimLimits | None, excluded: Sequence[str]) -> Quota:
        """What this claim may take under ``limits``, counted inside its transaction."""
        if limits is None:
            return Quota(limit, tuple(excluded))
        handled: dict[str, int] = {}
        if limits.server_caps or limits.max_runs_per_hour is not None:
            handled = {
                str(server): int(count)
                for server, count in self.conn.execute(
                    "SELECT server, count(*) FROM events WHERE state = 'processing' AND coalesce(lease_until >= ?, true)"
                    " GROUP BY server",
                    [now],
                )
            }
        runs, spend = (0, 0.0)
        if limits.counts_usage:
            runs, spend = agent_usage(self.conn, limits.hour_ago, limits.day_ago)
        return quota(
            limit, limits, handled=handled, runs_last_hour=runs, spend_last_day=spend, excluded=excluded
        )

    def take_rule_slot(self, event_row: int, rule: str, limit: int, now: str) -> bool:
        """One of ``rule``'s ``limit`` run slots for this event, if the events being handled leave one."""
        with self.transaction():
            taken = self.conn.execute(
                "SELECT count(*) FROM events WHERE slot_rule = ? AND state = 'processing' AND coalesce(lease_until >= ?, true)"
                " AND id <> ?",
                [rule, now, event_row],
            ).fetchone()[0]
            if taken >= limit:
                return False
            self.conn.execute("UPDATE events SET slot_rule = ? WHERE id = ?", [rule, event_row])
        return True

    def give_rule_slot(self, event_row: int) -> None:
        with self.transaction():
            self.conn.execute("UPDATE events SET slot_rule = NULL WHERE id = ?", [event_row])

    def renew_leases(self, leases: Sequence[tuple[int, int]], until: str) -> list[int]:
        """Extend the leases of events still held, given as (event row, attempts at the claim).

        Returns the rows whose lease was lost (the event was claimed again or moved on meanwhile).
        """
        lost: list[int] = []
        with self.transaction():
            for event_row, attempts in leases:
                cur = self.conn.execute(
                    "UPDATE events SET lease_until = ? WHERE id = ? AND state = 'processing' AND attempts = ?",
                    [until, event_row, attempts],
                )
                if cur.rowcount == 0:
                    lost.append(event_row)
        return lost

    def release(self, event_row: int, retry_at: str) -> None:
        """Give a claimed event back untouched (not an attempt): pending again, not before ``retry_at``."""
        with self.transaction():
            self.conn.execute(
                "UPDATE events SET state = 'pending', attempts = max(0, attempts - 1), available_at = ?,"
                " lease_until = NULL, state_changed_at = ? WHERE id = ? AND state = 'processing'",
                [retry_at, now_iso(), event_row],
            )

    def settle(self, settlements: Sequence[Settlement]) -> None:
        """Store decisions that end their events here (ignored, done, held), in one transaction."""
        now = now_iso()
        with self.transaction():
            # Holding is no attempt: the claim that decided to hold is given back, so an approved
            # event runs even with [agent] max_attempts = 1.
            self.conn.executemany(
                "UPDATE events SET decision = ?, state = ?, state_changed_at = ?,"
                " injection_score = coalesce(?, injection_score),"
                " attempts = CASE WHEN ? = 'held' THEN max(0, attempts - 1) ELSE attempts END WHERE id = ?",
                [settle_values(s, now) for s in settlements],
            )

    def record_decision(self, event_row: int, record: dict[str, Any]) -> None:
        """Store the decision of an event that goes on to a run; its state is left alone."""
        with self.transaction():
            self.conn.execute(
                "UPDATE events SET decision = ?, injection_score = coalesce(?, injection_score) WHERE id = ?",
                [encode_json(record), injection_score(record), event_row],
            )

    def flow_gate(self, event_row: int, rule: str, decision: dict[str, Any], gate: FlowGate) -> FlowOutcome:
        """Apply a rule's flow control to one event, atomically: dedup, then rate limit, then debounce.

        Returns what to do: run it now, or it was a duplicate / over the limit (nothing
        stored but the mark of the check), or it joined or opened a batch (stored here).
        """
        with self.transaction():
            execute = self.conn.execute
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
                        [leader[0], encode_json(decision), gate.now, event_row],
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
                    [gate.batch_due, encode_json({**decision, "batch_leader": True}), gate.now, event_row],
                )
                return FlowOutcome("leader")
            return FlowOutcome("run")

    def batch_members(self, leader_row: int) -> list[InboxEvent]:
        rows = self.conn.execute(
            "SELECT id, server, subscription, name, event_id, timestamp, data, attempts FROM events"
            " WHERE batch_leader = ? AND state = 'batched' ORDER BY id",
            [leader_row],
        ).fetchall()
        return [batch_member(r) for r in rows]

    def finish(self, ids: Iterable[int], state: EventState, error: str | None = None) -> None:
        now = now_iso()
        with self.transaction():
            self.conn.executemany(
                "UPDATE events SET state = ?, state_changed_at = ?, last_error = ? WHERE id = ?",
                [(state, now, error, event_id) for event_id in ids],
            )

    def event(self, event_row: int) -> InboxEvent:
        """One stored event, with its stored decision and approval, whatever its state."""
        row = self.conn.execute(
            f"SELECT {CLAIMED_COLUMNS} FROM events WHERE id = ?",
            [event_row],
        ).fetchone()
        if row is None:
            raise no_event(event_row)
        return inbox_event(row)

    def answer(
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
        with self.transaction():
            row = self.conn.execute("SELECT state, decision FROM events WHERE id = ?", [event_row]).fetchone()
            if row is None:
                raise no_event(event_row)
            check_held(row[0])
            self.conn.execute(
                "UPDATE events SET state = ?, approved_at = ?, approval_note = ?, state_changed_at = ? WHERE id = ?",
                [*answered_state(approve, note, now), event_row],
            )
            decision = json.loads(row[1]) if row[1] else None
            self.conn.execute(
                "INSERT INTO answers (event_row, answer, who, via, address, at, rule, tools, authority, note)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [event_row, *answer_values(decision, approve=approve, note=note, by=by, tools=tools, at=now)],
            )

    def retry(self, event_row: int, *, resend_unknown: bool = False) -> int:
        """A person requeues a failed or dead event: pending again, with a fresh count of attempts.

        The rerun goes on from the last run's transcript. A tool call that run sent without a
        recorded outcome is not sent again unless ``resend_unknown`` (then with the same
        idempotency key); without it the retry is refused, naming the calls. Returns how many
        calls are to be resent.
        """
        now = now_iso()
        with self.transaction():
            row = self.conn.execute("SELECT state FROM events WHERE id = ?", [event_row]).fetchone()
            if row is None:
                raise no_event(event_row)
            check_retryable(row[0])
            unknown = self.conn.execute(
                "SELECT t.id, t.tool, t.idempotency_key FROM tool_calls t WHERE t.status = 'sent' AND t.run_id ="
                " (SELECT max(id) FROM runs WHERE event_row = ? AND kind = 'agent')",
                [event_row],
            ).fetchall()
            check_no_unknown_calls(unknown, resend_unknown=resend_unknown)
            self.conn.executemany(
                "UPDATE tool_calls SET status = 'resend' WHERE id = ?",
                [(call_id,) for call_id, _, _ in unknown],
            )
            self.conn.execute(
                "UPDATE events SET state = 'pending', attempts = 0, available_at = NULL, lease_until = NULL,"
                " last_error = NULL, state_changed_at = ? WHERE id = ?",
                [now, event_row],
            )
            return len(unknown)
