"""PagerDuty's V3 webhooks and REST API items as the PagerDuty bridge's MCP events. Pure: no I/O.

The bridge learns of one incident change by a V3 webhook delivery or by polling the REST API
(``GET /incidents`` for new incidents, ``GET /log_entries`` for what happened to them). Either
way maps here to the same event with the same ``event_id``, so agentwake's dedup (server,
event name, eventId) wakes the agent once, whichever way arrived first:

    incident.triggered      incident.triggered:<incident id>
    incident.acknowledged   incident.acknowledged:<incident id>:<when, to the second>
    incident.resolved       incident.resolved:<incident id>:<when, to the second>
    incident.escalated      incident.escalated:<incident id>:<when, to the second>

Webhooks alone (the overview log entries the poller reads do not show them) bring
``incident.unacknowledged``, ``reopened``, ``priority_updated``, ``reassigned`` and ``delegated``
(ids as above: the type, the incident, the time), whose ``data`` is the whole incident as for the
four above, and three whose ``data`` is an object of its own naming the incident by reference
(so their payload has no number, status, urgency, priority or service):

    incident.annotated                 incident.annotated:<incident id>:<note id>
    incident.status_update_published   incident.status_update_published:<incident id>:<update id>
    incident.responder.added           incident.responder.added:<incident id>:<user id>:<when>

An incident is triggered once, so its id is enough. It may be acknowledged, escalated and
(after a reopen) resolved several times, and neither ingress path has an id for the change
that the other knows (a webhook's ``event.id`` is not a log entry's id), so the time stands
in: the webhook's ``occurred_at`` (PagerDuty sends milliseconds) and the log entry's
``created_at`` (seconds), both cut to the second in UTC. The two may still fall in different
seconds (12:00:00.950 and 12:00:01), so such an event also names its change without the time
(``same_prefix``, ``<kind>:<incident id>:``) and ``SAME_CHANGE_WITHIN``: the log keeps the first
sighting and drops one of the same change within that tolerance, whichever ingress was first.

``data`` is small and typed, never the raw JSON: strings are kept as PagerDuty sent them
(agentwake sanitizes later) but each one is bounded and lists are capped. A payload of a type
we emit with a missing or ill-typed field raises ``Unmapped`` naming the field, never its
value; everything we do not emit maps to None.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from agentwake.bridges import _payload
from agentwake.bridges._payload import closed_schema, integer_schema, text_schema
from agentwake.clock import iso

TITLE_CHARS: Final = 1024  # PagerDuty's own limit on an incident title
NAME_CHARS: Final = 256
URL_CHARS: Final = 2048
ID_CHARS: Final = 64
MAX_ASSIGNEES: Final = 50
PING: Final = "pagey.ping"
URGENCIES: Final = ("high", "low")
# How far apart a webhook's and a log entry's times of one change may be. The same change of one
# incident cannot recur sooner: an acknowledgement lapses after a timeout of a minute at least.
SAME_CHANGE_WITHIN: Final = timedelta(seconds=10)

EVENT_TYPES: dict[str, str] = {
    "incident.triggered": "An incident was triggered (opened) on a PagerDuty service.",
    "incident.acknowledged": "An incident was acknowledged.",
    "incident.unacknowledged": "An incident's acknowledgement lapsed (its timeout) or was undone: it is triggered again.",
    "incident.resolved": "An incident was resolved.",
    "incident.reopened": "A resolved incident was reopened: it is triggered again.",
    "incident.escalated": (
        "An incident was escalated to another level of its escalation policy, by someone or by its"
        " acknowledgement timeout."
    ),
    "incident.priority_updated": "An incident's priority was set or changed (to P1, say).",
    "incident.reassigned": "An incident was reassigned to other users.",
    "incident.delegated": "An incident was delegated (reassigned) to another escalation policy.",
    "incident.annotated": "A note was added to an incident.",
    "incident.responder.added": "A responder was asked to help with an incident.",
    "incident.status_update_published": "A status update was published for an incident's stakeholders.",
}
# The event types whose webhook ``data`` is the whole incident; the others' is an object of their own
# (a note, a responder request, a status update) that names the incident by a reference only.
_INCIDENT_TYPES: Final = frozenset(
    {
        "incident.triggered",
        "incident.acknowledged",
        "incident.unacknowledged",
        "incident.resolved",
        "incident.reopened",
        "incident.escalated",
        "incident.priority_updated",
        "incident.reassigned",
        "incident.delegated",
    }
)
MAX_TEAMS: Final = 20
NOTE_CHARS: Final = 4096
# What each log entry type (GET /log_entries) is as an event, and the status it leaves the incident in.
_LOG_ENTRY_TYPES: Final = {
    "trigger_log_entry": ("incident.triggered", "triggered"),
    "acknowledge_log_entry": ("incident.acknowledged", "acknowledged"),
    "resolve_log_entry": ("incident.resolved", "resolved"),
    "escalate_log_entry": ("incident.escalated", "triggered"),
}
# The event types polling the log entries can produce.
LOG_ENTRY_EVENT_TYPES: Final = tuple(dict.fromkeys(kind for kind, _ in _LOG_ENTRY_TYPES.values()))


@dataclass(frozen=True, slots=True)
class Mapped:
    """One MCP event: its type, an id stable across webhook and polling, when it happened, its payload,
    and the PagerDuty id of who caused it (None when nobody did, or the item does not say)."""

    type: str
    event_id: str
    occurred_at: datetime
    data: dict[str, Any]
    actor_id: str | None = None
    # Where the id holds a time: the id less the time, and how far apart two sightings may be.
    same_prefix: str | None = None
    same_within: timedelta = timedelta(0)


class Unmapped(_payload.Unmapped):
    """A payload of a type we emit with a missing or ill-typed field; the message names the field."""


@dataclass(frozen=True, slots=True)
class Envelope:
    """What a V3 webhook body says about itself: its event's id and type."""

    event_id: str
    event_type: str


