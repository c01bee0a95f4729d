"""The action log: agent runs and their tool calls; a run completes with its event in one transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentwake.clock import now_iso
from agentwake.jsontext import encode_json
from agentwake.store.records import EventVerdict, RunKind, RunProgress, RunStatus, ToolCallRecord
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
            cur = self.conn.execute(
                "INSERT INTO runs (event_row, kind, attempt, model, status, decision, system_prompt, user_prompt,"
                " started_at) VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?)",
                [
                    event_row,
                    kind,
                    attempt,
                    model,
                    encode_json(decision),
                    system_prompt,
                    user_prompt,
                    now_iso(),
                ],
            )
            return int(cur.lastrowid or 0)

    def _write_progress(self, run_id: int, progress: RunProgress) -> None:
        self.conn.execute(
            "UPDATE runs SET messages = ?, steps = ?, prompt_tokens = ?, completion_tokens = ?, cost_usd = ?"
            " WHERE id = ?",
            [
                encode_json(progress.messages),
                progress.steps,
                progress.prompt_tokens,
                progress.completion_tokens,
                progress.cost_usd,
                run_id,
            ],
        )

    def record_progress(self, run_id: int, progress: RunProgress, calls: Sequence[ToolCallRecord]) -> None:
        with self.transaction():
            self._write_progress(run_id, progress)
            now = now_iso()
            self.conn.executemany(
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
                        encode_json(c.arguments),
                        c.status,
                        c.result,
                        c.duration_ms,
                        now,
                    )
                    for c in calls
                ],
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
    ) -> None:
        """Close a run and, in the same transaction, move its event (exactly-once: done iff completed)."""
        now = now_iso()
        with self.transaction():
            self._write_progress(run_id, progress)
            self.conn.execute(
                "UPDATE runs SET status = ?, reason = ?, finished_at = ?, duration_ms = ? WHERE id = ?",
                [status, reason, now, duration_ms, run_id],
            )
            if verdict is not None:
                self.conn.execute(
                    "UPDATE events SET state = ?, last_error = ?, available_at = ?, state_changed_at = ?"
                    " WHERE id = (SELECT event_row FROM runs WHERE id = ?)",
                    [verdict.state, verdict.error, verdict.retry_at, now, run_id],
                )
                if verdict.state != "pending":
                    # The events batched behind this one end with it (they stay batched if it goes again).
                    self.conn.execute(
                        "UPDATE events SET state = ?, last_error = ?, state_changed_at = ?"
                        " WHERE state = 'batched' AND batch_leader = (SELECT event_row FROM runs WHERE id = ?)",
                        [verdict.state, verdict.error, now, run_id],
                    )
