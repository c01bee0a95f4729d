"""A fake PagerDuty REST API (v2) on loopback, for the PagerDuty bridge's tests and offline walkthroughs.

It keeps users, services, incidents, their notes and the account's log entries in memory, and
answers the endpoints the bridge uses with JSON shaped as PagerDuty's REST API shapes it:
``{"error": {"message", "code"}}`` bodies, 401 without ``Authorization: Token token=<key>``,
400 for a write without a ``From`` header naming a known user, ``limit``/``offset``/``more``
pagination, ``since``/``until`` windows, ``include[]=incidents`` on log entries, and
``ratelimit-*`` headers on every answer (a test queues a 429 with ``fail_next``).

Writes through the API behave as on PagerDuty: acknowledging, resolving or escalating changes
the incident and adds the matching log entry, whose agent is the key's user (a user-level key)
or the ``From`` user (an account-level key, ``account_key=True``, for which ``GET /users/me``
is a 400 as on PagerDuty).

It is one module of over 700 lines because the REST fake and the webhooks it sends share one
account's state.

``webhook(...)`` builds the V3 webhook body of an incident as it is now, and ``sign(...)`` its
``X-PagerDuty-Signature``. Tests drive it directly::

    async with FakePagerDuty() as pd:
        incident = pd.trigger("Checkout is down", service="Checkout API")
        ...  # point the code under test at pd.url, key "test-key", From pd.bot["email"]
        seen = await pd.wait_for("PUT", f"/incidents/{incident['id']}")

``python -m agentwake.fakes.pagerduty [--port N] [--webhook URL]`` serves it until interrupted,
printing its URL on stdout. ``POST /incidents`` (with a ``From`` header) triggers an incident
as on PagerDuty; with ``--webhook`` every change is also delivered there as a signed V3
webhook, with the secret in ``$PAGERDUTY_WEBHOOK_SECRET``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import hashlib
import hmac
import itertools
import json
import os
import sys
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp import web

from agentwake.fakes._http import Headers, RecordingFake, until_stopped

WEB = "https://acme.pagerduty.com"
API = "https://api.pagerduty.com"
RATE_LIMIT = 960  # PagerDuty's REST API: requests per minute per user
MAX_LIMIT = 100
DEFAULT_LIMIT = 25
OVERVIEW = {"trigger_log_entry", "acknowledge_log_entry", "escalate_log_entry", "resolve_log_entry"}
# The log entry each V3 webhook event type stands for.
_ENTRY_OF = {
    "incident.triggered": "trigger_log_entry",
    "incident.acknowledged": "acknowledge_log_entry",
    "incident.escalated": "escalate_log_entry",
    "incident.resolved": "resolve_log_entry",
}


def sign(body: bytes, *secrets_: str) -> str:
    """``X-PagerDuty-Signature`` as PagerDuty computes it: ``v1=`` + hex HMAC-SHA256, one per secret."""
    return ",".join("v1=" + hmac.new(s.encode(), body, hashlib.sha256).hexdigest() for s in secrets_)


def webhook_headers(
    signature: str, *, webhook_id: str | None = None, subscription: str = "PSUB0FAKE"
) -> dict[str, str]:
    """The headers of a V3 webhook delivery as PagerDuty sends them (a new ``X-Webhook-Id`` unless given)."""
    return {
        "Content-Type": "application/json",
        "User-Agent": "PagerDuty-Webhook/V3.0",
        "X-PagerDuty-Signature": signature,
        "X-Webhook-Id": webhook_id or str(uuid.uuid4()),
        "X-Webhook-Subscription": subscription,
    }


async def post_webhook(
    url: str, body: bytes, signature: str, *, webhook_id: str | None = None, subscription: str = "PSUB0FAKE"
) -> tuple[int, str]:
    """POST one V3 webhook delivery to ``url``; the answer's status code and its ``status``."""
    headers = webhook_headers(signature, webhook_id=webhook_id, subscription=subscription)
    async with aiohttp.ClientSession() as session, session.post(url, data=body, headers=headers) as answer:
        return answer.status, (await answer.json())["status"]


