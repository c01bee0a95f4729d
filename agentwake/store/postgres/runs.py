"""The action log: agent runs and their tool calls; a run completes with its event in one transaction."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import psycopg

from agentwake.clock import now_iso
from agentwake.errors import LeaseLost, StoreError
from agentwake.jsontext import encode_json
from agentwake.store.postgres.base import PostgresBase
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


def merge_patch(target: Any, patch: Any) -> Any:
    """``patch`` applied to ``target`` as a JSON merge patch (RFC 7396), as SQLite's json_patch does."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


async def _write_progress(conn: psycopg.AsyncConnection[Any], run_id: int, progress: RunProgress) -> None:
    await conn.execute(
        "UPDATE runs SET messages = %s, steps = %s, prompt_tokens = %s, completion_tokens = %s, cost_usd = %s,"
        " cached_tokens = %s"
        " WHERE id = %s",
        [*progress_values(progress), run_id],
    )


class ActionLog(PostgresBase):
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
    ) -> int:
        async with self.transaction() as conn:
            if sanitize_report is not None and kind == "agent":
                cur = await conn.execute("SELECT decision FROM events WHERE id = %s FOR UPDATE", [event_row])
                row = await cur.fetchone()
                # The policy's record (the rule's tools, prompt, batch) stays: a retry resumes from it.
                stored = row[0] if row is not None else None
                merged = decision if stored is None else merge_patch(decision, json.loads(stored))
                await conn.execute(
                    "UPDATE events SET injection_score = %s, sanitize_report = %s, decision = %s WHERE id = %s",
                    [
                        sanitize_report.get("injection_score"),
                        encode_json(sanitize_report),
                        encode_json(merged),
                        event_row,
                    ],
                )
            started = now_iso()
            cur = await conn.execute(
                "INSERT INTO runs (event_row, kind, attempt, model, status, decision, system_prompt, user_prompt,"
                " started_at) VALUES (%s, %s, %s, %s, 'running', %s, %s, %s, %s) RETURNING id",
                [event_row, kind, attempt, model, encode_json(decision), system_prompt, user_prompt, started],
            )
            created = await cur.fetchone()
            assert created is not None
            return int(created[0])

    async def record_progress(
        self, run_id: int, progress: RunProgress, calls: Sequence[ToolCallRecord]
    ) -> None:
        async with self.transaction() as conn:
            await _write_progress(conn, run_id, progress)
            now = now_iso()
            if not calls:
                return
            async with conn.cursor() as cur:
                await cur.executemany(
                    "INSERT INTO tool_calls (run_id, step, call_id, tool, server, name, arguments, status,"
                    " result, duration_ms, at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    [tool_call_values(run_id, c, now) for c in calls],
                )

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
        """Close a run and, in the same transaction, move its event (exactly-once: done iff completed).

        False when the run no longer held its event (its lease lapsed and the event was claimed again).
        """
        now = now_iso()
        async with self.transaction() as conn:
            # The event is locked first: no claim, renewal or flow gate moves it while this decides.
            cur = await conn.execute(
                "SELECT e.id, e.state, e.attempts, r.attempt FROM runs r JOIN events e ON e.id = r.event_row"
                " WHERE r.id = %s FOR UPDATE OF e",
                [run_id],
            )
            held = await cur.fetchone()
            await _write_progress(conn, run_id, progress)
            await conn.execute(
                "UPDATE runs SET status = %s, reason = %s, finished_at = %s, duration_ms = %s WHERE id = %s",
                [status, reason, now, duration_ms, run_id],
            )
            if verdict is None:
                return True
            # Only while this run still holds the event's lease (the claim that started it): a run
            # whose lease lapsed and whose event was claimed again must not move the event.
            if held is None or held[1] != "processing" or held[2] != held[3]:
                await conn.execute(
                    "UPDATE runs SET status = 'interrupted', reason = %s WHERE id = %s", [LEASE_LOST, run_id]
                )
                return False
            event_row = held[0]
            await conn.execute(
                "UPDATE events SET state = %s, last_error = %s, available_at = %s, state_changed_at = %s,"
                " lease_until = NULL, attempts = attempts - %s WHERE id = %s",
                [*verdict_values(verdict, now), event_row],
            )
            if verdict.state != "pending":
                # The events batched behind this one end with it (they stay batched if it goes again).
                await conn.execute(
                    "UPDATE events SET state = %s, last_error = %s, state_changed_at = %s"
                    " WHERE state = 'batched' AND batch_leader = %s",
                    [verdict.state, verdict.error, now, event_row],
                )
        return True

    # ---- the tool-call journal ---------------------------------------------------------------------

    async def journal_tool_call(
        self, run_id: int, call: ToolCallRecord, idempotency_key: str, *, now: str | None = None
    ) -> int:
        """Write a tool call as 'sent' before it goes out; ``settle_tool_call`` records what came back.

        Fenced on the run's claim, in the same transaction: the event is locked first (no claim or
        renewal moves it meanwhile), and unless the run still holds it (``claim_lost``, its lease
        judged at ``now``), nothing is written and ``LeaseLost`` is raised.
        """
        async with self.transaction() as conn:
            cur = await conn.execute(
                CLAIM_HELD_SQL + "%s FOR UPDATE OF e",
                [run_id],
            )
            held = await cur.fetchone()
            if held is None:
                raise StoreError(f"no run {run_id} to journal a tool call of")
            lost = claim_lost_row(held, now)
            if lost is not None:
                raise LeaseLost(run_id, lost)
            cur = await conn.execute(
                "INSERT INTO tool_calls (run_id, step, call_id, tool, server, name, arguments, status,"
                " idempotency_key, at) VALUES (%s, %s, %s, %s, %s, %s, %s, 'sent', %s, %s) RETURNING id",
                journal_values(run_id, call, idempotency_key, now_iso()),
            )
            created = await cur.fetchone()
            assert created is not None
            return int(created[0])

    async def settle_tool_call(
        self, call_row: int, *, status: ToolCallStatus, result: str | None, reply: str, duration_ms: int
    ) -> None:
        async with self.transaction() as conn:
            await conn.execute(
                "UPDATE tool_calls SET status = %s, result = %s, reply = %s, duration_ms = %s WHERE id = %s",
                [status, result, reply, duration_ms, call_row],
            )

    async def adopt_run(
        self, run_id: int, from_run: int, call_ids: Sequence[str], progress: RunProgress
    ) -> None:
        """A run that goes on from ``from_run`` takes over its transcript and the journal of the calls
        still to answer (``call_ids``), in one transaction: if it stops too, the next run finds all
        it needs in this one. Each call's row is the best any agent run of the event has for it
        (``journal_of_event``: settled first, then the newest); settled ones are copied as 'reused'."""
        async with self.transaction() as conn:
            await _write_progress(conn, run_id, progress)
            await conn.execute(
                "INSERT INTO tool_calls (run_id, step, call_id, tool, server, name, arguments, status, result,"
                " duration_ms, at, idempotency_key, reply)"
                " SELECT %s, step, call_id, tool, server, name, arguments,"
                " CASE WHEN status IN ('ok', 'error') THEN 'reused' ELSE status END, result, duration_ms, at,"
                " idempotency_key, reply FROM (SELECT t.*, row_number() OVER (PARTITION BY t.call_id"
                " ORDER BY t.status IN ('ok', 'error', 'reused') DESC, t.id DESC) AS pick"
                " FROM tool_calls t JOIN runs r ON r.id = t.run_id"
                " WHERE r.event_row = (SELECT event_row FROM runs WHERE id = %s) AND r.kind = 'agent'"
                " AND r.id <> %s AND t.call_id = ANY(%s::text[])) AS best"
                " WHERE pick = 1 ORDER BY id",
                [run_id, from_run, run_id, list(call_ids)],
            )

    async def resume_point(self, event_row: int) -> ResumePoint | None:
        """Where the event's agent runs got to: the newest one that got as far as an LLM answer.

        That run's stored transcript, and the journal of every agent run of the event
        (``journal_of_event``): a rerun goes on from there instead of starting over, so calls
        already made, by that run or by any earlier one, are not made again.
        """
        async with self.transaction() as conn:
            cur = await conn.execute(
                "SELECT id, messages, steps, prompt_tokens, completion_tokens, cost_usd, cached_tokens FROM runs"
                " WHERE event_row = %s AND kind = 'agent' ORDER BY id DESC",
                [event_row],
            )
            found = answered_run(await cur.fetchall())
            if found is None:
                return None
            cur = await conn.execute(
                "SELECT t.call_id, t.tool, t.status, t.arguments, t.result, t.reply, t.idempotency_key"
                " FROM tool_calls t JOIN runs r ON r.id = t.run_id"
                " WHERE r.event_row = %s AND r.kind = 'agent' ORDER BY t.id",
                [event_row],
            )
            journal = await cur.fetchall()
        return resume_point_of(*found, journal)

    async def agent_usage(self, since_hour: str, since_day: str) -> tuple[int, float]:
        """Agent runs started since ``since_hour``, and LLM spend (USD) of every run started since ``since_day``."""
        async with self.transaction() as conn:
            return await agent_usage(conn, since_hour, since_day)


async def agent_usage(
    conn: psycopg.AsyncConnection[Any], since_hour: str, since_day: str
) -> tuple[int, float]:
    """Agent runs started since ``since_hour``, and LLM spend (USD) of every run started since ``since_day``."""
    cur = await conn.execute(
        "SELECT (SELECT count(*) FROM runs WHERE kind = 'agent' AND started_at >= %s),"
        " (SELECT coalesce(sum(cost_usd), 0) FROM runs WHERE started_at >= %s)",
        [since_hour, since_day],
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), float(row[1])
