"""Heartbeat liveness with the default heartbeat_s, in real time, over a real stdio pipe.

The spec: a client that has received neither an event nor a heartbeat for more than
twice the heartbeat interval should treat the stream as dead and reconnect with its
cursor. The server need not say its interval: the push loop infers it from the
stream (``Liveness``), so a server that beats every 0.5 s is found dead about a
second after it goes quiet, although ``heartbeat_s`` is left at its default of 30 s.
The server (tests/push_server.py) writes a trace with its own monotonic clock: when
each stream opened, each heartbeat went out, and each cancel came in.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from conftest import REPO

from agentwake.config import ServerConfig, SubscriptionConfig
from agentwake.delivery.push import LIVENESS_FLOOR_S, PushLoop
from agentwake.mcp import ServerConnection
from agentwake.store import Store

pytestmark = pytest.mark.anyio

HEARTBEAT_MS = 500
# The spec's bound on how long after its last heartbeat a dead stream is open again, with slack:
# dead after 2 x 0.5 s (the 1 s floor), then the first reconnect wait (0.5 s plus up to 0.5 s jitter).
REOPENED_WITHIN_S = 3.0


def push_server(tmp_path: Path, **env: str) -> ServerConfig:
    return ServerConfig(
        command=sys.executable,
        args=["tests/push_server.py"],
        env={
            "PUSH_LOG": str(tmp_path / "push.log"),
            "PUSH_TRACE": str(tmp_path / "trace.log"),
            "PUSH_MARKER": str(tmp_path / "marker"),
            "PUSH_HEARTBEAT_MS": str(HEARTBEAT_MS),
            **env,
        },
        cwd=REPO,
        protocol="legacy",
    )


def default_feed() -> SubscriptionConfig:
    """A push subscription with nothing tuned: heartbeat_s keeps its default."""
    sub = SubscriptionConfig.model_validate(
        {"name": "feed", "server": "push", "event": "feed.item", "delivery": "push"}
    )
    assert sub.heartbeat_s == 30
    return sub


@dataclass(frozen=True)
class Line:
    at: float
    kind: str
    request_id: str
    cursor: str | None


def trace(tmp_path: Path) -> list[Line]:
    path = tmp_path / "trace.log"
    lines = []
    for text in path.read_text().splitlines() if path.exists() else []:
        at, kind, request_id, *rest = text.split(" ")
        cursor = rest[0] if rest else None
        lines.append(Line(float(at), kind, request_id, None if cursor == "None" else cursor))
    return lines


def of(lines: list[Line], kind: str, request_id: str | None = None) -> list[Line]:
    return [x for x in lines if x.kind == kind and request_id in (None, x.request_id)]


def push_log(tmp_path: Path) -> list[str]:
    path = tmp_path / "push.log"
    return path.read_text().splitlines() if path.exists() else []


async def stream_until(
    tmp_path: Path,
    store: Store,
    server: ServerConfig,
    done: Callable[[list[Line]], bool],
    limit_s: float = 8.0,
) -> tuple[PushLoop, list[Line]]:
    """Run a real PushLoop (real sleeps, real clock) until the server's trace satisfies ``done``.

    Returns the trace as it was at that moment, before the loop is cancelled.
    """
    async with ServerConnection("push", server) as conn, anyio.create_task_group() as tg:
        loop = PushLoop(default_feed(), conn, store)
        tg.start_soon(loop.run)
        with anyio.fail_after(limit_s):
            while not done(lines := trace(tmp_path)):  # noqa: ASYNC110
                await anyio.sleep(0.02)
        tg.cancel_scope.cancel()
    return loop, lines


async def test_a_stream_that_stops_heartbeating_is_reopened_from_the_heartbeat_cursor_within_seconds(
    tmp_path: Path, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    # Items 1-3, then heartbeats reporting 10 more items checked (cursor 13); silence after the 4th.
    server = push_server(tmp_path, PUSH_ITEMS="3", PUSH_SKIPPED="10", PUSH_SILENT_AFTER_BEATS="4")
    loop, lines = await stream_until(tmp_path, store, server, lambda lines: len(of(lines, "open")) == 2)
    first, again = of(lines, "open")
    beats = of(lines, "heartbeat", first.request_id)
    assert [b.cursor for b in beats] == ["13"] * 4  # it did heartbeat, then went silent
    assert of(lines, "silent", first.request_id)
    last_beat = beats[-1].at
    [cancel] = of(lines, "cancel", first.request_id)  # the dead stream was cancelled on the server
    # Not before the inferred deadline (twice the 0.5 s interval, the 1 s floor), and long before 2 x 30 s.
    assert LIVENESS_FLOOR_S <= cancel.at - last_beat < REOPENED_WITHIN_S
    assert cancel.at <= again.at
    assert again.at - last_beat < REOPENED_WITHIN_S
    assert again.cursor == "13"  # the last heartbeat's cursor, not the last event's
    assert [x for x in push_log(tmp_path) if x.startswith("open")] == ["open None", "open 13"]
    assert await store.cursor("feed") == "13"
    assert store.core.event_ids("feed") == ["item-1", "item-2", "item-3"]
    assert loop.streams == 2
    dead = [r.getMessage() for r in caplog.records if "the stream is dead" in r.getMessage()]
    assert dead and "heartbeat interval seen on this stream" in dead[0], dead


async def test_a_silent_stream_whose_heartbeats_carry_no_cursor_is_reopened_with_a_null_cursor(
    tmp_path: Path, store: Store
) -> None:
    # No events, heartbeats with cursor null (an event type without replay); silence after the 4th.
    server = push_server(tmp_path, PUSH_ITEMS="0", PUSH_NULL_HEARTBEAT="1", PUSH_SILENT_AFTER_BEATS="4")
    _, lines = await stream_until(tmp_path, store, server, lambda lines: len(of(lines, "open")) == 2)
    first, again = of(lines, "open")
    beats = of(lines, "heartbeat", first.request_id)
    assert [b.cursor for b in beats] == [None] * 4
    assert of(lines, "cancel", first.request_id)
    assert again.at - beats[-1].at < REOPENED_WITHIN_S
    assert again.cursor is None
    assert [x for x in push_log(tmp_path) if x.startswith("open")] == ["open None", "open None"]
    assert await store.cursor("feed") is None  # a null heartbeat cursor is not stored as a position


async def test_a_stream_that_keeps_heartbeating_is_never_declared_dead(tmp_path: Path, store: Store) -> None:
    # Heartbeats every 0.5 s and nothing else, for about 4 s: liveness infers a 1 s deadline and
    # must never reach it.
    server = push_server(tmp_path, PUSH_ITEMS="0")
    loop, lines = await stream_until(tmp_path, store, server, lambda lines: len(of(lines, "heartbeat")) >= 8)
    [opened] = of(lines, "open")
    assert len(of(lines, "heartbeat", opened.request_id)) >= 8
    assert lines[-1].at - opened.at >= 8 * HEARTBEAT_MS / 1000 - 0.5  # about 4 s of it
    assert not of(lines, "cancel")  # no cancel before the test itself stopped the loop
    assert [x for x in push_log(tmp_path) if x.startswith("open")] == ["open None"]
    assert loop.streams == 1
    assert await store.cursor("feed") == "0"


async def test_events_just_before_fixed_clock_heartbeats_do_not_shorten_the_inferred_interval(
    tmp_path: Path, store: Store
) -> None:
    # The server heartbeats on a fixed 1.2 s clock, as "periodic keepalive" reads, and an event
    # happens to go out 50 ms before each of the first three heartbeats. Its heartbeat interval is
    # 1.2 s, so a silence of up to 2.4 s is alive; the 50 ms since the event before each heartbeat
    # is not the interval.
    server = push_server(tmp_path, PUSH_ITEMS="0", PUSH_HEARTBEAT_MS="1200", PUSH_EVENTS_BETWEEN_BEATS="3")
    loop, lines = await stream_until(
        tmp_path,
        store,
        server,
        lambda lines: len(of(lines, "open")) > 1 or len(of(lines, "heartbeat")) >= 5,
    )
    opens = of(lines, "open")
    assert len(opens) == 1, f"a live stream was declared dead: {lines}"
    assert len(of(lines, "event", opens[0].request_id)) == 3
    assert not of(lines, "cancel")
    assert loop.streams == 1
