"""Read-only views for the CLI and the tests: status, inbox, action log, one event, approvals.

Each view is written once, as a generator that yields its queries (SQL and parameters) and is
sent back their rows, then returns the shaped result. ``run_async`` drives one on the store's
pooled async connection, ``run_sync`` on the reader's plain one: the same SQL, the same dicts,
and the same values as the SQLite store's views.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from agentwake.store.pauses import PAUSES_SQL, Pause, pause_of
from agentwake.store.records import final_answer, summary_line
from agentwake.store.shapes import (
    ANSWERS_SQL,
    EVENTS_BY_STATE_SQL,
    LAST_FAILURES_SQL,
    MAX_EVENT_ANSWERS,
    RUNS_BY_STATUS_SQL,
    SERVICE_COLUMNS,
    SUBSCRIPTIONS_SQL,
    UNDECIDED_SQL,
    action_view,
    answer_view,
    call_view,
    event_view,
    gap_view,
    held_view,
    inbox_view,
    run_counts_of,
    run_view,
    service_view,
    state_counts_of,
    subscription_view,
)
from agentwake.store.sqlite.owners import OWNER_COLUMNS

if TYPE_CHECKING:
    import psycopg

T = TypeVar("T")
Rows = list[tuple[Any, ...]]
Query = tuple[str, Sequence[Any]]
View = Generator[Query, Rows, T]


async def run_async(conn: psycopg.AsyncConnection[Any], view: View[T]) -> T:
    try:
        sql, params = next(view)
        while True:
            cur = await conn.execute(sql, params)
            sql, params = view.send(await cur.fetchall())
    except StopIteration as done:
        result: T = done.value
        return result


def run_sync(conn: psycopg.Connection[Any], view: View[T]) -> T:
    try:
        sql, params = next(view)
        while True:
            sql, params = view.send(conn.execute(sql, params).fetchall())
    except StopIteration as done:
        result: T = done.value
        return result


def subscriptions() -> View[list[dict[str, Any]]]:
    rows = yield (SUBSCRIPTIONS_SQL, ())
    return [subscription_view(r) for r in rows]


def run_counts() -> View[dict[str, dict[str, Any]]]:
    """Per subscription: agent runs by status, events by state and the last failure (failed or dead)."""
    runs = yield (RUNS_BY_STATUS_SQL, ())
    states = yield (EVENTS_BY_STATE_SQL, ())
    failures = yield (LAST_FAILURES_SQL, ())
    return run_counts_of(runs, states, failures)


def inbox(limit: int, state: str | None = None) -> View[list[dict[str, Any]]]:
    where, args = ("WHERE state = %s", [state]) if state is not None else ("", [])
    rows = yield (
        "SELECT id, server, subscription, name, event_id, timestamp, received_at, state, attempts, data,"
        f" last_error FROM events {where} ORDER BY id DESC LIMIT %s",
        [*args, limit],
    )
    return [inbox_view(r) for r in rows]


def _summary(messages_text: str) -> str | None:
    """The final answer as one line: the last message, if it is the assistant's text with no tool call."""
    messages = json.loads(messages_text)
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return None
    return summary_line(final_answer(messages))


def actions(limit: int) -> View[list[dict[str, Any]]]:
    """The most recent runs, newest first, one summary each."""
    rows = yield (
        "SELECT r.id, e.event_id, e.server, e.subscription, e.name, r.kind, r.attempt, r.model, r.status,"
        " r.reason, r.steps, r.prompt_tokens, r.completion_tokens, r.cached_tokens, r.cost_usd, r.started_at,"
        " r.duration_ms,"
        " (SELECT count(*) FROM tool_calls t WHERE t.run_id = r.id),"
        " (SELECT count(*) FROM tool_calls t WHERE t.run_id = r.id AND t.status = 'refused'),"
        " (SELECT array_agg(t.tool ORDER BY t.id) FROM tool_calls t WHERE t.run_id = r.id),"
        # The transcript as text: the summary is read from it here (it need not be valid jsonb).
        " r.messages"
        " FROM runs r JOIN events e ON e.id = r.event_row ORDER BY r.id DESC LIMIT %s",
        [limit],
    )
    # One line of at most SUMMARY_CHARS; `show` has the whole answer.
    return [action_view(r, r[-2], _summary(r[-1])) for r in rows]


def find_events(event_id: str, server: str | None = None) -> View[list[dict[str, Any]]]:
    """Stored events with this eventId (one per server at most), with their runs and tool calls."""
    if server is None:
        return (yield from _find_events("event_id = %s", [event_id]))
    return (yield from _find_events("event_id = %s AND server = %s", [event_id, server]))


def event_detail(event_row: int) -> View[dict[str, Any] | None]:
    """One stored event as ``find_events`` shows it."""
    found = yield from _find_events("id = %s", [event_row])
    return found[0] if found else None


