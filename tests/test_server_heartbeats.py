"""What ``EventsExtension`` sends on a push stream, and in the handshake, over real Streamable HTTP.

A real server (uvicorn, in process, on loopback) and a raw HTTP client that keeps
every SSE frame as the bytes it arrived as, with its arrival time, on both
protocol eras: 2025-11-25 (initialize handshake, session id) and 2026-07-28
(self-contained requests). What is checked:

- a heartbeat at least every ``heartbeat_ms`` however busy the stream, carrying
  the position checked up to, which runs ahead of the last matching event;
- a quiet stream still heartbeats every ``heartbeat_ms``;
- no SSE comment (``: ping``) on an events/stream response, while another SSE
  response of the same server (a slow tools/call) does get the SDK's pings;
- the capability under ``capabilities.extensions`` on both eras.

The SDK pings every 15 s. The stream tests shorten that to 0.2 s, through the same
settings the SDK reads when it pings (sse_starlette's ``DEFAULT_PING_INTERVAL``
for 2025-era responses, ``_compat.modern_sse_ping_interval`` for 2026-era ones),
and prove the shortening took hold with the tools/call control. The literal
scenario of the spec's numbers (30 s heartbeat, an event a second, 70 s) is
``test_the_spec_scenario_...``, marked ``long`` and deselected by default
(``pytest -m long`` runs it).

Traffic is made by the server itself (a check function read every
``next_poll_ms``); the tests never sleep, they read frames until a deadline
under ``anyio.fail_after``.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest
import uvicorn
from mcp.server.mcpserver import MCPServer
from sse_starlette import EventSourceResponse

from agentwake import _compat
from agentwake.server import Event, EventContext, EventResult, EventsExtension

pytestmark = pytest.mark.anyio

EXTENSION_ID = "io.modelcontextprotocol/events"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
HANDSHAKE_ERA = "2025-11-25"
MODERN_ERA = "2026-07-28"
ERAS = pytest.mark.parametrize("era", [HANDSHAKE_ERA, MODERN_ERA])
ACCEPT = {"accept": "application/json, text/event-stream"}
# Scheduling, loopback and the client's own reading, on a loaded CI machine.
TOLERANCE_S = 0.3
PING_S = 0.2  # the SDK's ping interval while a ping test runs (15 s otherwise)
# A blank line ends an SSE frame, in any of the three line-end spellings.
FRAME_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


# ---- the server ---------------------------------------------------------------------------


class Ticker:
    """An upstream that grows by two items between reads: one the subscription matches, one it does not.

    So every read returns one event (cursor ``2k-1``) and a batch cursor one ahead of it
    (``2k``): the position the server has checked up to.
    """

    async def check(self, ctx: EventContext, arguments: dict[str, Any], cursor: str | None) -> EventResult:
        if cursor is None:
            return EventResult(events=[], cursor="0")
        checked = int(cursor) + 2
        event = Event(
            name="tick", data={"n": checked - 1}, event_id=f"tick-{checked - 1}", cursor=str(checked - 1)
        )
        return EventResult(events=[event], cursor=str(checked))


class Incidents:
    """An emit-only type nothing is emitted for: a quiet stream."""


def extension(*, heartbeat_ms: int, event_every_ms: int) -> EventsExtension:
    events = EventsExtension(heartbeat_ms=heartbeat_ms)
    events.event(name="tick", next_poll_ms=event_every_ms)(Ticker().check)
    events.event(name="incident.created", emit_only=True)(Incidents)
    return events


@asynccontextmanager
async def serving(events: EventsExtension, release: anyio.Event | None = None) -> AsyncIterator[str]:
    """The server on loopback; with ``release``, also a ``slow`` tool that returns once it is set."""
    server = MCPServer("t", extensions=[events])
    events.install(server)
    if release is not None:

        @server.tool()
        async def slow() -> str:
            await release.wait()
            return "done"

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
                if release is not None:
                    release.set()
                http_server.should_exit = True
    finally:
        sock.close()


@pytest.fixture
def fast_sdk_pings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The SDK pings SSE responses every PING_S instead of 15 s, on both eras."""
    monkeypatch.setattr(EventSourceResponse, "DEFAULT_PING_INTERVAL", PING_S)
    with _compat.modern_sse_ping_interval(PING_S):
        yield


# ---- the raw client ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """One SSE frame as it came off the socket, and when."""

    at: float
    raw: bytes

    @property
    def lines(self) -> list[bytes]:
        return [line for line in self.raw.splitlines() if line]

    @property
    def comment(self) -> bool:
        return all(line.startswith(b":") for line in self.lines)

    @property
    def message(self) -> dict[str, Any] | None:
        data = [line[5:].strip() for line in self.lines if line.startswith(b"data:")]
        return json.loads(b"\n".join(data)) if data and any(data) else None

    @property
    def method(self) -> str | None:
        message = self.message
        return None if message is None else message.get("method")

    @property
    def params(self) -> dict[str, Any]:
        message = self.message
        return {} if message is None else dict(message.get("params") or {})


