"""The read-only views' SQL and row shapes that both backends share, so `status` prints the same dicts
whichever store it reads (the SQL here is plain enough for SQLite and PostgreSQL alike)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from agentwake.store.records import InboxEvent

# A subscription's events waiting for a decision, counted no further than a bound (the claim index
# serves it; the bound keeps a huge backlog from costing a full count). Parameters: name, bound.
UNDECIDED_SQL: Final = (
    "SELECT count(*) FROM (SELECT 1 FROM events WHERE subscription = %s"
    " AND state IN ('pending', 'processing') LIMIT %s) AS waiting"
)

SUBSCRIPTIONS_SQL: Final = (
    "SELECT s.name, s.server, s.event, s.arguments, s.mode, s.cursor, s.last_poll_at, s.events_received,"
    " s.duplicates, s.gaps, s.status, s.last_error, s.cursor_updated_at, s.stream_errors,"
    " w.webhook_id, w.url, w.refresh_before, w.no_expiry, w.delivery_status, w.refreshes,"
    " w.last_refresh_at, w.pending_secret IS NOT NULL, w.previous_until, s.rejected, s.recent_errors"
    " FROM subscriptions s LEFT JOIN webhooks w ON w.subscription = s.name ORDER BY s.name"
)

# What a claim returns of an event (InboxEvent); both backends select these and shape rows with
# inbox_event.
CLAIMED_COLUMNS: Final = (
    "id, server, subscription, name, event_id, timestamp, data, attempts, decision, approved_at,"
    " approval_note"
)


def inbox_event(row: Sequence[Any]) -> InboxEvent:
    """A row of CLAIMED_COLUMNS as the worker's InboxEvent."""
    return InboxEvent(
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        row[5],
        json.loads(row[6]),
        row[7],
        json.loads(row[8]) if row[8] else None,
        bool(row[9]),
        row[10],
    )


ANSWER_COLUMNS: Final = (
    "a.id, a.event_row, e.event_id, e.server, e.subscription, a.answer, a.who, a.via, a.address, a.at,"
    " a.rule, a.tools, a.authority, a.note"
)
# Newest first; the placeholder style ("?" or "%s") is the backend's.
ANSWERS_SQL: Final = (
    f"SELECT {ANSWER_COLUMNS} FROM answers a JOIN events e ON e.id = a.event_row{{where}} ORDER BY a.id DESC"
    " LIMIT {mark}"
)


def answer_view(r: Sequence[Any]) -> dict[str, Any]:
    """One row of ANSWERS_SQL: one approval or denial, who gave it, from where, when, granting what."""
    return {
        "id": r[0],
        "row": r[1],
        "event_id": r[2],
        "server": r[3],
        "subscription": r[4],
        "answer": r[5],
        "who": r[6],
        "via": r[7],
        "address": r[8],
        "at": r[9],
        "rule": r[10],
        "tools": json.loads(r[11]) if r[11] else [],
        "authority": json.loads(r[12]) if r[12] else None,
        "note": r[13],
    }


def answer_values(
    decision: dict[str, Any] | None,
    *,
    approve: bool,
    note: str | None,
    by: Any,
    tools: Sequence[str] | None,
    at: str,
) -> tuple[Any, ...]:
    """The audit record's values after (event_row): answer, who, via, address, at, rule, tools, authority, note."""
    decision = decision or {}
    rule = decision.get("rule")
    if tools is None:
        granted = decision.get("rule_tools")
        tools = granted if isinstance(granted, list) else []
    authority = decision.get("authority")
    lines = [str(line) for line in authority] if isinstance(authority, list) else None
    return (
        "approved" if approve else "denied",
        by.who if by is not None else "unrecorded",
        by.via if by is not None else "unrecorded",
        by.address if by is not None else None,
        at,
        str(rule) if rule is not None else None,
        json.dumps([str(t) for t in tools], ensure_ascii=False),
        json.dumps(lines, ensure_ascii=False) if lines is not None else None,
        note,
    )


def subscription_view(r: Sequence[Any]) -> dict[str, Any]:
    """One row of SUBSCRIPTIONS_SQL as `status --json` prints it."""
    return {
        "subscription": r[0],
        "server": r[1],
        "event": r[2],
        "arguments": json.loads(r[3]),
        "mode": r[4],
        "cursor": r[5],
        # The last poll, stream frame or webhook delivery that stored something.
        "last_activity_at": r[6],
        "last_poll_at": r[6],
        "events_received": r[7],
        "duplicates": r[8],
        "gaps": r[9],
        "status": r[10],
        "last_error": r[11],
        "cursor_updated_at": r[12],
        "stream_errors": r[13],
        "rejected": r[23],
        "recent_errors": json.loads(r[24]) if r[24] else [],
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
