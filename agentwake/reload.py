"""Reloading ``agentwake.toml`` while the service runs: on SIGHUP, and when the file changes.

What a reload applies is the supervisor's business (``Supervisor.reload``: servers and
subscriptions); this module reads the file, checks the new config as a start would (the
prompt templates its subscriptions use), and keeps the running config when any of it fails,
saying why once per distinct bad state, with the file and line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from agentwake.config import AgentwakeConfig, load_config
from agentwake.errors import AgentwakeError
from agentwake.policy import policy_fingerprint

if TYPE_CHECKING:
    from agentwake.agent.runner import AgentRunner
    from agentwake.supervisor import Supervisor

logger = logging.getLogger("agentwake")

# Sections a reload does not apply: they are read once, at start (but LIVE_AGENT_LIMITS of [agent]).
RESTART_ONLY = ("agent", "sanitize", "policy", "log")
# [agent] settings a reload applies at once: the next claim counts under them.
LIVE_AGENT_LIMITS = ("max_runs_per_hour", "max_cost_per_day_usd", "concurrency")


@dataclass
class ConfigReloader:
    """Watches one config file; ``reload`` applies its servers and subscriptions to the supervisor."""

    path: Path
    supervisor: Supervisor
    runner: AgentRunner | None = None
    _seen: tuple[tuple[str, int, int], ...] = field(default=(), init=False)
    _failed: tuple[tuple[str, int, int], ...] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._seen = policy_fingerprint([self.path])

    def changed(self) -> bool:
        return policy_fingerprint([self.path]) != self._seen

    async def reload(self, reason: str) -> bool:
        """Read the file again and apply it; False (the running config kept) when it is bad."""
        state = policy_fingerprint([self.path])
        self._seen = state
        try:
            new = await anyio.to_thread.run_sync(load_config, self.path)
            self._check(new)
        except AgentwakeError as exc:
            if state != self._failed:
                logger.error("config reload (%s) failed; the running config is kept:\n%s", reason, exc)
            self._failed = state
            return False
        self._failed = None
        old = self.supervisor.config
        changes = await self.supervisor.reload(new)
        changes += self._apply_agent_limits(old, new)
        changes += [
            f"[{name}] changed: not applied until a restart"
            for name in RESTART_ONLY
            if _restart_part(old, name) != _restart_part(new, name)
        ]
        if self.runner is not None:
            self.runner.config = new
        if not changes:
            logger.info("config reloaded (%s): nothing that runs changed", reason)
        for change in changes:
            logger.info("config reloaded (%s): %s", reason, change)
        return True

    def _apply_agent_limits(self, old: AgentwakeConfig, new: AgentwakeConfig) -> list[str]:
        """Apply [agent]'s changed limits to the running agent, one line each."""
        if self.runner is None or old.agent is None or new.agent is None:
            return []
        changed = {
            name: getattr(new.agent, name)
            for name in LIVE_AGENT_LIMITS
            if getattr(old.agent, name) != getattr(new.agent, name)
        }
        if not changed:
            return []
        self.runner.agent = self.runner.agent.model_copy(update=changed)
        if self.supervisor.worker is not None:
            self.supervisor.worker.limits_changed()
        return [f"[agent] {name} = {value}: applied" for name, value in changed.items()]

    def _check(self, new: AgentwakeConfig) -> None:
        """What a start would refuse: a prompt template a new subscription names but nobody has."""
        if self.runner is None:
            return
        renderer = self.runner.renderer
        renderer.check([renderer.template_for(s, s.event) for s in new.subscriptions if s.agent])


def _restart_part(config: AgentwakeConfig, section: str) -> object:
    """A section as far as a restart is needed to apply it: [agent] without its live limits."""
    value = getattr(config, section)
    if section == "agent" and value is not None:
        return value.model_copy(update=dict.fromkeys(LIVE_AGENT_LIMITS))
    return value


__all__ = ["LIVE_AGENT_LIMITS", "RESTART_ONLY", "ConfigReloader"]
