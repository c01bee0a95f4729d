"""kill -9 in the middle of a backlog drain loses nothing and stores nothing twice."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
import anyio.abc
import pytest
from conftest import QUIET_DEMO, REPO

from agentwake.config import load_config
from agentwake.delivery.common import subscription_key
from agentwake.store.sqlite import SqliteCore

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
BACKLOG = 30_000


def write_config(tmp_path: Path, delivery: str) -> Path:
    env = ", ".join(
        f'{k} = "{v}"'
        for k, v in {
            **QUIET_DEMO,
            "DEMO_DB": str(tmp_path / "demo.db"),  # the server runs in the repo: never its demo.db
            "DEMO_BACKLOG": str(BACKLOG),
            "DEMO_HEARTBEAT_MS": "300",
        }.items()
    )
    path = tmp_path / "agentwake.toml"
    path.write_text(
        f"""
[store]
path = "aw.db"

[servers.demo]
command = "{sys.executable}"
args = ["-m", "examples.demo_server"]
cwd = "{REPO}"
env = {{ {env} }}

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
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process: anyio.abc.Process = await anyio.open_process(
        [sys.executable, "-m", "agentwake.cli", "run", "-c", str(config)], cwd=config.parent, env=env
    )
    assert process.stderr is not None
    seen = anyio.Event()

    async def watch() -> None:
        assert process.stderr is not None
        pending = b""
        async for chunk in process.stderr:
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if any(marker.encode() in line for line in lines):
                seen.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            with anyio.fail_after(60):
                await seen.wait()
            process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            with anyio.fail_after(30):
                await process.wait()
            tg.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            process.kill()
        await process.aclose()


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
