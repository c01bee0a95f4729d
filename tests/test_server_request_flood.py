"""A server flooding the client with requests is slowed to ``[limits] max_server_requests_per_s`` (issue 29).

An MCP server may send the client requests (``ping``, ``roots/list``, ...) and the SDK answers each;
a server sending them as fast as it can kept a core of agentwake busy answering. Now each
connection passes at most the rate (bursts of twice that) and its reader waits beyond it: the
server's pipe (or socket) fills, nothing is dropped or answered differently, and one WARNING names
the server. Notifications and answers to our own requests are never held.

The rig tests run agentwake in-process beside tests/hostile_server.py in mode "request-flood" (ping
and roots/list as fast as stdout takes them, every answer recorded in its log with the time it was
read) and tests/feed_server.py feeding "good" (tests/test_hostile.py's rig). The HTTP test floods a
``ServerConnection`` from a minimal hand-written Streamable HTTP peer on loopback. Every wait is on a
condition under a deadline; the bounds are generous, for a machine running a second suite beside.
"""

from __future__ import annotations

import io
import json
import logging
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiohttp import web
from mcp import Client, StdioServerParameters
from test_hostile import Rig, running

from agentwake.config import LimitsConfig, ServerConfig
from agentwake.fakes._http import serve
from agentwake.mcp import ServerConnection
from agentwake.ratelimit import BURST_FACTOR, ServerRequestLimit, TokenBucket
from agentwake.stdio import StdioLimits, bounded_stdio_client

pytestmark = pytest.mark.anyio

FLOOD_WARNING = "sends requests faster than"
LOGGER = "agentwake.ratelimit"


def flood_answers(rig: Rig, since: float = 0.0, until: float = float("inf")) -> list[dict[str, Any]]:
    """The answers the hostile server read to its flood's requests, read between ``since`` and ``until``."""
    return [
        r
        for r in rig.requests()
        if r["method"] is None and str(r["id"]).startswith("flood-") and since <= r["t"] < until
    ]


def flood_warnings(caplog: pytest.LogCaptureFixture, server: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and FLOOD_WARNING in r.getMessage() and repr(server) in r.getMessage()
    ]


# ---- the token bucket ------------------------------------------------------------------------


def test_a_full_bucket_lets_its_burst_through_then_one_token_per_interval() -> None:
    bucket = TokenBucket(rate=10, burst=20)
    assert [bucket.take(100.0) for _ in range(20)] == [0.0] * 20
    # The 21st is reserved ahead: due 0.1 s later, the 22nd 0.2 s later.
    assert bucket.take(100.0) == pytest.approx(0.1)
    assert bucket.take(100.0) == pytest.approx(0.2)
    # A long quiet refills no more than the burst.
    assert [bucket.take(1000.0) for _ in range(20)] == [0.0] * 20
    assert bucket.take(1000.0) == pytest.approx(0.1)


def test_a_caller_waiting_its_turn_gets_at_most_rate_times_window_plus_burst() -> None:
    bucket = TokenBucket(rate=20, burst=40)
    now, taken = 0.0, 0
    while now < 5.0:  # a consumer as fast as the bucket lets it: it waits what it is told
        now += bucket.take(now)
        if now < 5.0:
            taken += 1
    assert 20 * 5 + 40 - 1 <= taken <= 20 * 5 + 40


def test_a_clock_stepping_back_refills_nothing() -> None:
    bucket = TokenBucket(rate=1, burst=1)
    assert bucket.take(10.0) == 0.0
    assert bucket.take(5.0) == pytest.approx(1.0)


def test_the_bucket_and_the_limits_refuse_a_rate_that_is_not_above_zero() -> None:
    with pytest.raises(ValueError, match="rate"):
        TokenBucket(rate=0, burst=1)
    with pytest.raises(ValueError, match="burst"):
        TokenBucket(rate=1, burst=0.5)
    with pytest.raises(ValueError, match="server_requests_per_s"):
        StdioLimits(server_requests_per_s=0)
    with pytest.raises(ValueError):
        LimitsConfig(max_server_requests_per_s=0)


