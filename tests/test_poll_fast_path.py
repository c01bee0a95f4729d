"""events/poll over agentwake's own stdio path, against a real server process.

Over ``BoundedStdioClient`` a poll is written and its answer read by the transport itself,
under ids of its own (``CALL_ID_PREFIX``), instead of going through the SDK's session. These
tests run a small hand-written stdio server (written to tmp_path; stdlib only) that logs every
message it reads, requests and notifications alike, and answers each poll as its cursor asks:
normally, with an error, never, by dying, with an answer over the message limit, or only once a
``tools/list`` comes. Every poll's id in the server's log shows the fast path was taken; the
same request sent through the SDK's path (``ServerConnection.request``) gives what the fast path
must match. Nothing sleeps to wait: waits are on a condition under fail_after.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from _support import SteppedSleep
from mcp_types import INTERNAL_ERROR, REQUEST_TIMEOUT

from agentwake import protocol
from agentwake.config import LimitsConfig, ServerConfig, SubscriptionConfig
from agentwake.delivery.poll import PollLoop
from agentwake.errors import ConnectionLost, EventsCallError, SubscriptionEnded, TransientEventsError
from agentwake.mcp import DEAD_AFTER_TIMEOUTS, ServerConnection
from agentwake.stdio import CALL_ID_PREFIX
from agentwake.store.sqlite import SqliteStore

pytestmark = pytest.mark.anyio

NAME = "fast"
EVENT = "f.tick"
LIMIT = 64 * 1024  # the least max_message_bytes a config may set

SERVER = """
    import json, os, sys

    LOG = os.environ["FAST_LOG"]
    MODERN = os.environ.get("FAST_ERA") == "modern"
    EXTENSION = "io.modelcontextprotocol/events"
    held = []  # polls answered only after the next tools/list

    def send(message):
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\\n")
        sys.stdout.flush()

    def page(cursor, **extra):
        return {"events": [], "cursor": cursor, "truncated": False, "hasMore": False, "nextPollMs": 100, **extra}

    def poll(message_id, params):
        cursor = params.get("cursor") or "0"
        if cursor == "hang":
            return
        if cursor == "die":
            os._exit(3)
        if cursor == "held":
            held.append(message_id)
            return
        if cursor.startswith("error:"):
            code = int(cursor.split(":")[1])
            error = {"code": code, "message": f"refused with {code}", "data": {"cursor": cursor}}
            send({"id": message_id, "error": error})
            return
        if cursor == "extra":  # a member JSON-RPC does not define, beside the result
            send({"id": message_id, "result": page(cursor), "note": "ignored"})
            return
        if cursor.startswith("big:"):
            send({"id": message_id, "result": page(cursor, padding="x" * int(cursor.split(":")[1]))})
            return
        send({"id": message_id, "result": page(cursor, echo=params)})

    def handle(message):
        with open(LOG, "a") as out:
            out.write(json.dumps(message) + "\\n")
        method, message_id = message.get("method"), message.get("id")
        params = message.get("params") or {}
        if method is None or message_id is None:
            return
        if method == "server/discover" and MODERN:
            capabilities = {"tools": {}, "extensions": {EXTENSION: {}}}
            send({"id": message_id, "result": {"supportedVersions": ["2026-07-28"], "capabilities": capabilities}})
        elif method == "initialize":
            result = {
                "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {}, "extensions": {EXTENSION: {}}},
                "serverInfo": {"name": "fast", "version": "1"},
            }
            send({"id": message_id, "result": result})
        elif method == "ping":
            send({"id": message_id, "result": {}})
        elif method == "tools/list":
            send({"id": message_id, "result": {"tools": []}})
            for held_id in held:
                send({"id": held_id, "result": page("held")})
            held.clear()
        elif method == "events/poll":
            poll(message_id, params)
        else:
            send({"id": message_id, "error": {"code": -32601, "message": f"Method not found: {method}"}})

    for line in sys.stdin:
        if line.strip():
            handle(json.loads(line))
