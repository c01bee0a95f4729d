"""The supervisor: servers and subscriptions fail alone, and events reach the processing stage."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from conftest import demo_stdio

from agentwake.config import AgentwakeConfig, ServerConfig
from agentwake.store import InboxEvent, Store
from agentwake.supervisor import Supervisor

pytestmark = pytest.mark.anyio


async def test_a_bad_subscription_and_a_dead_server_do_not_stop_the_good_one(
    tmp_path: Path, store: Store
) -> None:
    config = AgentwakeConfig.model_validate(
        {
            "servers": {
                "demo": demo_stdio(tmp_path / "demo.db", DEMO_RATE="20").model_dump(),
                "gone": ServerConfig(command="/nonexistent/server").model_dump(),
            },
            "subscriptions": [
                {"name": "good", "server": "demo", "event": "ticket.created", "poll_floor_ms": 50},
                {"name": "typo", "server": "demo", "event": "ticket.craeted"},
                {"name": "orphan", "server": "gone", "event": "x"},
            ],
        }
    )
    seen: list[InboxEvent] = []
    enough = anyio.Event()

    def process(event: InboxEvent) -> None:
        seen.append(event)
        if len(seen) >= 3:
            enough.set()

    supervisor = Supervisor(config, store, process=process, reconnect_initial_s=0.05, reconnect_max_s=0.2)
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.run)
        with anyio.fail_after(30):
            await enough.wait()
        tg.cancel_scope.cancel()

    assert {e.subscription for e in seen} == {"good"}
    status = {row["subscription"]: row for row in store.subscriptions_sync()}
    assert status["typo"]["status"] == "ended"
    assert "no event 'ticket.craeted'" in status["typo"]["last_error"]
    assert "command not found" in (status["orphan"]["last_error"] or "")
    assert status["good"]["status"] == "active" and status["good"]["events_received"] >= 3
    counts = store.state_counts_sync()
    assert counts["pending"] + counts["processing"] + counts["done"] == status["good"]["events_received"]
