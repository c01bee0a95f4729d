"""A subscription taken out of the config shows what is true in `status`, and a reload that only
removed a subscription does not claim the server's event types changed.

The minimal hand-written server (tests/minimal_server.py) over real stdio logs every request; a real
SQLite store; `status` read as the CLI reads it (``views.status_snapshot``) from a config file.
"""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest
from test_protocol_peers import (
    EVENT,
    free_port,
    raw_config,
    requests,
    row,
    server_entry,
    supervising,
    until,
    webhook_section,
    write_toml,
)

from agentwake.cli.views import status_snapshot
from agentwake.config import parse_config
from agentwake.store.sqlite import SqliteStore
from agentwake.supervisor import Supervisor

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

HOOK = {"name": "hook", "server": "m", "event": EVENT, "delivery": "webhook"}
TICKS = {"name": "ticks", "server": "m", "event": EVENT, "delivery": "webhook"}


async def test_a_removed_webhook_subscription_is_shown_unsubscribed_and_nothing_is_listed_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agentwake")
    port = free_port()
    server = server_entry(tmp_path, MINIMAL_DELIVERY="webhook")
    webhook = webhook_section(port)
    before = parse_config(raw_config(tmp_path, [HOOK, TICKS], server=server, webhook=webhook), env={})
    after_raw = raw_config(tmp_path, [TICKS], server=server, webhook=webhook)
    after = parse_config(after_raw, env={})
    store = await SqliteStore.open(before.store.path)
    try:
        supervisor = Supervisor(before, store)
        async with anyio.create_task_group() as tg:
            await tg.start(supervisor.run)
            await until(
                lambda: all((row(store, name)["webhook"] or {}).get("id") for name in ("hook", "ticks")),
                "both webhooks subscribed",
            )
            listed = len(requests(tmp_path, "events/list"))
            assert await supervisor.reload(after) == ["subscription hook: removed"]
            await until(lambda: not store.core.to_unsubscribe(), "the unsubscribe recorded")
            await until(lambda: row(store, "hook")["status"] == "unsubscribed", "hook shown unsubscribed")
            # Only the subscriptions changed: the event types were not asked for again.
            assert len(requests(tmp_path, "events/list")) == listed
            assert row(store, "ticks")["status"] == "active"
            assert "event types changed" not in caplog.text
            # What the server says keeps its meaning: its list_changed lists them again.
            supervisor._live_signals["m"].on_events_changed()
            await until(lambda: len(requests(tmp_path, "events/list")) > listed, "events/list again")
            tg.cancel_scope.cancel()
    finally:
        await store.close()
    assert "server m: its subscriptions changed; planning them again" in caplog.text
    assert "server m: event types changed; listing them again" in caplog.text
    # `agentwake status` on the new config, the service gone.
    _, rows = status_snapshot(write_toml(tmp_path / "agentwake.toml", after_raw))
    shown = {r["subscription"]: r for r in rows}
    assert (shown["hook"]["configured"], shown["hook"]["status"]) == (False, "unsubscribed")
    assert (shown["ticks"]["configured"], shown["ticks"]["status"]) == (True, "active")


async def test_a_subscription_gone_from_the_config_is_shown_removed(tmp_path: Path) -> None:
    """Stored by an earlier run, not in the config now: `removed` once a service starts, and
    `removed` in `status` even before one does, not the `active` its loop last had."""
    ticks = {**TICKS, "delivery": "poll"}
    old = {"name": "old", "server": "m", "event": EVENT, "delivery": "poll"}
    first = parse_config(raw_config(tmp_path, [ticks, old], server=server_entry(tmp_path)), env={})
    async with supervising(first) as store:
        await until(lambda: row(store, "old")["status"] == "active", "old running")
    now_raw = raw_config(tmp_path, [ticks], server=server_entry(tmp_path))
    path = write_toml(tmp_path / "agentwake.toml", now_raw)
    # No service runs: the config says it is gone.
    _, rows = status_snapshot(path)
    shown = {r["subscription"]: r for r in rows}
    assert (shown["old"]["configured"], shown["old"]["status"]) == (False, "removed")
    # A service on the new config records it so.
    async with supervising(parse_config(now_raw, env={})) as store:
        await until(lambda: row(store, "ticks")["status"] == "active", "ticks running")
        assert row(store, "old")["status"] == "removed"


def test_the_status_table_does_not_also_flag_a_removed_subscription_as_not_in_config() -> None:
    from agentwake.cli.tables import _subscription_label

    assert _subscription_label({"subscription": "old", "configured": False, "status": "removed"}) == "old"
    assert (
        _subscription_label({"subscription": "hook", "configured": False, "status": "unsubscribed"}) == "hook"
    )
    # Still driven but no longer configured (a reload under way): worth the flag.
    assert (
        _subscription_label({"subscription": "x", "configured": False, "status": "active"})
        == "x (not in config)"
    )
    assert _subscription_label({"subscription": "y", "configured": True, "status": "active"}) == "y"
