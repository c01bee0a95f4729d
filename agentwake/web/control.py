"""What an operator does from the page besides answering one event: answer many at once, pause and
resume (the kill switch, agentwake.store.pauses), and see the limits with their current use.

    POST /approvals/bulk    form: row (repeated), answer = approve | deny, note
    GET  /pauses            what is paused, by whom, why, since when (JSON)
    POST /pauses            form or JSON: scope = all | server | subscription | rule, name, reason,
                            now (cut running runs short)
    POST /pauses/resume     form or JSON: scope, name        (DELETE /pauses takes the same)
    GET  /limits            [agent] and [servers.X] limits with their current use (JSON)

Answers and pauses need the approve scope and, from a browser, the session's CSRF token (checked
by the endpoint before these run). Who acted is the caller (the token's name, or the identity a
relaying bearer token gives in ``on_behalf_of``), never the request's body.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from agentwake.clock import iso, utc_now
from agentwake.store.pauses import PAUSE_SCOPES, as_dict, checked
from agentwake.web.pages import shown

if TYPE_CHECKING:
    from agentwake.web.app import Caller, Endpoint

# Events answered by one bulk request, at most.
BULK_MAX: Final = 100


async def _body(request: web.Request) -> dict[str, Any] | None:
    """The request's fields: a JSON object or a form (the endpoint may have read it already); None:
    unreadable."""
    if request.content_type == "application/json":
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return None
        return body if isinstance(body, dict) else None
    try:
        form = await request.post()
    except ValueError:
        return None
    fields: dict[str, Any] = {}
    for key in form:
        values = form.getall(key)
        fields[key] = values if len(values) > 1 else values[0]
    return fields


async def _done(
    endpoint: Endpoint,
    request: web.Request,
    caller: Caller,
    ok: bool,
    message: str,
    status: int,
    **extra: Any,
) -> web.Response:
    """JSON for a tool (bearer token, or asking for JSON); a browser goes back to the page with the message."""
    if "application/json" in request.headers.get("Accept", "") or caller.via == "bearer":
        return web.json_response({"ok": ok, "message": message, **extra}, status=status)
    return await endpoint.back_to_page(
        request, caller, message, "/#held" if "approvals" in request.path else "/#pauses"
    )


async def bulk_answer(endpoint: Endpoint, request: web.Request, caller: Caller | None) -> web.Response:
    assert caller is not None
    fields = await _body(request)
    if fields is None:
        return web.json_response({"ok": False, "message": "the form is not readable"}, status=400)
    answer = fields.get("answer")
    if answer not in ("approve", "deny"):
        return web.json_response({"ok": False, "message": "answer must be approve or deny"}, status=400)
    given = fields.get("row", [])
    given = given if isinstance(given, list) else [given]
    if not given:
        return await _done(endpoint, request, caller, False, "no event was ticked", 400)
    if len(given) > BULK_MAX or not all(isinstance(r, str | int) and str(r).isdigit() for r in given):
        return web.json_response(
            {"ok": False, "message": f"row must be event rows (whole numbers), at most {BULK_MAX}"},
            status=400,
        )
    rows = list(dict.fromkeys(int(r) for r in given))
    typed = fields.get("note")
    answerer = endpoint.answerer(request, caller, fields.get("on_behalf_of"))
    if isinstance(answerer, str):
        return web.json_response({"ok": False, "message": answerer}, status=400)
    results: list[dict[str, Any]] = []
    for row in rows:
        status, message = await endpoint.answer_one(
            row, approve=answer == "approve", typed=typed, answerer=answerer
        )
        results.append({"row": row, "ok": status == 200, "message": message})
    answered = sum(r["ok"] for r in results)
    summary = f"{'approved' if answer == 'approve' else 'denied'} {answered} of {len(rows)}: " + "; ".join(
        r["message"] for r in results
    )
    return await _done(
        endpoint, request, caller, answered == len(rows), summary, 200 if answered else 409, results=results
    )


async def _known(endpoint: Endpoint, scope: str) -> list[str] | None:
    """The names the service knows for ``scope`` (configured, or stored with events); None: any name
    (no policy loaded to check a rule by)."""
    config = endpoint.supervisor.config
    if scope in ("server", "subscription"):
        stored = await endpoint.store.subscriptions()
        if scope == "server":
            return sorted({*config.servers, *(str(s["server"]) for s in stored)})
        return list(
            dict.fromkeys(
                [*(s.name for s in config.subscriptions), *(str(s["subscription"]) for s in stored)]
            )
        )
    worker = endpoint.supervisor.worker
    policy = worker.policy if worker is not None else None
    return [loaded.rule.name for loaded in policy.rules] if policy is not None else None


async def pause_names(endpoint: Endpoint) -> list[str]:
    """Every name the pause form may take, for its suggestions."""
    names: list[str] = []
    for scope in ("server", "subscription", "rule"):
        names.extend(await _known(endpoint, scope) or [])
    return list(dict.fromkeys(names))


async def _scope_and_name(endpoint: Endpoint, fields: dict[str, Any]) -> tuple[Any, str] | str:
    scope, name = fields.get("scope", "all"), fields.get("name") or ""
    if not isinstance(scope, str) or not isinstance(name, str):
        return "scope and name must be text, given once"
    if scope not in PAUSE_SCOPES:
        return f"unknown scope {shown(scope, 40)!r}: one of {', '.join(PAUSE_SCOPES)}"
    name = name.strip() if scope != "all" else ""
    if scope != "all":
        known = await _known(endpoint, scope)
        if not name:
            return f"pausing a {scope} needs its name"
        if known is not None and name not in known:
            return f"no {scope} named {shown(name, 80)!r} (known: {', '.join(known) or 'none'})"
    return scope, name


async def pause(endpoint: Endpoint, request: web.Request, caller: Caller | None) -> web.Response:
    assert caller is not None
    fields = await _body(request)
    if fields is None:
        return web.json_response(
            {"ok": False, "message": "the body is not a readable form or JSON object"}, status=400
        )
    found = await _scope_and_name(endpoint, fields)
    reason = fields.get("reason")
    if isinstance(found, str) or (reason is not None and not isinstance(reason, str)):
        return web.json_response(
            {"ok": False, "message": found if isinstance(found, str) else "reason must be text"}, status=400
        )
    answerer = endpoint.answerer(request, caller, fields.get("on_behalf_of"))
    if isinstance(answerer, str):
        return web.json_response({"ok": False, "message": answerer}, status=400)
    try:
        scope, name, why = checked(found[0], found[1], reason)
    except ValueError as exc:
        return web.json_response({"ok": False, "message": str(exc)}, status=400)
    now = fields.get("now") in ("1", "true", "on", "yes", True, 1)
    stored = await endpoint.store.pause(scope, name, reason=why, by=answerer.who, cut_short=now)
    what = "everything" if scope == "all" else f"{scope} {name}"
    endpoint.log_action(f"paused {what}{' (runs cut short)' if now else ''}", answerer)
    message = f"paused {shown(what)}" + (": its running runs are stopped" if now else "")
    return await _done(endpoint, request, caller, True, message, 200, pause=as_dict(stored))


async def resume(endpoint: Endpoint, request: web.Request, caller: Caller | None) -> web.Response:
    assert caller is not None
    fields = await _body(request)
    if fields is None and request.method == "DELETE":
        fields = dict(request.query)
    if fields is None:
        return web.json_response(
            {"ok": False, "message": "the body is not a readable form or JSON object"}, status=400
        )
    if request.method == "DELETE" and not fields:
        fields = dict(request.query)
    scope, name = fields.get("scope", "all"), fields.get("name") or ""
    if not isinstance(scope, str) or scope not in PAUSE_SCOPES or not isinstance(name, str):
        return web.json_response(
            {"ok": False, "message": f"scope must be one of {', '.join(PAUSE_SCOPES)}"}, status=400
        )
    answerer = endpoint.answerer(request, caller, fields.get("on_behalf_of"))
    if isinstance(answerer, str):
        return web.json_response({"ok": False, "message": answerer}, status=400)
    lifted = await endpoint.store.resume(scope, name.strip() if scope != "all" else "")  # type: ignore[arg-type]
    what = "everything" if scope == "all" else f"{scope} {name.strip()}"
    if lifted is None:
        return await _done(endpoint, request, caller, False, f"{shown(what)} was not paused", 404)
    endpoint.log_action(f"resumed {what}", answerer)
    if endpoint.supervisor.worker is not None:
        endpoint.supervisor.worker.wake()
    return await _done(endpoint, request, caller, True, f"resumed {shown(what)}", 200, pause=as_dict(lifted))


async def pauses(endpoint: Endpoint, request: web.Request, caller: Caller | None) -> web.Response:
    return web.json_response({"paused": [as_dict(p) for p in await endpoint.store.pauses()]})


async def limit_rows(endpoint: Endpoint) -> list[dict[str, Any]]:
    """Each limit, what it is set to (None: none) and its current use."""
    config = endpoint.supervisor.config
    worker = endpoint.supervisor.worker
    agent = config.agent
    now = utc_now()
    # Counted over every process on the store (agentwake.store.limits).
    use = await endpoint.store.limit_use(iso(now - timedelta(hours=1)), iso(now - timedelta(days=1)), {})
    runs, cost = int(use["runs_last_hour"]), float(use["cost_last_day_usd"])
    handled: dict[str, int] = use["handled_by_server"]
    rows: list[dict[str, Any]] = [
        {
            "name": "[agent] max_runs_per_hour",
            "limit": agent.max_runs_per_hour if agent else None,
            "used": runs,
            "use": f"{runs} run(s) in the last hour",
        },
        {
            "name": "[agent] max_cost_per_day_usd",
            "limit": agent.max_cost_per_day_usd if agent else None,
            "used": round(cost, 4),
            "use": f"${cost:.4f} in the last 24 hours",
        },
        {
            "name": "[agent] concurrency",
            "limit": agent.concurrency if agent else None,
            "used": worker.active if worker is not None else 0,
            "use": "runs going on now (this process)",
        },
    ]
    for name, server_config in sorted(config.servers.items()):
        rows.append(
            {
                "name": f"[servers.{name}] max_concurrent_runs",
                "limit": server_config.max_concurrent_runs,
                "used": handled.get(name, 0),
                "use": "events being handled now (every process)",
            }
        )
    return rows


async def limits(endpoint: Endpoint, request: web.Request, caller: Caller | None) -> web.Response:
    return web.json_response(
        {"limits": await limit_rows(endpoint)}, dumps=lambda v: json.dumps(v, ensure_ascii=False)
    )


__all__ = ["BULK_MAX", "bulk_answer", "limit_rows", "limits", "pause", "pause_names", "pauses", "resume"]