async def frames(response: httpx.Response) -> AsyncIterator[Frame]:
    buffer = b""
    async for chunk in response.aiter_raw():
        at = anyio.current_time()
        buffer += chunk
        while (end := FRAME_END.search(buffer)) is not None:
            raw, buffer = buffer[: end.start()], buffer[end.end() :]
            if raw.strip():
                yield Frame(at, raw)


class RawClient:
    """A JSON-RPC client over plain HTTP POSTs, on one protocol era."""

    def __init__(self, http: httpx.AsyncClient, url: str, era: str) -> None:
        self.http, self.url, self.era = http, url, era
        self.session: dict[str, str] = {}

    async def connect(self) -> dict[str, Any]:
        """The handshake's result: ``initialize`` on 2025-11-25, ``server/discover`` on 2026-07-28."""
        if self.era == HANDSHAKE_ERA:
            params = {
                "protocolVersion": self.era,
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            }
            response = await self.http.post(self.url, json=self.body(1, "initialize", params), headers=ACCEPT)
            self.session = {
                "mcp-session-id": response.headers["mcp-session-id"],
                "mcp-protocol-version": self.era,
            }
            initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            await self.http.post(self.url, json=initialized, headers={**ACCEPT, **self.session})
            return self.result(response)
        response = await self.http.post(
            self.url, json=self.body(1, "server/discover", {}), headers=self.headers("server/discover", {})
        )
        return self.result(response)

    def body(self, request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if self.era == MODERN_ERA and method != "initialize":
            params = {
                **params,
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": self.era,
                    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
                    "io.modelcontextprotocol/clientCapabilities": {},
                },
            }
        return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}

    def headers(self, method: str, params: dict[str, Any]) -> dict[str, str]:
        if self.era == HANDSHAKE_ERA:
            return {**ACCEPT, **self.session}
        headers = {**ACCEPT, "mcp-protocol-version": self.era, "mcp-method": method}
        if method == "tools/call":
            headers["mcp-name"] = params["name"]
        return headers

    @staticmethod
    def result(response: httpx.Response) -> dict[str, Any]:
        if response.headers["content-type"].startswith("text/event-stream"):
            messages = [Frame(0, raw).message for raw in FRAME_END.split(response.content) if raw.strip()]
            (result,) = [message["result"] for message in messages if message and "result" in message]
            return dict(result)
        return dict(response.json()["result"])

    @asynccontextmanager
    async def sse(
        self, request_id: int, method: str, params: dict[str, Any]
    ) -> AsyncIterator[AsyncIterator[Frame]]:
        """The request's SSE response, frame by frame; leaving the block closes it."""
        body, headers = self.body(request_id, method, params), self.headers(method, params)
        async with self.http.stream("POST", self.url, json=body, headers=headers) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            yield frames(response)


@asynccontextmanager
async def client(url: str, era: str) -> AsyncIterator[RawClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=None)) as http:
        raw = RawClient(http, url, era)
        await raw.connect()
        yield raw
        if raw.session:  # end the 2025-era session, as a client leaving does
            await http.delete(url, headers=raw.session)


async def watch_stream(
    raw: RawClient, name: str, *, seconds: float, heartbeats: int | None = None
) -> list[Frame]:
    """Every frame of an events/stream from its ``active`` on, for ``seconds`` (or up to ``heartbeats`` of them)."""
    seen: list[Frame] = []
    async with raw.sse(7, "events/stream", {"name": name}) as stream:
        async for frame in stream:
            seen.append(frame)
            opened = next(f.at for f in seen if f.method == "notifications/events/active")
            beats = sum(f.method == "notifications/events/heartbeat" for f in seen)
            if frame.at - opened >= seconds or beats == heartbeats:
                break
    return seen


# ---- what the frames must show ---------------------------------------------------------------


def heartbeat_gaps(seen: list[Frame]) -> list[float]:
    """From ``active`` to each heartbeat in turn, then from the last heartbeat to the end of the watch."""
    marks = [
        f.at for f in seen if f.method in ("notifications/events/active", "notifications/events/heartbeat")
    ]
    return [b - a for a, b in zip(marks, [*marks[1:], seen[-1].at], strict=True)]


def assert_push_frames_only(seen: list[Frame], subscription_id: int) -> None:
    """Data frames of notifications/events/* for this subscription, and no comment of any kind."""
    assert [f.raw for f in seen if f.comment] == []
    assert seen[0].method == "notifications/events/active"
    assert {f.params["_meta"][SUBSCRIPTION_ID] for f in seen} == {subscription_id}
    assert all(str(f.method).startswith("notifications/events/") for f in seen)


