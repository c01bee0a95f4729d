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
