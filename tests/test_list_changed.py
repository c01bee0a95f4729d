"""notifications/events/list_changed on every protocol era and transport: re-list, then re-check.

tests/list_changed_server.py adds an event type after its first events/poll. A subscription
to that type cannot run at first (``invalid``); once the server's list changes the client
lists again and the subscription starts, on a handshake-era or a 2026-era connection, over
stdio (where the server notifies) or Streamable HTTP (where a 2026-era server has no channel
to notify on, and the connection's liveness probe notices the change instead).
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import REPO

from agentwake.config import ServerConfig, parse_config
from agentwake.store import Store
from agentwake.supervisor import Supervisor

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def http_server(list_log: Path, change_on: str = "poll") -> AsyncIterator[str]:
    process = await anyio.open_process(
        [sys.executable, "tests/list_changed_server.py", "--http"],
        cwd=REPO,
        env={**os.environ, "LIST_LOG": str(list_log), "LIST_CHANGE_ON": change_on},
    )
    try:
        assert process.stderr is not None
        buffered = b""
        with anyio.fail_after(20):
            async for chunk in process.stderr:
                buffered += chunk
                if b"/mcp\n" in buffered:
                    break
        line = next(x for x in buffered.decode().splitlines() if "listening on " in x)
        yield line.split("listening on ", 1)[1].strip()
    finally:
        process.kill()
        with anyio.CancelScope(shield=True):
            await process.wait()
            await process.aclose()


def lists(list_log: Path) -> int:
    return len(list_log.read_text().splitlines()) if list_log.exists() else 0


async def until(condition: Any, what: str, within: float = 10.0) -> None:
    with anyio.fail_after(within):
        while not condition():  # noqa: ASYNC110 - the store and the server's log signal nothing
            await anyio.sleep(0.02)


async def run_until_the_new_type_flows(
    server: ServerConfig, store: Store, list_log: Path, first_delivery: str = "poll"
) -> None:
    config = parse_config(
        {
            "servers": {"lc": server.model_dump(exclude_defaults=True, mode="json")},
            "subscriptions": [
                {
                    "name": "one",
                    "server": "lc",
                    "event": "a.one",
                    "delivery": first_delivery,
                    "poll_floor_ms": 50,
                },
                {"name": "two", "server": "lc", "event": "b.two", "delivery": "poll", "poll_floor_ms": 50},
            ],
        }
    )

    def row(name: str) -> dict[str, Any]:
        return next(r for r in store.core.subscriptions() if r["subscription"] == name)  # type: ignore[attr-defined]

    supervisor = Supervisor(config, store, reconnect_initial_s=0.05)
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.run)
        await until(lambda: row("two")["status"] == "invalid", "b.two is not offered yet")
        assert "has no event 'b.two'" in row("two")["last_error"]
        # The first poll of a.one makes the server add b.two; the client lists again and starts it.
        await until(lambda: row("two")["status"] == "active", "b.two polled after the list changed")
        tg.cancel_scope.cancel()
    assert lists(list_log) >= 2
    assert row("one")["status"] == "active"


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_list_changed_over_stdio_relists_and_starts_the_new_subscription(
    tmp_path: Path, store: Store, protocol: str
) -> None:
    list_log = tmp_path / "lists"
    server = ServerConfig(
        command=sys.executable,
        args=["tests/list_changed_server.py"],
        cwd=REPO,
        env={"LIST_LOG": str(list_log)},
        protocol=protocol,  # type: ignore[arg-type]
        # Long enough that only the notification can explain a prompt relist.
        ping_interval_s=300,
    )
    await run_until_the_new_type_flows(server, store, list_log)


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_a_changed_list_over_http_is_noticed_on_every_protocol_era(
    tmp_path: Path, store: Store, protocol: str
) -> None:
    list_log = tmp_path / "lists"
    async with http_server(list_log) as url:
        # A 2026-era HTTP connection has no channel for the notification: the probe sees the change.
        server = ServerConfig(url=url, protocol=protocol, ping_interval_s=0.3)  # type: ignore[arg-type]
        await run_until_the_new_type_flows(server, store, list_log)


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_over_http_the_server_announces_a_changed_list_on_an_open_stream(
    tmp_path: Path, store: Store, protocol: str
) -> None:
    list_log = tmp_path / "lists"
    async with http_server(list_log, change_on="stream") as url:
        # No probe in time: only the notification (on the events/stream response, on a 2026-era
        # connection, which has no other channel) can explain a prompt relist.
        server = ServerConfig(url=url, protocol=protocol, ping_interval_s=300)  # type: ignore[arg-type]
        await run_until_the_new_type_flows(server, store, list_log, first_delivery="push")