"""


def server(tmp_path: Path, *, era: str = "handshake", request_timeout_s: float = 20.0) -> ServerConfig:
    path = tmp_path / "fast_server.py"
    path.write_text(textwrap.dedent(SERVER))
    return ServerConfig(
        command=sys.executable,
        args=["-u", str(path)],
        env={"FAST_LOG": str(tmp_path / "fast.log"), "FAST_ERA": era},
        cwd=tmp_path,
        request_timeout_s=request_timeout_s,
    )


def connect(config: ServerConfig) -> ServerConnection:
    return ServerConnection(NAME, config, limits=LimitsConfig(max_message_bytes=LIMIT))


def received(tmp_path: Path, method: str | None = None) -> list[dict[str, Any]]:
    """What the server read, in order (complete lines only)."""
    log = tmp_path / "fast.log"
    lines = log.read_text().split("\n")[:-1] if log.exists() else []
    return [m for m in map(json.loads, lines) if method is None or m.get("method") == method]


async def until(predicate: Callable[[], bool], what: str, within: float = 10.0) -> None:
    try:
        with anyio.fail_after(within):
            while not predicate():  # noqa: ASYNC110 - the server's log signals nothing
                await anyio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {within:g}s: {what}") from None


def params(cursor: str | None = None) -> dict[str, Any]:
    """events/poll's params in their wire form, as the poll loop sends them."""
    model = protocol.PollParams(name=EVENT, arguments={"q": "x"}, cursor=cursor, max_events=10)
    return model.model_dump(by_alias=True, exclude_none=True)


def body(cursor: str | None = None) -> dict[str, Any]:
    """The same poll, as ``ServerConnection.request`` takes it (the SDK's path): a copy of its own."""
    return dict(params(cursor))


def described(exc: BaseException) -> tuple[Any, ...]:
    return (
        type(exc),
        str(exc),
        getattr(exc, "code", None),
        getattr(exc, "data", None),
        getattr(exc, "server", None),
        getattr(exc, "subscription", None),
    )


def fast_ids(tmp_path: Path) -> list[str]:
    ids = [m["id"] for m in received(tmp_path, protocol.METHOD_POLL)]
    return [i for i in ids if isinstance(i, str) and i.startswith(CALL_ID_PREFIX)]


@pytest.mark.parametrize("era", ["handshake", "modern"])
async def test_a_poll_is_answered_on_the_fast_path_and_sends_what_the_sdk_path_sends(
    tmp_path: Path, era: str
) -> None:
    async with connect(server(tmp_path, era=era)) as conn:
        assert conn.handshake_era is (era == "handshake")
        with anyio.fail_after(20):
            fast = await conn.poll(params("7"), subscription="s")
            through_sdk = await conn.request(protocol.METHOD_POLL, body("7"), subscription="s")
    polls = received(tmp_path, protocol.METHOD_POLL)
    assert [type(p["id"]) for p in polls] == [str, int]
    assert polls[0]["id"].startswith(CALL_ID_PREFIX)
    # The same request on the wire (the modern era's _meta stamp included), and the same result.
    assert polls[0]["params"] == polls[1]["params"]
    assert ("_meta" in polls[0]["params"]) is (era == "modern")
    assert fast == through_sdk
    assert fast["cursor"] == "7" and fast["events"] == [] and fast["nextPollMs"] == 100


async def test_a_bootstrap_poll_leaves_out_the_null_cursor_as_the_sdk_path_does(tmp_path: Path) -> None:
    async with connect(server(tmp_path)) as conn:
        with anyio.fail_after(20):
            await conn.poll(params(None))
            await conn.request(protocol.METHOD_POLL, body(None))
    fast, through_sdk = received(tmp_path, protocol.METHOD_POLL)
    assert (
        fast["params"] == through_sdk["params"] == {"name": EVENT, "arguments": {"q": "x"}, "maxEvents": 10}
    )


async def test_an_answer_with_a_member_beside_its_result_is_read_as_the_sdk_reads_it(tmp_path: Path) -> None:
    async with connect(server(tmp_path, request_timeout_s=60)) as conn:
        with anyio.fail_after(20):
            fast = await conn.poll(params("extra"))
            through_sdk = await conn.request(protocol.METHOD_POLL, body("extra"))
    assert fast == through_sdk
    assert fast["cursor"] == "extra" and "note" not in fast
    assert len(fast_ids(tmp_path)) == 1


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (-32602, EventsCallError),  # invalid params: kept as is
        (-32011, SubscriptionEnded),  # not found: the subscription ends
        (-32000, TransientEventsError),  # a server's own "busy"
        (-32099, TransientEventsError),  # a code this client does not know
    ],
)
async def test_an_error_answer_is_mapped_as_on_the_sdk_path(
    tmp_path: Path, code: int, kind: type[EventsCallError]
) -> None:
    async with connect(server(tmp_path)) as conn:
        with anyio.fail_after(20):
            with pytest.raises(kind) as fast:
                await conn.poll(params(f"error:{code}"), subscription="s")
            with pytest.raises(kind) as through_sdk:
                await conn.request(protocol.METHOD_POLL, body(f"error:{code}"), subscription="s")
            # The connection goes on.
            assert (await conn.poll(params("1")))["cursor"] == "1"
    assert described(fast.value) == described(through_sdk.value)
    assert fast.value.code == code and fast.value.data == {"cursor": f"error:{code}"}
    assert len(fast_ids(tmp_path)) == 2


