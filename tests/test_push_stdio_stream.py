"""An events/stream over stdio is written beside the session and ended by its own answer.

The peer is a few lines of hand-written JSON-RPC (written to the test's folder): it answers
``initialize``, and each events/stream with what ``STREAM_ANSWER`` says, after sending
``active`` at the cursor asked for and one event (``e-<n>`` for the n-th stream) one past it:

  close   the final result: the server closed the stream (the loop opens it again)
  error   a JSON-RPC error (-32602, "no such queue"): the subscription ends with it
  busy    a JSON-RPC error -32603: the stream is opened again, with backoff
  exit    no answer: the process exits (the connection is lost)
  hold    no answer: it stays open, silent (idle streams)

Every request is logged as a JSON line (STREAM_LOG), notifications included.
"""

from __future__ import annotations

import asyncio
import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from _support import SteppedSleep, set_cursor

from agentwake.config import ServerConfig, SubscriptionConfig
from agentwake.delivery.common import subscription_key
from agentwake.delivery.push import PushLoop
from agentwake.errors import ConnectionLost, EventsCallError
from agentwake.mcp import ServerConnection
from agentwake.store import Store

pytestmark = pytest.mark.anyio

PEER = r"""
import json, os, sys
answer = os.environ["STREAM_ANSWER"]
log = open(os.environ["STREAM_LOG"], "a", buffering=1)
META = "io.modelcontextprotocol/subscriptionId"
opened = 0

def send(message):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
    sys.stdout.flush()

for line in sys.stdin:
    message = json.loads(line)
    log.write(json.dumps(message) + "\n")
    method, rid = message.get("method"), message.get("id")
    if method == "initialize":
        send({"id": rid, "result": {
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"experimental": {"io.modelcontextprotocol/events": {}}},
            "serverInfo": {"name": "peer", "version": "1"}}})
    elif method == "events/stream":
        opened += 1
        meta = {META: rid}
        at = int(message["params"].get("cursor") or 0)
        send({"method": "notifications/events/active", "params": {"cursor": str(at), "_meta": meta}})
        event = {"eventId": f"e-{opened}", "name": "feed.item", "timestamp": "2026-01-01T00:00:00Z",
                 "data": {"n": opened}, "cursor": str(at + 1), "_meta": meta}
        send({"method": "notifications/events/event", "params": event})
        if answer == "close":
            send({"id": rid, "result": {"_meta": meta}})
        elif answer == "error":
            send({"id": rid, "error": {"code": -32602, "message": "no such queue"}})
        elif answer == "busy":
            send({"id": rid, "error": {"code": -32603, "message": "busy"}})
        elif answer == "exit":
            sys.exit(0)
    elif rid is not None:
        send({"id": rid, "error": {"code": -32601, "message": "no"}})
"""


def peer(tmp_path: Path, answer: str) -> ServerConfig:
    script = tmp_path / "peer.py"
    script.write_text(PEER)
    return ServerConfig(
        command=sys.executable,
        args=[str(script)],
        env={"STREAM_ANSWER": answer, "STREAM_LOG": str(tmp_path / "requests.log")},
        protocol="legacy",
    )