# ---- payload schemas -----------------------------------------------------------------


def _common() -> dict[str, dict[str, Any]]:
    return {
        "incidentId": text_schema("The incident's PagerDuty id (what the tools take).", ID_CHARS),
        "number": integer_schema("The incident's number in the account (#1234)."),
        "title": text_schema("The incident's title.", TITLE_CHARS),
        "status": text_schema(
            'The incident\'s status after the change: "triggered", "acknowledged" or "resolved".', NAME_CHARS
        ),
        "urgency": text_schema('The incident\'s urgency: "high" or "low".', NAME_CHARS),
        "priority": text_schema(
            'The incident\'s priority ("P1"...), or null when it has none.', NAME_CHARS, nullable=True
        ),
        "service": {
            "type": "object",
            "properties": {
                "id": text_schema("The service's PagerDuty id.", ID_CHARS),
                "name": text_schema("The service's name.", NAME_CHARS),
            },
            "required": ["id", "name"],
            "additionalProperties": False,
            "description": "The service the incident is on.",
        },
        "url": text_schema("The incident's web page.", URL_CHARS),
        "actor": text_schema(
            "Who or what caused the change (a user's name, a service or integration), or null (a timeout,"
            " or a polled new incident, whose creator the incidents list does not name).",
            NAME_CHARS,
            nullable=True,
        ),
        "actorType": text_schema(
            'The kind of actor: "user", "service", "integration"..., or null with no actor.',
            NAME_CHARS,
            nullable=True,
        ),
        "occurredAt": {
            "type": "string",
            "format": "date-time",
            "description": "When it happened on PagerDuty, ISO 8601 in UTC.",
        },
    }


def _reference_schema(what: str, *, nullable: bool = False) -> dict[str, Any]:
    return {
        "type": ["object", "null"] if nullable else "object",
        "properties": {
            "id": text_schema(f"The {what}'s PagerDuty id.", ID_CHARS),
            "name": text_schema(f"The {what}'s name.", NAME_CHARS),
        },
        "required": ["id", "name"],
        "additionalProperties": False,
    }


def _names_schema(description: str, limit: int) -> dict[str, Any]:
    return {
        "type": "array",
        "items": {"type": "string", "maxLength": NAME_CHARS},
        "maxItems": limit,
        "description": description,
    }


def _incident_schema() -> dict[str, dict[str, Any]]:
    properties = _common()
    properties.update(
        {
            "incidentKey": text_schema(
                "The incident's key (the de-duplication key its alerts share), or null.",
                NAME_CHARS,
                nullable=True,
            ),
            "createdAt": {
                "type": "string",
                "format": "date-time",
                "description": "When the incident was created, ISO 8601 in UTC.",
            },
            "escalationPolicy": _reference_schema("escalation policy", nullable=True)
            | {"description": "The escalation policy the incident follows, or null when not told."},
            "teams": _names_schema(f"The names of the incident's teams (at most {MAX_TEAMS}).", MAX_TEAMS),
            "assignees": _names_schema(
                "The names of the users the incident is assigned to after the change ([] for none, as when"
                f" resolved; at most {MAX_ASSIGNEES}); polled, as the log entry lists them, else as the"
                " incident is assigned when polled.",
                MAX_ASSIGNEES,
            ),
            "client": {
                "type": ["object", "null"],
                "properties": {
                    "name": text_schema("The client's name (Datadog, PagerDuty Mobile...).", NAME_CHARS),
                    "url": text_schema(
                        "Its link (the monitor, the alert), or null.", URL_CHARS, nullable=True
                    ),
                },
                "required": ["name", "url"],
                "additionalProperties": False,
                "description": (
                    "The client through which the change came: for a trigger, the monitoring tool that sent"
                    " it, with its link. Null when not told (a polled incident, most changes made in"
                    " PagerDuty itself)."
                ),
            },
        }
    )
    return properties


