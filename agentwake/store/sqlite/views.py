"""Read-only views for the CLI and the tests: status, inbox, action log, one event, approvals."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, Final

from agentwake.store.records import summary_line
from agentwake.store.shapes import (
    ANSWERS_SQL,
    EVENTS_BY_STATE_SQL,
    LAST_FAILURES_SQL,
    MAX_EVENT_ANSWERS,
    RUNS_BY_STATUS_SQL,
    SUBSCRIPTIONS_SQL,
    UNDECIDED_SQL,
    action_view,
    answer_view,
    call_view,
    event_view,
    gap_view,
    held_view,
    inbox_view,
    json_or_none,
    run_counts_of,
    run_view,
    state_counts_of,
    subscription_view,
)
from agentwake.store.sqlite.base import SqliteBase

AUTO_VACUUM_MODES: Final = {0: "none", 1: "full", 2: "incremental"}


class Views(SqliteBase):
    def subscriptions(self) -> list[dict[str, Any]]:
        return [subscription_view(r) for r in self.conn.execute(SUBSCRIPTIONS_SQL).fetchall()]

    def run_counts(self) -> dict[str, dict[str, Any]]:
        """Per subscription: agent runs by status, events by state and the last failure (failed or dead)."""
        execute = self.conn.execute
        return run_counts_of(
            execute(RUNS_BY_STATUS_SQL).fetchall(),
            execute(EVENTS_BY_STATE_SQL).fetchall(),
            execute(LAST_FAILURES_SQL).fetchall(),
        )

    def inbox(self, limit: int, *, state: str | None = None) -> list[dict[str, Any]]:
        where, args = "", []
        if state is not None:
            where, args = "WHERE state = ?", [state]
        rows = self.conn.execute(
            "SELECT id, server, subscription, name, event_id, timestamp, received_at, state, attempts, data,"
            f" last_error FROM events {where} ORDER BY id DESC LIMIT ?",
            [*args, limit],
        ).fetchall()
        return [inbox_view(r) for r in rows]

    def actions(self, limit: int) -> list[dict[str, Any]]:
        """The most recent runs, newest first, one summary each."""
        rows = self.conn.execute(
            "SELECT r.id, e.event_id, e.server, e.subscription, e.name, r.kind, r.attempt, r.model, r.status,"
            " r.reason, r.steps, r.prompt_tokens, r.completion_tokens, r.cached_tokens, r.cost_usd, r.started_at,"
            " r.duration_ms,"
            " (SELECT count(*) FROM tool_calls t WHERE t.run_id = r.id),"
            " (SELECT count(*) FROM tool_calls t WHERE t.run_id = r.id AND t.status = 'refused'),"
            " (SELECT json_group_array(tool) FROM (SELECT t.tool FROM tool_calls t WHERE t.run_id = r.id"
            " ORDER BY t.id)),"
            # The final answer: the last message, if it is the assistant's text with no tool call.
            " CASE WHEN json_extract(r.messages, '$[#-1].role') = 'assistant'"
            " AND json_array_length(coalesce(json_extract(r.messages, '$[#-1].tool_calls'), '[]')) = 0"
            " THEN json_extract(r.messages, '$[#-1].content') END"
            " FROM runs r JOIN events e ON e.id = r.event_row ORDER BY r.id DESC LIMIT ?",
            [limit],
        ).fetchall()
        return [action_view(r, json_or_none(r[-2]), _answer_line(r[-1])) for r in rows]

    def find_events(self, event_id: str, server: str | None = None) -> list[dict[str, Any]]:
        """Stored events with this eventId (one per server at most), with their runs and tool calls."""
        where, args = "event_id = ?", [event_id]
        if server is not None:
            where, args = where + " AND server = ?", [*args, server]
        return self._find_events(where, args)

    def event_detail(self, event_row: int) -> dict[str, Any] | None:
        """One stored event as ``find_events`` shows it."""
        found = self._find_events("id = ?", [event_row])
        return found[0] if found else None

    def _find_events(self, where: str, args: list[Any]) -> list[dict[str, Any]]:
        rows = self.conn.execute(
            "SELECT id, server, subscription, name, event_id, timestamp, received_at, state, attempts, data,"
            f" meta, last_error, injection_score, sanitize_report, decision, approved_at, approval_note"
            f" FROM events WHERE {where} ORDER BY id",
            args,
        ).fetchall()
        events = []
        for r in rows:
            event = event_view(r)
            event["runs"] = self._runs_of(event["id"])
            event["answers"] = self.answers(MAX_EVENT_ANSWERS, event["id"])[::-1]
            events.append(event)
        return events

    def _runs_of(self, event_row: int) -> list[dict[str, Any]]:
        rows = self.conn.execute(
            "SELECT id, kind, attempt, model, status, reason, decision, system_prompt, user_prompt, messages, steps,"
            " prompt_tokens, completion_tokens, cached_tokens, cost_usd, started_at, finished_at, duration_ms"
            " FROM runs WHERE event_row = ? ORDER BY id",
            [event_row],
        ).fetchall()
        runs = []
        for r in rows:
            run = run_view(r)
            run["tool_calls"] = self._calls_of(run["run_id"])
            runs.append(run)
        return runs

    def _calls_of(self, run_id: int) -> list[dict[str, Any]]:
        calls = self.conn.execute(
            "SELECT step, call_id, tool, server, name, arguments, status, result, duration_ms"
            " FROM tool_calls WHERE run_id = ? ORDER BY id",
            [run_id],
        ).fetchall()
        return [call_view(c) for c in calls]

    def approvals(self) -> list[dict[str, Any]]:
        rows = self.conn.execute(
            "SELECT id, server, subscription, name, event_id, timestamp, received_at, decision, data, injection_score"
            " FROM events WHERE state = 'held' ORDER BY id"
        ).fetchall()
        return [held_view(r) for r in rows]

    def answers(self, limit: int = 50, event_row: int | None = None) -> list[dict[str, Any]]:
        """The approvals' audit trail, newest first."""
        if event_row is None:
            rows = self.conn.execute(ANSWERS_SQL.format(where="", mark="?"), [limit]).fetchall()
        else:
            rows = self.conn.execute(
                ANSWERS_SQL.format(where=" WHERE a.event_row = ?", mark="?"), [event_row, limit]
            ).fetchall()
        return [answer_view(r) for r in rows]

    def gaps(self, subscription: str | None = None) -> list[dict[str, Any]]:
        where, args = "", []
        if subscription is not None:
            where, args = "WHERE subscription = ?", [subscription]
        rows = self.conn.execute(
            f"SELECT subscription, server, event, detected_at, cursor_before, cursor_after FROM gaps {where}"
            " ORDER BY id",
            args,
        ).fetchall()
        return [gap_view(r) for r in rows]

    def event_ids(self, subscription: str | None = None) -> list[str]:
        where, args = "", []
        if subscription is not None:
            where, args = "WHERE subscription = ?", [subscription]
        return [
            r[0]
            for r in self.conn.execute(f"SELECT event_id FROM events {where} ORDER BY id", args).fetchall()
        ]

    def undecided(self, subscription: str, up_to: int) -> int:
        row = self.conn.execute(UNDECIDED_SQL.replace("%s", "?"), [subscription, up_to]).fetchone()
        return int(row[0]) if row else 0

    def oldest_pending_at(self) -> str | None:
        """When the oldest event still pending was stored (ISO), or None when none is."""
        row = self.conn.execute("SELECT min(received_at) FROM events WHERE state = 'pending'").fetchone()
        return str(row[0]) if row and row[0] is not None else None

    def state_counts(self) -> dict[str, int]:
        return state_counts_of(
            self.conn.execute("SELECT state, count(*) FROM events GROUP BY state").fetchall()
        )

    def storage(self) -> dict[str, Any]:
        """The store's size and its oldest kept event, for ``status``."""
        return sqlite_storage(self.conn, self.path)


def _answer_line(answer: Any) -> str | None:
    """The final answer the SQL picked out, as one line of at most SUMMARY_CHARS (`show` has it whole)."""
    return summary_line(answer) if isinstance(answer, str) and answer.strip() else None


def wal_path(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def sqlite_storage(conn: sqlite3.Connection, path: Path) -> dict[str, Any]:
    """The store's size on disk (the file and its WAL), what is free inside it, and the oldest
    kept event's receipt time (ids follow receipt: the first row's)."""
    page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
    free = int(conn.execute("PRAGMA freelist_count").fetchone()[0]) * page_size
    mode = AUTO_VACUUM_MODES.get(int(conn.execute("PRAGMA auto_vacuum").fetchone()[0]), "unknown")
    row = conn.execute("SELECT received_at FROM events ORDER BY id LIMIT 1").fetchone()
    main, wal = file_size(path), file_size(wal_path(path))
    return {
        "backend": "sqlite",
        "size_bytes": main + wal,
        "file_bytes": main,
        "wal_bytes": wal,
        "free_bytes": free,
        "auto_vacuum": mode,
        "oldest_event_at": None if row is None else row[0],
    }
