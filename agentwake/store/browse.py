"""The operator page's lists: events and runs, filtered and paged, newest first; and a run's event.

Written once as views (generators that yield their queries and are sent their rows, as the
PostgreSQL views are); the SQLite store drives them with ``?`` placeholders. Where the two
engines differ (reading the rule out of a decision's JSON) the backend passes its expression.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from agentwake.store.shapes import page_event_view, page_run_view

Rows = list[tuple[Any, ...]]
Query = tuple[str, Sequence[Any]]
View = Generator[Query, Rows, Any]

# How each engine reads a stored decision's rule.
SQLITE_RULE: Final = "json_extract(decision, '$.rule')"
POSTGRES_RULE: Final = "(decision::jsonb ->> 'rule')"


@dataclass(frozen=True, slots=True)
class EventFilter:
    """What the events list shows: every given field must match (None: any)."""

    state: str | None = None
    server: str | None = None
    subscription: str | None = None
    rule: str | None = None


@dataclass(frozen=True, slots=True)
class RunFilter:
    """What the runs list shows: every given field must match (None: any)."""

    status: str | None = None
    server: str | None = None
    subscription: str | None = None


def _matching(*filters: tuple[str, str | None]) -> tuple[str, list[Any]]:
    """A WHERE clause (or "") requiring each (column, value) whose value is given, and its arguments."""
    given = [(column, value) for column, value in filters if value is not None]
    clause = " AND ".join(f"{column} = %s" for column, _ in given)
    return (f" WHERE {clause}" if given else ""), [value for _, value in given]


def event_page(
    filters: EventFilter, offset: int, limit: int, *, rule_sql: str
) -> Generator[Query, Rows, tuple[list[dict[str, Any]], int]]:
    """One page of events matching ``filters``, newest first, and how many match in all."""
    clause, args = _matching(
        ("state", filters.state),
        ("server", filters.server),
        ("subscription", filters.subscription),
        (rule_sql, filters.rule),
    )
    [(total,)] = yield (f"SELECT count(*) FROM events{clause}", args)
    rows = yield (
        "SELECT id, server, subscription, name, event_id, timestamp, received_at, state, attempts, data,"
        f" last_error, decision FROM events{clause} ORDER BY id DESC LIMIT %s OFFSET %s",
        [*args, limit, offset],
    )
    return [page_event_view(r) for r in rows], int(total)


def run_page(
    filters: RunFilter, offset: int, limit: int
) -> Generator[Query, Rows, tuple[list[dict[str, Any]], int]]:
    """One page of runs matching ``filters``, newest first, and how many match in all."""
    clause, args = _matching(
        ("r.status", filters.status), ("e.server", filters.server), ("e.subscription", filters.subscription)
    )
    joined = " FROM runs r JOIN events e ON e.id = r.event_row"
    [(total,)] = yield (f"SELECT count(*){joined}{clause}", args)
    rows = yield (
        "SELECT r.id, e.id, e.event_id, e.server, e.subscription, e.name, r.kind, r.attempt, r.model,"
        f" r.status, r.reason, r.cost_usd, r.started_at, r.duration_ms, r.messages{joined}{clause}"
        " ORDER BY r.id DESC LIMIT %s OFFSET %s",
        [*args, limit, offset],
    )
    return [page_run_view(r) for r in rows], int(total)


def run_event(run_id: int) -> Generator[Query, Rows, int | None]:
    """The row of the event a run was for; None: no such run."""
    rows = yield ("SELECT event_row FROM runs WHERE id = %s", [run_id])
    return int(rows[0][0]) if rows else None


def drive_sync(execute: Any, view: Generator[Query, Rows, Any]) -> Any:
    """Run ``view`` with ``execute(sql, params) -> rows``."""
    try:
        sql, params = next(view)
        while True:
            sql, params = view.send(execute(sql, params))
    except StopIteration as done:
        return done.value


__all__ = [
    "POSTGRES_RULE",
    "SQLITE_RULE",
    "EventFilter",
    "RunFilter",
    "drive_sync",
    "event_page",
    "run_event",
    "run_page",
]