async def test_an_unanswered_poll_times_out_sends_a_cancel_and_the_third_in_a_row_drops_the_connection(
    tmp_path: Path,
) -> None:
    async with connect(server(tmp_path, request_timeout_s=0.3)) as conn:
        with anyio.fail_after(20):
            with pytest.raises(TransientEventsError) as first:
                await conn.poll(params("hang"), subscription="s")
            # The SDK's path, for what the fast path must match: its timeout counts in the same row.
            with pytest.raises(TransientEventsError) as through_sdk:
                await conn.request(protocol.METHOD_POLL, body("hang"), subscription="s")
            with pytest.raises(ConnectionLost) as third:
                await conn.poll(params("hang"), subscription="s")
            await until(lambda: len(received(tmp_path, "notifications/cancelled")) == 3, "three cancels")
    assert first.value.code == REQUEST_TIMEOUT
    assert described(first.value) == described(through_sdk.value)
    assert (
        str(third.value)
        == f"server {NAME!r}: no answer to {DEAD_AFTER_TIMEOUTS} requests in a row; reconnecting"
    )
    polls = [p["id"] for p in received(tmp_path, protocol.METHOD_POLL)]
    cancels = [c["params"] for c in received(tmp_path, "notifications/cancelled")]
    assert [c["requestId"] for c in cancels] == polls
    assert [c["reason"] for c in cancels] == ["timed out after 0.3s"] * 3
    assert len(fast_ids(tmp_path)) == 2


async def test_an_answer_resets_the_count_of_timeouts_in_a_row(tmp_path: Path) -> None:
    async with connect(server(tmp_path, request_timeout_s=0.3)) as conn:
        with anyio.fail_after(20):
            for _ in range(DEAD_AFTER_TIMEOUTS - 1):
                with pytest.raises(TransientEventsError):
                    await conn.poll(params("hang"))
            await conn.poll(params("1"))
            for _ in range(DEAD_AFTER_TIMEOUTS - 1):
                with pytest.raises(TransientEventsError):
                    await conn.poll(params("hang"))


async def test_a_cancelled_poll_sends_a_cancel_for_its_id(tmp_path: Path) -> None:
    async with connect(server(tmp_path)) as conn:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(conn.poll, params("hang"))
                await until(
                    lambda: bool(received(tmp_path, protocol.METHOD_POLL)), "the poll reaches the server"
                )
                tg.cancel_scope.cancel()
            await until(lambda: bool(received(tmp_path, "notifications/cancelled")), "the cancel")
            # Its answer, were it to come, would find no waiter; the connection goes on.
            assert (await conn.poll(params("2")))["cursor"] == "2"
    (poll, *_) = received(tmp_path, protocol.METHOD_POLL)
    (cancel,) = received(tmp_path, "notifications/cancelled")
    assert cancel["params"] == {"requestId": poll["id"], "reason": "caller cancelled"}
    assert poll["id"].startswith(CALL_ID_PREFIX)


async def test_the_server_dying_with_a_poll_in_flight_is_a_lost_connection_naming_its_exit(
    tmp_path: Path,
) -> None:
    async with connect(server(tmp_path)) as conn:
        with anyio.fail_after(20), pytest.raises(ConnectionLost) as lost:
            await conn.poll(params("die"))
        with anyio.fail_after(20), pytest.raises(ConnectionLost) as after:
            await conn.poll(params("1"))
    assert str(lost.value) == f"server {NAME!r}: connection closed: exited with code 3"
    assert str(after.value) == str(lost.value)
    assert len(fast_ids(tmp_path)) == 1


