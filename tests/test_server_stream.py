"""``events/stream`` (push delivery) served by ``EventsExtension``.

Most tests talk to an in-process ``MCPServer`` through the SDK's ``mcp.Client``,
on both of its paths (the ``mode`` fixture): the default 2026-era path, where
the client's ``DirectDispatcher`` awaits the server's handler in the calling
task (a cancelled caller cancels the handler directly), and the handshake-era
path (``mode="legacy"``), JSON-RPC over memory streams like stdio, where a
cancelled caller makes the SDK send ``notifications/cancelled``.

Notifications are taken off the client's dispatcher in the order they arrived,
through the synchronous notification intercept the SDK's own
``subscriptions/listen`` driver uses, and routed by
``_meta["io.modelcontextprotocol/subscriptionId"]``. ``NotificationBinding``
is not used for this: its queues are per method (so ``active`` vs ``event`` vs
``terminated`` order is lost) and drop the oldest entry past 256. Streams are
opened with a request id chosen up front, the way the SDK's listen driver does
it, so a test can route frames before the first one arrives.

Nothing sleeps: every wait is on a frame, an event or a result, under
``anyio.fail_after``. Heartbeat tests use a 50 ms interval.
"""

from __future__ import annotations

import json
import math
import socket
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread
import httpx
import pytest
import uvicorn
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from conftest import demo_stdio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import MCPError
from mcp_types import RequestId
from pydantic import TypeAdapter

from agentwake.mcp import ServerConnection, _EventsRequest, _Params
from agentwake.server import (
    STREAM_NOTIFICATIONS,
    EmitBuffer,
    Event,
    EventContext,
    EventResult,
    EventsExtension,
    forbidden,
    isoformat,
)

SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
RESULT = TypeAdapter(dict[str, Any])
T0 = datetime(2026, 2, 19, 15, 30, tzinfo=UTC)
WAIT = 10.0  # seconds any single expected frame may take

Frame = tuple[str, dict[str, Any]]


