"""The action log: agent runs and their tool calls; a run completes with its event in one transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from agentwake.clock import now_iso
from agentwake.errors import LeaseLost, StoreError
from agentwake.jsontext import encode_json
from agentwake.store.records import (
    CLAIM_HELD_SQL,
    EventVerdict,
    ResumePoint,
    RunKind,
    RunProgress,
    RunStatus,
    ToolCallRecord,
    ToolCallStatus,
    claim_lost_row,
)
from agentwake.store.rows import (
    LEASE_LOST,
    answered_run,
    journal_values,
    progress_values,
    resume_point_of,
    tool_call_values,
    verdict_values,
)
from agentwake.store.sqlite.base import SqliteBase


class ActionLog(SqliteBase):
    def start_run(
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
        with self.transaction():
            if sanitize_report is not None and kind == "agent":
                self.conn.execute(
                    # The policy's record (the rule's tools, prompt, batch) stays: a retry resumes from it.
                    "UPDATE events SET injection_score = :score, sanitize_report = :report,"
                    " decision = CASE WHEN decision IS NULL THEN :decision ELSE json_patch(:decision, decision) END"
                    " WHERE id = :row",
                    {
                        "score": sanitize_report.get("injection_score"),
                        "report": encode_json(sanitize_report),
                        "decision": encode_json(decision),
                        "row": event_row,
                    },
                )
            started = now_iso()
            cur = self.conn.execute(
                "INSERT INTO runs (event_row, kind, attempt, model, status, decision, system_prompt, user_prompt,"
                " started_at) VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?)",
                [event_row, kind, attempt, model, encode_json(decision), system_prompt, user_prompt, started],
            )
            return int(cur.lastrowid or 0)

    def _write_progress(self, run_id: int, progress: RunProgress) -> None:
        self.conn.execute(
            "UPDATE runs SET messages = ?, steps = ?, prompt_tokens = ?, completion_tokens = ?, cost_usd = ?,"
            " cached_tokens = ?"
            " WHERE id = ?",
            [*progress_values(progress), run_id],
        )

    def record_progress(self, run_id: int, progress: RunProgress, calls: Sequence[ToolCallRecord]) -> None:
        with self.transaction():
            self._write_progress(run_id, progress)
            now = now_iso()
            self.conn.executemany(
                "INSERT INTO tool_calls (run_id, step, call_id, tool, server, name, arguments, status, result,"
                " duration_ms, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [tool_call_values(run_id, c, now) for c in calls],
            )

    def finish_run(
        self,
        run_id: int,
        *,
        status: RunStatus,
        reason: str | None,
        progress: RunProgress,
        duration_ms: int,
        verdict: EventVerdict | None,
    ) -> bool:
        """Close a run and, in the same transaction, move its event (exactly-once: done iff completed).

        False when the run no longer held its event (its lease lapsed and the event was claimed again).
        """
        now = now_iso()
        with self.transaction():
            self._write_progress(run_id, progress)
            self.conn.execute(
                "UPDATE runs SET status = ?, reason = ?, finished_at = ?, duration_ms = ? WHERE id = ?",
                [status, reason, now, duration_ms, run_id],
            )
            if verdict is not None:
                # Only while this run still holds the event's lease (the claim that started it): a run
                # whose lease lapsed and whose event was claimed again must not move the event.
                cur = self.conn.execute(
                    "UPDATE events SET state = ?, last_error = ?, available_at = ?, state_changed_at = ?,"
                    " lease_until = NULL, attempts = attempts - ?"
                    " WHERE id = (SELECT event_row FROM runs WHERE id = ?) AND state = 'processing'"
                    " AND attempts = (SELECT attempt FROM runs WHERE id = ?)",
                    [*verdict_values(verdict, now), run_id, run_id],
                )
                if cur.rowcount == 0:
                    self.conn.execute(
                        "UPDATE runs SET status = 'interrupted', reason = ? WHERE id = ?",
                        [LEASE_LOST, run_id],
                    )
                    return False
                if verdict.state != "pending":
                    # The events batched behind this one end with it (they stay batched if it goes again).
                    self.conn.execute(
                        "UPDATE events SET state = ?, last_error = ?, state_changed_at = ?"
                        " WHERE state = 'batched' AND batch_leader = (SELECT event_row FROM runs WHERE id = ?)",
                        [verdict.state, verdict.error, now, run_id],
                    )
        return True

    # ---- the tool-call journal ---------------------------------------------------------------------

    def journal_tool_call(
        self, run_id: int, call: ToolCallRecord, idempotency_key: str, *, now: str | None = None
    ) -> int:
        """Write a tool call as 'sent' before it goes out; ``settle_tool_call`` records what came back.

        Fenced on the run's claim, in the same transaction: unless the run still holds its event
        (``claim_lost``, its lease judged at ``now``), nothing is written and ``LeaseLost`` is raised.
        """
        with self.transaction():
            held = self.conn.execute(
                CLAIM_HELD_SQL + "?",
                [run_id],
            ).fetchone()
            if held is None:
                raise StoreError(f"no run {run_id} to journal a tool call of")
            lost = claim_lost_row(held, now)
            if lost is not None:
                raise LeaseLost(run_id, lost)
            cur = self.conn.execute(
                "INSERT INTO tool_calls (run_id, step, call_id, tool, server, name, arguments, status,"
                " idempotency_key, at) VALUES (?, ?, ?, ?, ?, ?, ?, 'sent', ?, ?)",
                journal_values(run_id, call, idempotency_key, now_iso()),
            )
            return int(cur.lastrowid or 0)

    def settle_tool_call(
        self, call_row: int, *, status: ToolCallStatus, result: str | None, reply: str, duration_ms: int
    ) -> None:
        with self.transaction():
            self.conn.execute(
                "UPDATE tool_calls SET status = ?, result = ?, reply = ?, duration_ms = ? WHERE id = ?",
                [status, result, reply, duration_ms, call_row],
            )

    def adopt_run(self, run_id: int, from_run: int, call_ids: Sequence[str], progress: RunProgress) -> None:
        """A run that goes on from ``from_run`` takes over its transcript and the journal of the calls
        still to answer (``call_ids``), in one transaction: if it stops too, the next run finds all
        it needs in this one. Each call's row is the best any agent run of the event has for it
        (``journal_of_event``: settled first, then the newest); settled ones are copied as 'reused'."""
        with self.transaction():
            self._write_progress(run_id, progress)
            self.conn.execute(
                "INSERT INTO tool_calls (run_id, step, call_id, tool, server, name, arguments, status, result,"
                " duration_ms, at, idempotency_key, reply)"
                " SELECT ?, step, call_id, tool, server, name, arguments,"
                " CASE WHEN status IN ('ok', 'error') THEN 'reused' ELSE status END, result, duration_ms, at,"
                " idempotency_key, reply FROM (SELECT t.*, row_number() OVER (PARTITION BY t.call_id"
                " ORDER BY t.status IN ('ok', 'error', 'reused') DESC, t.id DESC) AS pick"
                " FROM tool_calls t JOIN runs r ON r.id = t.run_id"
                " WHERE r.event_row = (SELECT event_row FROM runs WHERE id = ?) AND r.kind = 'agent'"
                " AND r.id <> ? AND t.call_id IN (SELECT value FROM json_each(?)))"
                " WHERE pick = 1 ORDER BY id",
                [run_id, from_run, run_id, encode_json(list(call_ids))],
            )

    def resume_point(self, event_row: int) -> ResumePoint | None:
        """Where the event's agent runs got to: the newest one that got as far as an LLM answer.

        That run's stored transcript, and the journal of every agent run of the event
        (``journal_of_event``): a rerun goes on from there instead of starting over, so calls
        already made, by that run or by any earlier one, are not made again.
        """
        found = answered_run(
            self.conn.execute(
                "SELECT id, messages, steps, prompt_tokens, completion_tokens, cost_usd, cached_tokens FROM runs"
                " WHERE event_row = ? AND kind = 'agent' ORDER BY id DESC",
                [event_row],
            ).fetchall()
        )
        if found is None:
            return None
        journal = self.conn.execute(
            "SELECT t.call_id, t.tool, t.status, t.arguments, t.result, t.reply, t.idempotency_key"
            " FROM tool_calls t JOIN runs r ON r.id = t.run_id"
            " WHERE r.event_row = ? AND r.kind = 'agent' ORDER BY t.id",
            [event_row],
        ).fetchall()
        return resume_point_of(*found, journal)

    def agent_usage(self, since_hour: str, since_day: str) -> tuple[int, float]:
        """Agent runs started since ``since_hour``, and LLM spend (USD) of every run started since ``since_day``."""
        return agent_usage(self.conn, since_hour, since_day)


def agent_usage(conn: sqlite3.Connection, since_hour: str, since_day: str) -> tuple[int, float]:
    """Agent runs started since ``since_hour``, and LLM spend (USD) of every run started since ``since_day``."""
    runs = conn.execute(
        "SELECT count(*) FROM runs WHERE kind = 'agent' AND started_at >= ?", [since_hour]
    ).fetchone()[0]
    cost = conn.execute(
        "SELECT coalesce(sum(cost_usd), 0) FROM runs WHERE started_at >= ?", [since_day]
    ).fetchone()[0]
    return int(runs), float(cost)
