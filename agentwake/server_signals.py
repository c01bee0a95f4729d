"""What a connected server says about itself: its event types or its tools changed.

``ServerSignals`` collects it for the supervisor (``agentwake.supervisor``), which plans a server's
subscriptions again when its event types change; ``watch_tools`` refreshes the agent's view of a
server's tools when they change, whichever way the server says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from agentwake.mcp import ServerConnection

if TYPE_CHECKING:
    from agentwake.agent.tools import ConnectionPool

# The supervisor's name, as before the split: each log line names its logger.
logger = logging.getLogger("agentwake.supervisor")


@dataclass
class ServerSignals:
    """What a connected server said since it was last looked at: its event types or its tools changed."""

    events_changed: anyio.Event = field(default_factory=anyio.Event)
    tools_changed: anyio.Event = field(default_factory=anyio.Event)
    # Set with tools_changed when nothing is known to have changed: a precautionary relist.
    tools_recheck_only: bool = False
    # Whether the server said its event types changed since the last take_server_change (a reload
    # that changed only this server's subscriptions sets events_changed without it).
    server_said: bool = False

    def on_events_changed(self) -> None:
        """The server says its event types changed (list_changed, or the liveness probe saw it)."""
        self.server_said = True
        self.events_changed.set()

    def on_config_changed(self) -> None:
        """A reload changed this server's subscriptions: plan them again, on what is listed."""
        self.events_changed.set()

    def take_server_change(self) -> bool:
        said, self.server_said = self.server_said, False
        return said

    async def on_tools_changed(self) -> None:
        self.tools_recheck_only = False
        self.tools_changed.set()

    async def next_events_change(self) -> None:
        await self.events_changed.wait()
        self.events_changed = anyio.Event()

    async def next_tools_change(self) -> None:
        await self.tools_changed.wait()
        self.tools_changed = anyio.Event()


async def watch_tools(pool: ConnectionPool, conn: ServerConnection, signals: ServerSignals) -> None:
    """Refresh the server's tools when it says they changed (either protocol generation)."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(_listen_tools, conn, signals)
        while True:
            await signals.next_tools_change()
            if signals.tools_recheck_only:
                signals.tools_recheck_only = False
                logger.debug("server %s: listing tools once more, now that changes are watched", conn.name)
            else:
                logger.info("server %s: tools changed; listing them again", conn.name)
            await pool.refresh(conn.name)


async def _listen_tools(conn: ServerConnection, signals: ServerSignals) -> None:
    # 2026-07-28 servers announce changes on a subscriptions/listen stream, not a notification.
    if not conn.offers_tools:
        return  # no tools capability: nothing to watch, and nothing to ask it
    try:
        async with conn.client.listen(tools_list_changed=True) as changes:
            # A change between the first listing and this stream's start would be missed: list once more.
            signals.tools_recheck_only = True
            signals.tools_changed.set()
            async for _change in changes:
                signals.tools_recheck_only = False
                signals.tools_changed.set()
    except Exception as exc:
        # Not offered (older protocol, or the server declines): the notification path stays.
        logger.debug("server %s: no tools change stream: %s", conn.name, exc)