def _reference_common() -> dict[str, dict[str, Any]]:
    common = _common()
    properties = {key: common[key] for key in ("incidentId", "url", "actor", "actorType", "occurredAt")}
    properties["title"] = text_schema(
        "The incident's title as the event names it, or null when it does not.", TITLE_CHARS, nullable=True
    )
    return properties


def _schema(kind: str) -> dict[str, Any]:
    if kind in _INCIDENT_TYPES:
        return closed_schema(_incident_schema())
    properties = _reference_common()
    if kind == "incident.annotated":
        properties["noteId"] = text_schema("The note's PagerDuty id.", ID_CHARS)
        properties["note"] = text_schema(f"The note's text (its first {NOTE_CHARS} characters).", NOTE_CHARS)
    elif kind == "incident.status_update_published":
        properties["statusUpdateId"] = text_schema("The status update's PagerDuty id.", ID_CHARS)
        properties["message"] = text_schema(
            f"The status update's text (its first {NOTE_CHARS} characters).", NOTE_CHARS
        )
    elif kind == "incident.responder.added":
        properties["responder"] = _reference_schema("responder (a user)") | {
            "description": "Who was asked to respond."
        }
        properties["escalationPolicy"] = _reference_schema("escalation policy", nullable=True) | {
            "description": "The escalation policy asked to respond, or null when a user was asked."
        }
        properties["state"] = text_schema(
            'The request\'s state: "pending", "joined" or "declined".', NAME_CHARS, nullable=True
        )
        properties["message"] = text_schema(
            "The requester's message to the responder, or null.", NOTE_CHARS, nullable=True
        )
    return closed_schema(properties)


PAYLOAD_SCHEMAS: dict[str, dict[str, Any]] = {kind: _schema(kind) for kind in EVENT_TYPES}

ARGUMENTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "service": {
            "type": "string",
            "minLength": 1,
            "maxLength": NAME_CHARS,
            "description": "Only incidents of this service: its id (PIJ90N7) or its name, in any case.",
        },
        "urgency": {
            "type": "string",
            "enum": list(URGENCIES),
            "description": 'Only incidents of this urgency: "high" or "low".',
        },
    },
    "additionalProperties": False,
}


# ---- reading a payload ---------------------------------------------------------------


class _Object(_payload.Fields):
    __slots__ = ()
    error = Unmapped


@dataclass(frozen=True, slots=True)
class _Actor:
    """Who caused a change, from a webhook's ``agent`` or a log entry's; all None for nobody."""

    id: str | None = None
    name: str | None = None
    type: str | None = None

    @classmethod
    def read(cls, agent: _Object | None) -> _Actor:
        if agent is None:
            return cls()
        kind = agent.optional_text("type", NAME_CHARS)
        return cls(
            agent.optional_text("id", ID_CHARS),
            agent.optional_text("summary", NAME_CHARS),
            # "user_reference" and "user" are the same kind of actor to a policy.
            kind.removesuffix("_reference") if kind else None,
        )


def _id_time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _priority(incident: _Object) -> str | None:
    priority = incident.optional_object("priority")
    return None if priority is None else priority.text("summary", NAME_CHARS)


def _service(incident: _Object) -> dict[str, str]:
    service = incident.object("service")
    return {"id": service.text("id", ID_CHARS), "name": service.text("summary", NAME_CHARS)}


def _names(references: list[_Object]) -> list[str]:
    return [reference.text("summary", NAME_CHARS) for reference in references]


def _assignees(incident: _Object) -> list[str]:
    """The assignees' names: a webhook's incident lists ``assignees``, the REST API's ``assignments``."""
    if "assignees" in incident.raw:
        return _names(incident.objects("assignees", MAX_ASSIGNEES))
    assignments = incident.objects("assignments", MAX_ASSIGNEES)
    return _names([assignment.object("assignee") for assignment in assignments])


