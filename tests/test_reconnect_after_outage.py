"""A server back after a long outage is reconnected within seconds, not after a grown backoff.

The outage is compressed: while the demo server (Streamable HTTP on loopback) is down, the
supervisor's sleeps return at once, so it fails many connects in a row as in an hour-long outage
(before the fix the backoff had grown to a minute: 1, 2, 4 ... 60 s). Then the server starts on
its port and the sleeps are real: the supervisor must be connected within a few seconds.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from conftest import DemoHTTP, free_port

from agentwake.config import parse_config
from agentwake.store.sqlite import SqliteStore
from agentwake.supervisor import Supervisor

pytestmark = pytest.mark.anyio

FAILURES = 12  # 1+2+4+...: well past the point where the old backoff reached its cap
WITHIN_S = 10.0  # a few seconds: the backoff's cap, its jitter, and a connect


class OutageSleep:
    """The supervisor's sleep: instant while the server is down (a compressed outage), real after."""

    def __init__(self) -> None:
        self.down = True
        self.delays: list[float] = []
        self._changed = anyio.Event()

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        changed, self._changed = self._changed, anyio.Event()
        changed.set()
        if self.down:
            await anyio.lowlevel.checkpoint()
        else:
            await anyio.sleep(seconds)

    async def until_failures(self, count: int) -> None:
        while len(self.delays) < count:
            await self._changed.wait()


async def test_a_server_back_after_a_long_outage_is_reconnected_within_seconds(tmp_path: Path) -> None:
    demo = DemoHTTP(db=tmp_path / "demo.db", env={}, port=free_port())
    cfg = parse_config(
        {
            "store": {"path": str(tmp_path / "aw.db")},
            "servers": {"demo": {"url": demo.url, "connect_timeout_s": 5, "request_timeout_s": 5}},
            "subscriptions": [{"name": "tickets", "server": "demo", "event": "ticket.created"}],
            "policy": {"dir": str(tmp_path / "no-policies")},
        },
        env={},
    )
    store = await SqliteStore.open(tmp_path / "aw.db")
    sleep = OutageSleep()
    try:
        supervisor = Supervisor(cfg, store, sleep=sleep)  # the default backoff
        async with anyio.create_task_group() as tg:
            await tg.start(supervisor.run)
            with anyio.fail_after(60):
                await sleep.until_failures(FAILURES)
            assert supervisor.readiness()["demo"].startswith("error:")
            sleep.down = False
            await demo.start()
            back = time.monotonic()
            try:
                with anyio.fail_after(WITHIN_S):
                    while supervisor.readiness()["demo"] != "connected":  # noqa: ASYNC110 - no event for it
                        await anyio.sleep(0.02)
                took = time.monotonic() - back
                tg.cancel_scope.cancel()
            finally:
                await demo.stop()
        assert took < WITHIN_S
        # No wait of the outage grew past a few seconds.
        assert max(sleep.delays) < 7.0
    finally:
        await store.close()
