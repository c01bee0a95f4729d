"""``EventsExtension`` over the wire: capability, events/list, events/poll and list_changed.

Every test builds ``MCPServer("t", extensions=[events])``, calls
``events.install(server)`` and talks to it through the SDK's in-process
``mcp.Client``: the default (2026-era, no handshake) path and, where the
``mode`` fixture is used, also the handshake-era ``mode="legacy"`` path.
Time is a fake ``now`` the tests move by hand; nothing sleeps.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client._memory import InMemoryTransport
from mcp.client.extension import ClientExtension, NotificationBinding
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, TypeAdapter

from agentwake import protocol
from agentwake.mcp import _EventsRequest, _Params
from agentwake.server import (
    EmitBuffer,
    Event,
    EventContext,
    EventResult,
    EventsExtension,
    forbidden,
    isoformat,
)

RESULT = TypeAdapter(dict[str, Any])
EXTENSION_ID = "io.modelcontextprotocol/events"
T0 = datetime(2026, 2, 19, 15, 30, tzinfo=UTC)

INCIDENT_INPUT = {
    "type": "object",
    "properties": {
        "severity": {"type": "string", "enum": ["P1", "P2", "P3", "P4"]},
        "redact_pii": {"type": "boolean", "default": False},
    },
    "additionalProperties": False,
}
INCIDENT_PAYLOAD = {
    "type": "object",
    "properties": {
        "incidentId": {"type": "string"},
        "severity": {"type": "string"},
        "reporter": {"type": ["string", "null"]},
    },
}
TICKET_INPUT = {
    "type": "object",
    "properties": {"queue": {"type": "string"}, "priority": {"type": "string", "enum": ["P1", "P2"]}},
    "additionalProperties": False,
}
TICKET_PAYLOAD = {"type": "object", "properties": {"n": {"type": "integer"}}}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["auto", "legacy"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class FakeNow:
    """A wall clock that only moves when the test says so."""

    def __init__(self, start: datetime = T0) -> None:
        self.value = start

    def __call__(self) -> datetime:
        return self.value

    def advance(self, **delta: float) -> None:
        self.value += timedelta(**delta)


# ---- talking to the server ------------------------------------------------------------


@dataclass
class Wire:
    client: Client

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request = _EventsRequest(method=method, params=_Params.model_validate(params))
        return await self.client.session.send_request(request, RESULT)  # type: ignore[type-var]

    async def list(self, cursor: str | None = None) -> dict[str, Any]:
        return await self.call("events/list", {"cursor": cursor} if cursor is not None else {})

    async def poll(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        cursor: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"name": name, "cursor": cursor, **extra}
        if arguments is not None:
            params["arguments"] = arguments
        return await self.call("events/poll", params)


@asynccontextmanager
async def connect(events: EventsExtension, mode: str = "auto", **client_options: Any) -> AsyncIterator[Wire]:
    server = MCPServer("t", extensions=[events])
    events.install(server)
    async with Client(server, mode=mode, **client_options) as client:
        yield Wire(client)


def event_ids(result: dict[str, Any]) -> list[str]:
    return [event["eventId"] for event in result["events"]]


async def poll_error(wire: Wire, name: str, **kwargs: Any) -> MCPError:
    with pytest.raises(MCPError) as caught:
        await wire.poll(name, **kwargs)
    return caught.value


# ---- a check-function event type ----------------------------------------------------------


@dataclass
class Upstream:
    """A durable upstream: the cursor is the position in ``events``.

    The check deliberately returns events even for a null cursor, so the tests
    can see the SDK enforce "null means start from now".
    """

    events: list[Event] = field(default_factory=list)
    calls: list[tuple[EventContext, dict[str, Any], str | None]] = field(default_factory=list)
    next_poll_ms: int | None = None
    truncated: bool = False

    def add(self, count: int, *, at: datetime = T0) -> None:
        for _ in range(count):
            n = len(self.events) + 1
            self.events.append(
                Event(name="ticket.created", data={"n": n}, event_id=f"t{n}", timestamp=at, cursor=str(n))
            )

    async def check(self, ctx: EventContext, arguments: dict[str, Any], cursor: str | None) -> EventResult:
        self.calls.append((ctx, arguments, cursor))
        start = int(cursor) if cursor is not None else 0
        return EventResult(
            events=self.events[start:],
            cursor=str(len(self.events)),
            next_poll_ms=self.next_poll_ms,
            truncated=self.truncated,
        )


def ticket_extension(upstream: Upstream, **options: Any) -> EventsExtension:
    type_options = {key: options.pop(key) for key in ("next_poll_ms", "delivery") if key in options}
    events = EventsExtension(**options)
    events.event(
        name="ticket.created",
        description="A ticket was opened.",
        input_schema=TICKET_INPUT,
        payload_schema=TICKET_PAYLOAD,
        **type_options,
    )(upstream.check)
    return events


# ---- capability ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_capability_is_advertised_under_extensions_on_a_modern_connection() -> None:
    async with connect(EventsExtension()) as wire:
        capabilities = wire.client.server_capabilities
        assert wire.client.protocol_version not in ("2025-11-25", "2025-06-18")

    assert capabilities.extensions is not None
    assert capabilities.extensions[EXTENSION_ID] == {"listChanged": True}


@pytest.mark.anyio
async def test_the_capability_is_advertised_under_experimental_on_a_handshake_era_connection() -> None:
    async with connect(EventsExtension(), "legacy") as wire:
        capabilities = wire.client.server_capabilities
        assert wire.client.protocol_version == "2025-11-25"

    assert capabilities.experimental is not None
    assert capabilities.experimental[EXTENSION_ID] == {"listChanged": True}


class _RecordingReadStream:
    """Wraps the client's read stream and keeps every message the server sent."""

    def __init__(self, inner: Any, seen: list[Any]) -> None:
        self._inner, self._seen = inner, seen

    async def receive(self) -> Any:
        item = await self._inner.receive()
        self._seen.append(item)
        return item

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _RecordingReadStream:
        return self

    async def __anext__(self) -> Any:
        item = await self._inner.__anext__()
        self._seen.append(item)
        return item

    async def __aenter__(self) -> _RecordingReadStream:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self._inner.__aexit__(exc_type, exc, tb)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _RecordingTransport:
    """The SDK's in-memory transport, with the server-to-client JSON-RPC messages recorded."""

    def __init__(self, server: MCPServer) -> None:
        self._transport = InMemoryTransport(server)
        self.seen: list[Any] = []

    async def __aenter__(self) -> tuple[Any, Any]:
        read, write = await self._transport.__aenter__()
        return _RecordingReadStream(read, self.seen), write

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self._transport.__aexit__(exc_type, exc, tb)