def _reference(value: _Object | None) -> dict[str, str] | None:
    if value is None:
        return None
    return {"id": value.text("id", ID_CHARS), "name": value.text("summary", NAME_CHARS)}


def _client(name: str | None, url: str | None) -> dict[str, str | None] | None:
    return None if name is None else {"name": name, "url": url}


def _webhook_client(event: _Object) -> dict[str, str | None] | None:
    """A V3 webhook's ``event.client``: the monitoring tool or app through which the change came."""
    client = event.optional_object("client")
    if client is None:
        return None
    return _client(client.optional_text("name", NAME_CHARS), client.optional_text("url", URL_CHARS))


def _entry_client(entry: _Object) -> dict[str, str | None] | None:
    """A log entry's ``channel.client`` and ``channel.client_url``, as the Events API's sender set them."""
    channel = entry.optional_object("channel")
    if channel is None:
        return None
    return _client(
        channel.optional_text("client", NAME_CHARS), channel.optional_text("client_url", URL_CHARS)
    )


def _time_id(kind: str, incident_id: str, occurred_at: datetime) -> tuple[str, str | None]:
    """An id holding the time, and its prefix for the same change seen by the other ingress path."""
    if kind == "incident.triggered":
        return f"{kind}:{incident_id}", None
    return f"{kind}:{incident_id}:{_id_time(occurred_at)}", f"{kind}:{incident_id}:"


def _event(
    kind: str,
    incident: _Object,
    status: str,
    occurred_at: datetime,
    actor: _Actor,
    assignees: list[str],
    client: dict[str, str | None] | None,
) -> Mapped:
    incident_id = incident.text("id", ID_CHARS)
    data: dict[str, Any] = {
        "incidentId": incident_id,
        # A webhook's incident has "number", the REST API's "incident_number".
        "number": incident.integer("number" if "number" in incident.raw else "incident_number"),
        "title": incident.text("title", TITLE_CHARS),
        "status": status,
        "urgency": incident.text("urgency", NAME_CHARS),
        "priority": _priority(incident),
        "service": _service(incident),
        "url": incident.text("html_url", URL_CHARS),
        "actor": actor.name,
        "actorType": actor.type,
        "occurredAt": iso(occurred_at),
        "incidentKey": incident.optional_text("incident_key", NAME_CHARS),
        "createdAt": iso(incident.moment("created_at")),
        "escalationPolicy": _reference(incident.optional_object("escalation_policy")),
        "teams": _names(incident.objects("teams", MAX_TEAMS)),
        "assignees": assignees,
        "client": client,
    }
    event_id, prefix = _time_id(kind, incident_id, occurred_at)
    if prefix is None:
        return Mapped(kind, event_id, occurred_at, data, actor.id)
    return Mapped(kind, event_id, occurred_at, data, actor.id, prefix, SAME_CHANGE_WITHIN)


def _referencing(kind: str, event: _Object, body: _Object) -> Mapped:
    """An event whose ``data`` is an object of its own naming the incident by ``data.incident``."""
    incident = body.object("incident")
    incident_id = incident.text("id", ID_CHARS)
    occurred_at = event.moment("occurred_at")
    actor = _Actor.read(event.optional_object("agent"))
    data: dict[str, Any] = {
        "incidentId": incident_id,
        "title": incident.optional_text("summary", TITLE_CHARS),
        "url": incident.text("html_url", URL_CHARS),
        "actor": actor.name,
        "actorType": actor.type,
        "occurredAt": iso(occurred_at),
    }
    if kind == "incident.annotated":
        # A note has an id of its own: two notes in one second are two events.
        data["noteId"] = body.text("id", ID_CHARS)
        data["note"] = body.text("content", NOTE_CHARS)
        return Mapped(kind, f"{kind}:{incident_id}:{data['noteId']}", occurred_at, data, actor.id)
    if kind == "incident.status_update_published":
        data["statusUpdateId"] = body.text("id", ID_CHARS)
        data["message"] = body.text("message", NOTE_CHARS)
        return Mapped(kind, f"{kind}:{incident_id}:{data['statusUpdateId']}", occurred_at, data, actor.id)
    # incident.responder.added: one request per responder and time.
    responder = _reference(body.object("user"))
    assert responder is not None
    data["responder"] = responder
    data["escalationPolicy"] = _reference(body.optional_object("escalation_policy"))
    data["state"] = body.optional_text("state", NAME_CHARS)
    data["message"] = body.optional_text("message", NOTE_CHARS)
    event_id = f"{kind}:{incident_id}:{responder['id']}:{_id_time(occurred_at)}"
    return Mapped(kind, event_id, occurred_at, data, actor.id)