def requests(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "requests.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def feed(name: str = "feed") -> SubscriptionConfig:
    return SubscriptionConfig.model_validate(
        {"name": name, "server": "peer", "event": "feed.item", "delivery": "push", "heartbeat_s": 30}
    )


async def test_a_stream_the_server_closes_is_opened_again_from_the_stored_cursor(
    tmp_path: Path, store: Store
) -> None:
    sub = feed()
    await set_cursor(store, subscription_key(sub), "0")
    sleep = SteppedSleep()
    async with ServerConnection("peer", peer(tmp_path, "close")) as conn:
        loop = PushLoop(sub, conn, store, sleep=sleep)
        async with anyio.create_task_group() as tg:
            tg.start_soon(loop.run)
            await sleep.next(limit_s=20)  # the first stream ended; the loop waits to open it again
            sleep.release()
            await sleep.next(limit_s=20)
            tg.cancel_scope.cancel()
    streams = [r for r in requests(tmp_path) if r.get("method") == "events/stream"]
    assert [r["params"]["cursor"] for r in streams[:2]] == ["0", "1"]
    assert store.core.event_ids("feed") == ["e-1", "e-2"]
    # A stream that ended by itself is not cancelled afterwards.
    assert not [r for r in requests(tmp_path) if r.get("method") == "notifications/cancelled"]


async def test_a_stream_refused_with_an_error_ends_the_subscription_with_its_words(
    tmp_path: Path, store: Store
) -> None:
    sub = feed()
    await set_cursor(store, subscription_key(sub), "0")
    async with ServerConnection("peer", peer(tmp_path, "error")) as conn:
        with pytest.raises(EventsCallError) as refused, anyio.fail_after(20):
            await PushLoop(sub, conn, store, sleep=SteppedSleep()).run()
    assert refused.value.code == -32602 and "no such queue" in str(refused.value)
    # What came before the answer is stored.
    assert store.core.event_ids("feed") == ["e-1"]


async def test_a_transient_error_answer_opens_the_stream_again_after_a_backoff(
    tmp_path: Path, store: Store
) -> None:
    sub = feed()
    await set_cursor(store, subscription_key(sub), "0")
    sleep = SteppedSleep()
    async with ServerConnection("peer", peer(tmp_path, "busy")) as conn, anyio.create_task_group() as tg:
        tg.start_soon(PushLoop(sub, conn, store, sleep=sleep).run)
        await sleep.next(limit_s=20)
        tg.cancel_scope.cancel()
    assert sleep.delays and sleep.delays[0] > 0
    assert "busy" in (store.core.subscriptions()[0]["last_error"] or "")


async def test_a_server_that_exits_mid_stream_is_a_lost_connection(tmp_path: Path, store: Store) -> None:
    sub = feed()
    await set_cursor(store, subscription_key(sub), "0")
    async with ServerConnection("peer", peer(tmp_path, "exit")) as conn:
        with pytest.raises(ConnectionLost), anyio.fail_after(20):
            await PushLoop(sub, conn, store, sleep=SteppedSleep()).run()
    assert store.core.event_ids("feed") == ["e-1"]


async def test_idle_streams_hold_no_task_of_their_own_and_each_is_cancelled_when_its_loop_stops(
    tmp_path: Path, store: Store
) -> None:
    count = 40
    subs = [feed(f"feed-{n}") for n in range(count)]
    for sub in subs:
        await set_cursor(store, subscription_key(sub), "0")
    stored = anyio.Event()
    streaming: set[str] = set()

    def on_stored(name: str, cursor: str | None) -> None:
        if cursor == "1":
            streaming.add(name)
            if len(streaming) == count:
                stored.set()

    async with ServerConnection("peer", peer(tmp_path, "hold")) as conn:
        before = len(asyncio.all_tasks())
        async with anyio.create_task_group() as tg:
            for sub in subs:
                loop = PushLoop(
                    sub, conn, store, sleep=SteppedSleep(), on_stored=partial(on_stored, sub.name)
                )
                tg.start_soon(loop.run)
            with anyio.fail_after(20):
                await stored.wait()
            # One task a loop: the stream's request waits in no task (its answer ends the route).
            assert len(asyncio.all_tasks()) - before == count
            tg.cancel_scope.cancel()
    # The connection is closed: the peer has read (and logged) all it was sent, and exited.
    streams = {r["id"] for r in requests(tmp_path) if r.get("method") == "events/stream"}
    cancelled = {
        r["params"]["requestId"] for r in requests(tmp_path) if r.get("method") == "notifications/cancelled"
    }
    assert len(streams) == count and cancelled == streams