@pytest.mark.anyio
async def test_the_spec_spelling_capabilities_events_reaches_the_wire_in_the_initialize_result() -> None:
    events = EventsExtension()
    server = MCPServer("t", extensions=[events])
    events.install(server)
    transport = _RecordingTransport(server)

    async with Client(transport, mode="legacy"):  # type: ignore[arg-type]
        pass

    results = [
        message.message.result
        for message in transport.seen
        if isinstance(getattr(getattr(message, "message", None), "result", None), dict)
        and "protocolVersion" in message.message.result
    ]
    assert len(results) == 1
    assert results[0]["capabilities"]["events"] == {"listChanged": True}
    assert results[0]["capabilities"]["experimental"][EXTENSION_ID] == {"listChanged": True}


# ---- events/list -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_events_list_describes_every_declared_type(mode: str) -> None:
    events = ticket_extension(Upstream())
    events.event(
        name="incident.created",
        description="An incident was opened.",
        emit_only=True,
        input_schema=INCIDENT_INPUT,
        payload_schema=INCIDENT_PAYLOAD,
    )(type("IncidentCreated", (), {}))

    async with connect(events, mode) as wire:
        result = await wire.list()

    assert "nextCursor" not in result
    assert result["events"] == [
        {
            "name": "ticket.created",
            "description": "A ticket was opened.",
            "delivery": ["poll", "push"],
            "inputSchema": TICKET_INPUT,
            "payloadSchema": TICKET_PAYLOAD,
        },
        {
            "name": "incident.created",
            "description": "An incident was opened.",
            "delivery": ["poll", "push"],
            "inputSchema": INCIDENT_INPUT,
            "payloadSchema": INCIDENT_PAYLOAD,
        },
    ]


@pytest.mark.anyio
async def test_a_check_functions_docstring_is_the_description_when_none_is_given() -> None:
    events = EventsExtension()

    @events.event(name="e")
    async def check(ctx: EventContext, arguments: dict[str, Any], cursor: str | None) -> EventResult:
        """Fires when something happens."""
        return EventResult(events=[], cursor=None)

    async with connect(events) as wire:
        (descriptor,) = (await wire.list())["events"]

    assert descriptor["description"] == "Fires when something happens."
    assert descriptor["inputSchema"] == {"type": "object"}


@pytest.mark.anyio
async def test_events_list_pages_cover_every_type_exactly_once(mode: str) -> None:
    events = EventsExtension(list_page_size=2)
    names = [f"type.{n}" for n in range(5)]
    for name in names:
        events.event(name=name, emit_only=True)(type("T", (), {}))

    pages: list[list[str]] = []
    async with connect(events, mode) as wire:
        cursor: str | None = None
        for _ in range(10):
            page = await wire.list(cursor)
            pages.append([descriptor["name"] for descriptor in page["events"]])
            cursor = page.get("nextCursor")
            if cursor is None:
                break

    assert pages == [names[0:2], names[2:4], names[4:5]]