# ---- the entry points ----------------------------------------------------------------


def envelope(payload: Any) -> Envelope:
    """The id and type of a V3 webhook body's event; Unmapped if it has none."""
    event = _Object.of(payload, "").object("event")
    return Envelope(event.text("id", NAME_CHARS), event.text("event_type", NAME_CHARS))


def from_webhook(payload: dict[str, Any]) -> Mapped | None:
    """A V3 webhook body as an event, or None if its event type is not one we emit."""
    event = _Object.of(payload, "").object("event")
    kind = event.text("event_type", NAME_CHARS)
    if kind not in EVENT_TYPES:
        return None  # pagey.ping, service.updated, incident.conference_bridge.updated...
    if kind not in _INCIDENT_TYPES:
        return _referencing(kind, event, event.object("data"))
    incident = event.object("data")
    return _event(
        kind,
        incident,
        incident.text("status", NAME_CHARS),
        event.moment("occurred_at"),
        _Actor.read(event.optional_object("agent")),
        _assignees(incident),
        _webhook_client(event),
    )


def from_incident(item: dict[str, Any]) -> Mapped:
    """One item of GET /incidents as incident.triggered (the list names no creator: actor is null)."""
    incident = _Object.of(item, "incident")
    return _event(
        "incident.triggered",
        incident,
        "triggered",
        incident.moment("created_at"),
        _Actor(),
        _assignees(incident),
        None,
    )


def from_log_entry(item: dict[str, Any]) -> Mapped | None:
    """One item of GET /log_entries (asked with ``include[]=incidents``, so that its ``incident`` is the
    whole incident) as an event, or None for a log entry type we do not emit."""
    entry = _Object.of(item, "log_entry")
    emitted = _LOG_ENTRY_TYPES.get(entry.text("type", NAME_CHARS))
    if emitted is None:
        return None  # notify, annotate, assign, snooze...
    kind, status = emitted
    incident = entry.object("incident")
    # Whom the change assigned, as the entry lists them; else whom the incident has now.
    listed = "assignees" in entry.raw
    assignees = _names(entry.objects("assignees", MAX_ASSIGNEES)) if listed else _assignees(incident)
    if status == "resolved":
        assignees = []
    actor = _Actor.read(entry.optional_object("agent"))
    return _event(kind, incident, status, entry.moment("created_at"), actor, assignees, _entry_client(entry))


# ---- the subscription filter ---------------------------------------------------------


def matches(arguments: dict[str, Any], data: dict[str, Any]) -> bool:
    """Whether an event's data passes a subscription's arguments; an absent argument lets all through."""
    service = arguments.get("service")
    if service is not None and not _service_matches(service, data.get("service")):
        return False
    urgency = arguments.get("urgency")
    return urgency is None or urgency == data.get("urgency")


def _service_matches(wanted: Any, service: Any) -> bool:
    if not isinstance(wanted, str) or not isinstance(service, dict):
        return False
    # A subscription names a service as a person types it: its id or its name, in any case.
    return any(
        isinstance(value, str) and value.casefold() == wanted.casefold()
        for value in (service.get("id"), service.get("name"))
    )


# ---- the tools' brief form -----------------------------------------------------------


def brief(incident: dict[str, Any]) -> dict[str, Any]:
    """An incident of the REST API in a few fields, for a list an agent reads whole. Lenient: a
    field PagerDuty left out is null rather than an error, since this is an answer, not an event."""

    def text(value: Any, limit: int) -> str | None:
        return _payload.bounded(value, limit) if isinstance(value, str) else None

    def part(key: str) -> dict[str, Any]:
        value = incident.get(key)
        return value if isinstance(value, dict) else {}

    service, priority = part("service"), part("priority")
    number = incident.get("incident_number", incident.get("number"))
    return {
        "id": text(incident.get("id"), ID_CHARS),
        "number": number if isinstance(number, int) and not isinstance(number, bool) else None,
        "title": text(incident.get("title"), TITLE_CHARS),
        "status": text(incident.get("status"), NAME_CHARS),
        "urgency": text(incident.get("urgency"), NAME_CHARS),
        "priority": text(priority.get("summary"), NAME_CHARS),
        "service": {
            "id": text(service.get("id"), ID_CHARS),
            "name": text(service.get("summary"), NAME_CHARS),
        },
        "createdAt": text(incident.get("created_at"), NAME_CHARS),
        "url": text(incident.get("html_url"), URL_CHARS),
    }