def test_an_infinite_rate_never_waits() -> None:
    bucket = TokenBucket(rate=float("inf"), burst=1)
    assert {bucket.take(0.0) for _ in range(1000)} == {0.0}


def test_one_warning_per_flood_episode_naming_the_server(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    clock = [0.0]
    limit = ServerRequestLimit("noisy", 5.0, clock=lambda: clock[0])
    burst = int(BURST_FACTOR * 5)
    assert [limit.delay() for _ in range(burst)] == [0.0] * burst
    assert flood_warnings(caplog, "noisy") == []
    for _ in range(500):  # a flood: every request waits its turn
        clock[0] += limit.delay()
    assert limit.slowed == 500
    assert flood_warnings(caplog, "noisy") == [
        "server 'noisy': sends requests faster than 5/s ([limits] max_server_requests_per_s);"
        " reading from it is slowed"
    ]
    # Quiet for long enough, then another flood: a second episode, a second warning.
    clock[0] += 3600
    for _ in range(burst + 5):
        clock[0] += limit.delay()
    assert limit.episodes == 2
    assert len(flood_warnings(caplog, "noisy")) == 2


# ---- over stdio, in the service ------------------------------------------------------------------


async def test_a_request_flood_is_slowed_to_the_rate_costs_little_cpu_and_is_told_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rate = LimitsConfig().max_server_requests_per_s
    burst = BURST_FACTOR * rate
    # A short backlog for "good": the CPU is measured once it is drained.
    items = 5000
    async with running(tmp_path, caplog, "request-flood", feed_items=items) as rig:
        await rig.acted("events/list", 1, within=30)
        await rig.until(
            lambda: len(flood_answers(rig)) >= 1, "agentwake answered a request of the flood", within=30
        )
        # The good subscription keeps its pace meanwhile: its whole backlog flows and is handled.
        await rig.good_keeps_flowing(within=30)
        await rig.until(
            lambda: rig.count("good") >= items and rig.count("good", "done") >= items,
            "the good backlog drained and handled while the other server flooded requests",
            within=60,
        )
        window_s = 3.0
        start, cpu = time.time(), time.process_time()
        await rig.until(
            lambda: time.time() >= start + window_s, "the measurement window", within=window_s + 30
        )
        elapsed = time.time() - start
        used = (time.process_time() - cpu) / elapsed
        answered = len(flood_answers(rig, start, start + elapsed))
        rig.check_alive()

        assert answered <= rate * elapsed + burst + 5, f"{answered} requests answered in {elapsed:.1f}s"
        assert answered >= rate * window_s / 4, f"only {answered} requests answered in {elapsed:.1f}s"
        # Answering as fast as the server asks takes a whole core; at 20 a second, next to nothing.
        assert used < 0.4, f"the process used {used:.0%} of a core while the server flooded requests"

        # Nothing dropped nor answered twice or wrongly: the answers are the requests, in order.
        answers = flood_answers(rig)
        assert [a["id"] for a in answers] == [f"flood-{n}" for n in range(1, len(answers) + 1)]
        pings = {a["answer"] for a in answers if int(a["id"].removeprefix("flood-")) % 2}
        assert pings == {"result"}, "a ping must get its (empty) result"
    assert len(flood_warnings(caplog, "hostile")) == 1, flood_warnings(caplog, "hostile")
    assert flood_warnings(caplog, "feed") == []


async def test_the_request_rate_is_configurable(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rate = 4.0
    async with running(tmp_path, caplog, "request-flood", limits={"max_server_requests_per_s": rate}) as rig:
        await rig.acted("events/list", 1, within=30)
        burst = int(BURST_FACTOR * rate)
        await rig.until(
            lambda: len(flood_answers(rig)) > burst,
            f"agentwake answered the first {burst + 1} of the flood",
            within=30,
        )
        window_s = 3.0
        start = time.time()
        await rig.until(
            lambda: time.time() >= start + window_s, "the measurement window", within=window_s + 30
        )
        elapsed = time.time() - start
        answered = len(flood_answers(rig, start, start + elapsed))
        # Under the default rate (20/s) about 60 would be answered in the window.
        assert 1 <= answered <= rate * elapsed + BURST_FACTOR * rate + 3, (
            f"{answered} requests answered in {elapsed:.1f}s"
        )
        await rig.good_keeps_flowing(more=10, within=30)
    assert flood_warnings(caplog, "hostile") == [
        "server 'hostile': sends requests faster than 4/s ([limits] max_server_requests_per_s);"
        " reading from it is slowed"
    ]


# ---- over stdio, the transport -------------------------------------------------------------------


def script(tmp_path: Path, body: str) -> StdioServerParameters:
    path = tmp_path / "server.py"
    path.write_text(textwrap.dedent(body))
    return StdioServerParameters(command=sys.executable, args=["-u", str(path)])


# A handshake-era server that answers initialize, then does what FLOOD says.
HANDSHAKE = """\
    import json, os, sys

    def send(message):
        sys.stdout.buffer.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\\n")
        sys.stdout.buffer.flush()

    for line in sys.stdin.buffer:
        message = json.loads(line)
        if message.get("method") == "initialize":
            send({"id": message["id"], "result": {
                "protocolVersion": message["params"]["protocolVersion"], "capabilities": {},
                "serverInfo": {"name": "s", "version": "1"}}})
        elif message.get("method") == "notifications/initialized":
            break
"""


async def test_notifications_that_look_like_requests_are_not_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """3,000 notifications whose params hold "id" and "method", then one ping: at 1 request a second
    (burst 2), counting any notification as a request would hold the ping for many minutes."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    params = script(
        tmp_path,
        HANDSHAKE
        + """\
    note = {"method": "notifications/message",
            "params": {"level": "info", "data": {"id": 7, "method": "ping", "jsonrpc": "2.0"}}}
    sys.stdout.buffer.write((json.dumps({"jsonrpc": "2.0", **note}) + "\\n").encode() * 3000)
    send({"id": "last", "method": "ping"})
    for line in sys.stdin.buffer:
        if json.loads(line).get("id") == "last":
            send({"method": "notifications/tools/list_changed"})
    """,
    )
    answered = anyio.Event()

    async def on_message(message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            answered.set()

    transport = bounded_stdio_client(
        params, name="chatty", limits=StdioLimits(server_requests_per_s=1.0), errlog=io.StringIO()
    )
    with anyio.fail_after(20):
        async with Client(transport, mode="legacy", message_handler=on_message):
            await answered.wait()
    assert transport.requests.slowed == 0
    assert flood_warnings(caplog, "chatty") == []


async def test_closing_while_the_reader_waits_its_turn_lets_the_server_exit_on_stdins_end(
    tmp_path: Path,
) -> None:
    """The shutdown cuts the reader's wait short and drains stdout, so a server blocked writing its
    flood reads the end of its stdin and exits by itself (no SIGTERM), however low the rate."""
    params = script(
        tmp_path,
        HANDSHAKE
        + """\
    os.set_blocking(0, False)
    batch = b"".join(b'{"jsonrpc": "2.0", "id": %d, "method": "ping"}\\n' % n for n in range(100))
    while True:
        sys.stdout.buffer.write(batch)
        sys.stdout.buffer.flush()
        try:
            if os.read(0, 65536) == b"":
                sys.exit(0)
        except BlockingIOError:
            pass
    """,
    )
    transport = bounded_stdio_client(
        params, name="flooder", limits=StdioLimits(server_requests_per_s=0.1), errlog=io.StringIO()
    )
    with anyio.fail_after(20):
        async with Client(transport, mode="legacy"):
            while transport.requests.slowed == 0:  # noqa: ASYNC110 - the limit has no event to wait on
                await anyio.sleep(0.01)
        exit = await transport.wait_exit()
    assert exit.returncode == 0 and not exit.stopped_by_agentwake, exit


# ---- over Streamable HTTP ------------------------------------------------------------------------


class FloodingPeer:
    """A minimal handshake-era Streamable HTTP MCP server on loopback: ``initialize`` opens a session,
    and its GET stream sends ping requests as fast as the socket takes them; each answer the client
    POSTs back is recorded with the time it arrived."""

    def __init__(self) -> None:
        self.answers: list[tuple[float, Any, str]] = []
        self.changed = anyio.Event()
        self.sent = 0

    def _record(self, message: dict[str, Any]) -> None:
        self.answers.append((time.time(), message.get("id"), "error" if "error" in message else "result"))
        changed, self.changed = self.changed, anyio.Event()
        changed.set()

    async def post(self, request: web.Request) -> web.StreamResponse:
        message = await request.json()
        method, message_id = message.get("method"), message.get("id")
        if method == "initialize":
            result = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {},
                "serverInfo": {"name": "flooder", "version": "1"},
            }
            return web.json_response(
                {"jsonrpc": "2.0", "id": message_id, "result": result}, headers={"Mcp-Session-Id": "s-1"}
            )
        if method is not None and message_id is not None:
            error = {"code": -32601, "message": f"Method not found: {method}"}
            return web.json_response({"jsonrpc": "2.0", "id": message_id, "error": error})
        if method is None and message_id is not None:
            self._record(message)
        return web.Response(status=202)

    async def get(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        try:
            while True:
                events = []
                for _ in range(100):
                    self.sent += 1
                    data = json.dumps({"jsonrpc": "2.0", "id": f"flood-{self.sent}", "method": "ping"})
                    events.append(f"event: message\ndata: {data}\n\n")
                await response.write("".join(events).encode())  # waits while the client reads nothing
        except ConnectionError:
            return response  # the client went away

    async def delete(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=200)

    async def answered(self, n: int) -> None:
        while len(self.answers) < n:
            await self.changed.wait()


@asynccontextmanager
async def flooding_peer() -> AsyncIterator[tuple[FloodingPeer, str]]:
    peer = FloodingPeer()
    app = web.Application()
    app.router.add_post("/mcp", peer.post)
    app.router.add_get("/mcp", peer.get)
    app.router.add_delete("/mcp", peer.delete)
    runner = await serve(app, 0)
    try:
        host, port = runner.addresses[0][:2]
        yield peer, f"http://{host}:{port}/mcp"
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()


async def test_a_request_flood_over_streamable_http_is_slowed_to_the_rate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    rate = 10.0
    async with flooding_peer() as (peer, url):
        config = ServerConfig(url=url, protocol="legacy")
        limits = LimitsConfig(max_server_requests_per_s=rate)
        with anyio.fail_after(30):
            async with ServerConnection("flooder", config, limits=limits):
                # Past the first burst, so that the window sees the rate (the bound allows a burst anyway).
                await peer.answered(int(BURST_FACTOR * rate) + 1)
                window_s = 2.0
                start = time.time()
                with anyio.move_on_after(window_s):
                    await anyio.sleep_forever()  # the window itself: what arrives in it is counted
                elapsed = time.time() - start
                answered = [a for a in peer.answers if start <= a[0] < start + elapsed]
                assert len(answered) <= rate * elapsed + BURST_FACTOR * rate + 3, (
                    f"{len(answered)} requests answered in {elapsed:.1f}s ({peer.sent} sent)"
                )
                assert len(answered) >= 1
    assert [a[2] for a in peer.answers] == ["result"] * len(peer.answers)
    assert [a[1] for a in peer.answers] == [f"flood-{n}" for n in range(1, len(peer.answers) + 1)]
    assert len(flood_warnings(caplog, "flooder")) == 1