@pytest.mark.anyio
async def test_when_the_types_fill_the_last_page_exactly_there_is_no_trailing_empty_page() -> None:
    events = EventsExtension(list_page_size=2)
    for n in range(4):
        events.event(name=f"type.{n}", emit_only=True)(type("T", (), {}))

    async with connect(events) as wire:
        first = await wire.list()
        second = await wire.list(first["nextCursor"])

    assert [d["name"] for d in second["events"]] == ["type.2", "type.3"]
    assert "nextCursor" not in second


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


@pytest.mark.anyio
@pytest.mark.parametrize(
    "cursor",
    [
        "bogus",
        "!!!!",
        _b64("tools:2"),
        _b64("events:two"),
        _b64("events:-1"),
        _b64("events:\N{SUPERSCRIPT TWO}"),
    ],
)
async def test_events_list_rejects_a_pagination_cursor_it_did_not_issue(cursor: str) -> None:
    async with connect(EventsExtension(list_page_size=1)) as wire:
        with pytest.raises(MCPError) as caught:
            await wire.list(cursor)

    assert caught.value.code == -32602


# ---- events/poll on a check-function type -----------------------------------------------------


@pytest.mark.anyio
async def test_a_null_cursor_bootstraps_with_a_fresh_cursor_and_no_events_even_if_the_check_returned_some(
    mode: str,
) -> None:
    upstream = Upstream()
    upstream.add(3)

    async with connect(ticket_extension(upstream), mode) as wire:
        result = await wire.poll("ticket.created", cursor=None)

    assert result["events"] == []
    assert result["cursor"] == "3"
    assert result["truncated"] is False
    assert result["hasMore"] is False
    assert upstream.calls[0][2] is None


@pytest.mark.anyio
async def test_an_absent_cursor_is_treated_as_null(mode: str) -> None:
    upstream = Upstream()
    upstream.add(2)

    async with connect(ticket_extension(upstream), mode) as wire:
        result = await wire.call("events/poll", {"name": "ticket.created"})

    assert result["events"] == []
    assert result["cursor"] == "2"
    assert upstream.calls[0][1] == {}
    assert upstream.calls[0][2] is None


@pytest.mark.anyio
async def test_a_poll_from_a_cursor_returns_the_new_events_as_event_occurrences(mode: str) -> None:
    upstream = Upstream()
    upstream.add(1)

    async with connect(ticket_extension(upstream), mode) as wire:
        start = await wire.poll("ticket.created", {"queue": "ops"})
        upstream.add(2)
        result = await wire.poll("ticket.created", {"queue": "ops"}, cursor=start["cursor"])

    assert result["events"] == [
        {"eventId": "t2", "name": "ticket.created", "timestamp": isoformat(T0), "data": {"n": 2}},
        {"eventId": "t3", "name": "ticket.created", "timestamp": isoformat(T0), "data": {"n": 3}},
    ]
    assert result["cursor"] == "3"
    assert (result["truncated"], result["hasMore"]) == (False, False)
    assert upstream.calls[-1][1:] == ({"queue": "ops"}, "1")


@pytest.mark.anyio
async def test_max_events_cuts_at_an_intermediate_cursor_and_the_next_polls_continue_without_loss_or_duplication(
    mode: str,
) -> None:
    upstream = Upstream()
    upstream.add(5)
    pages: list[tuple[list[str], str, bool]] = []

    async with connect(ticket_extension(upstream), mode) as wire:
        cursor = "0"
        for _ in range(5):
            result = await wire.poll("ticket.created", cursor=cursor, maxEvents=2)
            cursor = result["cursor"]
            pages.append((event_ids(result), cursor, result["hasMore"]))
            if not result["hasMore"]:
                break

    assert pages == [(["t1", "t2"], "2", True), (["t3", "t4"], "4", True), (["t5"], "5", False)]


@pytest.mark.anyio
async def test_the_check_sees_the_requested_max_events_and_a_server_default_when_none_is_given() -> None:
    upstream = Upstream()

    async with connect(ticket_extension(upstream, default_max_events=7)) as wire:
        await wire.poll("ticket.created", cursor="0", maxEvents=3)
        await wire.poll("ticket.created", cursor="0")

    assert [ctx.max_events for ctx, _, _ in upstream.calls] == [3, 7]


@pytest.mark.anyio
async def test_next_poll_ms_comes_from_the_event_type_when_it_declares_one() -> None:
    async with connect(ticket_extension(Upstream(), next_poll_ms=1234, default_next_poll_ms=777)) as wire:
        assert (await wire.poll("ticket.created"))["nextPollMs"] == 1234
        assert (await wire.poll("ticket.created", cursor="0"))["nextPollMs"] == 1234