@pytest.fixture(params=["auto", "legacy"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# ---- the client side of the tests ------------------------------------------------------------


class Router:
    """events/stream notifications by subscription id, in arrival order; never drops one."""

    def __init__(self) -> None:
        self._routes: dict[
            RequestId, tuple[MemoryObjectSendStream[Frame], MemoryObjectReceiveStream[Frame]]
        ] = {}
        self.unclaimed = self.route("<unclaimed>")
        self.log: list[tuple[RequestId, str]] = []  # every frame's (subscription id, method), across streams

    def route(self, subscription_id: RequestId) -> MemoryObjectReceiveStream[Frame]:
        if subscription_id not in self._routes:
            self._routes[subscription_id] = anyio.create_memory_object_stream[Frame](math.inf)
        return self._routes[subscription_id][1]

    def intercept(self, method: str, params: Any) -> bool:
        if method not in STREAM_NOTIFICATIONS:
            return False
        subscription_id = params["_meta"][SUBSCRIPTION_ID]
        self.log.append((subscription_id, method))
        send, _ = self._routes.get(subscription_id) or self._routes["<unclaimed>"]
        send.send_nowait((method, params))
        return True

    def install(self, client: Client) -> None:
        # Both of the SDK's dispatchers read this attribute for every notification, in order.
        dispatcher: Any = client.session._dispatcher
        original = dispatcher._on_notify_intercept

        def intercept(method: str, params: Any) -> bool:
            return self.intercept(method, params) or bool(original and original(method, params))

        dispatcher._on_notify_intercept = intercept
        # agentwake's stdio transport shows notifications to its claim before the dispatcher.
        transport: Any = getattr(client, "server", None)
        claim = getattr(transport, "claim", None)
        if claim is not None:
            transport.claim = lambda method, params: (
                self.intercept(method, params) or bool(claim(method, params))
            )

    def close(self) -> None:
        for send, receive in self._routes.values():
            send.close()
            receive.close()


@dataclass
class Stream:
    id: RequestId
    frames: MemoryObjectReceiveStream[Frame]
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    done: anyio.Event = field(default_factory=anyio.Event)
    result: dict[str, Any] | None = None
    error: MCPError | None = None

    async def next(self, *, skip_heartbeats: bool = False) -> Frame:
        with anyio.fail_after(WAIT):
            while True:
                method, params = await self.frames.receive()
                assert params["_meta"][SUBSCRIPTION_ID] == self.id
                if not (skip_heartbeats and method.endswith("/heartbeat")):
                    return method, params

    async def expect(self, kind: str, *, skip_heartbeats: bool = True) -> dict[str, Any]:
        method, params = await self.next(skip_heartbeats=skip_heartbeats)
        assert method == f"notifications/events/{kind}", (method, params)
        return params

    async def events(self, count: int) -> list[dict[str, Any]]:
        return [await self.expect("event") for _ in range(count)]

    async def finished(self) -> None:
        with anyio.fail_after(WAIT):
            await self.done.wait()

    def pending(self) -> list[Frame]:
        """Frames already received and not read yet (no waiting)."""
        out: list[Frame] = []
        while True:
            try:
                out.append(self.frames.receive_nowait())
            except anyio.WouldBlock:
                return out


async def _send_stream_request(
    client: Client, params: dict[str, Any], request_id: RequestId
) -> dict[str, Any]:
    # What the SDK's subscriptions/listen driver does: mint the id, stamp the envelope, send raw.
    session: Any = client.session
    data: dict[str, Any] = {"method": "events/stream", "params": params}
    opts: CallOptions = {"request_id": request_id}
    session._stamp(data, opts)
    result: dict[str, Any] = await session._dispatcher.send_raw_request("events/stream", data["params"], opts)
    return result


@dataclass
class Harness:
    client: Client
    router: Router
    tg: anyio.abc.TaskGroup
    serial: int = 0

    def open(self, name: str, arguments: dict[str, Any] | None = None, **params: Any) -> Stream:
        self.serial += 1
        request_id: RequestId = params.pop("request_id", f"stream-{self.serial}")
        body: dict[str, Any] = {"name": name, **params}
        if arguments is not None:
            body["arguments"] = arguments
        stream = Stream(request_id, self.router.route(request_id))

        async def run() -> None:
            with stream.scope:
                try:
                    stream.result = await _send_stream_request(self.client, body, request_id)
                except MCPError as exc:
                    stream.error = exc
            stream.done.set()

        self.tg.start_soon(run)
        return stream

    async def refused(self, name: str, arguments: dict[str, Any] | None = None, **params: Any) -> MCPError:
        stream = self.open(name, arguments, **params)
        await stream.finished()
        assert stream.error is not None, stream.result
        assert stream.pending() == []
        return stream.error

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request = _EventsRequest(method=method, params=_Params.model_validate(params))
        return await self.client.session.send_request(request, RESULT)  # type: ignore[type-var]


@asynccontextmanager
async def harness_for(client: Client) -> AsyncIterator[Harness]:
    router = Router()
    router.install(client)
    try:
        async with anyio.create_task_group() as tg:
            yield Harness(client, router, tg)
            tg.cancel_scope.cancel()
    finally:
        router.close()


@asynccontextmanager
async def streaming(events: EventsExtension, mode: str = "auto") -> AsyncIterator[Harness]:
    server = MCPServer("t", extensions=[events])
    events.install(server)
    async with Client(server, mode=mode) as client, harness_for(client) as harness:
        yield harness


# ---- event types ------------------------------------------------------------------------------


@dataclass
class Upstream:
    """A durable upstream: the cursor is the position in ``events``; ``queue`` filters by argument."""

    events: list[Event] = field(default_factory=list)
    calls: list[tuple[RequestId | None, str | None]] = field(default_factory=list)
    failures: list[Exception] = field(default_factory=list)
    truncate_next: bool = False
    called: anyio.Event = field(default_factory=anyio.Event)

    def add(self, count: int, *, queue: str = "ops", at: datetime = T0, with_cursors: bool = True) -> None:
        for _ in range(count):
            n = len(self.events) + 1
            self.events.append(
                Event(
                    name="ticket.created",
                    data={"n": n, "queue": queue},
                    event_id=f"t{n}",
                    timestamp=at,
                    cursor=str(n) if with_cursors else None,
                )
            )

    async def check(self, ctx: EventContext, arguments: dict[str, Any], cursor: str | None) -> EventResult:
        self.calls.append((getattr(ctx.request, "request_id", None), cursor))
        self.called.set()
        self.called = anyio.Event()
        if self.failures:
            raise self.failures.pop(0)
        head = str(len(self.events))
        if self.truncate_next:
            self.truncate_next = False
            return EventResult(events=[], cursor=head, truncated=True)
        start = int(cursor) if cursor is not None else 0
        wanted = [e for e in self.events[start:] if arguments.get("queue") in (None, e.data["queue"])]
        return EventResult(events=wanted, cursor=head)


TICKET_INPUT = {
    "type": "object",
    "properties": {"queue": {"type": "string"}},
    "additionalProperties": False,
}


def ticket_extension(
    upstream: Upstream, *, next_poll_ms: int | None = None, **options: Any
) -> EventsExtension:
    events = EventsExtension(**options)
    events.event(name="ticket.created", input_schema=TICKET_INPUT, next_poll_ms=next_poll_ms)(upstream.check)
    return events


INCIDENT_INPUT = {
    "type": "object",
    "properties": {
        "severity": {"type": "string", "enum": ["P1", "P2", "P3"]},
        "redact_pii": {"type": "boolean"},
    },
    "additionalProperties": False,
}


@dataclass
class Incidents:
    contexts: list[EventContext] = field(default_factory=list)

    def match(self, ctx: EventContext, event: Event, arguments: dict[str, Any]) -> bool:
        self.contexts.append(ctx)
        return arguments.get("severity") in (None, event.data["severity"])

    def transform(self, ctx: EventContext, event: Event, arguments: dict[str, Any]) -> Event:
        if arguments.get("redact_pii"):
            return event.replace(data={**event.data, "reporter": None})
        return event


def incident_extension(hooks: Incidents | None = None, **options: Any) -> EventsExtension:
    events = EventsExtension(**options)
    events.event(
        name="incident.created",
        emit_only=True,
        input_schema=INCIDENT_INPUT,
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


def load_extension(**options: Any) -> EventsExtension:
    events = EventsExtension(**options)
    events.event(name="system.load", emit_only=True, replay=False)(type("SystemLoad", (), {}))
    return events


@dataclass
class Hooks:
    """Lifecycle hooks that record what they saw and signal each call."""

    subscribed: list[tuple[EventContext, dict[str, Any], str]] = field(default_factory=list)
    unsubscribed: list[tuple[EventContext, dict[str, Any], str]] = field(default_factory=list)
    gone: anyio.Event = field(default_factory=anyio.Event)
    refuse: MCPError | None = None

    def attach(self, events: EventsExtension, name: str) -> None:
        @events.on_subscribe(name)
        async def subscribe(ctx: EventContext, arguments: dict[str, Any], subscription_id: str) -> None:
            self.subscribed.append((ctx, arguments, subscription_id))
            if self.refuse is not None:
                raise self.refuse

        @events.on_unsubscribe(name)
        async def unsubscribe(ctx: EventContext, arguments: dict[str, Any], subscription_id: str) -> None:
            self.unsubscribed.append((ctx, arguments, subscription_id))
            self.gone.set()

    async def wait_gone(self) -> None:
        with anyio.fail_after(WAIT):
            await self.gone.wait()


def meta(stream: Stream) -> dict[str, Any]:
    return {SUBSCRIPTION_ID: stream.id}


SDK_STAMPS = {"io.modelcontextprotocol/serverInfo"}


def is_stream_events_result(result: dict[str, Any] | None) -> bool:
    """The empty StreamEventsResult ``{"_meta": {}}``, give or take what the SDK stamps on 2026-era results."""
    if (
        result is None
        or set(result) - {"_meta", "resultType"}
        or result.get("resultType", "complete") != "complete"
    ):
        return False
    return set(result["_meta"]) <= SDK_STAMPS


# ---- events/list ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_events_list_advertises_push_for_every_kind_of_type(mode: str) -> None:
    events = ticket_extension(Upstream())
    events.event(name="incident.created", emit_only=True)(type("I", (), {}))
    events.event(name="system.load", emit_only=True, replay=False)(type("L", (), {}))

    async with streaming(events, mode) as wire:
        listed = await wire.call("events/list", {})

    assert [(d["name"], d["delivery"]) for d in listed["events"]] == [
        ("ticket.created", ["poll", "push"]),
        ("incident.created", ["poll", "push"]),
        ("system.load", ["poll", "push"]),
    ]


# ---- a check-function type: poll-driven push ------------------------------------------------------


@pytest.mark.anyio
async def test_a_null_cursor_stream_confirms_with_active_first_carrying_the_current_position(
    mode: str,
) -> None:
    upstream = Upstream()
    upstream.add(3)

    async with streaming(ticket_extension(upstream), mode) as wire:
        stream = wire.open("ticket.created", cursor=None)
        first = await stream.next()

    assert first == (
        "notifications/events/active",
        {"cursor": "3", "truncated": False, "_meta": meta(stream)},
    )
    assert upstream.calls == [(stream.id, None)]


@pytest.mark.anyio
async def test_new_upstream_events_arrive_in_order_as_event_occurrences_with_their_cursors(mode: str) -> None:
    upstream = Upstream()
    upstream.add(1)
    # A long poll interval: only wake() makes the stream read again within the test.
    events = ticket_extension(upstream, next_poll_ms=600_000)

    async with streaming(events, mode) as wire:
        stream = wire.open("ticket.created", {"queue": "ops"})
        await stream.expect("active")
        upstream.add(3)
        events.wake("ticket.created")
        received = await stream.events(3)

    assert received == [
        {
            "eventId": f"t{n}",
            "name": "ticket.created",
            "timestamp": isoformat(T0),
            "data": {"n": n, "queue": "ops"},
            "cursor": str(n),
            "_meta": meta(stream),
        }
        for n in (2, 3, 4)
    ]
    assert upstream.calls[-1] == (stream.id, "1")


@pytest.mark.anyio
async def test_the_stream_polls_the_check_function_at_next_poll_ms_on_its_own() -> None:
    upstream = Upstream()

    async with streaming(ticket_extension(upstream, next_poll_ms=5)) as wire:
        stream = wire.open("ticket.created")
        assert (await stream.expect("active"))["cursor"] == "0"
        upstream.add(2)
        received = await stream.events(2)
        upstream.add(1)
        later = await stream.events(1)

    assert [e["eventId"] for e in received + later] == ["t1", "t2", "t3"]


@pytest.mark.anyio
async def test_events_without_their_own_cursor_get_safe_ones_and_the_last_gets_the_batch_cursor() -> None:
    upstream = Upstream()
    events = ticket_extension(upstream, next_poll_ms=600_000)

    async with streaming(events) as wire:
        stream = wire.open("ticket.created")
        await stream.expect("active")
        upstream.add(3, with_cursors=False)
        events.wake("ticket.created")
        received = await stream.events(3)

    # Persisting an earlier event's cursor replays the batch (dedup by eventId); it never skips.
    assert [(e["eventId"], e["cursor"]) for e in received] == [("t1", "0"), ("t2", "0"), ("t3", "3")]


@pytest.mark.anyio
async def test_a_replay_of_events_without_their_own_cursor_starts_from_the_requested_cursor() -> None:
    upstream = Upstream()
    upstream.add(3, with_cursors=False)

    async with streaming(ticket_extension(upstream)) as wire:
        stream = wire.open("ticket.created", cursor="1")
        await stream.expect("active")
        replayed = await stream.events(2)

    assert [(e["eventId"], e["cursor"]) for e in replayed] == [("t2", "1"), ("t3", "3")]


@pytest.mark.anyio
async def test_a_heartbeat_in_a_quiet_period_carries_the_position_checked_up_to(mode: str) -> None:
    upstream = Upstream()
    upstream.add(2)
    events = ticket_extension(upstream, next_poll_ms=600_000, heartbeat_ms=50)

    async with streaming(events, mode) as wire:
        stream = wire.open("ticket.created", {"queue": "support"})
        active = await stream.expect("active")
        first = await stream.expect("heartbeat", skip_heartbeats=False)
        # Upstream activity this subscription filters out still moves its position on.
        upstream.add(3, queue="ops")
        events.wake("ticket.created")
        with anyio.fail_after(WAIT):
            while (heartbeat := await stream.expect("heartbeat", skip_heartbeats=False))["cursor"] != "5":
                pass

    assert active["cursor"] == "2"
    assert first == {"cursor": "2", "_meta": meta(stream)}
    assert heartbeat == {"cursor": "5", "_meta": meta(stream)}


@pytest.mark.anyio
async def test_heartbeats_keep_coming_while_nothing_happens() -> None:
    async with streaming(incident_extension(heartbeat_ms=50)) as wire:
        stream = wire.open("incident.created")
        active = await stream.expect("active")
        beats = [await stream.expect("heartbeat", skip_heartbeats=False) for _ in range(3)]

    assert [beat["cursor"] for beat in beats] == [active["cursor"]] * 3


def test_the_heartbeat_interval_is_at_most_thirty_seconds() -> None:
    assert EventsExtension().heartbeat_ms == 30_000
    EventsExtension(heartbeat_ms=30_000)
    for bad in (0, 30_001):
        with pytest.raises(ValueError, match="heartbeat_ms"):
            EventsExtension(heartbeat_ms=bad)


def test_the_demo_servers_heartbeat_setting_defaults_to_thirty_seconds_and_is_capped_there() -> None:
    from examples.demo_server import DemoSettings, parse_args

    assert DemoSettings.from_env({}).heartbeat_ms == 30_000
    assert DemoSettings.from_env({"DEMO_HEARTBEAT_MS": "50"}).heartbeat_ms == 50
    assert DemoSettings.from_env({"DEMO_HEARTBEAT_MS": "90000"}).heartbeat_ms == 30_000
    assert parse_args(["--heartbeat-ms", "75"])[1].heartbeat_ms == 75
    with pytest.raises(ValueError, match="at least 1 ms"):
        DemoSettings.from_env({"DEMO_HEARTBEAT_MS": "0"})


@pytest.mark.anyio
async def test_a_stream_from_a_cursor_replays_what_came_after_it(mode: str) -> None:
    upstream = Upstream()
    upstream.add(4)

    async with streaming(ticket_extension(upstream), mode) as wire:
        stream = wire.open("ticket.created", cursor="1")
        active = await stream.expect("active")
        replayed = await stream.events(3)

    assert active == {"cursor": "1", "truncated": False, "_meta": meta(stream)}
    assert [(e["eventId"], e["cursor"]) for e in replayed] == [("t2", "2"), ("t3", "3"), ("t4", "4")]


@pytest.mark.anyio
async def test_max_age_ms_bounds_the_replay_and_says_truncated(mode: str) -> None:
    upstream = Upstream()
    upstream.add(2, at=T0 - timedelta(minutes=10))
    upstream.add(2, at=T0 - timedelta(seconds=5))

    async with streaming(ticket_extension(upstream, now=lambda: T0), mode) as wire:
        stream = wire.open("ticket.created", cursor="0", maxAgeMs=60_000)
        active = await stream.expect("active")
        replayed = await stream.events(2)

    assert active["truncated"] is True
    assert [e["eventId"] for e in replayed] == ["t3", "t4"]


@pytest.mark.anyio
async def test_a_cursor_the_upstream_no_longer_has_gives_active_truncated_with_a_fresh_cursor(
    mode: str,
) -> None:
    upstream = Upstream(truncate_next=True)
    upstream.add(5)

    async with streaming(ticket_extension(upstream), mode) as wire:
        stream = wire.open("ticket.created", cursor="gone-from-retention")
        active = await stream.expect("active")

    assert active == {"cursor": "5", "truncated": True, "_meta": meta(stream)}


@pytest.mark.anyio
async def test_a_gap_mid_stream_sends_a_fresh_active_truncated_and_delivery_goes_on(mode: str) -> None:
    upstream = Upstream()
    events = ticket_extension(upstream, next_poll_ms=600_000)

    async with streaming(events, mode) as wire:
        stream = wire.open("ticket.created")
        assert (await stream.expect("active"))["truncated"] is False
        upstream.add(3)
        upstream.truncate_next = True  # the upstream lost the stream's position
        events.wake("ticket.created")
        gap = await stream.expect("active")
        upstream.add(1)
        events.wake("ticket.created")
        after = await stream.events(1)

    assert gap == {"cursor": "3", "truncated": True, "_meta": meta(stream)}
    assert [(e["eventId"], e["cursor"]) for e in after] == [("t4", "4")]


@pytest.mark.anyio
async def test_a_failing_check_sends_an_error_notification_and_the_stream_goes_on(mode: str) -> None:
    upstream = Upstream()
    events = ticket_extension(upstream, next_poll_ms=5)

    async with streaming(events, mode) as wire:
        stream = wire.open("ticket.created")
        await stream.expect("active")
        upstream.failures.append(RuntimeError("upstream is down: password=hunter2"))
        error = await stream.expect("error")
        upstream.add(1)
        after = await stream.events(1)

    assert error == {
        "error": {"code": -32603, "message": "UpstreamError", "data": {"reason": "RuntimeError"}},
        "_meta": meta(stream),
    }
    assert [e["eventId"] for e in after] == ["t1"]


@pytest.mark.anyio
async def test_a_transient_mcp_error_from_the_check_is_reported_as_is_and_retried() -> None:
    upstream = Upstream()
    events = ticket_extension(upstream, next_poll_ms=5)

    async with streaming(events) as wire:
        stream = wire.open("ticket.created")
        await stream.expect("active")
        upstream.failures.append(MCPError(code=-32013, message="ResourceExhausted", data={"limit": "rate"}))
        error = await stream.expect("error")
        upstream.add(1)
        after = await stream.events(1)

    assert error["error"] == {"code": -32013, "message": "ResourceExhausted", "data": {"limit": "rate"}}
    assert [e["eventId"] for e in after] == ["t1"]


@pytest.mark.anyio
async def test_access_revoked_mid_stream_terminates_then_the_stream_ends_with_the_stream_events_result(
    mode: str,
) -> None:
    upstream = Upstream()
    hooks = Hooks()
    events = ticket_extension(upstream, next_poll_ms=600_000)
    hooks.attach(events, "ticket.created")

    async with streaming(events, mode) as wire:
        stream = wire.open("ticket.created")
        await stream.expect("active")
        upstream.failures.append(forbidden("access revoked"))
        events.wake("ticket.created")
        terminated = await stream.expect("terminated")
        await stream.finished()
        await hooks.wait_gone()
        leftover = stream.pending()

    assert terminated == {
        "error": {"code": -32012, "message": "Forbidden", "data": {"reason": "access revoked"}},
        "_meta": meta(stream),
    }
    assert stream.error is None
    assert is_stream_events_result(stream.result)
    assert leftover == []
    assert events.open_streams() == 0


@pytest.mark.anyio
async def test_a_type_removed_mid_stream_terminates_its_streams_with_not_found() -> None:
    events = incident_extension()

    async with streaming(events) as wire:
        stream = wire.open("incident.created")
        await stream.expect("active")
        events.remove_event_type("incident.created")
        events.wake("incident.created")
        terminated = await stream.expect("terminated")
        await stream.finished()

    assert terminated["error"]["code"] == -32011
    assert is_stream_events_result(stream.result)


@pytest.mark.anyio
async def test_the_server_can_close_streams_with_or_without_a_termination_error(mode: str) -> None:
    events = incident_extension()

    async with streaming(events, mode) as wire:
        revoked = wire.open("incident.created", {"severity": "P1"})
        kept = wire.open("incident.created", {"severity": "P2"})
        await revoked.expect("active")
        await kept.expect("active")
        picked = events.close_streams(
            "incident.created",
            error=forbidden("access revoked"),
            where=lambda arguments, principal: arguments.get("severity") == "P1",
        )
        terminated = await revoked.expect("terminated")
        await revoked.finished()
        events.emit(incident(1, "P2"))
        still = await kept.events(1)
        assert events.close_streams() == 1
        await kept.finished()
        leftover = kept.pending()

    assert picked == 1
    assert terminated["error"]["data"] == {"reason": "access revoked"}
    assert [e["eventId"] for e in still] == ["inc1"]
    assert leftover == []  # a close without an error sends no terminated
    assert is_stream_events_result(kept.result) and is_stream_events_result(revoked.result)


# ---- emit-only types --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_emitted_events_reach_each_open_stream_through_its_own_match_and_transform(mode: str) -> None:
    hooks = Incidents()
    events = incident_extension(hooks)
    subscriptions: dict[str, dict[str, Any]] = {
        "all": {},
        "p1": {"severity": "P1"},
        "redacted": {"redact_pii": True},
    }

    async with streaming(events, mode) as wire:
        streams = {key: wire.open("incident.created", args) for key, args in subscriptions.items()}
        for stream in streams.values():
            await stream.expect("active")
        events.emit(incident(1, "P1"))
        events.emit(incident(2, "P3"))
        events.emit(incident(3, "P1"))
        received = {key: await stream.events(2 if key == "p1" else 3) for key, stream in streams.items()}

    assert [e["eventId"] for e in received["all"]] == ["inc1", "inc2", "inc3"]
    assert [e["eventId"] for e in received["p1"]] == ["inc1", "inc3"]
    assert [e["data"]["reporter"] for e in received["all"]] == ["dsp@example.com"] * 3
    assert [e["data"]["reporter"] for e in received["redacted"]] == [None] * 3
    for key, stream in streams.items():
        assert {e["_meta"][SUBSCRIPTION_ID] for e in received[key]} == {stream.id}
    assert {(ctx.event_name, ctx.mode) for ctx in hooks.contexts} == {("incident.created", "push")}
    # A filtered-out event still moves the position on: P1's last cursor equals everybody's.
    assert received["p1"][-1]["cursor"] == received["all"][-1]["cursor"]


@pytest.mark.anyio
async def test_an_emit_only_stream_from_a_cursor_replays_the_ring_buffer_first(mode: str) -> None:
    events = incident_extension()

    async with streaming(events, mode) as wire:
        cursor = (await wire.call("events/poll", {"name": "incident.created"}))["cursor"]
        events.emit(incident(1))
        events.emit(incident(2))
        stream = wire.open("incident.created", cursor=cursor)
        active = await stream.expect("active")
        replayed = await stream.events(2)
        events.emit(incident(3))
        live = await stream.events(1)

    assert active == {"cursor": cursor, "truncated": False, "_meta": meta(stream)}
    assert [e["eventId"] for e in replayed + live] == ["inc1", "inc2", "inc3"]


@pytest.mark.anyio
@pytest.mark.parametrize("stale", ["deadbeef-3", "not a cursor"])
async def test_a_stale_emit_only_cursor_gives_active_truncated_with_a_fresh_cursor(
    mode: str, stale: str
) -> None:
    events = incident_extension()
    events.emit(incident(1))

    async with streaming(events, mode) as wire:
        stream = wire.open("incident.created", cursor=stale)
        active = await stream.expect("active")
        events.emit(incident(2))
        live = await stream.events(1)

    assert active["truncated"] is True
    assert active["cursor"] not in (stale, None)
    assert [e["eventId"] for e in live] == ["inc2"]


@pytest.mark.anyio
async def test_a_stream_that_falls_behind_the_ring_buffer_gets_a_fresh_active_truncated(mode: str) -> None:
    events = incident_extension(emit_buffer=EmitBuffer(max_events=3))

    async with streaming(events, mode) as wire:
        stream = wire.open("incident.created")
        start = await stream.expect("active")
        for n in range(1, 6):  # no await in between: the stream reads after all five
            events.emit(incident(n))
        gap = await stream.expect("active")
        kept = await stream.events(3)

    epoch = start["cursor"].rpartition("-")[0]
    assert gap == {"cursor": f"{epoch}-2", "truncated": True, "_meta": meta(stream)}
    assert [(e["eventId"], e["cursor"]) for e in kept] == [(f"inc{n}", f"{epoch}-{n}") for n in (3, 4, 5)]


@pytest.mark.anyio
async def test_a_no_replay_type_streams_with_null_cursors_everywhere(mode: str) -> None:
    events = load_extension(heartbeat_ms=50)
    events.emit(Event(name="system.load", data={"load1": 0.1}, event_id="before"))

    async with streaming(events, mode) as wire:
        stream = wire.open("system.load", cursor="left-over", maxAgeMs=1)
        active = await stream.expect("active")
        events.emit(Event(name="system.load", data={"load1": 0.2}, event_id="load1"))
        (event,) = await stream.events(1)
        heartbeat = await stream.expect("heartbeat", skip_heartbeats=False)

    assert active == {"cursor": None, "truncated": False, "_meta": meta(stream)}
    assert (event["eventId"], event["cursor"]) == ("load1", None)
    assert heartbeat == {"cursor": None, "_meta": meta(stream)}


@pytest.mark.anyio
async def test_emit_from_a_plain_thread_hands_the_event_to_the_servers_event_loop(mode: str) -> None:
    events = incident_extension()

    async with streaming(events, mode) as wire:
        stream = wire.open("incident.created")
        await stream.expect("active")
        thread = threading.Thread(target=events.emit, args=(incident(1),))
        thread.start()
        await anyio.to_thread.run_sync(thread.join)
        (event,) = await stream.events(1)

    assert event["eventId"] == "inc1"


# ---- subscription errors come back at once, with no stream -------------------------------------


@pytest.mark.anyio
async def test_invalid_subscriptions_are_json_rpc_errors_and_open_no_stream(mode: str) -> None:
    upstream = Upstream()
    events = ticket_extension(upstream)
    events.event(name="poll.only", emit_only=True, delivery=["poll"])(type("P", (), {}))
    hooks = Hooks()
    hooks.attach(events, "ticket.created")

    async with streaming(events, mode) as wire:
        unknown = await wire.refused("no.such.event")
        bad_arguments = await wire.refused("ticket.created", {"queue": 5})
        extra_argument = await wire.refused("ticket.created", {"colour": "red"})
        poll_only = await wire.refused("poll.only")
        bad_max_age = await wire.refused("ticket.created", maxAgeMs=-1)

    assert (unknown.code, unknown.data) == (-32011, {"kind": "event", "name": "no.such.event"})
    assert bad_arguments.code == -32602 and "queue" in bad_arguments.message
    assert extra_argument.code == -32602 and "colour" in extra_argument.message
    assert (poll_only.code, poll_only.data) == (-32014, {"feature": "deliveryMode", "value": "push"})
    assert bad_max_age.code == -32602
    assert upstream.calls == []
    assert hooks.subscribed == []
    assert events.open_streams() == 0


@pytest.mark.anyio
async def test_a_subscription_the_check_refuses_at_once_is_forbidden_and_unsubscribes_again(
    mode: str,
) -> None:
    upstream = Upstream(failures=[forbidden("not your channel")])
    events = ticket_extension(upstream)
    hooks = Hooks()
    hooks.attach(events, "ticket.created")

    async with streaming(events, mode) as wire:
        error = await wire.refused("ticket.created", {"queue": "secret"})

    assert (error.code, error.data) == (-32012, {"reason": "not your channel"})
    assert [s[2] for s in hooks.subscribed] == [s[2] for s in hooks.unsubscribed]


@pytest.mark.anyio
async def test_an_on_subscribe_hook_that_refuses_is_the_requests_error(mode: str) -> None:
    events = incident_extension()
    hooks = Hooks(refuse=forbidden("quota"))
    hooks.attach(events, "incident.created")

    async with streaming(events, mode) as wire:
        error = await wire.refused("incident.created")

    assert (error.code, error.data) == (-32012, {"reason": "quota"})
    assert events.open_streams() == 0


@pytest.mark.anyio
async def test_beyond_max_streams_a_stream_is_resource_exhausted_before_on_subscribe() -> None:
    events = incident_extension(max_streams=2)
    hooks = Hooks()
    hooks.attach(events, "incident.created")

    async with streaming(events) as wire:
        first, second = wire.open("incident.created"), wire.open("incident.created")
        await first.expect("active")
        await second.expect("active")
        error = await wire.refused("incident.created")
        first.scope.cancel()
        await hooks.wait_gone()
        third = wire.open("incident.created")
        await third.expect("active")

    assert (error.code, error.data) == (-32013, {"limit": "streams", "max": 2})
    assert len(hooks.subscribed) == 3


# ---- lifecycle: on_subscribe, cancellation, on_unsubscribe ------------------------------------------


@pytest.mark.anyio
async def test_cancelling_a_stream_fires_on_unsubscribe_and_stops_its_loop(mode: str) -> None:
    upstream = Upstream()
    events = ticket_extension(upstream, next_poll_ms=1)
    hooks = Hooks()
    hooks.attach(events, "ticket.created")

    async with streaming(events, mode) as wire:
        first = wire.open("ticket.created", {"queue": "ops"})
        await first.expect("active")
        with anyio.fail_after(WAIT):
            await upstream.called.wait()  # its loop is polling
        first.scope.cancel()
        await hooks.wait_gone()
        calls_when_gone = len(upstream.calls)
        # A second stream polls a few times; the first one's loop must not poll again meanwhile.
        second = wire.open("ticket.created")
        await second.expect("active")
        with anyio.fail_after(WAIT):
            while sum(1 for request_id, _ in upstream.calls if request_id == second.id) < 5:
                await upstream.called.wait()

    (sub_ctx, sub_args, sub_id), second_sub = hooks.subscribed
    (unsub_ctx, unsub_args, unsub_id) = hooks.unsubscribed[0]
    assert (sub_ctx.mode, sub_ctx.event_name, sub_args) == ("push", "ticket.created", {"queue": "ops"})
    assert sub_id.startswith("push:") and sub_id.endswith(f":{first.id}")
    assert (unsub_ctx.mode, unsub_args, unsub_id) == ("push", {"queue": "ops"}, sub_id)
    assert second_sub[2] != sub_id
    assert [c for c in upstream.calls[calls_when_gone:] if c[0] == first.id] == []
    assert first.result is None and first.error is None  # a cancelled request gets no answer


@pytest.mark.anyio
async def test_a_stream_blocked_on_a_slow_check_still_unsubscribes_when_cancelled(mode: str) -> None:
    release = anyio.Event()
    entered = anyio.Event()
    events = EventsExtension(default_next_poll_ms=1)
    hooks = Hooks()

    @events.event(name="slow")
    async def slow(ctx: EventContext, arguments: dict[str, Any], cursor: str | None) -> EventResult:
        if cursor is not None:
            entered.set()
            await release.wait()
        return EventResult(events=[], cursor="0")

    hooks.attach(events, "slow")
    async with streaming(events, mode) as wire:
        stream = wire.open("slow")
        await stream.expect("active")
        with anyio.fail_after(WAIT):
            await entered.wait()
        stream.scope.cancel()
        await hooks.wait_gone()

    assert events.open_streams() == 0


# ---- concurrency and volume ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_many_concurrent_streams_on_one_connection_each_get_their_own_events(mode: str) -> None:
    upstream = Upstream()
    events = ticket_extension(upstream, next_poll_ms=600_000)
    queues = [f"q{n}" for n in range(20)]

    async with streaming(events, mode) as wire:
        streams = {queue: wire.open("ticket.created", {"queue": queue}) for queue in queues}
        for stream in streams.values():
            await stream.expect("active")
        for queue in queues:
            upstream.add(2, queue=queue)
        events.wake("ticket.created")
        received = {queue: await stream.events(2) for queue, stream in streams.items()}
        leftovers = [frame for stream in streams.values() for frame in stream.pending()]

    for queue, got in received.items():
        assert {e["data"]["queue"] for e in got} == {queue}
        assert {e["_meta"][SUBSCRIPTION_ID] for e in got} == {streams[queue].id}
    assert [f for f in leftovers if f[0].endswith("/event")] == []


@pytest.mark.anyio
async def test_a_subscription_id_minted_by_the_client_dispatcher_routes_its_frames() -> None:
    events = incident_extension()

    async with streaming(events) as wire:

        async def plain_request() -> None:
            # The SDK mints an (integer) id here; the frames carry it back.
            request = _EventsRequest(
                method="events/stream", params=_Params.model_validate({"name": "incident.created"})
            )
            await wire.client.session.send_request(request, RESULT)  # type: ignore[type-var]

        wire.tg.start_soon(plain_request)
        with anyio.fail_after(WAIT):
            method, params = await wire.router.unclaimed.receive()

    assert method == "notifications/events/active"
    assert isinstance(params["_meta"][SUBSCRIPTION_ID], int)


@pytest.mark.anyio
async def test_a_burst_of_ten_thousand_emitted_events_arrives_complete_and_in_order(mode: str) -> None:
    events = incident_extension(emit_buffer=EmitBuffer(max_events=10_000))

    async with streaming(events, mode) as wire:
        stream = wire.open("incident.created")
        await stream.expect("active")
        for n in range(10_000):
            events.emit(incident(n))
        received = await stream.events(10_000)
        leftover = stream.pending()

    assert [e["eventId"] for e in received] == [f"inc{n}" for n in range(10_000)]
    assert leftover == []


@pytest.mark.anyio
async def test_a_burst_of_ten_thousand_upstream_events_arrives_complete_and_in_order(mode: str) -> None:
    upstream = Upstream()
    events = ticket_extension(upstream, next_poll_ms=600_000)

    async with streaming(events, mode) as wire:
        stream = wire.open("ticket.created")
        await stream.expect("active")
        upstream.add(10_000)
        events.wake("ticket.created")
        received = await stream.events(10_000)

    assert [e["cursor"] for e in received] == [str(n) for n in range(1, 10_001)]
    # Read in maxEvents-sized batches, each only after the previous one was sent.
    assert len(upstream.calls) == 1 + 10_000 // events.default_max_events


# ---- over real transports ---------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.slow
async def test_over_stdio_the_demo_server_streams_a_backlog_live_alerts_heartbeats_and_hears_cancellation(
    tmp_path: Path,
) -> None:
    config = demo_stdio(
        tmp_path / "demo.db", DEMO_BACKLOG="10000", DEMO_HEARTBEAT_MS="50", DEMO_ALERT_INTERVAL="0.02"
    )
    async with ServerConnection("demo", config) as connection, harness_for(connection.client) as wire:
        listed = await wire.call("events/list", {})
        tickets = wire.open("ticket.created", cursor="0")
        active = await tickets.expect("active")
        backlog = await tickets.events(10_000)
        heartbeat = await tickets.expect("heartbeat", skip_heartbeats=False)
        tickets.scope.cancel()  # the SDK sends notifications/cancelled for it on stdin
        alerts = wire.open("alert.fired")
        await alerts.expect("active")
        cancelled_at = wire.router.log.index((alerts.id, "notifications/events/active"))
        live = await alerts.events(10)  # ~200 ms: a live tickets stream would heartbeat every 50 ms

    assert {d["name"]: d["delivery"] for d in listed["events"]} == {
        "ticket.created": ["poll", "push"],
        "alert.fired": ["poll", "push"],
        "system.load": ["poll", "push"],
    }
    assert active == {"cursor": "0", "truncated": False, "_meta": meta(tickets)}
    assert [(e["eventId"], e["cursor"]) for e in backlog] == [
        (f"T-{n:06d}", str(n)) for n in range(1, 10_001)
    ]
    assert heartbeat == {"cursor": "10000", "_meta": meta(tickets)}
    assert [m for sid, m in wire.router.log[cancelled_at:] if sid == tickets.id] == []
    assert len({e["eventId"] for e in live}) == 10
    assert all(e["data"]["alertId"].startswith("A-") for e in live)


@asynccontextmanager
async def serving_http(events: EventsExtension) -> AsyncIterator[str]:
    """An in-process Streamable HTTP server on loopback (so its hooks are observable)."""
    server = MCPServer("t", extensions=[events])
    events.install(server)
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    http_server = uvicorn.Server(
        uvicorn.Config(server.streamable_http_app(), log_level="warning", lifespan="on")
    )
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: http_server.serve(sockets=[sock]))
            try:
                yield f"http://127.0.0.1:{port}/mcp"
            finally:
                http_server.should_exit = True
    finally:
        sock.close()


@pytest.mark.anyio
async def test_over_streamable_http_the_sdk_client_streams_and_its_cancellation_unsubscribes(
    mode: str,
) -> None:
    events = incident_extension(heartbeat_ms=50)
    hooks = Hooks()
    hooks.attach(events, "incident.created")

    async with (
        serving_http(events) as url,
        Client(streamable_http_client(url), mode=mode) as client,
        harness_for(client) as wire,
    ):
        stream = wire.open("incident.created", {"severity": "P1"})
        active = await stream.expect("active")
        events.emit(incident(1, "P1"))
        (event,) = await stream.events(1)
        heartbeat = await stream.expect("heartbeat", skip_heartbeats=False)
        # 2026-era: the client drops the POST's response; 2025-era: it sends notifications/cancelled.
        stream.scope.cancel()
        await hooks.wait_gone()
        protocol_version = client.protocol_version

    assert protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
    assert active["truncated"] is False
    assert (event["eventId"], event["_meta"]) == ("inc1", meta(stream))
    assert heartbeat["cursor"] == event["cursor"]
    assert events.open_streams() == 0


async def _sse_messages(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    async for line in response.aiter_lines():
        if line.startswith("data:") and line[5:].strip():
            yield json.loads(line[5:])


@pytest.mark.anyio
@pytest.mark.parametrize("busy", [False, True], ids=["quiet", "busy"])
async def test_a_handshake_era_http_client_that_just_closes_the_response_is_unsubscribed(busy: bool) -> None:
    """No notifications/cancelled: the client aborts the POST's SSE response, as the spec says it may.

    The SDK's 2025-era transport then only drops what the stream writes, so the stream
    asks the HTTP request about once a heartbeat interval, also while it is busy sending.
    """
    events = incident_extension(heartbeat_ms=50)
    hooks = Hooks()
    hooks.attach(events, "incident.created")
    accept = {"accept": "application/json, text/event-stream"}
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }

    async with serving_http(events) as url, httpx.AsyncClient(timeout=WAIT) as http:
        opened = await http.post(url, json=initialize, headers=accept)
        session = {
            **accept,
            "mcp-session-id": opened.headers["mcp-session-id"],
            "mcp-protocol-version": "2025-11-25",
        }
        await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
        request = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "events/stream",
            "params": {"name": "incident.created"},
        }
        frames: list[dict[str, Any]] = []
        with anyio.fail_after(WAIT):
            async with http.stream("POST", url, json=request, headers=session) as response:
                content_type = response.headers["content-type"]
                async for message in _sse_messages(response):
                    frames.append(message)
                    if message["method"].endswith("/active"):
                        events.emit(incident(1))
                    if message["method"].endswith("/heartbeat"):
                        break  # and close the response mid-stream
        emitted = 1
        with anyio.fail_after(WAIT):
            while not hooks.gone.is_set():
                if busy:  # keep the stream sending, so it is never quiet for a heartbeat
                    emitted += 1
                    events.emit(incident(emitted))
                    await anyio.lowlevel.checkpoint()
                else:
                    await hooks.gone.wait()

    assert content_type.startswith("text/event-stream")
    assert [frame["method"] for frame in frames] == [
        "notifications/events/active",
        "notifications/events/event",
        "notifications/events/heartbeat",
    ]
    assert {frame["params"]["_meta"][SUBSCRIPTION_ID] for frame in frames} == {7}
    assert events.open_streams() == 0
    assert (emitted > 1) is busy
