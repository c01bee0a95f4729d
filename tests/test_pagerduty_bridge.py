"""The PagerDuty bridge (``agentwake bridge pagerduty``) piece by piece: the mapping of PagerDuty's
payloads, V3 webhook ingress, the filters, the tools, the poller, the REST client's secrecy and the
command line.

Everything runs in process: a ``BridgeServer`` with its real aiohttp webhook listener on loopback, the
SDK's in-memory ``mcp.Client`` for MCP, a real SQLite log in tmp_path, and agentwake/fakes/pagerduty.py as
PagerDuty. What the framework does for every bridge (log bounds, cursors, events/list, restarts, MCP
auth) is tested with the GitHub bridge and not again here.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from conftest import UPSTREAM_PAYLOADS, free_port
from jsonschema import Draft202012Validator
from mcp import Client
from mcp.shared.exceptions import MCPError
from pydantic import TypeAdapter
from typer.testing import CliRunner

from agentwake import protocol
from agentwake.bridges import pagerduty_events
from agentwake.bridges.framework import BridgeOptions, BridgeServer
from agentwake.bridges.pagerduty import TOOLS, PagerDutyBridge, PagerDutySettings
from agentwake.bridges.pagerduty_api import PagerDutyAPI, PagerDutyError, RateLimited
from agentwake.cli import app
from agentwake.fakes.pagerduty import FakePagerDuty, sign
from agentwake.mcp import _EventsRequest, _Params

pytestmark = pytest.mark.anyio

SECRET = "ChPGG0QqGAXrFAQ+Ffx6cR7B5/Jz9MNWCg9XwiTVtJWmy1eVy3jjhI8y4AAHVq1t"
OLD_SECRET = "wXq7+0mPzC2kHv9T1yLr5bN3dJfA8sGe4uQoZiWc6MtRxYpKlVnBhDgEjU"
KEY = "u+Pd7ExAmPlEkEy_9f2c"
FIXTURES = Path(__file__).parent / "fixtures" / "pagerduty"
RESULT = TypeAdapter(dict[str, Any])


# PagerDuty's own published payloads (see its PROVENANCE.md), read in place, never copied here.
UPSTREAM = UPSTREAM_PAYLOADS / "pagerduty"


def fixture(relative: str) -> Any:
    return json.loads((FIXTURES / relative).read_text(encoding="utf-8"))


def upstream_payload(event_type: str) -> dict[str, Any]:
    """PagerDuty's documented example V3 delivery of ``event_type`` (developer-docs), as published."""
    examples = json.loads((UPSTREAM / "developer-docs-v3-overview.json").read_text(encoding="utf-8"))
    body: dict[str, Any] = json.loads(examples["webhook_examples"][event_type]["raw"])
    return body


def headers(body: bytes, signature: str | None, webhook_id: str | None = None) -> dict[str, str]:
    """What PagerDuty sends with a V3 webhook."""
    found = {
        "Content-Type": "application/json",
        "User-Agent": "PagerDuty-Webhook/V3.0",
        "X-Webhook-Id": webhook_id or str(uuid.uuid4()),
        "X-Webhook-Subscription": "PSUB0TEST",
    }
    if signature is not None:
        found["X-PagerDuty-Signature"] = signature
    return found


@dataclass
class Hook:
    """PagerDuty's side of the webhook: POSTs to the bridge's listener."""

    url: str
    session: aiohttp.ClientSession

    async def post(self, body: bytes, sent: dict[str, str]) -> tuple[int, dict[str, Any]]:
        async with self.session.post(self.url, data=body, headers=sent) as answer:
            return answer.status, await answer.json()

    async def deliver(self, payload: dict[str, Any], *secrets: str) -> tuple[int, dict[str, Any]]:
        body = json.dumps(payload).encode()
        return await self.post(body, headers(body, sign(body, *(secrets or (SECRET,)))))