@pytest.mark.anyio
async def test_next_poll_ms_falls_back_to_the_server_default() -> None:
    async with connect(ticket_extension(Upstream(), default_next_poll_ms=777)) as wire:
        result = await wire.poll("ticket.created", cursor="0")

    assert result["nextPollMs"] == 777


@pytest.mark.anyio
async def test_next_poll_ms_from_the_check_result_wins_over_the_type_and_the_default() -> None:
    upstream = Upstream(next_poll_ms=42)

    async with connect(ticket_extension(upstream, next_poll_ms=1234, default_next_poll_ms=777)) as wire:
        bootstrap = await wire.poll("ticket.created")
        later = await wire.poll("ticket.created", cursor="0")

    assert (bootstrap["nextPollMs"], later["nextPollMs"]) == (42, 42)


@pytest.mark.anyio
async def test_max_age_ms_with_a_cursor_drops_events_older_than_the_floor_and_sets_truncated(
    mode: str,
) -> None:
    now = FakeNow(T0)
    upstream = Upstream()
    upstream.add(1, at=T0 - timedelta(seconds=10))
    upstream.add(1, at=T0 - timedelta(seconds=2))

    async with connect(ticket_extension(upstream, now=now), mode) as wire:
        result = await wire.poll("ticket.created", cursor="0", maxAgeMs=5_000)

    assert event_ids(result) == ["t2"]
    assert result["truncated"] is True
    assert result["cursor"] == "2"
    ctx = upstream.calls[-1][0]
    assert (ctx.max_age_ms, ctx.not_before) == (5_000, T0 - timedelta(seconds=5))


@pytest.mark.anyio
async def test_max_age_ms_that_reaches_back_past_every_event_is_not_truncated() -> None:
    upstream = Upstream()
    upstream.add(2, at=T0 - timedelta(seconds=10))

    async with connect(ticket_extension(upstream, now=FakeNow(T0))) as wire:
        result = await wire.poll("ticket.created", cursor="0", maxAgeMs=60_000)

    assert event_ids(result) == ["t1", "t2"]
    assert result["truncated"] is False


@pytest.mark.anyio
async def test_max_age_ms_is_ignored_with_a_null_cursor(mode: str) -> None:
    upstream = Upstream()
    upstream.add(2, at=T0 - timedelta(days=7))

    async with connect(ticket_extension(upstream, now=FakeNow(T0)), mode) as wire:
        result = await wire.poll("ticket.created", cursor=None, maxAgeMs=1_000)

    assert result["events"] == []
    assert result["truncated"] is False
    assert result["cursor"] == "2"
    assert upstream.calls[-1][0].not_before is None


@pytest.mark.anyio
async def test_truncated_from_the_check_result_reaches_the_client() -> None:
    upstream = Upstream(truncated=True)

    async with connect(ticket_extension(upstream)) as wire:
        result = await wire.poll("ticket.created", cursor="0")

    assert result["truncated"] is True


@pytest.mark.anyio
async def test_an_unknown_event_name_is_not_found_with_kind_event(mode: str) -> None:
    async with connect(ticket_extension(Upstream()), mode) as wire:
        error = await poll_error(wire, "no.such.event")

    assert error.code == -32011
    assert error.data["kind"] == "event"
    assert error.data["name"] == "no.such.event"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("arguments", "field_name"),
    [({"priority": "P9"}, "priority"), ({"queue": 5}, "queue"), ({"colour": "red"}, "colour")],
)
async def test_arguments_that_do_not_match_the_input_schema_are_invalid_params_naming_the_field(
    mode: str, arguments: dict[str, Any], field_name: str
) -> None:
    upstream = Upstream()

    async with connect(ticket_extension(upstream), mode) as wire:
        error = await poll_error(wire, "ticket.created", arguments=arguments)

    assert error.code == -32602
    assert field_name in error.message
    assert upstream.calls == []


@pytest.mark.anyio
async def test_a_check_function_that_raises_is_an_internal_error_and_the_server_keeps_serving(
    mode: str,
) -> None:
    failures = [RuntimeError("upstream is down")]

    class Flaky(Upstream):
        async def check(
            self, ctx: EventContext, arguments: dict[str, Any], cursor: str | None
        ) -> EventResult:
            if failures:
                raise failures.pop()
            return await super().check(ctx, arguments, cursor)

    upstream = Flaky()
    upstream.add(1)

    async with connect(ticket_extension(upstream), mode) as wire:
        error = await poll_error(wire, "ticket.created", cursor="0")
        result = await wire.poll("ticket.created", cursor="0")

    assert error.code == -32603
    assert "upstream is down" not in error.message
    assert event_ids(result) == ["t1"]