def rest_time(moment: datetime) -> str:
    """The REST API's timestamp form: UTC to the second."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def webhook_time(moment: datetime) -> str:
    """A V3 webhook's ``occurred_at``: UTC with milliseconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


@dataclass(frozen=True)
class Recorded:
    """One request as the fake received it; ``query`` keeps repeated keys (``statuses[]``) as lists."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: Headers
    json: Any | None

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None


@dataclass(frozen=True)
class _Failure:
    status: int
    message: str | None
    headers: dict[str, str]


@dataclass
class _Incident:
    data: dict[str, Any]
    created: datetime
    level: int = 1
    notes: list[dict[str, Any]] = field(default_factory=list)


class ApiError(Exception):
    """An answer other than success, raised by a handler."""

    def __init__(self, status: int, message: str, code: int, errors: list[str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body: dict[str, Any] = {"error": {"message": message, "code": code}}
        if errors:
            self.body["error"]["errors"] = errors


def _not_found(what: str = "Not Found") -> ApiError:
    return ApiError(404, what, 2100)


def _invalid(*errors: str) -> ApiError:
    return ApiError(400, "Invalid Input Provided", 2001, list(errors))


def _reference(kind: str, item: dict[str, Any]) -> dict[str, Any]:
    return {key: item[key] for key in ("id", "summary", "self", "html_url")} | {"type": f"{kind}_reference"}


class FakePagerDuty(RecordingFake[Recorded]):
    """PagerDuty's REST API in memory, served on 127.0.0.1 on a free port."""

    def __init__(self, *, api_key: str | None = "test-key", port: int = 0, account_key: bool = False) -> None:
        super().__init__(port)
        self.api_key = api_key
        self.account_key = account_key
        self.rate_limit_remaining = RATE_LIMIT
        # Where and how every change is also delivered as a V3 webhook (the program's --webhook).
        self.webhook_url: str | None = None
        self.webhook_secret = ""
        # PagerDuty's ids are letters and digits: P + 6 for users and services, 14 for incidents and entries.
        self._serial = itertools.count(0x0A0001)
        self._numbers = itertools.count(1001)
        self._users: dict[str, dict[str, Any]] = {}
        self._services: dict[str, dict[str, Any]] = {}
        self._incidents: dict[str, _Incident] = {}
        self._log: list[tuple[datetime, dict[str, Any]]] = []  # oldest first; served newest first
        self._failures: deque[_Failure] = deque()
        self._deliveries: set[asyncio.Task[None]] = set()
        # Whom the key authenticates: the agent of a user-level key's writes.
        self.bot = self.add_user("agentwake bot", "oncall-bot@example.com")

    async def close(self) -> None:
        for task in self._deliveries:
            task.cancel()
        await super().close()

    # -- state: set up -------------------------------------------------------------------------

    def add_user(self, name: str, email: str) -> dict[str, Any]:
        """A user of the account; returns it as ``GET /users/{id}`` would."""
        user_id = self._id("P", 6)
        self._users[user_id] = {
            "id": user_id,
            "type": "user",
            "summary": name,
            "name": name,
            "email": email,
            "time_zone": "Etc/UTC",
            "role": "user",
            "self": f"{API}/users/{user_id}",
            "html_url": f"{WEB}/users/{user_id}",
        }
        return copy.deepcopy(self._users[user_id])

    def add_service(self, name: str) -> dict[str, Any]:
        """A service (the same one if it exists by name)."""
        found = next((s for s in self._services.values() if s["name"] == name), None)
        if found is None:
            service_id = self._id("P", 6)
            found = self._services[service_id] = {
                "id": service_id,
                "type": "service",
                "summary": name,
                "name": name,
                "self": f"{API}/services/{service_id}",
                "html_url": f"{WEB}/service-directory/{service_id}",
            }
        return copy.deepcopy(found)

    def trigger(
        self,
        title: str,
        *,
        service: str = "Checkout API",
        urgency: str = "high",
        priority: str | None = None,
        assignee: dict[str, Any] | None = None,
        by: dict[str, Any] | None = None,
        at: datetime | None = None,
        incident_id: str | None = None,
    ) -> dict[str, Any]:
        """A new incident on ``service`` (its integration triggers it unless ``by`` names a user),
        triggered now or ``at`` an earlier time; ``incident_id`` chooses its id (the playground's
        sample deliveries name one)."""
        return copy.deepcopy(self._trigger(title, service, urgency, priority, assignee, by, at, incident_id))

    def acknowledge(self, incident_id: str, user: dict[str, Any]) -> dict[str, Any]:
        """``user`` acknowledges the incident (as in PagerDuty's app)."""
        return copy.deepcopy(self._set_status(self._incident(incident_id), "acknowledged", user))

    def resolve(self, incident_id: str, user: dict[str, Any]) -> dict[str, Any]:
        """``user`` resolves the incident."""
        return copy.deepcopy(self._set_status(self._incident(incident_id), "resolved", user))

    def escalate(self, incident_id: str, level: int, user: dict[str, Any] | None = None) -> dict[str, Any]:
        """The incident escalates to ``level``, by ``user`` or (None) by its acknowledgement timeout."""
        return copy.deepcopy(self._escalate(self._incident(incident_id), level, user))

    def fail_next(
        self, status: int, *, message: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        """The next request (after any already queued failures) gets this error instead of its answer."""
        self._failures.append(_Failure(status, message, dict(headers or {})))

    # -- state: inspect ------------------------------------------------------------------------

    def incident(self, incident_id: str) -> dict[str, Any]:
        """An incident as ``GET /incidents/{id}`` returns it."""
        return copy.deepcopy(self._incident(incident_id).data)

    def notes(self, incident_id: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self._incident(incident_id).notes)

    def log_entries(self) -> list[dict[str, Any]]:
        """Every log entry, newest first, each with its incident reference."""
        return [copy.deepcopy(entry) for _, entry in reversed(self._log)]

    # -- webhook bodies ------------------------------------------------------------------------

    def webhook(
        self,
        event_type: str,
        incident_id: str,
        *,
        agent: dict[str, Any] | None = None,
        occurred_at: datetime | None = None,
        event_id: str | None = None,
    ) -> dict[str, Any]:
        """The V3 webhook body of ``event_type`` for the incident as it is now. ``occurred_at`` is by
        default the time of the incident's last log entry of that kind, as PagerDuty's would be."""
        incident = self._incident(incident_id)
        entries = [(at, e) for at, e in self._log if e["incident"]["id"] == incident_id]
        matching = [(at, e) for at, e in entries if e["type"] == _ENTRY_OF.get(event_type)]
        at, entry = (matching or entries)[-1]
        if agent is None and matching:
            agent = entry["agent"]
        data = incident.data
        body = {
            "event": {
                "id": event_id or str(uuid.uuid4()),
                "event_type": event_type,
                "resource_type": "incident",
                "occurred_at": webhook_time(occurred_at or at),
                "agent": copy.deepcopy(agent),
                "client": {"name": "PagerDuty"},
                "data": {
                    "id": data["id"],
                    "type": "incident",
                    "self": data["self"],
                    "html_url": data["html_url"],
                    "number": data["incident_number"],
                    "status": data["status"],
                    "incident_key": data["incident_key"],
                    "created_at": data["created_at"],
                    "title": data["title"],
                    "service": copy.deepcopy(data["service"]),
                    "assignees": [copy.deepcopy(a["assignee"]) for a in data["assignments"]],
                    "escalation_policy": copy.deepcopy(data["escalation_policy"]),
                    "teams": [],
                    "priority": copy.deepcopy(data["priority"]),
                    "urgency": data["urgency"],
                    "conference_bridge": None,
                    "resolve_reason": None,
                },
            }
        }
        return body

    # -- shapes --------------------------------------------------------------------------------

    def _id(self, prefix: str, digits: int) -> str:
        return f"{prefix}{next(self._serial):0{digits}X}"

    def _incident(self, incident_id: str) -> _Incident:
        found = self._incidents.get(incident_id)
        if found is None:
            raise KeyError(f"no incident {incident_id}")
        return found

    def _trigger(
        self,
        title: str,
        service_name: str,
        urgency: str,
        priority: str | None,
        assignee: dict[str, Any] | None,
        by: dict[str, Any] | None,
        at: datetime | None = None,
        incident_id: str | None = None,
    ) -> dict[str, Any]:
        service = self.add_service(service_name)
        now = at or datetime.now(UTC)
        incident_id = incident_id or self._id("Q", 13)
        number = next(self._numbers)
        assignee = assignee or self.bot
        data: dict[str, Any] = {
            "id": incident_id,
            "type": "incident",
            "summary": f"[#{number}] {title}",
            "self": f"{API}/incidents/{incident_id}",
            "html_url": f"{WEB}/incidents/{incident_id}",
            "incident_number": number,
            "title": title,
            "description": title,
            "created_at": rest_time(now),
            "updated_at": rest_time(now),
            "status": "triggered",
            "incident_key": uuid.uuid4().hex,
            "service": _reference("service", service),
            "assignments": [{"at": rest_time(now), "assignee": _reference("user", assignee)}],
            "assigned_via": "escalation_policy",
            "last_status_change_at": rest_time(now),
            "last_status_change_by": _reference("service", service),
            "escalation_policy": {
                "id": "PEP0L1C",
                "type": "escalation_policy_reference",
                "summary": f"{service_name} On-Call",
                "self": f"{API}/escalation_policies/PEP0L1C",
                "html_url": f"{WEB}/escalation_policies/PEP0L1C",
            },
            "teams": [],
            "acknowledgements": [],
            "urgency": urgency,
            "priority": None
            if priority is None
            else {
                "id": f"PPR{priority}",
                "type": "priority_reference",
                "summary": priority,
                "self": f"{API}/priorities/PPR{priority}",
                "html_url": f"{WEB}/account/incident_priorities",
            },
            "resolve_reason": None,
            "conference_bridge": None,
        }
        incident = self._incidents[incident_id] = _Incident(data, now)
        agent = _reference("user", by) if by is not None else _reference("service", service)
        self._add_entry(incident, "trigger", now, agent, {"type": "api" if by is None else "website"})
        self._deliver("incident.triggered", incident)
        return data

    def _set_status(self, incident: _Incident, status: str, user: dict[str, Any]) -> dict[str, Any]:
        now = datetime.now(UTC)
        data = incident.data
        data.update(status=status, updated_at=rest_time(now), last_status_change_at=rest_time(now))
        data["last_status_change_by"] = _reference("user", user)
        if status == "acknowledged":
            data["acknowledgements"].append({"at": rest_time(now), "acknowledger": _reference("user", user)})
        if status == "resolved":
            data["assignments"] = []
        kind = "acknowledge" if status == "acknowledged" else "resolve"
        self._add_entry(incident, kind, now, _reference("user", user), {"type": "website"})
        self._deliver(f"incident.{status}", incident)
        return data

    def _escalate(self, incident: _Incident, level: int, user: dict[str, Any] | None) -> dict[str, Any]:
        now = datetime.now(UTC)
        incident.level = level
        data = incident.data
        # On PagerDuty the next level's on-call users get it; here, whoever is the first other user.
        others = [u for u in self._users.values() if u["id"] != self.bot["id"]] or [self.bot]
        assignee = others[(level - 1) % len(others)]
        data.update(status="triggered", updated_at=rest_time(now), acknowledgements=[])
        data["assignments"] = [{"at": rest_time(now), "assignee": _reference("user", assignee)}]
        agent = None if user is None else _reference("user", user)
        channel = {"type": "timeout" if user is None else "website"}
        self._add_entry(
            incident, "escalate", now, agent, channel, assignees=[_reference("user", assignee)], level=level
        )
        self._deliver("incident.escalated", incident)
        return data

    def _add_entry(
        self,
        incident: _Incident,
        kind: str,
        at: datetime,
        agent: dict[str, Any] | None,
        channel: dict[str, Any],
        *,
        assignees: list[dict[str, Any]] | None = None,
        level: int | None = None,
    ) -> None:
        entry_id = self._id("R", 13)
        data = incident.data
        summaries = {
            "trigger": "Triggered through the API.",
            "acknowledge": f"Acknowledged by {agent['summary'] if agent else 'timeout'}",
            "resolve": f"Resolved by {agent['summary'] if agent else 'timeout'}",
            "escalate": f"Escalated to level {level} by {agent['summary'] if agent else 'timeout'}",
            "annotate": "Note added",
        }
        entry: dict[str, Any] = {
            "id": entry_id,
            "type": f"{kind}_log_entry",
            "summary": summaries[kind],
            "self": f"{API}/log_entries/{entry_id}?incident_id={data['id']}",
            "html_url": f"{WEB}/incidents/{data['id']}/log_entries/{entry_id}",
            "created_at": rest_time(at),
            "agent": agent,
            "channel": channel,
            "service": copy.deepcopy(data["service"]),
            "incident": _reference("incident", data),
            "teams": [],
            "contexts": [],
            "event_details": {},
        }
        if assignees is not None:
            entry["assignees"] = assignees
        self._log.append((at, entry))
        self._log.sort(key=lambda pair: pair[0])

    def _deliver(self, event_type: str, incident: _Incident) -> None:
        """With a webhook URL, the change as a signed V3 webhook, sent in the background as PagerDuty does."""
        if self.webhook_url is None:
            return
        body = json.dumps(self.webhook(event_type, incident.data["id"])).encode()
        task = asyncio.get_running_loop().create_task(self._post(self.webhook_url, body))
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)

    async def _post(self, url: str, body: bytes) -> None:
        headers = webhook_headers(sign(body, self.webhook_secret))
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.post(url, data=body, headers=headers) as answer,
            ):
                sys.stderr.write(f"fake pagerduty: webhook {answer.status} {await answer.text()}\n")
        except aiohttp.ClientError as exc:
            sys.stderr.write(f"fake pagerduty: webhook failed: {exc}\n")

    # -- serving -------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw_body = await request.read()
        try:
            parsed: Any = json.loads(raw_body) if raw_body else None
            malformed = False
        except ValueError:
            parsed, malformed = None, True
        query: dict[str, list[str]] = {}
        for key, value in request.query.items():
            query.setdefault(key, []).append(value)
        recorded = Recorded(request.method, request.path, query, Headers(request.headers.items()), parsed)
        self._record(recorded)
        if self._failures:
            # An injected failure goes out with exactly the headers it was given.
            failure = self._failures.popleft()
            body = {"error": {"message": failure.message or "Too Many Requests", "code": 2020}}
            return web.json_response(body, status=failure.status, headers=failure.headers)
        try:
            response = self._refusal(recorded)
            if response is None:
                if malformed:
                    raise ApiError(400, "Invalid JSON", 2001)
                response = self._route(recorded)
        except ApiError as error:
            response = web.json_response(error.body, status=error.status)
        self._spend(response)
        return response

    def _refusal(self, call: Recorded) -> web.Response | None:
        """Bad credentials, before the request is served."""
        if self.api_key is not None and call.headers.get("Authorization") != f"Token token={self.api_key}":
            return web.json_response({"error": {"message": "Unauthorized", "code": 2006}}, status=401)
        return None

    def _spend(self, response: web.Response) -> None:
        if self.rate_limit_remaining > 0 and response.status != 401:
            self.rate_limit_remaining -= 1
        response.headers.setdefault("ratelimit-limit", str(RATE_LIMIT))
        response.headers.setdefault("ratelimit-remaining", str(self.rate_limit_remaining))
        response.headers.setdefault("ratelimit-reset", str(60 - int(time.time()) % 60))

    def _route(self, call: Recorded) -> web.Response:
        method, parts = call.method, call.path.strip("/").split("/")
        if parts == ["users", "me"] and method == "GET":
            if self.account_key:
                raise ApiError(400, "Invalid Input Provided", 2001, ["Cannot use an account-level token."])
            return _json({"user": self.bot})
        if parts == ["users"] and method == "GET":
            wanted = (call.param("query") or "").casefold()
            users = [u for u in self._users.values() if wanted in (u["email"] + " " + u["name"]).casefold()]
            return _json({"users": users, "limit": 25, "offset": 0, "more": False, "total": None})
        if parts == ["incidents"]:
            if method == "GET":
                return _json(self._list_incidents(call))
            if method == "POST":
                return _json({"incident": self._create_incident(call)}, status=201)
        if parts == ["log_entries"] and method == "GET":
            return _json(self._list_log_entries(call))
        if len(parts) >= 2 and parts[0] == "incidents":
            incident = self._incidents.get(parts[1])
            if incident is None:
                raise _not_found("Incident Not Found")
            if parts[2:] == [] and method == "GET":
                return _json({"incident": incident.data})
            if parts[2:] == [] and method == "PUT":
                return _json({"incident": self._update(call, incident)})
            if parts[2:] == ["notes"] and method == "POST":
                return _json({"note": self._add_note(call, incident)}, status=201)
            if parts[2:] == ["notes"] and method == "GET":
                return _json({"notes": incident.notes})
        raise _not_found()

    # -- endpoints -----------------------------------------------------------------------------

    def _writer(self, call: Recorded) -> dict[str, Any]:
        """Who a write is done as: the From user with an account-level key, else the key's user."""
        sender = call.headers.get("From")
        user = next((u for u in self._users.values() if u["email"] == sender), None)
        if user is None:
            raise ApiError(
                400,
                "Invalid Input Provided",
                2001,
                ["The From header must be the email of a user of the account."],
            )
        return user if self.account_key else self.bot

    def _update(self, call: Recorded, incident: _Incident) -> dict[str, Any]:
        user = self._writer(call)
        body = call.json.get("incident") if isinstance(call.json, dict) else None
        if not isinstance(body, dict) or body.get("type") not in ("incident", "incident_reference"):
            raise _invalid("incident must be an object of type incident_reference.")
        if "escalation_level" in body:
            level = body["escalation_level"]
            if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= 3:
                raise _invalid(
                    "Escalation level must be a level of the incident's escalation policy (1 to 3)."
                )
            return self._escalate(incident, level, user)
        status = body.get("status")
        if status not in ("acknowledged", "resolved"):
            raise _invalid("Status must be acknowledged or resolved.")
        if incident.data["status"] == "resolved":
            raise _invalid("Incident Already Resolved")
        return self._set_status(incident, status, user)

    def _add_note(self, call: Recorded, incident: _Incident) -> dict[str, Any]:
        user = self._writer(call)
        note = call.json.get("note") if isinstance(call.json, dict) else None
        content = note.get("content") if isinstance(note, dict) else None
        if not isinstance(content, str) or not content.strip():
            raise _invalid("Note content must be given.")
        now = datetime.now(UTC)
        created = {
            "id": self._id("P", 6),
            "user": _reference("user", user),
            "channel": {"summary": "The PagerDuty REST API"},
            "content": content,
            "created_at": rest_time(now),
        }
        incident.notes.append(created)
        self._add_entry(
            incident, "annotate", now, _reference("user", user), {"type": "note", "summary": content}
        )
        return created

    def _create_incident(self, call: Recorded) -> dict[str, Any]:
        user = self._writer(call)
        body = call.json.get("incident") if isinstance(call.json, dict) else None
        if not isinstance(body, dict) or not isinstance(body.get("title"), str) or not body["title"]:
            raise _invalid("Incident title must be given.")
        service = body.get("service")
        name = next(
            (
                s["name"]
                for s in self._services.values()
                if isinstance(service, dict) and service.get("id") == s["id"]
            ),
            None,
        )
        if name is None:
            raise _invalid("Service must be the reference of a service of the account.")
        urgency = body.get("urgency", "high")
        if urgency not in ("high", "low"):
            raise _invalid("Urgency must be high or low.")
        return self._trigger(body["title"], name, urgency, None, None, user)

    def _list_incidents(self, call: Recorded) -> dict[str, Any]:
        since, until = _window(call)
        items = [i for i in self._incidents.values() if since <= _shown(i.created) < until]
        services = call.query.get("service_ids[]")
        if services:
            items = [i for i in items if i.data["service"]["id"] in services]
        statuses = call.query.get("statuses[]")
        if statuses:
            items = [i for i in items if i.data["status"] in statuses]
        items.sort(key=lambda i: i.created, reverse=call.param("sort_by") == "created_at:desc")
        return _page([i.data for i in items], call, "incidents")

    def _list_log_entries(self, call: Recorded) -> dict[str, Any]:
        since, until = _window(call)
        entries = [e for at, e in reversed(self._log) if since <= _shown(at) < until]
        if call.param("is_overview") == "true":
            entries = [e for e in entries if e["type"] in OVERVIEW]
        if "incidents" in call.query.get("include[]", []):
            entries = [{**e, "incident": self._incidents[e["incident"]["id"]].data} for e in entries]
        return _page(entries, call, "log_entries")


