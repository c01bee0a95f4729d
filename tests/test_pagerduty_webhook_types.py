"""The incident events triage wants beyond trigger/acknowledge/escalate/resolve, each delivered as
PagerDuty delivers it (a signed V3 webhook POSTed to the bridge's listener) with PagerDuty's own
payloads from /work/shared/upstream-payloads/pagerduty (see its PROVENANCE.md): the documented
``incident.priority_updated`` example, the recorded ``incident.annotated`` delivery, and for the
other types the documented example envelope around the documented ``event.data`` of that type.
Only ``occurred_at`` is moved to now (the examples are years old, so stale) and the body re-signed.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from test_pagerduty_bridge import KEY, UPSTREAM, in_process, upstream_payload

from agentwake.bridges import pagerduty_events
from agentwake.fakes.pagerduty import FakePagerDuty, webhook_time

pytestmark = pytest.mark.anyio

DOCS = json.loads((UPSTREAM / "developer-docs-v3-overview.json").read_text(encoding="utf-8"))
RECORDED = json.loads((UPSTREAM / "aldaviva-recorded-deliveries.json").read_text(encoding="utf-8"))
DOCS_INCIDENT = "PGR0VU2"
DOCS_ACTOR = ("Tenex Engineer", "user")


@pytest.fixture
async def pd() -> AsyncIterator[FakePagerDuty]:
    async with FakePagerDuty(api_key=KEY) as fake:
        yield fake


def documented(event_type: str, data_type: str) -> dict[str, Any]:
    """The documented example envelope (incident.priority_updated's) as ``event_type``, its ``data``
    the documented object of ``data_type``."""
    body = upstream_payload("incident.priority_updated")
    body["event"]["event_type"] = event_type
    body["event"]["data"] = copy.deepcopy(DOCS["event_data_types"][data_type])
    return body


def recorded(name: str) -> dict[str, Any]:
    delivery = next(d for d in RECORDED["deliveries"] if d["name"] == name)
    body: dict[str, Any] = json.loads(delivery["body"])
    return body


def now_and_unique(body: dict[str, Any], n: int) -> dict[str, Any]:
    body["event"]["occurred_at"] = webhook_time(datetime.now(UTC))
    body["event"]["id"] = f"{body['event']['id']}-{n}"
    return body


# The documented incident's fields, as every event whose data is the whole incident maps them.
INCIDENT_FIELDS = {
    "incidentId": DOCS_INCIDENT,
    "number": 2,
    "title": "A little bump in the road",
    "status": "triggered",
    "urgency": "high",
    "priority": "P1",
    "service": {"id": "PF9KMXH", "name": "API Service"},
    "url": f"https://acme.pagerduty.com/incidents/{DOCS_INCIDENT}",
    "actor": "Tenex Engineer",
    "actorType": "user",
    "incidentKey": "d3640fbd41094207a1c11e58e46b1662",
    "createdAt": "2020-04-09T15:16:27.000Z",
    "escalationPolicy": {"id": "PUS0KTE", "name": "Default"},
    "teams": ["Engineering"],
    "assignees": ["User 123"],
    "client": {"name": "PagerDuty", "url": None},
}

CASES: dict[str, tuple[Any, dict[str, Any]]] = {
    # An escalation to P1: what triage most wants to hear of.
    "incident.priority_updated": (lambda: upstream_payload("incident.priority_updated"), INCIDENT_FIELDS),
    "incident.reassigned": (lambda: documented("incident.reassigned", "incident"), INCIDENT_FIELDS),
    "incident.delegated": (lambda: documented("incident.delegated", "incident"), INCIDENT_FIELDS),
    "incident.reopened": (lambda: documented("incident.reopened", "incident"), INCIDENT_FIELDS),
    "incident.unacknowledged": (lambda: documented("incident.unacknowledged", "incident"), INCIDENT_FIELDS),
    "incident.escalated": (lambda: documented("incident.escalated", "incident"), INCIDENT_FIELDS),
    "incident.annotated": (
        lambda: recorded("incident.annotated"),
        {
            "incidentId": "Q2CKYRLH85UNN4",
            "title": "Test",
            "url": "https://aldaviva.pagerduty.com/incidents/Q2CKYRLH85UNN4",
            "actor": "Ben",
            "actorType": "user",
            "noteId": "PTSAIFZ",
            "note": "Resolution Note: I'm resolving it",
        },
    ),
    "incident.responder.added": (
        lambda: documented("incident.responder.added", "incident_responder"),
        {
            "incidentId": DOCS_INCIDENT,
            "title": "A little bump in the road",
            "url": f"https://acme.pagerduty.com/incidents/{DOCS_INCIDENT}",
            "actor": "Tenex Engineer",
            "actorType": "user",
            "responder": {"id": "PVMGSML", "name": "Maeve"},
            "escalationPolicy": {"id": "PJFWPEP", "name": "The Policy"},
            "state": "pending",
            "message": "Please help me make the tests pass",
        },
    ),
    "incident.status_update_published": (
        lambda: documented("incident.status_update_published", "incident_status_update"),
        {
            "incidentId": DOCS_INCIDENT,
            "title": "A little bump in the road",
            "url": f"https://acme.pagerduty.com/incidents/{DOCS_INCIDENT}",
            "actor": "Tenex Engineer",
            "actorType": "user",
            "statusUpdateId": "P2LA89X",
            "message": "A fix for this incident is being developed",
        },
    ),
}


@pytest.mark.parametrize("event_type", list(CASES))
async def test_each_triage_event_type_is_mapped_from_a_signed_webhook(
    tmp_path: Path, pd: FakePagerDuty, event_type: str
) -> None:
    make, expected = CASES[event_type]
    body = now_and_unique(make(), 1)
    assert body["event"]["event_type"] == event_type
    async with in_process(tmp_path, pd) as bridge:
        status, answer = await bridge.hook.deliver(body)
        assert (status, answer["status"]) == (202, "accepted"), answer
        [event] = await bridge.poll(event_type)
        data = event["data"]
        assert data.pop("occurredAt") == body["event"]["occurred_at"]
        assert data == expected
        validator = Draft202012Validator(pagerduty_events.PAYLOAD_SCHEMAS[event_type])
        assert not [e.message for e in validator.iter_errors(event["data"] | {"occurredAt": "x"})]


async def test_two_notes_in_one_second_are_two_events_and_the_agents_own_note_wakes_nobody(
    tmp_path: Path, pd: FakePagerDuty
) -> None:
    first = now_and_unique(recorded("incident.annotated"), 1)
    second = now_and_unique(recorded("incident.annotated"), 2)
    second["event"]["occurred_at"] = first["event"]["occurred_at"]
    second["event"]["data"]["id"] = "PTSAIG0"
    own = now_and_unique(recorded("incident.annotated"), 3)
    own["event"]["data"]["id"] = "PTSAIG1"
    own["event"]["agent"] = {**own["event"]["agent"], "id": pd.bot["id"], "summary": pd.bot["name"]}
    async with in_process(tmp_path, pd) as bridge:
        for body, outcome in ((first, "accepted"), (second, "accepted"), (own, "ignored")):
            status, answer = await bridge.hook.deliver(body)
            assert answer["status"] == outcome, (status, answer)
        events = await bridge.poll("incident.annotated")
        assert [e["data"]["noteId"] for e in events] == ["PTSAIFZ", "PTSAIG0"]


async def test_every_incident_event_carries_the_new_fields_and_a_note_without_content_is_unmapped() -> None:
    body = upstream_payload("incident.priority_updated")
    for event_type in ("incident.triggered", "incident.acknowledged", "incident.resolved"):
        body["event"]["event_type"] = event_type
        mapped = pagerduty_events.from_webhook(body)
        assert mapped is not None
        for name in ("incidentKey", "createdAt", "escalationPolicy", "teams", "assignees", "client"):
            assert mapped.data[name] == INCIDENT_FIELDS[name], (event_type, name)
    note = recorded("incident.annotated")
    del note["event"]["data"]["content"]
    with pytest.raises(pagerduty_events.Unmapped, match=r"^event\.data\.content: missing$"):
        pagerduty_events.from_webhook(note)
