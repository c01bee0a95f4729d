"""A quiet subscription (nothing new, the same cursor) writes "still active" at most every QUIET_WRITE_S.

On a thousand idle subscriptions those writes were most of the idle CPU (bench/soak.py). A batch
with events, a gap or a new cursor is always written; after an error the next batch is too, so
the error shown in `status` clears as soon as delivery works again.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from conftest import demo_stdio

from agentwake.config import SubscriptionConfig
from agentwake.delivery.common import QuietWrites, subscription_key
from agentwake.delivery.poll import PollLoop
from agentwake.mcp import ServerConnection
from agentwake.store.sqlite import SqliteStore

pytestmark = pytest.mark.anyio


def test_quiet_batches_are_written_once_per_interval_and_after_every_error() -> None:
    now = [100.0]
    quiet = QuietWrites(every_s=120, clock=lambda: now[0])
    assert not quiet.skip()  # never written: write
    quiet.wrote()
    now[0] += 119
    assert quiet.skip()
    now[0] += 1
    assert not quiet.skip()
    quiet.wrote()
    quiet.failed()
    assert not quiet.skip()  # an error since: write, so the error clears


async def test_a_quiet_poll_loop_keeps_polling_without_writing_until_something_happens(
    tmp_path: Path,
) -> None:
    sub = SubscriptionConfig(name="tickets", server="demo", event="ticket.created", poll_floor_ms=20)
    store = await SqliteStore.open(tmp_path / "aw.db")
    try:
        async with ServerConnection("demo", demo_stdio(tmp_path / "demo.db", DEMO_NEXT_POLL_MS="20")) as conn:
            loop = PollLoop(sub, conn, store)
            async with anyio.create_task_group() as tg:
                tg.start_soon(loop.run)
                with anyio.fail_after(20):
                    while loop.polls < 3:  # noqa: ASYNC110 - the loop has no event for a poll
                        await anyio.sleep(0.01)
                first = store.core.subscriptions()[0]["last_activity_at"]
                start = loop.polls
                with anyio.fail_after(20):
                    while loop.polls < start + 10:  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                assert store.core.subscriptions()[0]["last_activity_at"] == first  # ten polls, no write
                # A ticket: written at once.
                from agentwake.demo.store import TicketStore

                tickets = TicketStore(tmp_path / "demo.db")
                tickets.create([("support", "P2", "printer", "", "al@example.com")])
                tickets.close()
                with anyio.fail_after(20):
                    while not store.core.event_ids("tickets"):  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                tg.cancel_scope.cancel()
        assert store.core.subscriptions()[0]["last_activity_at"] != first
        assert await store.cursor(subscription_key(sub).name) is not None
    finally:
        await store.close()
