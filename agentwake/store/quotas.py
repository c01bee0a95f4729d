"""What a claim may take under limits that hold across every process on one store.

``[servers.X] max_concurrent_runs`` and ``[agent] max_runs_per_hour`` / ``max_cost_per_day_usd``
count events being handled by any process, so each backend counts them inside the claim's own
transaction (serialized with other claims on PostgreSQL), and this module turns the counts into
what the claim may take. An event being handled is one in 'processing' whose lease has not
lapsed (or that was claimed without one): a crashed process's claims stop counting when their
leases lapse.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ClaimLimits:
    """Limits a claim honours, over every process sharing the store."""

    # Per server: events of it being handled at once, at most.
    server_caps: Mapping[str, int] = field(default_factory=dict)
    # Agent runs started since ``hour_ago`` plus events being handled, at most.
    max_runs_per_hour: int | None = None
    hour_ago: str = ""
    # Nothing is claimed once the spend of runs started since ``day_ago`` reaches it.
    max_cost_per_day_usd: float | None = None
    day_ago: str = ""

    @property
    def counts_usage(self) -> bool:
        return self.max_runs_per_hour is not None or self.max_cost_per_day_usd is not None


@dataclass(frozen=True, slots=True)
class Quota:
    """What one claim may take: at most ``limit`` events, none of ``excluded`` servers, at most
    ``per_server[s]`` of a capped server's."""

    limit: int
    excluded: tuple[str, ...] = ()
    per_server: Mapping[str, int] = field(default_factory=dict)

    def trim(self, due: Sequence[tuple[int, str]]) -> list[int]:
        """Of the due events, as (row id, server) in claim order, the ids this quota lets through."""
        left = dict(self.per_server)
        kept: list[int] = []
        for event_row, server in due:
            if len(kept) >= self.limit:
                break
            if server in left:
                if left[server] <= 0:
                    continue
                left[server] -= 1
            kept.append(event_row)
        return kept


def quota(
    limit: int,
    limits: ClaimLimits,
    *,
    handled: Mapping[str, int],
    runs_last_hour: int = 0,
    spend_last_day: float = 0.0,
    excluded: Sequence[str] = (),
) -> Quota:
    """What a claim of ``limit`` may take, given the events being handled per server (every
    process's) and the agent's usage (counted only when ``limits.counts_usage``)."""
    if limits.max_cost_per_day_usd is not None and spend_last_day >= limits.max_cost_per_day_usd:
        return Quota(0)
    if limits.max_runs_per_hour is not None:
        limit = min(limit, limits.max_runs_per_hour - runs_last_hour - sum(handled.values()))
    per_server = {server: cap - handled.get(server, 0) for server, cap in limits.server_caps.items()}
    full = tuple(sorted({*excluded, *(server for server, left in per_server.items() if left <= 0)}))
    return Quota(max(limit, 0), full, per_server)
