"""Reloading agentwake.toml in a running `agentwake run`: on a file change and on SIGHUP.

A real service on the demo server over stdio. Adding a subscription starts it on the open
connection; adding a server connects it and leaves the first one alone; a bad edit keeps the
running config and names the line; removing a subscription stops it.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Final

import anyio
import pytest
from _support import agentwake_run, demo_server_toml

from agentwake.store.sqlite import SqliteCore

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

TICKETS: Final = """
[[subscriptions]]
name = "tickets"
server = "demo"
event = "ticket.created"
delivery = "poll"
poll_floor_ms = 100
"""
ALERTS: Final = """
[[subscriptions]]
name = "alerts"
server = "demo"
event = "alert.fired"
delivery = "poll"
poll_floor_ms = 100
"""
OTHER_TICKETS: Final = """
[[subscriptions]]
name = "other-tickets"
server = "other"
event = "ticket.created"
delivery = "poll"
poll_floor_ms = 100
"""


def write(path: Path, tmp: Path, *parts: str) -> None:
    servers = demo_server_toml(tmp / "demo.db", DEMO_ALERT_INTERVAL="0.2", DEMO_BACKLOG="2")
    path.write_text('[store]\npath = "aw.db"\n\n' + servers + "".join(parts))


def events_of(store: Path, subscription: str) -> int:
    core = SqliteCore.open(store)
    try:
        return sum(1 for row in core.inbox(10_000) if row["subscription"] == subscription)
    finally:
        core.close()


async def wait_events(store: Path, subscription: str, timeout: float = 20) -> None:  # noqa: ASYNC109
    with anyio.fail_after(timeout):
        while events_of(store, subscription) == 0:  # noqa: ASYNC110 - the service writes the file
            await anyio.sleep(0.05)


async def test_a_changed_config_file_starts_and_stops_subscriptions_and_a_bad_edit_is_kept_out(
    tmp_path: Path,
) -> None:
    config, store = tmp_path / "agentwake.toml", tmp_path / "aw.db"
    write(config, tmp_path, TICKETS)
    async with agentwake_run(config) as service:
        await service.wait_for("subscription tickets: polling")
        connected = sum("connected to demo" in line for line in service.lines)

        # Added on the open connection: the demo server is not reconnected.
        write(config, tmp_path, TICKETS, ALERTS)
        await service.wait_for("config reloaded (the config file changed): subscription alerts: added")
        await wait_events(store, "alerts")
        assert sum("connected to demo" in line for line in service.lines) == connected

        # A bad edit: the running config stays, and the error names the line.
        at = len(service.lines)
        config.write_text(
            config.read_text() + '\n[[subscriptions]]\nname = "x"\nserver = "demo"\nevnt = "y"\n'
        )
        await service.wait_for(
            "config reload (the config file changed) failed; the running config is kept", after=at
        )
        await service.wait_for("evnt", after=at)
        assert any("line" in line and "evnt" in line for line in service.lines[at:]), service.log()

        # A second server, added by SIGHUP after a good edit: connected, the first one left alone.
        (tmp_path / "other.toml").write_text(
            demo_server_toml(tmp_path / "other.db", name="other", DEMO_RATE="10")
        )
        write(config, tmp_path, TICKETS, ALERTS)
        config.write_text(config.read_text() + "\n" + (tmp_path / "other.toml").read_text() + OTHER_TICKETS)
        at = len(service.lines)
        service.process.send_signal(signal.SIGHUP)
        await service.wait_for("server other: added", after=at)
        await service.wait_for("subscription other-tickets: added", after=at)
        await wait_events(store, "other-tickets")
        assert sum("connected to demo" in line for line in service.lines) == connected

        # Removed: its loop stops; the others go on.
        at = len(service.lines)
        write(config, tmp_path, ALERTS)
        config.write_text(config.read_text() + "\n" + (tmp_path / "other.toml").read_text() + OTHER_TICKETS)
        await service.wait_for("subscription tickets: removed", after=at)
        assert await service.stop(signal.SIGTERM) == 0, service.log()
    assert "Traceback" not in service.log(10_000)


async def test_a_webhook_subscription_removed_by_a_reload_is_unsubscribed_on_the_open_connection(
    tmp_path: Path,
) -> None:
    """The minimal server (tests/minimal_server.py) grants a webhook and logs each request; a reload
    without the subscription retires it and sends events/unsubscribe, the other subscription goes on."""
    from test_protocol_peers import (
        EVENT,
        free_port,
        raw_config,
        requests,
        row,
        server_entry,
        until,
        webhook_section,
    )

    from agentwake.config import parse_config
    from agentwake.store.sqlite import SqliteStore
    from agentwake.supervisor import Supervisor

    port = free_port()
    server = server_entry(tmp_path, MINIMAL_DELIVERY="webhook")
    hook = {"name": "hook", "server": "m", "event": EVENT, "delivery": "webhook"}
    ticks = {"name": "ticks", "server": "m", "event": EVENT, "delivery": "webhook"}
    webhook = webhook_section(port)
    before = parse_config(raw_config(tmp_path, [hook, ticks], server=server, webhook=webhook), env={})
    after = parse_config(raw_config(tmp_path, [ticks], server=server, webhook=webhook), env={})
    store = await SqliteStore.open(before.store.path)
    try:
        supervisor = Supervisor(before, store)
        async with anyio.create_task_group() as tg:
            await tg.start(supervisor.run)
            await until(
                lambda: (row(store, "hook")["webhook"] or {}).get("id") is not None, "the webhook subscribed"
            )
            url = row(store, "hook")["webhook"]["url"]
            assert requests(tmp_path, "events/unsubscribe") == []
            changes = await supervisor.reload(after)
            assert changes == ["subscription hook: removed"]
            await until(lambda: bool(requests(tmp_path, "events/unsubscribe")), "events/unsubscribe sent")
            await until(lambda: not store.core.to_unsubscribe(), "the unsubscribe recorded")
            [unsubscribe] = requests(tmp_path, "events/unsubscribe")
            assert unsubscribe["params"]["delivery"] == {"mode": "webhook", "url": url}
            assert unsubscribe["error"] is None
            assert row(store, "ticks")["status"] == "active" and row(store, "ticks")["webhook"]["id"]
            assert [r["params"]["delivery"]["url"] for r in requests(tmp_path, "events/unsubscribe")] == [url]
            tg.cancel_scope.cancel()
    finally:
        await store.close()
