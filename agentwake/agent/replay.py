"""Run the agent again on a stored event, outside the service (``agentwake replay``).

The event goes through the same decision as in the service (``agentwake.decide``):
an event the policy ignores, only logs, or holds for approval is refused unless
``force`` is given; one that runs gets its rule's tools, prompt and model. Flow
control is not applied (a replay is on purpose) and the event's state is left alone.
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace

from agentwake.agent.runner import AgentRunner, RunPlan, RunResult
from agentwake.agent.tools import ConnectionPool
from agentwake.clock import utc_now
from agentwake.config import AgentwakeConfig
from agentwake.decide import Outcome, decide
from agentwake.errors import AgentwakeError, ConfigError
from agentwake.mcp import ServerConnection
from agentwake.policy import Policy
from agentwake.store import Store

logger = logging.getLogger(__name__)


class ReplayRefused(AgentwakeError):
    """The policy would not run the agent on this event; ``--force`` runs it anyway."""

    def __init__(self, outcome: Outcome) -> None:
        event = outcome.event
        if outcome.verdict == "hold":
            what = (
                f"is held for approval by rule {outcome.rule!r} ({outcome.why}); approve it"
                f" (agentwake approve {event.event_id}) or pass --force to replay it anyway"
            )
        else:
            what = (
                f"is not run by the policy: {outcome.verdict} by rule {outcome.rule!r} ({outcome.why});"
                " pass --force to replay it anyway"
            )
        super().__init__(f"event {event.event_id!r} {what}")
        self.outcome = outcome


@dataclass(frozen=True, slots=True)
class Replay:
    """What a replay decided, the plan it ran (the first prompt, the tools), and the run."""

    outcome: Outcome
    plan: RunPlan
    result: RunResult
    forced: bool


async def replay(
    cfg: AgentwakeConfig, store: Store, policy: Policy, event_row: int, *, dry_run: bool, force: bool = False
) -> Replay:
    """A new run, recorded as 'replay' (or 'dry_run', whose tool calls are planned, never sent).

    The event's own state is left alone: replaying a done event does not make it
    pending, and a replay is never counted as the event's completed run.
    """
    if cfg.agent is None:
        raise ConfigError("there is no [agent] section in the config; nothing to replay with")
    event = await store.event(event_row)
    outcome = await decide(event, config=cfg, policy=policy, now=utc_now(), flow=None)
    forced = outcome.verdict != "run"
    if forced and not force:
        raise ReplayRefused(outcome)
    if forced:
        logger.warning("replay of %s forced past the policy's %s", event.event_id, outcome.verdict)
        outcome = replace(outcome, verdict="run", why=f"forced past {outcome.verdict}: {outcome.why}")
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
        plan = runner.prepare(outcome)
        result = await runner.run(outcome, kind="dry_run" if dry_run else "replay")
        return Replay(outcome, plan, result, forced)
