"""kill -9 in the middle of a backlog drain loses nothing and stores nothing twice."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from _support import agentwake_run, demo_server_toml

from agentwake.config import load_config
from agentwake.delivery.common import subscription_key
from agentwake.store.sqlite import SqliteCore

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
BACKLOG = 30_000


def write_config(tmp_path: Path, delivery: str) -> Path:
    # The server runs in the repo: its tickets file must be the test's, never the repo's demo.db.
    demo = demo_server_toml(tmp_path / "demo.db", DEMO_BACKLOG=str(BACKLOG), DEMO_HEARTBEAT_MS="300")
    path = tmp_path / "agentwake.toml"
    path.write_text(
        f"""
[store]
path = "aw.db"

{demo}
[[subscriptions]]
name = "tickets"
server = "demo"
event = "ticket.created"
max_events = 500
delivery = "{delivery}"
"""
    )
    return path


async def run_until(config: Path, marker: str, *, kill: bool) -> None:
    """Start `agentwake run`, wait for a log line containing ``marker``, then SIGKILL or SIGTERM it."""
    async with agentwake_run(config) as run:
        await run.wait_for(marker)
        await run.stop(signal.SIGKILL if kill else signal.SIGTERM)


# The log line that says the drain is under way, and the one that says it is over, per mode.
MARKERS = {
    "poll": ("draining backlog", "caught up after draining"),
    "push": ("events so far", "stream caught up after"),
}


@pytest.mark.parametrize("delivery", ["poll", "push"])
async def test_sigkill_mid_drain_then_restart_stores_every_event_exactly_once(
    tmp_path: Path, delivery: str
) -> None:
    midway, done = MARKERS[delivery]
    config_path = write_config(tmp_path, delivery)
    config = load_config(config_path)
    seeded = SqliteCore.open(config.store.path)
    key = subscription_key(config.subscriptions[0])
    seeded.register(key)
    seeded.ingest(key, [], "0")  # start from the beginning of the backlog
    seeded.close()

    await run_until(config_path, midway, kill=True)
    after_kill = SqliteCore.open(config.store.path)
    partial = len(after_kill.event_ids())
    after_kill.close()
    assert 0 < partial < BACKLOG, "the kill should land mid-drain"

    await run_until(config_path, done, kill=False)
    final = SqliteCore.open(config.store.path)
    ids = final.event_ids()
    [status] = final.subscriptions()
    final.close()
    assert ids == [f"T-{n:06d}" for n in range(1, BACKLOG + 1)]
    assert status["events_received"] == BACKLOG
    assert status["duplicates"] == 0  # cursor and batch commit together: nothing is fetched twice
    assert status["cursor"] == str(BACKLOG)