@pytest.mark.anyio
async def test_an_mcp_error_raised_by_the_check_passes_through_unchanged(mode: str) -> None:
    events = EventsExtension()

    @events.event(name="secret.thing")
    async def check(ctx: EventContext, arguments: dict[str, Any], cursor: str | None) -> EventResult:
        raise forbidden("x")

    async with connect(events, mode) as wire:
        error = await poll_error(wire, "secret.thing", cursor="0")

    assert (error.code, error.message, error.data) == (-32012, "Forbidden", {"reason": "x"})


def test_a_type_whose_delivery_modes_are_not_served_yet_is_refused_at_declaration() -> None:
    # The spec requires a non-empty delivery list; until webhook lands, a webhook-only type would list none.
    with pytest.raises(ValueError, match=r"none of its delivery modes \['webhook'\] is served yet"):
        ticket_extension(Upstream(), delivery=["webhook"])


@pytest.mark.anyio
async def test_a_type_can_opt_out_of_push_and_list_poll_only() -> None:
    async with connect(ticket_extension(Upstream(), delivery=["poll"])) as wire:
        (descriptor,) = (await wire.list())["events"]

    assert descriptor["delivery"] == ["poll"]


@pytest.mark.anyio
@pytest.mark.parametrize("extra", [{"maxEvents": 0}, {"maxAgeMs": -1}])
async def test_out_of_range_poll_limits_are_invalid_params(extra: dict[str, Any]) -> None:
    upstream = Upstream()

    async with connect(ticket_extension(upstream)) as wire:
        error = await poll_error(wire, "ticket.created", cursor="0", **extra)

    assert error.code == -32602
    assert upstream.calls == []


# ---- events/poll on an emit-only type ------------------------------------------------------------


@dataclass
class Incidents:
    """Broadcast hooks for the emit-only incident type; records what they saw."""

    contexts: list[EventContext] = field(default_factory=list)

    def match(self, ctx: EventContext, event: Event, arguments: dict[str, Any]) -> bool:
        self.contexts.append(ctx)
        severity = arguments.get("severity")
        return severity is None or event.data["severity"] == severity

    def transform(self, ctx: EventContext, event: Event, arguments: dict[str, Any]) -> Event:
        if arguments.get("redact_pii"):
            return event.replace(data={**event.data, "reporter": None})
        return event


def incident_extension(hooks: Incidents | None = None, **options: Any) -> EventsExtension:
    events = EventsExtension(**options)
    events.event(
        name="incident.created",
        description="An incident was opened.",
        emit_only=True,
        input_schema=INCIDENT_INPUT,
        payload_schema=INCIDENT_PAYLOAD,
        match=hooks.match if hooks else None,
        transform=hooks.transform if hooks else None,
    )(type("IncidentCreated", (), {}))
    return events


def incident(n: int, severity: str = "P1", *, at: datetime = T0) -> Event:
    return Event(
        name="incident.created",
        data={"incidentId": f"inc{n}", "severity": severity, "reporter": "dsp@example.com"},
        event_id=f"inc{n}",
        timestamp=at,
    )


@pytest.mark.anyio
async def test_an_emit_only_null_cursor_returns_a_fresh_cursor_and_none_of_the_earlier_events(
    mode: str,
) -> None:
    events = incident_extension()
    events.emit(incident(1))

    async with connect(events, mode) as wire:
        result = await wire.poll("incident.created")

    assert result["events"] == []
    assert isinstance(result["cursor"], str) and result["cursor"]
    assert (result["truncated"], result["hasMore"]) == (False, False)


@pytest.mark.anyio
async def test_emitted_events_are_polled_in_order_with_their_event_ids(mode: str) -> None:
    events = incident_extension()

    async with connect(events, mode) as wire:
        start = await wire.poll("incident.created")
        for n in range(1, 6):
            events.emit(incident(n))
        result = await wire.poll("incident.created", cursor=start["cursor"])
        after = await wire.poll("incident.created", cursor=result["cursor"])

    assert event_ids(result) == ["inc1", "inc2", "inc3", "inc4", "inc5"]
    assert result["events"][0] == {
        "eventId": "inc1",
        "name": "incident.created",
        "timestamp": isoformat(T0),
        "data": {"incidentId": "inc1", "severity": "P1", "reporter": "dsp@example.com"},
    }
    assert result["cursor"] != start["cursor"]
    assert (result["truncated"], result["hasMore"]) == (False, False)
    assert after["events"] == []
    assert after["cursor"] == result["cursor"]