def _json(body: Any, *, status: int = 200) -> web.Response:
    return web.json_response(copy.deepcopy(body), status=status)


def _shown(moment: datetime) -> datetime:
    """A time as the REST API stores and compares it: to the second."""
    return moment.replace(microsecond=0)


def _window(call: Recorded) -> tuple[datetime, datetime]:
    """The ``since``/``until`` of a list request (PagerDuty's default: the last 30 days)."""
    now = datetime.now(UTC)

    def moment(name: str, default: datetime) -> datetime:
        value = call.param(name)
        if value is None:
            return default
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise _invalid(f"{name} must be an ISO 8601 date-time.") from None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)

    since = moment("since", datetime.fromtimestamp(now.timestamp() - 30 * 86400, UTC))
    return since, moment("until", now)


def _page(items: list[dict[str, Any]], call: Recorded, key: str) -> dict[str, Any]:
    try:
        limit = max(1, min(MAX_LIMIT, int(call.param("limit") or DEFAULT_LIMIT)))
        offset = max(0, int(call.param("offset") or 0))
    except ValueError:
        raise _invalid("limit and offset must be integers.") from None
    return {
        key: items[offset : offset + limit],
        "limit": limit,
        "offset": offset,
        "more": offset + limit < len(items),
        "total": None,
    }


