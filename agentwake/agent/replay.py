"""Run the agent again on a stored event, outside the service (``agentwake replay``)."""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack

from agentwake.agent.runner import AgentRunner, RunResult
from agentwake.agent.tools import ConnectionPool
from agentwake.config import AgentwakeConfig
from agentwake.errors import AgentwakeError, ConfigError
from agentwake.mcp import ServerConnection
from agentwake.store import Store

logger = logging.getLogger(__name__)


async def replay(cfg: AgentwakeConfig, store: Store, event_row: int, *, dry_run: bool) -> RunResult:
    """A new run, recorded as 'replay' (or 'dry_run', whose tool calls are planned, never sent).

    The event's own state is left alone: replaying a done event does not make it
    pending, and a replay is never counted as the event's completed run.
    """
    if cfg.agent is None:
        raise ConfigError("there is no [agent] section in the config; nothing to replay with")
    event = await store.event_for_replay(event_row)
    pool = ConnectionPool(call_timeout_s=cfg.agent.request_timeout_s)
    async with AsyncExitStack() as stack:
        for name, server in cfg.servers.items():
            try:
                conn = await stack.enter_async_context(ServerConnection(name, server))
            except AgentwakeError as exc:
                logger.warning("replay: %s; its tools are not available", exc)
                continue
            await pool.attach(conn)
        runner = AgentRunner.build(cfg, store, pool)
        return await runner.run(event, kind="dry_run" if dry_run else "replay")
