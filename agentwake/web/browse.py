"""The operator's lists and detail pages: events and runs, filtered and paged, newest first; the
page of one event (its data, decision, approval record and every run) and of one run.

    GET /events?state=held&server=S&subscription=N&rule=R&page=2   (Accept: application/json: JSON)
    GET /events/{row}
    GET /runs?status=completed&server=S&subscription=N&page=2
    GET /runs/{id}

A filter value that cannot match anything sensible (an unknown state, a page that is not a
positive number, an unknown parameter, a value too long or with control characters) is a 400
saying which, never a 500. Everything shown is made safe by agentwake.web.pages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Final, get_args
from urllib.parse import urlencode

from aiohttp import web

from agentwake.store.browse import EventFilter, RunFilter
from agentwake.store.records import EVENT_STATES, RunStatus
from agentwake.web.pages import TEMPLATES, event_shown, recent_event, recent_run, shown

if TYPE_CHECKING:
    from agentwake.web.app import Caller, Endpoint

PAGE_SIZE: Final = 50
MAX_PAGE: Final = 1_000_000
# A filter value longer than this matches no stored name.
FILTER_CHARS: Final = 200
RUN_STATUSES: Final = get_args(RunStatus)
# A row or run id beyond this is no row (SQLite's integers are 64-bit).
MAX_ID: Final = 2**62


@dataclass(frozen=True, slots=True)
class Paging:
    number: int
    pages: int
    total: int
    prev: str | None
    next: str | None


class BadQuery(ValueError):
    """A query parameter the list cannot take; the message says which and why."""


def parse_query(query: Mapping[str, str], keys: tuple[str, ...]) -> tuple[dict[str, str | None], int]:
    """The filters ``keys`` (None: not given) and the page number of a list's query; BadQuery."""
    multi = getattr(query, "getall", None)
    found: dict[str, str | None] = dict.fromkeys(keys)
    page = 1
    for key in query:
        if key not in (*keys, "page"):
            raise BadQuery(
                f"unknown parameter {shown(key, 40)!r}: this list takes {', '.join((*keys, 'page'))}"
            )
        if multi is not None and len(multi(key)) > 1:
            raise BadQuery(f"{key} is given more than once")
        value = query[key].strip()
        if len(value) > FILTER_CHARS or not value.isprintable():
            raise BadQuery(f"{key} must be printable text of at most {FILTER_CHARS} characters")
        if key == "page":
            if value:
                if not value.isdigit() or not 1 <= int(value) <= MAX_PAGE:
                    raise BadQuery(f"page must be a whole number from 1 to {MAX_PAGE}")
                page = int(value)
        elif value:
            found[key] = value
    return found, page


def paging(path: str, filters: Mapping[str, str | None], number: int, total: int) -> Paging:
    pages = max(1, -(-total // PAGE_SIZE))
    given = {k: v for k, v in filters.items() if v is not None}

    def link(n: int) -> str:
        return f"{path}?{urlencode({**given, 'page': n})}"

    return Paging(
        number,
        pages,
        total,
        link(number - 1) if number > 1 else None,
        link(number + 1) if number < pages else None,
    )


def _bad(request: web.Request, message: str) -> web.Response:
    if "text/html" in request.headers.get("Accept", ""):
        return web.Response(text=f"Bad request: {message}\n", status=400, content_type="text/plain")
    return web.json_response({"error": message}, status=400)


def _not_found(what: str) -> web.Response:
    return web.json_response({"error": f"no {what}"}, status=404)


def _wants_json(request: web.Request) -> bool:
    return "application/json" in request.headers.get("Accept", "")


async def events_list(endpoint: Endpoint, request: web.Request, caller: Caller | None) -> web.Response:
    assert caller is not None
    try:
        found, number = parse_query(request.query, ("state", "server", "subscription", "rule"))
        if found["state"] is not None and found["state"] not in EVENT_STATES:
            raise BadQuery(f"unknown state {shown(found['state'], 40)!r}: one of {', '.join(EVENT_STATES)}")
    except BadQuery as exc:
        return _bad(request, str(exc))
    filters = EventFilter(**found)
    rows, total = await endpoint.store.event_page(filters, (number - 1) * PAGE_SIZE, PAGE_SIZE)
    config = endpoint.supervisor.config
    events = [recent_event(r, config) for r in rows]
    page = paging("/events", found, number, total)
    if _wants_json(request):
        return web.json_response({"events": events, **asdict(page)})
    html = TEMPLATES.get_template("events.html").render(
        events=events,
        page=page,
        filters=filters,
        states=EVENT_STATES,
        server_names=sorted(config.servers),
        subscription_names=[s.name for s in config.subscriptions],
        **endpoint.chrome(caller),
    )
    return web.Response(text=html, content_type="text/html")


async def runs_list(endpoint: Endpoint, request: web.Request, caller: Caller | None) -> web.Response:
    assert caller is not None
    try:
        found, number = parse_query(request.query, ("status", "server", "subscription"))
        if found["status"] is not None and found["status"] not in RUN_STATUSES:
            raise BadQuery(f"unknown status {shown(found['status'], 40)!r}: one of {', '.join(RUN_STATUSES)}")
    except BadQuery as exc:
        return _bad(request, str(exc))
    filters = RunFilter(**found)
    rows, total = await endpoint.store.run_page(filters, (number - 1) * PAGE_SIZE, PAGE_SIZE)
    runs = [recent_run(r) for r in rows]
    page = paging("/runs", found, number, total)
    if _wants_json(request):
        return web.json_response({"runs": runs, **asdict(page)})
    html = TEMPLATES.get_template("runs.html").render(
        runs=runs, page=page, filters=filters, statuses=RUN_STATUSES, **endpoint.chrome(caller)
    )
    return web.Response(text=html, content_type="text/html")


def _id(request: web.Request, key: str) -> int | None:
    value = int(request.match_info[key])
    return value if 0 < value < MAX_ID else None


async def _event(endpoint: Endpoint, row: int) -> dict[str, Any] | None:
    detail = await endpoint.store.event_detail(row)
    if detail is None:
        return None
    worker = endpoint.supervisor.worker
    return event_shown(detail, endpoint.supervisor.config, worker.policy if worker is not None else None)


async def event_page(endpoint: Endpoint, request: web.Request, caller: Caller | None) -> web.Response:
    assert caller is not None
    row = _id(request, "row")
    shown_event = await _event(endpoint, row) if row is not None else None
    if shown_event is None:
        return _not_found("such event")
    if _wants_json(request):
        return web.json_response(shown_event)
    html = TEMPLATES.get_template("event.html").render(e=shown_event, **endpoint.chrome(caller))
    return web.Response(text=html, content_type="text/html")


async def run_page(endpoint: Endpoint, request: web.Request, caller: Caller | None) -> web.Response:
    assert caller is not None
    run_id = _id(request, "run")
    row = await endpoint.store.run_event(run_id) if run_id is not None else None
    shown_event = await _event(endpoint, row) if row is not None else None
    run = next((r for r in (shown_event or {}).get("runs", []) if r["run_id"] == run_id), None)
    if shown_event is None or run is None:
        return _not_found("such run")
    if _wants_json(request):
        return web.json_response({"event_row": row, "event_id": shown_event["event_id"], "run": run})
    html = TEMPLATES.get_template("run.html").render(
        r=run,
        event_row=row,
        event_id=shown_event["event_id"],
        subscription=shown_event["subscription"],
        **endpoint.chrome(caller),
    )
    return web.Response(text=html, content_type="text/html")


__all__ = ["PAGE_SIZE", "event_page", "events_list", "parse_query", "run_page", "runs_list"]