def assert_busy_stream_heartbeats(seen: list[Frame], *, heartbeat_s: float, event_every_s: float) -> None:
    methods = [f.method for f in seen]
    beats = [f for f in seen if f.method == "notifications/events/heartbeat"]
    events = [f for f in seen if f.method == "notifications/events/event"]
    watched = seen[-1].at - seen[0].at
    # Busy: never quiet for a heartbeat interval, so a heartbeat only after one of quiet would never come.
    assert len(events) >= watched / event_every_s * 0.6
    assert max(b.at - a.at for a, b in itertools.pairwise(seen)) < heartbeat_s - TOLERANCE_S
    # And still a heartbeat at least every interval, from the active on.
    assert len(beats) >= int(watched / heartbeat_s)
    assert max(heartbeat_gaps(seen)) <= heartbeat_s + TOLERANCE_S, heartbeat_gaps(seen)
    # Each heartbeat carries the position checked up to: one past the last event it follows.
    for beat in beats:
        before = [f for f in seen[: seen.index(beat)] if f.method == "notifications/events/event"]
        assert before, methods
        assert int(beat.params["cursor"]) == int(before[-1].params["cursor"]) + 1


# ---- heartbeats -----------------------------------------------------------------------------------


@ERAS
async def test_a_busy_stream_heartbeats_at_least_every_interval_with_the_position_checked_up_to(
    era: str, fast_sdk_pings: None
) -> None:
    """An event every 200 ms, heartbeats every 1 s, watched for 3.5 intervals (and no SDK pings)."""
    heartbeat_s, event_every_s = 1.0, 0.2
    events = extension(heartbeat_ms=int(heartbeat_s * 1000), event_every_ms=int(event_every_s * 1000))

    async with serving(events) as url, client(url, era) as raw:
        with anyio.fail_after(3.5 * heartbeat_s + 10):
            seen = await watch_stream(raw, "tick", seconds=3.5 * heartbeat_s)

    assert_push_frames_only(seen, 7)
    assert_busy_stream_heartbeats(seen, heartbeat_s=heartbeat_s, event_every_s=event_every_s)


@ERAS
async def test_a_quiet_stream_heartbeats_every_interval_and_carries_no_sdk_ping_unlike_other_responses(
    era: str, fast_sdk_pings: None
) -> None:
    """Nothing happens for two heartbeat intervals (ten SDK ping intervals); a slow tools/call
    on the same server meanwhile shows the SDK's pings, so they were due and were held back."""
    heartbeat_s = 1.0
    events = extension(heartbeat_ms=int(heartbeat_s * 1000), event_every_ms=1000)
    release = anyio.Event()
    pings: list[Frame] = []

    async def watch_tool_call(raw: RawClient) -> None:
        async with raw.sse(8, "tools/call", {"name": "slow", "arguments": {}}) as response:
            async for frame in response:
                if frame.comment:
                    pings.append(frame)
                if len(pings) == 3:
                    return

    async with serving(events, release) as url, client(url, era) as raw:
        with anyio.fail_after(2 * heartbeat_s + 10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch_tool_call, raw)
                seen = await watch_stream(raw, "incident.created", seconds=math.inf, heartbeats=2)

    assert_push_frames_only(seen, 7)
    assert [f.method for f in seen] == ["notifications/events/active"] + [
        "notifications/events/heartbeat"
    ] * 2
    gaps = heartbeat_gaps(seen)[:2]
    assert all(heartbeat_s - TOLERANCE_S <= gap <= heartbeat_s + TOLERANCE_S for gap in gaps), gaps
    assert [beat.params["cursor"] for beat in seen[1:]] == [seen[0].params["cursor"]] * 2
    assert len(pings) == 3 and all(ping.lines[0].startswith(b": ping") for ping in pings)


@pytest.mark.long
@pytest.mark.timeout(180)
async def test_the_spec_scenario_an_event_every_second_for_seventy_seconds_gets_a_heartbeat_every_thirty() -> (
    None
):
    """The spec's numbers as they are: the default 30 s heartbeat, the SDK's own 15 s pings,
    an event every second, for 70 s, on both eras at once."""
    heartbeat_s, event_every_s = 30.0, 1.0
    events = extension(heartbeat_ms=int(heartbeat_s * 1000), event_every_ms=int(event_every_s * 1000))
    seen: dict[str, list[Frame]] = {}

    async def watch(url: str, era: str) -> None:
        async with client(url, era) as raw:
            seen[era] = await watch_stream(raw, "tick", seconds=70)

    async with serving(events) as url:
        with anyio.fail_after(70 + 20):
            async with anyio.create_task_group() as tg:
                for era in (HANDSHAKE_ERA, MODERN_ERA):
                    tg.start_soon(watch, url, era)

    for era in (HANDSHAKE_ERA, MODERN_ERA):
        assert_push_frames_only(seen[era], 7)
        assert_busy_stream_heartbeats(seen[era], heartbeat_s=heartbeat_s, event_every_s=event_every_s)


# ---- the capability ------------------------------------------------------------------------------


@ERAS
async def test_the_handshake_result_advertises_the_capability_under_extensions_on_both_eras(era: str) -> None:
    events = extension(heartbeat_ms=30_000, event_every_ms=1000)

    async with serving(events) as url, httpx.AsyncClient(timeout=10) as http:
        result = await RawClient(http, url, era).connect()

    capabilities = result["capabilities"]
    assert capabilities["extensions"][EXTENSION_ID] == {"listChanged": True}
    assert capabilities["events"] == {"listChanged": True}
    assert capabilities["experimental"][EXTENSION_ID] == {"listChanged": True}