@dataclass
class InProcess:
    server: BridgeServer
    bridge: PagerDutyBridge
    client: Client
    hook: Hook

    def head(self) -> int:
        return self.server.log.head()

    async def poll(self, name: str, arguments: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every logged event of ``name`` that passes ``arguments``, by events/poll from the start."""
        params: dict[str, Any] = {"name": name, "cursor": "0"}
        if arguments is not None:
            params["arguments"] = arguments
        request = _EventsRequest(method="events/poll", params=_Params.model_validate(params))
        result = await self.client.session.send_request(request, RESULT)  # type: ignore[type-var]
        events: list[dict[str, Any]] = result["events"]
        return events

    async def tool(self, name: str, arguments: dict[str, Any]) -> Any:
        result = await self.client.call_tool(name, arguments)
        assert not result.is_error, result
        return result.structured_content


@asynccontextmanager
async def in_process(
    tmp_path: Path,
    pd: FakePagerDuty,
    *,
    secrets: tuple[str, ...] = (SECRET,),
    from_email: str | None = "oncall-bot@example.com",
    allowed_tools: tuple[str, ...] = (),
) -> AsyncIterator[InProcess]:
    """A PagerDuty bridge in this process: its webhook listener on a free loopback port (as ``--listen
    127.0.0.1:0``) and its MCP server behind an in-memory client. The poller is stepped by the tests."""
    options = BridgeOptions(state_dir=tmp_path / "bridge", listen="127.0.0.1:0", max_events=1000)
    settings = PagerDutySettings(
        webhook_secrets=tuple(secret.encode() for secret in secrets),
        api_key=KEY,
        from_email=from_email,
        api_base=pd.url,
        max_delivery_age=timedelta(hours=1),
        allowed_tools=allowed_tools,
    )
    bridge = PagerDutyBridge(options, settings)
    server = BridgeServer(bridge)
    try:
        async with (
            server.events.running(),
            anyio.create_task_group() as tg,
            Client(server.mcp) as client,
            aiohttp.ClientSession() as session,
        ):
            await server._start_webhook_listener(tg)
            assert server.webhook_address is not None
            host, port = server.webhook_address
            yield InProcess(server, bridge, client, Hook(f"http://{host}:{port}/webhook", session))
            tg.cancel_scope.cancel()
    finally:
        await bridge.aclose()
        server.log.close()
        server.webhook_store.close()


@pytest.fixture
async def pd() -> AsyncIterator[FakePagerDuty]:
    async with FakePagerDuty(api_key=KEY) as fake:
        yield fake


def ids(events: list[dict[str, Any]]) -> list[str]:
    return [event["eventId"] for event in events]


def polls(pd: FakePagerDuty) -> list[Any]:
    """The poller's requests (not the look-up of the bridge's own user)."""
    return [r for r in pd.requests if not r.path.startswith("/users")]


# ---- the mapping ----------------------------------------------------------------------------------


def test_every_fixture_maps_to_a_valid_event_and_both_ingress_paths_agree_on_ids() -> None:
    webhooks = {
        name: pagerduty_events.from_webhook(fixture(f"webhooks/{name}.json"))
        for name in ("incident.triggered", "incident.acknowledged", "incident.escalated", "incident.resolved")
    }
    entries = fixture("rest/log_entries.json")["log_entries"]
    polled = [m for m in map(pagerduty_events.from_log_entry, entries) if m is not None]
    incidents = [pagerduty_events.from_incident(item) for item in fixture("rest/incidents.json")["incidents"]]
    for mapped in [*webhooks.values(), *polled, *incidents]:
        assert mapped is not None
        validator = Draft202012Validator(pagerduty_events.PAYLOAD_SCHEMAS[mapped.type])
        assert not [e.message for e in validator.iter_errors(mapped.data)], mapped
    assert pagerduty_events.from_webhook(fixture("webhooks/pagey.ping.json")) is None
    assert [entry["type"] for entry in entries if pagerduty_events.from_log_entry(entry) is None] == [
        "annotate_log_entry"
    ]

    incident = "Q2KX7Z4M9FJHTA"
    assert {name: m.event_id for name, m in webhooks.items() if m is not None} == {
        "incident.triggered": f"incident.triggered:{incident}",
        "incident.acknowledged": f"incident.acknowledged:{incident}:2024-05-02T09:46:42Z",
        "incident.escalated": f"incident.escalated:{incident}:2024-05-02T09:44:07Z",
        "incident.resolved": f"incident.resolved:{incident}:2024-05-02T10:31:55Z",
    }
    # The webhook's occurred_at has milliseconds, the log entry's created_at seconds: the same ids.
    assert {m.event_id for m in webhooks.values() if m is not None} <= {m.event_id for m in polled}
    assert incidents[0].event_id == f"incident.triggered:{incident}"

    acknowledged = webhooks["incident.acknowledged"]
    assert acknowledged is not None
    assert acknowledged.actor_id == "PGR4C3H"
    assert acknowledged.data == {
        "incidentId": incident,
        "number": 1234,
        "title": "High error rate on checkout-api (5xx > 5% for 5 min)",
        "status": "acknowledged",
        "urgency": "high",
        "priority": "P1",
        "service": {"id": "PSV7K2Q", "name": "Checkout API"},
        "url": f"https://acme.pagerduty.com/incidents/{incident}",
        "actor": "Grace Hopper",
        "actorType": "user",
        "occurredAt": "2024-05-02T09:46:42.108Z",
        "incidentKey": "3f0c9e1b6e8d4a0f9a1b2c3d4e5f6a7b",
        "createdAt": "2024-05-02T09:14:07.000Z",
        "escalationPolicy": {"id": "PEP0L1C", "name": "Checkout On-Call"},
        "teams": ["Payments"],
        "assignees": ["Grace Hopper"],
        "client": {"name": "PagerDuty Mobile", "url": None},
    }
    escalated = webhooks["incident.escalated"]
    assert escalated is not None
    assert (escalated.data["actor"], escalated.data["actorType"], escalated.actor_id) == (None, None, None)
    assert escalated.data["assignees"] == ["Grace Hopper"]
    by_id = {m.event_id: m for m in polled}
    assert by_id[escalated.event_id].data["assignees"] == ["Grace Hopper"]
    batch = next(m for m in incidents if m.data["number"] == 1235)
    assert (batch.data["urgency"], batch.data["priority"], batch.data["assignees"]) == (
        "low",
        None,
        ["Ada Lovelace"],
    )


def test_a_payload_missing_what_an_event_needs_is_unmapped_naming_the_field_only() -> None:
    body = fixture("webhooks/incident.triggered.json")
    body["event"]["data"]["service"] = "Checkout API — do not print me"
    with pytest.raises(pagerduty_events.Unmapped) as wrong:
        pagerduty_events.from_webhook(body)
    assert str(wrong.value) == "event.data.service: must be an object, not a string"
    entry = fixture("rest/log_entries.json")["log_entries"][0]
    entry["incident"] = {"id": "Q2KX7Z4M9FJHTA", "type": "incident_reference", "summary": "[#1234] t"}
    with pytest.raises(pagerduty_events.Unmapped, match=r"^log_entry\.incident\.incident_number: missing$"):
        pagerduty_events.from_log_entry(entry)


# ---- webhook ingress ------------------------------------------------------------------------------


async def test_any_v1_signature_under_any_secret_is_accepted_and_forgeries_are_401(
    tmp_path: Path, pd: FakePagerDuty
) -> None:
    async with in_process(tmp_path, pd, secrets=(SECRET, OLD_SECRET)) as bridge:
        incident = pd.trigger("Checkout error rate above 5%")
        body = json.dumps(pd.webhook("incident.triggered", incident["id"])).encode()
        forged = {
            "wrong secret": sign(body, "not the secret"),
            "another body": sign(body + b" ", SECRET),
            "another version": sign(body, SECRET).replace("v1=", "v2="),
            "bare hex": sign(body, SECRET).removeprefix("v1="),
            "too long": sign(body, SECRET) + "," + "v1=" + "0" * 64 * 40,
            "empty": "",
            "missing": None,
        }
        for what, signature in forged.items():
            status, answer = await bridge.hook.post(body, headers(body, signature))
            assert (status, answer["status"]) == (401, "refused"), what
            assert "X-PagerDuty-Signature" in answer["error"]
        assert bridge.head() == 0

        # While PagerDuty rotates, it signs with two secrets; one we hold is enough, in any place.
        rotating = f"{sign(body, 'a secret we do not hold')},{sign(body, OLD_SECRET)}"
        status, answer = await bridge.hook.post(body, headers(body, rotating))
        assert (status, answer["status"]) == (202, "accepted"), answer

        other = pd.trigger("Checkout latency above 2 s")
        status, answer = await bridge.hook.deliver(pd.webhook("incident.triggered", other["id"]), SECRET)
        assert (status, answer["status"]) == (202, "accepted"), answer
        assert ids(await bridge.poll("incident.triggered")) == [
            f"incident.triggered:{incident['id']}",
            f"incident.triggered:{other['id']}",
        ]


async def test_replays_and_retries_are_duplicates_and_stale_unreadable_and_unemitted_ones_store_nothing(
    tmp_path: Path, pd: FakePagerDuty
) -> None:
    async with in_process(tmp_path, pd) as bridge:
        incident = pd.trigger("Checkout error rate above 5%")
        payload = pd.webhook("incident.triggered", incident["id"])
        event_id = payload["event"]["id"]
        body = json.dumps(payload).encode()
        sent = headers(body, sign(body, SECRET))

        status, answer = await bridge.hook.post(body, sent)
        assert (status, answer) == (202, {"status": "accepted", "event": event_id})
        # A replay: the same request again.
        status, answer = await bridge.hook.post(body, sent)
        assert (status, answer) == (200, {"status": "duplicate", "event": event_id})
        # A retry: PagerDuty sends the same event again under a new delivery.
        status, answer = await bridge.hook.post(body, headers(body, sign(body, SECRET)))
        assert (status, answer["status"]) == (200, "duplicate")
        # The same occurrence under another event id is accepted, and logged once.
        status, answer = await bridge.hook.deliver({"event": {**payload["event"], "id": str(uuid.uuid4())}})
        assert (status, answer["status"]) == (202, "accepted")
        assert ids(await bridge.poll("incident.triggered")) == [f"incident.triggered:{incident['id']}"]

        stale = pd.webhook(
            "incident.triggered", incident["id"], occurred_at=datetime.now(UTC) - timedelta(hours=2)
        )
        status, answer = await bridge.hook.deliver(stale)
        assert status == 400 and "stale" in answer["error"], answer
        status, answer = await bridge.hook.deliver(fixture("webhooks/pagey.ping.json"))
        assert (status, answer) == (200, {"status": "pong"})
        # An event type the bridge does not emit (PagerDuty's documented service.updated example).
        unemitted = upstream_payload("service.updated")
        status, answer = await bridge.hook.deliver(unemitted)
        assert (status, answer["status"]) == (202, "ignored")
        status, answer = await bridge.hook.deliver(unemitted)
        assert (status, answer["status"]) == (200, "duplicate")
        for junk in (b"{not json", b"[]", b'{"event": {"event_type": "incident.triggered"}}'):
            status, answer = await bridge.hook.post(junk, headers(junk, sign(junk, SECRET)))
            assert status == 400 and "V3 webhook" in answer["error"], answer
        broken = pd.webhook("incident.acknowledged", incident["id"])
        del broken["event"]["data"]["urgency"]
        status, answer = await bridge.hook.deliver(broken)
        assert status == 400 and "event.data.urgency: missing" in answer["error"], answer
        assert bridge.head() == 1


@pytest.mark.parametrize("account_key", [False, True], ids=["user key", "account key"])
async def test_the_bridges_own_actions_are_ignored(tmp_path: Path, account_key: bool) -> None:
    async with FakePagerDuty(api_key=KEY, account_key=account_key) as pd, in_process(tmp_path, pd) as bridge:
        grace = pd.add_user("Grace Hopper", "grace@example.com")
        incident = pd.trigger("Checkout error rate above 5%")
        pd.acknowledge(incident["id"], pd.bot)  # as the agent's acknowledge tool would
        status, answer = await bridge.hook.deliver(pd.webhook("incident.acknowledged", incident["id"]))
        assert (status, answer["status"]) == (202, "ignored")
        pd.escalate(incident["id"], 2)
        pd.acknowledge(incident["id"], grace)
        status, answer = await bridge.hook.deliver(pd.webhook("incident.acknowledged", incident["id"]))
        assert (status, answer["status"]) == (202, "accepted")
        [acknowledged] = await bridge.poll("incident.acknowledged")
        assert acknowledged["data"]["actor"] == "Grace Hopper"
        # Whom the key acts as is learned once: the key's user, else the From email's.
        lookups = [(r.path, r.param("query")) for r in pd.calls("GET", "/users")]
        expected = [("/users/me", None)] + ([("/users", "oncall-bot@example.com")] if account_key else [])
        assert lookups == expected


# ---- filters --------------------------------------------------------------------------------------


async def test_service_and_urgency_arguments_filter_and_bad_arguments_are_invalid_params(
    tmp_path: Path, pd: FakePagerDuty
) -> None:
    async with in_process(tmp_path, pd) as bridge:
        checkout = pd.trigger("Checkout down", service="Checkout API", urgency="high")
        batch = pd.trigger("Export late", service="Nightly Batch", urgency="low")
        search = pd.trigger("Search slow", service="Search", urgency="low")
        for incident in (checkout, batch, search):
            status, _ = await bridge.hook.deliver(pd.webhook("incident.triggered", incident["id"]))
            assert status == 202
        checkout_id = checkout["service"]["id"]

        async def selected(arguments: dict[str, Any]) -> list[str]:
            return [e["data"]["title"] for e in await bridge.poll("incident.triggered", arguments)]

        assert await selected({}) == ["Checkout down", "Export late", "Search slow"]
        assert await selected({"urgency": "low"}) == ["Export late", "Search slow"]
        assert await selected({"service": checkout_id}) == ["Checkout down"]
        assert await selected({"service": "nightly batch"}) == ["Export late"]
        assert await selected({"service": "Search", "urgency": "high"}) == []
        for arguments in ({"urgency": "urgent"}, {"service": ""}, {"team": "Payments"}):
            with pytest.raises(MCPError) as caught:
                await bridge.poll("incident.triggered", arguments)
            assert caught.value.code == protocol.INVALID_PARAMS, arguments


# ---- tools ----------------------------------------------------------------------------------------


async def test_the_tools_send_pagerdutys_requests_as_the_from_user(tmp_path: Path, pd: FakePagerDuty) -> None:
    async with in_process(tmp_path, pd) as bridge:
        names = {tool.name for tool in (await bridge.client.list_tools()).tools}
        assert names == {"get_incident", "acknowledge", "add_note", "escalate", "list_recent_incidents"}
        incident = pd.trigger("Checkout error rate above 5%", priority="P1")
        other = pd.trigger("Export late", service="Nightly Batch", urgency="low")
        path = f"/incidents/{incident['id']}"

        acknowledged = await bridge.tool("acknowledge", {"incident_id": incident["id"]})
        note = await bridge.tool("add_note", {"incident_id": incident["id"], "note": "Rolling back v42."})
        escalated = await bridge.tool("escalate", {"incident_id": incident["id"], "escalation_level": 2})
        fetched = await bridge.tool("get_incident", {"incident_id": incident["id"]})
        listed = await bridge.tool(
            "list_recent_incidents", {"hours": 2, "statuses": ["triggered"], "limit": 10}
        )

        sent = [(r.method, r.path, r.json) for r in pd.requests if not r.path.startswith("/users")]
        assert sent == [
            ("PUT", path, {"incident": {"type": "incident_reference", "status": "acknowledged"}}),
            ("POST", f"{path}/notes", {"note": {"content": "Rolling back v42."}}),
            ("PUT", path, {"incident": {"type": "incident_reference", "escalation_level": 2}}),
            ("GET", path, None),
            ("GET", "/incidents", None),
        ]
        for request in pd.requests:
            assert request.headers["Authorization"] == f"Token token={KEY}"
            assert request.headers["Accept"] == "application/vnd.pagerduty+json;version=2"
            assert request.headers.get("From") == (
                "oncall-bot@example.com" if request.method != "GET" else None
            )
        query = pd.calls("GET", "/incidents")[-1].query
        assert query["statuses[]"] == ["triggered"] and query["sort_by"] == ["created_at:desc"]
        assert query["limit"] == ["10"]
        window = datetime.fromisoformat(query["until"][0]) - datetime.fromisoformat(query["since"][0])
        assert window == timedelta(hours=2)

        assert acknowledged["status"] == "acknowledged" and note["content"] == "Rolling back v42."
        assert escalated["status"] == "triggered" and fetched["id"] == incident["id"]
        # The escalation re-triggered the incident, so both are "triggered" now, newest first, in brief.
        assert [i["id"] for i in listed["incidents"]] == [other["id"], incident["id"]]
        assert listed["incidents"][1] == {
            "id": incident["id"],
            "number": incident["incident_number"],
            "title": "Checkout error rate above 5%",
            "status": "triggered",
            "urgency": "high",
            "priority": "P1",
            "service": {"id": incident["service"]["id"], "name": "Checkout API"},
            "createdAt": incident["created_at"],
            "url": incident["html_url"],
        }
        assert listed["more"] is False

        before = len(pd.requests)
        refused = [
            ("acknowledge", {"incident_id": "../users/me"}, "incident_id"),
            ("add_note", {"incident_id": incident["id"], "note": ""}, "note"),
            ("escalate", {"incident_id": incident["id"], "escalation_level": 0}, "escalation_level"),
            ("list_recent_incidents", {"statuses": ["open"]}, "statuses"),
            ("resolve", {"incident_id": incident["id"]}, "resolve"),
        ]
        for tool, arguments, named in refused:
            result = await bridge.client.call_tool(tool, arguments)
            assert result.is_error, (tool, arguments)
            assert named in result.content[0].text, result.content[0].text  # type: ignore[union-attr]
        assert len(pd.requests) == before
        result = await bridge.client.call_tool(
            "escalate", {"incident_id": incident["id"], "escalation_level": 9}
        )
        assert result.is_error
        text = result.content[0].text  # type: ignore[union-attr]
        assert f"PUT {path}: 400" in text and "Escalation level must be" in text and KEY not in text, text


async def test_resolve_is_offered_only_when_allowed_and_writes_need_a_from_email(
    tmp_path: Path, pd: FakePagerDuty
) -> None:
    incident = pd.trigger("Checkout error rate above 5%")
    async with in_process(tmp_path / "a", pd, allowed_tools=("resolve",)) as bridge:
        assert {tool.name for tool in (await bridge.client.list_tools()).tools} == set(TOOLS)
        resolved = await bridge.tool("resolve", {"incident_id": incident["id"]})
        assert resolved["status"] == "resolved"
        request = pd.calls("PUT")[-1]
        assert request.json == {"incident": {"type": "incident_reference", "status": "resolved"}}
        assert request.headers["From"] == "oncall-bot@example.com"
    before = len(pd.requests)
    async with in_process(tmp_path / "b", pd, from_email=None) as bridge:
        result = await bridge.client.call_tool("acknowledge", {"incident_id": incident["id"]})
        assert result.is_error and "--from-email" in result.content[0].text  # type: ignore[union-attr]
        assert (await bridge.tool("get_incident", {"incident_id": incident["id"]}))["status"] == "resolved"
    assert [r.method for r in pd.requests[before:]] == ["GET"]


# ---- the poller -----------------------------------------------------------------------------------


async def test_the_poller_keeps_since_cursors_waits_out_a_429_and_agrees_with_webhooks(
    tmp_path: Path, pd: FakePagerDuty
) -> None:
    grace = pd.add_user("Grace Hopper", "grace@example.com")
    before = pd.trigger("Opened before the bridge started", at=datetime.now(UTC) - timedelta(minutes=5))
    async with in_process(tmp_path, pd) as bridge:
        log = bridge.server.log
        # Round 1 is the baseline: nothing is asked, and nothing before it will be news.
        assert await bridge.bridge.poll_once() == 30.0
        assert pd.requests == []
        baseline = log.get_state("baseline")
        cursor = log.get_state("log_entries:since")
        assert cursor == log.get_state("incidents:since") and baseline <= cursor
        pd.acknowledge(before["id"], grace)
        new = pd.trigger("Checkout error rate above 5%")
        status, _ = await bridge.hook.deliver(pd.webhook("incident.triggered", new["id"]))
        assert status == 202

        # Rate limited: both cursors stay, nothing is logged, and the round asks to wait for the reset.
        pd.fail_next(429, headers={"ratelimit-reset": "45"})
        started = time.time()
        assert 44 <= await bridge.bridge.poll_once() <= 45.5
        assert (log.get_state("log_entries:since"), log.get_state("incidents:since")) == (cursor, cursor)
        assert len(polls(pd)) == 1
        assert bridge.head() == 1

        # The next round reads both feeds from the baseline (the cursor less the overlap is before it).
        assert await bridge.bridge.poll_once() == 30.0
        entries, incidents = polls(pd)[1:]
        assert (entries.path, incidents.path) == ("/log_entries", "/incidents")
        assert entries.query["since"] == incidents.query["since"] == [baseline]
        assert entries.query["is_overview"] == ["true"] and entries.query["include[]"] == ["incidents"]
        assert incidents.query["sort_by"] == ["created_at:asc"]
        until = entries.query["until"][0]
        assert datetime.fromisoformat(until).timestamp() >= started
        assert log.get_state("log_entries:since") == log.get_state("incidents:since") == until
        # The acknowledgement of an incident from before the baseline is news; its trigger is not.
        # The trigger already came by webhook: the same id, logged once.
        assert ids(await bridge.poll("incident.triggered")) == [f"incident.triggered:{new['id']}"]
        [acknowledged] = await bridge.poll("incident.acknowledged")
        assert acknowledged["data"]["incidentId"] == before["id"]
        assert acknowledged["data"]["actor"] == "Grace Hopper"

        # Round 3: the window starts a minute before the cursor; what it reads again is kept once,
        # and the bridge's own acknowledgement wakes nobody.
        pd.escalate(new["id"], 2)
        pd.acknowledge(new["id"], pd.bot)
        await bridge.bridge.poll_once()
        since = datetime.fromisoformat(polls(pd)[-1].query["since"][0])
        assert since == max(
            datetime.fromisoformat(baseline), datetime.fromisoformat(until) - timedelta(minutes=1)
        )
        [escalated] = await bridge.poll("incident.escalated")
        assert escalated["data"]["assignees"] == ["Grace Hopper"] and escalated["data"]["actor"] is None
        assert len(await bridge.poll("incident.acknowledged")) == 1
        assert len(await bridge.poll("incident.triggered")) == 1


# ---- the REST client ------------------------------------------------------------------------------


async def test_the_key_is_in_no_error_or_repr_and_a_429_says_when_to_retry(pd: FakePagerDuty) -> None:
    errors: list[BaseException] = []
    async with PagerDutyAPI(base_url=pd.url, api_key=KEY, from_email="oncall-bot@example.com") as api:
        assert KEY not in repr(api) and "with a key" in repr(api)
        for call in (api.get_incident("QNOTHERE"), api.acknowledge("QNOTHERE")):
            with pytest.raises(PagerDutyError) as missing:
                await call
            assert missing.value.status == 404 and missing.value.message == "Incident Not Found (code 2100)"
            errors.append(missing.value)
        pd.fail_next(429, headers={"Retry-After": "5", "ratelimit-reset": "50"})
        pd.fail_next(429, headers={"ratelimit-reset": "50"})
        pd.fail_next(429)
        now = time.time()
        retry_at = []
        for _ in range(3):
            with pytest.raises(RateLimited) as limited:
                await api.me()
            retry_at.append(limited.value.retry_at - now)
            errors.append(limited.value)
        assert [round(delta) for delta in retry_at] == [5, 50, 60]
    async with PagerDutyAPI(base_url=f"http://127.0.0.1:{free_port()}", api_key=KEY) as unreachable:
        with pytest.raises(PagerDutyError) as refused:
            await unreachable.me()
        assert refused.value.status == 0 and refused.value.__cause__ is None
        errors.append(refused.value)
    for error in errors:
        assert KEY not in str(error) and KEY not in repr(vars(error))
    with pytest.raises(ValueError, match="printable") as bad:
        PagerDutyAPI(api_key=f"{KEY} \n")
    assert KEY not in str(bad.value)
    for address in ("not an email", "a@b.c, d@e.f", "bot@example.com\r\nX-Evil: 1"):
        with pytest.raises(ValueError, match="From email"):
            PagerDutyAPI(from_email=address)


# ---- the command line -----------------------------------------------------------------------------


def test_bad_command_lines_exit_2_with_one_error_line_and_no_secret(tmp_path: Path) -> None:
    secrets: dict[str, str | None] = {"PAGERDUTY_API_KEY": KEY, "PAGERDUTY_WEBHOOK_SECRET": SECRET}
    cases: list[tuple[list[str], dict[str, str | None], list[str]]] = [
        (["--listen", "127.0.0.1:0"], {"PAGERDUTY_WEBHOOK_SECRET": None}, ["PAGERDUTY_WEBHOOK_SECRET"]),
        (["--poll"], {"PAGERDUTY_API_KEY": None}, ["--poll", "--api-key-env"]),
        (["--allow-tool", "delete_service"], secrets, ["delete_service", "resolve"]),
        (["--from-email", "on call"], secrets, ["From email"]),
        (["--api-base", "ftp://api.pagerduty.com"], secrets, ["http"]),
    ]
    level = logging.getLogger("agentwake.bridge").level
    try:
        for args, env, named in cases:
            result = CliRunner().invoke(
                app, ["bridge", "pagerduty", "--state-dir", str(tmp_path / "state"), *args], env=env
            )
            assert result.exit_code == 2, (args, result.output)
            errors = [line for line in result.output.splitlines() if line.startswith("error:")]
            assert len(errors) == 1, (args, result.output)
            assert all(needle in errors[0] for needle in named), (args, result.output)
            assert KEY not in result.output and SECRET not in result.output
    finally:
        logging.getLogger("agentwake.bridge").setLevel(level)
    assert not (tmp_path / "state").exists()