@pytest.mark.anyio
async def test_emit_only_max_events_pages_through_the_buffer_with_has_more(mode: str) -> None:
    events = incident_extension()
    seen: list[str] = []
    flags: list[bool] = []

    async with connect(events, mode) as wire:
        cursor = (await wire.poll("incident.created"))["cursor"]
        for n in range(1, 6):
            events.emit(incident(n))
        for _ in range(5):
            result = await wire.poll("incident.created", cursor=cursor, maxEvents=2)
            seen += event_ids(result)
            flags.append(result["hasMore"])
            cursor = result["cursor"]
            if not result["hasMore"]:
                break

    assert seen == ["inc1", "inc2", "inc3", "inc4", "inc5"]
    assert flags == [True, True, False]


@pytest.mark.anyio
async def test_match_and_transform_hooks_shape_each_pollers_view_by_its_arguments(mode: str) -> None:
    hooks = Incidents()
    events = incident_extension(hooks)
    subscriptions: dict[str, dict[str, Any]] = {
        "all": {},
        "p1": {"severity": "P1"},
        "redacted": {"redact_pii": True},
    }

    async with connect(events, mode) as wire:
        cursors = {
            key: (await wire.poll("incident.created", args))["cursor"] for key, args in subscriptions.items()
        }
        events.emit(incident(1, "P1"))
        events.emit(incident(2, "P3"))
        events.emit(incident(3, "P1"))
        results = {
            key: await wire.poll("incident.created", args, cursor=cursors[key])
            for key, args in subscriptions.items()
        }

    assert event_ids(results["all"]) == ["inc1", "inc2", "inc3"]
    assert event_ids(results["p1"]) == ["inc1", "inc3"]
    assert [event["data"]["reporter"] for event in results["all"]["events"]] == ["dsp@example.com"] * 3
    assert [event["data"]["reporter"] for event in results["redacted"]["events"]] == [None] * 3
    assert {(ctx.event_name, ctx.mode) for ctx in hooks.contexts} == {("incident.created", "poll")}
    # A filtered-out event still moves the cursor on: nothing is reread.
    assert results["p1"]["cursor"] == results["all"]["cursor"]


@pytest.mark.anyio
async def test_hooks_given_as_static_methods_on_the_decorated_class_are_applied() -> None:
    events = EventsExtension()

    class HighOnly:
        @staticmethod
        def match(ctx: EventContext, event: Event, arguments: dict[str, Any]) -> bool:
            return bool(event.data["severity"] == "P1")

        @staticmethod
        def transform(ctx: EventContext, event: Event, arguments: dict[str, Any]) -> Event:
            return event.replace(data={"severity": event.data["severity"]})

    events.event(name="incident.created", emit_only=True)(HighOnly)

    async with connect(events) as wire:
        cursor = (await wire.poll("incident.created"))["cursor"]
        events.emit(incident(1, "P2"))
        events.emit(incident(2, "P1"))
        result = await wire.poll("incident.created", cursor=cursor)

    assert [(event["eventId"], event["data"]) for event in result["events"]] == [("inc2", {"severity": "P1"})]


@pytest.mark.anyio
async def test_eviction_by_count_makes_the_next_poll_truncated_with_the_newest_events(mode: str) -> None:
    events = incident_extension(emit_buffer=EmitBuffer(max_events=3))

    async with connect(events, mode) as wire:
        cursor = (await wire.poll("incident.created"))["cursor"]
        for n in range(1, 6):
            events.emit(incident(n))
        result = await wire.poll("incident.created", cursor=cursor)

    assert event_ids(result) == ["inc3", "inc4", "inc5"]
    assert result["truncated"] is True


@pytest.mark.anyio
async def test_eviction_by_age_makes_the_next_poll_truncated_with_only_the_recent_events(mode: str) -> None:
    now = FakeNow(T0)
    events = incident_extension(emit_buffer=EmitBuffer(max_age=timedelta(minutes=10)), now=now)

    async with connect(events, mode) as wire:
        cursor = (await wire.poll("incident.created"))["cursor"]
        events.emit(incident(1))
        now.advance(minutes=9)
        events.emit(incident(2))
        now.advance(minutes=2)
        result = await wire.poll("incident.created", cursor=cursor)

    assert event_ids(result) == ["inc2"]
    assert result["truncated"] is True


@pytest.mark.anyio
async def test_a_quiet_cursor_at_the_head_stays_valid_after_everything_aged_out() -> None:
    now = FakeNow(T0)
    events = incident_extension(emit_buffer=EmitBuffer(max_age=timedelta(minutes=10)), now=now)

    async with connect(events) as wire:
        cursor = (await wire.poll("incident.created"))["cursor"]
        events.emit(incident(1))
        caught_up = await wire.poll("incident.created", cursor=cursor)
        now.advance(hours=2)
        quiet = await wire.poll("incident.created", cursor=caught_up["cursor"])

    assert event_ids(caught_up) == ["inc1"]
    assert quiet["events"] == []
    assert quiet["truncated"] is False


