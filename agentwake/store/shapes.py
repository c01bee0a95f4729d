"""The read-only views' SQL and row shapes that both backends share, so `status` prints the same dicts
whichever store it reads (the SQL here is plain enough for SQLite and PostgreSQL alike). Where a
view's SQL differs between the engines, each backend keeps its own and shapes the rows here."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Final

from agentwake.store.records import EVENT_STATES, InboxEvent, final_answer, summary_line

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

# Whether a claim could find anything at all, in both backends: a seek in events_pending. When idle
# (the usual case) it answers for the claim's query, which visits every subscription's turn (6 ms
# at 10,000 subscriptions in SQLite).
ANY_CLAIMABLE_SQL: Final = "SELECT EXISTS (SELECT 1 FROM events WHERE state IN ('pending', 'processing'))"
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


# The answers shown with events (each held event has one, unless held again after a retry).
MAX_EVENT_ANSWERS: Final = 1000

SERVICE_COLUMNS: Final = (
    "id",
    "pid",
    "host",
    "version",
    "started_at",
    "heartbeat_at",
    "heartbeat_s",
    "stopped_at",
    "paused",
)

# The keys of each view's dicts, in the order of the columns the backends select for it.
_RECEIVED: Final = ("id", "server", "subscription", "event", "event_id", "timestamp", "received_at")
INBOX_KEYS: Final = (*_RECEIVED, "state", "attempts", "data", "last_error")
EVENT_KEYS: Final = (
    *_RECEIVED,
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
HELD_KEYS: Final = (*_RECEIVED, "decision", "data", "injection_score")
# A run as listed with its event's identity.
_RUN_OF_EVENT: Final = (
    "event_id",
    "server",
    "subscription",
    "event",
    "kind",
    "attempt",
    "model",
    "status",
    "reason",
)
_USAGE: Final = ("steps", "prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd", "started_at")
ACTION_KEYS: Final = (
    "run_id",
    *_RUN_OF_EVENT,
    *_USAGE,
    "duration_ms",
    "tool_calls",
    "refused",
    "tools",
    "summary",
)
PAGE_RUN_KEYS: Final = (
    "run_id",
    "event_row",
    *_RUN_OF_EVENT,
    "cost_usd",
    "started_at",
    "duration_ms",
    "messages",
)
RUN_KEYS: Final = (
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
    *_USAGE,
    "finished_at",
    "duration_ms",
)
CALL_KEYS: Final = (
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
GAP_KEYS: Final = ("subscription", "server", "event", "detected_at", "cursor_before", "cursor_after")


def json_or_none(text: str | None) -> Any:
    """A stored JSON column that may be empty (NULL or '')."""
    return json.loads(text) if text else None


def inbox_view(r: Sequence[Any]) -> dict[str, Any]:
    """One row of INBOX_KEYS' columns as `inbox` lists it."""
    event = dict(zip(INBOX_KEYS, r, strict=True))
    event["data"] = json.loads(event["data"])
    return event


def page_event_view(r: Sequence[Any]) -> dict[str, Any]:
    """One row of INBOX_KEYS' columns and the decision: an event of the operator page's list."""
    event = inbox_view(r[:-1])
    event["decision"] = json_or_none(r[-1])
    return event


def page_run_view(r: Sequence[Any]) -> dict[str, Any]:
    """One row of PAGE_RUN_KEYS' columns: a run of the operator page's list, its transcript summed up."""
    run = dict(zip(PAGE_RUN_KEYS, r, strict=True))
    messages = json.loads(run.pop("messages") or "[]")
    run["summary"] = summary_line(final_answer(messages))
    return run


def action_view(r: Sequence[Any], tools: list[str] | None, summary: str | None) -> dict[str, Any]:
    """One row of ACTION_KEYS' columns, with the tools and one-line summary the backend read from its own."""
    action = dict(zip(ACTION_KEYS, r, strict=True))
    action["tools"] = tools or []
    action["summary"] = summary
    return action


def event_view(r: Sequence[Any]) -> dict[str, Any]:
    """One row of EVENT_KEYS' columns as `show` prints it; the caller adds its "runs", then its "answers"."""
    event = dict(zip(EVENT_KEYS, r, strict=True))
    event["data"] = json.loads(event["data"])
    event["sanitize_report"] = json_or_none(event["sanitize_report"])
    event["meta"] = json_or_none(event["meta"])
    event["decision"] = json_or_none(event["decision"])
    return event


def run_view(r: Sequence[Any]) -> dict[str, Any]:
    """One row of RUN_KEYS' columns, with its final answer's summary; the caller adds its "tool_calls"."""
    run = dict(zip(RUN_KEYS, r, strict=True))
    run["decision"] = json.loads(run["decision"])
    run["messages"] = json.loads(run["messages"])
    run["summary"] = summary_line(final_answer(run["messages"]))
    return run


def call_view(r: Sequence[Any]) -> dict[str, Any]:
    """One row of CALL_KEYS' columns."""
    call = dict(zip(CALL_KEYS, r, strict=True))
    call["arguments"] = json_or_none(call["arguments"])
    return call


def held_view(r: Sequence[Any]) -> dict[str, Any]:
    """One row of HELD_KEYS' columns: an event waiting for approval."""
    event = dict(zip(HELD_KEYS, r, strict=True))
    event["decision"] = json_or_none(event["decision"])
    event["data"] = json.loads(event["data"])
    return event


def gap_view(r: Sequence[Any]) -> dict[str, Any]:
    return dict(zip(GAP_KEYS, r, strict=True))


def service_view(r: Sequence[Any]) -> dict[str, Any]:
    return dict(zip(SERVICE_COLUMNS, r, strict=True))


# ``run_counts``' three queries, the same text in both backends.
RUNS_BY_STATUS_SQL: Final = (
    "SELECT e.subscription, r.status, count(*) FROM runs r JOIN events e ON e.id = r.event_row"
    " WHERE r.kind = 'agent' GROUP BY e.subscription, r.status"
)
EVENTS_BY_STATE_SQL: Final = "SELECT subscription, state, count(*) FROM events GROUP BY subscription, state"
LAST_FAILURES_SQL: Final = (
    "SELECT subscription, last_error FROM events WHERE id IN"
    " (SELECT max(id) FROM events WHERE state IN ('failed', 'dead') GROUP BY subscription)"
)


def run_counts_of(
    runs: Iterable[Sequence[Any]], states: Iterable[Sequence[Any]], failures: Iterable[Sequence[Any]]
) -> dict[str, dict[str, Any]]:
    """The rows of those three queries as ``run_counts``: per subscription, agent runs by status,
    events by state and the last failure (failed or dead)."""
    counts: dict[str, dict[str, Any]] = {}
    for sub, status, count in runs:
        counts.setdefault(sub, {})[f"runs_{status}"] = count
    for sub, state, count in states:
        counts.setdefault(sub, {})[f"events_{state}"] = count
    for sub, error in failures:
        counts.setdefault(sub, {})["last_failure"] = error
    return counts


def state_counts_of(rows: Iterable[Sequence[Any]]) -> dict[str, int]:
    """(state, count) rows as a count for every state, the absent ones 0."""
    counts: dict[str, int] = dict.fromkeys(EVENT_STATES, 0)
    for state, count in rows:
        counts[state] = count
    return counts