async def _serve(port: int, api_key: str | None, services: list[str], webhook: str | None) -> None:
    # An account-level key, as most integrations use: writes are done as the From user.
    async with FakePagerDuty(api_key=api_key, port=port, account_key=True) as fake:
        person = fake.add_user("Dev Oncall", "dev@example.com")
        created = [fake.add_service(name) for name in services]
        if webhook is not None:
            fake.webhook_url = webhook
            fake.webhook_secret = os.environ.get("PAGERDUTY_WEBHOOK_SECRET", "")
            if not fake.webhook_secret:
                raise SystemExit("--webhook needs the secret in $PAGERDUTY_WEBHOOK_SECRET")
        incident = {
            "incident": {
                "type": "incident",
                "title": "Checkout error rate above 5%",
                "service": {"id": created[0]["id"], "type": "service_reference"},
                "urgency": "high",
            }
        }
        key = f" -H 'Authorization: Token token={api_key}'" if api_key else ""
        for line in (
            *(f"service {service['id']}: {service['name']}" for service in created),
            f"users: {fake.bot['email']} (for the bridge's --from-email), {person['email']} (a person)",
            f"trigger an incident as {person['name']}:",
            f"  curl -s -X POST {fake.url}/incidents{key} -H 'From: {person['email']}'"
            f" -H 'Content-Type: application/json' -d '{json.dumps(incident)}'",
        ):
            sys.stderr.write(f"fake pagerduty: {line}\n")
        sys.stdout.write(fake.url + "\n")
        sys.stdout.flush()
        await until_stopped()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A fake PagerDuty REST API on 127.0.0.1.")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    parser.add_argument("--api-key", default="test-key", help="the key clients must send (default: test-key)")
    parser.add_argument(
        "--service", action="append", default=[], help="a service to create (default: Checkout API)"
    )
    parser.add_argument("--webhook", metavar="URL", help="deliver every change there as a signed V3 webhook")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.port, args.api_key, args.service or ["Checkout API"], args.webhook))


if __name__ == "__main__":
    main()