@pytest.mark.anyio
async def test_emit_only_max_age_ms_drops_events_older_than_the_floor_and_sets_truncated() -> None:
    now = FakeNow(T0)
    events = incident_extension(now=now)

    async with connect(events) as wire:
        cursor = (await wire.poll("incident.created"))["cursor"]
        events.emit(incident(1, at=T0 - timedelta(minutes=4)))
        events.emit(incident(2, at=T0 - timedelta(seconds=30)))
        result = await wire.poll("incident.created", cursor=cursor, maxAgeMs=60_000)

    assert event_ids(result) == ["inc2"]
    assert result["truncated"] is True


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["made-up", "future", "non-ascii digits", "garbage"])
async def test_a_cursor_this_process_never_issued_gives_truncated_no_events_and_a_fresh_cursor(
    mode: str, kind: str
) -> None:
    events = incident_extension()

    async with connect(events, mode) as wire:
        start = (await wire.poll("incident.created"))["cursor"]
        epoch = start.rpartition("-")[0]
        cursor = {
            "made-up": "deadbeef-3",
            "future": f"{epoch}-999",
            "non-ascii digits": f"{epoch}-\N{SUPERSCRIPT TWO}",
            "garbage": "not a cursor",
        }[kind]
        events.emit(incident(1))
        stale = await wire.poll("incident.created", cursor=cursor)
        events.emit(incident(2))
        resumed = await wire.poll("incident.created", cursor=stale["cursor"])

    assert stale["events"] == []
    assert stale["truncated"] is True
    assert stale["cursor"] not in (cursor, start)
    assert event_ids(resumed) == ["inc2"]
    assert resumed["truncated"] is False


@pytest.mark.anyio
async def test_a_cursor_from_before_a_restart_gives_truncated_and_a_fresh_cursor_on_the_new_process(
    mode: str,
) -> None:
    before = incident_extension()
    async with connect(before, mode) as wire:
        old_cursor = (await wire.poll("incident.created"))["cursor"]
    before.emit(incident(1))  # lost with the old process

    after = incident_extension()
    async with connect(after, mode) as wire:
        after.emit(incident(2))
        restarted = await wire.poll("incident.created", cursor=old_cursor)
        after.emit(incident(3))
        resumed = await wire.poll("incident.created", cursor=restarted["cursor"])

    assert restarted["events"] == []
    assert restarted["truncated"] is True
    assert restarted["cursor"] != old_cursor
    assert event_ids(resumed) == ["inc3"]


@pytest.mark.anyio
async def test_emitting_an_undeclared_event_type_is_refused() -> None:
    events = incident_extension()

    with pytest.raises(ValueError, match="unknown event type"):
        events.emit(Event(name="nope", data={}))


# ---- an emit-only type without replay (cursor: null) --------------------------------------------


def load_extension(**options: Any) -> EventsExtension:
    events = EventsExtension(**options)
    events.event(
        name="system.load",
        emit_only=True,
        replay=False,
        input_schema={"type": "object", "properties": {"host": {"type": "string"}}},
    )(type("SystemLoad", (), {}))
    return events


def sample(n: int) -> Event:
    return Event(name="system.load", data={"load1": n / 10}, event_id=f"load{n}")


@pytest.mark.anyio
async def test_a_no_replay_type_returns_a_null_cursor_and_never_truncated(mode: str) -> None:
    events = load_extension(emit_buffer=EmitBuffer(max_events=1))
    results: list[dict[str, Any]] = []

    async with connect(events, mode) as wire:
        results.append(await wire.poll("system.load"))
        for n in range(5):
            events.emit(sample(n))  # overflows the buffer of one
        results.append(await wire.poll("system.load"))
        results.append(await wire.poll("system.load", cursor="deadbeef-3", maxAgeMs=1))

    assert [(result["cursor"], result["truncated"]) for result in results] == [(None, False)] * 3


@pytest.mark.anyio
async def test_a_no_replay_first_poll_returns_nothing_even_if_events_were_emitted_before(mode: str) -> None:
    events = load_extension()
    events.emit(sample(1))

    async with connect(events, mode) as wire:
        first = await wire.poll("system.load")
        second = await wire.poll("system.load")

    assert first["events"] == []
    assert second["events"] == []


@pytest.mark.anyio
async def test_a_no_replay_poller_gets_events_emitted_since_its_last_poll_exactly_once(mode: str) -> None:
    events = load_extension()

    async with connect(events, mode) as wire:
        await wire.poll("system.load")
        events.emit(sample(1))
        events.emit(sample(2))
        second = await wire.poll("system.load")
        third = await wire.poll("system.load")
        events.emit(sample(3))
        fourth = await wire.poll("system.load")

    assert event_ids(second) == ["load1", "load2"]
    assert third["events"] == []
    assert event_ids(fourth) == ["load3"]