def _find_events(where: str, args: list[Any]) -> View[list[dict[str, Any]]]:
    rows = yield (
        "SELECT id, server, subscription, name, event_id, timestamp, received_at, state, attempts, data,"
        " meta, last_error, injection_score, sanitize_report, decision, approved_at, approval_note"
        f" FROM events WHERE {where} ORDER BY id",
        args,
    )
    if not rows:
        return []
    # Every run of these events, then every call of those runs: three queries, not one per row.
    run_rows = yield (
        "SELECT event_row, id, kind, attempt, model, status, reason, decision, system_prompt, user_prompt,"
        " messages, steps, prompt_tokens, completion_tokens, cached_tokens, cost_usd, started_at, finished_at,"
        " duration_ms"
        " FROM runs WHERE event_row = ANY(%s) ORDER BY id",
        [[r[0] for r in rows]],
    )
    runs_of: dict[int, list[dict[str, Any]]] = {}
    calls_of: dict[int, list[dict[str, Any]]] = {}
    for r in run_rows:
        run = run_view(r[1:])
        run["tool_calls"] = calls_of.setdefault(run["run_id"], [])
        runs_of.setdefault(r[0], []).append(run)
    if calls_of:
        for c in (
            yield (
                "SELECT run_id, step, call_id, tool, server, name, arguments, status, result, duration_ms"
                " FROM tool_calls WHERE run_id = ANY(%s) ORDER BY id",
                [list(calls_of)],
            )
        ):
            calls_of[c[0]].append(call_view(c[1:]))
    answers_of: dict[int, list[dict[str, Any]]] = {}
    for a in (
        yield (
            ANSWERS_SQL.format(where=" WHERE a.event_row = ANY(%s)", mark="%s"),
            [[r[0] for r in rows], MAX_EVENT_ANSWERS],
        )
    ):
        answers_of.setdefault(a[1], []).insert(0, answer_view(a))
    events = []
    for r in rows:
        event = event_view(r)
        event["runs"] = runs_of.get(event["id"], [])
        event["answers"] = answers_of.get(event["id"], [])  # after runs, as the SQLite store's
        events.append(event)
    return events


def approvals() -> View[list[dict[str, Any]]]:
    rows = yield (
        "SELECT id, server, subscription, name, event_id, timestamp, received_at, decision, data,"
        " injection_score FROM events WHERE state = 'held' ORDER BY id",
        (),
    )
    return [held_view(r) for r in rows]


def answers(limit: int = 50, event_row: int | None = None) -> View[list[dict[str, Any]]]:
    """The approvals' audit trail, newest first."""
    if event_row is None:
        rows = yield (ANSWERS_SQL.format(where="", mark="%s"), [limit])
    else:
        rows = yield (ANSWERS_SQL.format(where=" WHERE a.event_row = %s", mark="%s"), [event_row, limit])
    return [answer_view(r) for r in rows]


def gaps(subscription: str | None = None) -> View[list[dict[str, Any]]]:
    where, args = ("WHERE subscription = %s", [subscription]) if subscription is not None else ("", [])
    rows = yield (
        f"SELECT subscription, server, event, detected_at, cursor_before, cursor_after FROM gaps {where}"
        " ORDER BY id",
        args,
    )
    return [gap_view(r) for r in rows]


def event_ids(subscription: str | None = None) -> View[list[str]]:
    where, args = ("WHERE subscription = %s", [subscription]) if subscription is not None else ("", [])
    rows = yield (f"SELECT event_id FROM events {where} ORDER BY id", args)
    return [r[0] for r in rows]


def undecided(subscription: str, up_to: int) -> View[int]:
    rows = yield (UNDECIDED_SQL, [subscription, up_to])
    return int(rows[0][0]) if rows else 0


def oldest_pending_at() -> View[str | None]:
    """When the oldest event still pending was stored (ISO), or None when none is."""
    rows = yield ("SELECT min(received_at) FROM events WHERE state = 'pending'", ())
    return str(rows[0][0]) if rows and rows[0][0] is not None else None


def state_counts() -> View[dict[str, int]]:
    return state_counts_of((yield ("SELECT state, count(*) FROM events GROUP BY state", ())))


def services(limit: int = 5) -> View[list[dict[str, Any]]]:
    """The most recent starts of the service, newest first."""
    rows = yield (f"SELECT {', '.join(SERVICE_COLUMNS)} FROM service ORDER BY id DESC LIMIT %s", [limit])
    return [service_view(r) for r in rows]


def subscription_owners() -> View[list[dict[str, Any]]]:
    """Each subscription's owner, fence and lease end (a lease in the past is free to take)."""
    rows = yield (f"SELECT {', '.join(OWNER_COLUMNS)} FROM subscription_owners ORDER BY subscription", ())
    return [dict(zip(OWNER_COLUMNS, r, strict=True)) for r in rows]


def pauses() -> View[list[Pause]]:
    rows = yield (PAUSES_SQL, [])
    return [pause_of(row) for row in rows]


def storage() -> View[dict[str, Any]]:
    """The database's size (``pg_database_size``) and the oldest kept event's receipt time."""
    rows = yield (
        "SELECT pg_database_size(current_database()), (SELECT received_at FROM events ORDER BY id LIMIT 1)",
        (),
    )
    return {"backend": "postgresql", "size_bytes": int(rows[0][0]), "oldest_event_at": rows[0][1]}