async def test_an_answer_over_the_message_limit_fails_that_poll_at_once_and_the_connection_goes_on(
    tmp_path: Path,
) -> None:
    async with connect(server(tmp_path, request_timeout_s=60)) as conn:
        with anyio.fail_after(20):
            with pytest.raises(TransientEventsError) as fast:
                await conn.poll(params(f"big:{2 * LIMIT}"), subscription="s")
            with pytest.raises(TransientEventsError) as through_sdk:
                await conn.request(protocol.METHOD_POLL, body(f"big:{2 * LIMIT}"), subscription="s")
            assert (await conn.poll(params("3")))["cursor"] == "3"
            # Under the limit, a big answer is an answer.
            assert (await conn.poll(params(f"big:{LIMIT // 2}")))["cursor"] == f"big:{LIMIT // 2}"
    assert fast.value.code == INTERNAL_ERROR
    assert f"over the {LIMIT}-byte message limit" in str(fast.value)
    assert described(fast.value) == described(through_sdk.value)
    assert len(fast_ids(tmp_path)) == 3


async def test_polls_interleave_with_the_sdks_own_requests_on_one_connection(tmp_path: Path) -> None:
    answers: dict[str, Any] = {}

    async def poll(cursor: str) -> None:
        answers[cursor] = (await conn.poll(params(cursor)))["cursor"]

    async def ping(n: int) -> None:
        await conn.client.session.send_ping()
        answers[f"ping-{n}"] = "pong"

    async with connect(server(tmp_path)) as conn:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                # A poll the server holds until a tools/list: that answer overtakes it on the wire.
                tg.start_soon(poll, "held")
                await until(lambda: bool(received(tmp_path, protocol.METHOD_POLL)), "the held poll sent")
                tools = await conn.list_tools()
                for n in range(20):
                    tg.start_soon(poll, f"c{n}")
                    tg.start_soon(ping, n)
    assert tools == []
    assert answers == {
        "held": "held",
        **{f"c{n}": f"c{n}" for n in range(20)},
        **{f"ping-{n}": "pong" for n in range(20)},
    }
    assert len(fast_ids(tmp_path)) == 21
    pings = [m["id"] for m in received(tmp_path, "ping")]
    assert all(type(i) is int for i in pings) and len(set(pings)) == 20


async def test_a_poll_on_a_closed_connection_is_a_lost_connection(tmp_path: Path) -> None:
    conn = connect(server(tmp_path))
    async with conn:
        assert (await conn.poll(params("1")))["cursor"] == "1"
    with pytest.raises(ConnectionLost, match="is not connected"):
        await conn.poll(params("2"))


async def test_the_poll_loop_polls_through_the_fast_path(tmp_path: Path, store: SqliteStore) -> None:
    sub = SubscriptionConfig.model_validate({"name": "s", "server": NAME, "event": EVENT})
    sleep = SteppedSleep()
    async with connect(server(tmp_path)) as conn, anyio.create_task_group() as tg:
        tg.start_soon(PollLoop(sub, conn, store, sleep=sleep).run)
        await sleep.next()
        sleep.release()
        await sleep.next()
        tg.cancel_scope.cancel()
    polls = received(tmp_path, protocol.METHOD_POLL)
    assert [p["params"].get("cursor") for p in polls] == [None, "0"]
    assert len(fast_ids(tmp_path)) == 2
    assert store.core.cursor("s") == "0"


@pytest.mark.parametrize("cursor", [None, "c-1"])
@pytest.mark.parametrize("resuming", [False, True])
@pytest.mark.parametrize(
    "bounds", [{}, {"max_events": 50}, {"max_age_ms": 60_000}, {"max_events": 5, "max_age_ms": 0}]
)
def test_the_poll_loop_sends_the_params_models_wire_form(
    cursor: str | None, resuming: bool, bounds: dict[str, int]
) -> None:
    """The loop builds events/poll's params as a dict (cheaper than the model each poll): the same
    members, in the same order, as ``protocol.PollParams`` dumps by alias."""
    sub = SubscriptionConfig.model_validate(
        {"name": "s", "server": "x", "event": EVENT, "arguments": {"q": "x"}, "delivery": "poll", **bounds}
    )
    loop = PollLoop(sub, cast(Any, None), cast(Any, None))
    sent = loop._params(cursor, resuming=resuming)
    model = protocol.PollParams(
        name=EVENT,
        arguments={"q": "x"},
        cursor=cursor,
        max_events=sub.max_events,
        max_age_ms=sub.max_age_ms if resuming else None,
    )
    wire = model.model_dump(by_alias=True, exclude_none=True)
    assert list(sent.items()) == list(wire.items())