@pytest.mark.anyio
async def test_no_replay_pollers_with_different_arguments_each_keep_their_own_position() -> None:
    events = load_extension()

    async with connect(events) as wire:
        await wire.poll("system.load", {"host": "a"})
        events.emit(sample(1))
        await wire.poll("system.load", {"host": "b"})
        events.emit(sample(2))
        a = await wire.poll("system.load", {"host": "a"})
        b = await wire.poll("system.load", {"host": "b"})

    assert event_ids(a) == ["load1", "load2"]
    assert event_ids(b) == ["load2"]


@pytest.mark.anyio
async def test_a_no_replay_poller_whose_lease_lapsed_starts_from_now_again() -> None:
    clock_value = [0.0]
    events = load_extension(poll_lease_ttl=timedelta(seconds=30), clock=lambda: clock_value[0])

    async with connect(events) as wire:
        await wire.poll("system.load")
        events.emit(sample(1))
        clock_value[0] += 31
        assert await events.sweep_leases() == 1
        events.emit(sample(2))
        after_gap = await wire.poll("system.load")
        events.emit(sample(3))
        next_poll = await wire.poll("system.load")

    assert after_gap["events"] == []
    assert event_ids(next_poll) == ["load3"]


@pytest.mark.anyio
async def test_a_no_replay_poller_pages_with_max_events_and_has_more() -> None:
    events = load_extension()

    async with connect(events) as wire:
        await wire.poll("system.load")
        for n in range(1, 4):
            events.emit(sample(n))
        first = await wire.poll("system.load", maxEvents=2)
        second = await wire.poll("system.load", maxEvents=2)

    assert (event_ids(first), first["hasMore"]) == (["load1", "load2"], True)
    assert (event_ids(second), second["hasMore"]) == (["load3"], False)


@pytest.mark.anyio
async def test_a_no_replay_check_type_answers_with_a_null_cursor_and_no_truncation_even_if_the_check_reports_one() -> (
    None
):
    events = EventsExtension()

    @events.event(name="presence.changed", replay=False)
    async def check(ctx: EventContext, arguments: dict[str, Any], cursor: str | None) -> EventResult:
        return EventResult(events=[], cursor="upstream-position", truncated=True)

    async with connect(events) as wire:
        results = [
            await wire.poll("presence.changed"),
            await wire.poll("presence.changed", cursor="left-over-from-a-client"),
        ]

    assert [(result["cursor"], result["truncated"]) for result in results] == [(None, False)] * 2


# ---- notifications/events/list_changed ----------------------------------------------------------


class _AnyParams(BaseModel):
    model_config = ConfigDict(extra="allow")


class _ListChangedWatcher(ClientExtension):
    identifier = EXTENSION_ID

    def __init__(self) -> None:
        self.changed = anyio.Event()
        self.count = 0

    def notifications(self) -> list[NotificationBinding[Any]]:
        async def handle(_params: _AnyParams) -> None:
            self.count += 1
            self.changed.set()

        return [
            NotificationBinding(
                method=protocol.NOTIFICATION_LIST_CHANGED, params_type=_AnyParams, handler=handle
            )
        ]


def _add_type(events: EventsExtension, name: str) -> None:
    events.event(name=name, emit_only=True)(type("Added", (), {}))


@pytest.mark.anyio
async def test_a_client_that_listed_events_is_told_when_the_list_changes() -> None:
    events = incident_extension()
    watcher = _ListChangedWatcher()

    async with connect(events, "legacy", extensions=[watcher]) as wire:
        before = await wire.list()
        _add_type(events, "plugin.loaded")
        await events.notify_list_changed()
        with anyio.fail_after(5):
            await watcher.changed.wait()
        after = await wire.list()

    assert [d["name"] for d in before["events"]] == ["incident.created"]
    assert [d["name"] for d in after["events"]] == ["incident.created", "plugin.loaded"]
    assert watcher.count == 1


@pytest.mark.anyio
async def test_list_changed_reaches_an_open_client_after_another_client_disconnected() -> None:
    events = incident_extension()
    server = MCPServer("t", extensions=[events])
    events.install(server)
    watcher = _ListChangedWatcher()

    async with Client(server, mode="legacy", extensions=[watcher]) as staying:
        async with Client(server, mode="legacy", extensions=[_ListChangedWatcher()]) as leaving:
            await Wire(leaving).list()
        await Wire(staying).poll("incident.created")
        events.remove_event_type("incident.created")
        await events.notify_list_changed()
        with anyio.fail_after(5):
            await watcher.changed.wait()
        remaining = await Wire(staying).list()

    assert remaining["events"] == []
