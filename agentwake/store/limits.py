"""What counts against the limits right now, for `agentwake limits` and the operator page: runs in the
last hour and spend in the last day (``[agent]``), events being handled (``concurrency``, per server
``max_concurrent_runs``), each rule's slots taken (``max_concurrent``) and its busiest rate-limit key.

Written once as a view (a generator that yields its queries and is sent their rows, as the
PostgreSQL views are); the SQLite store drives it with ``?`` placeholders.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import Any

Rows = list[tuple[Any, ...]]
LimitUseView = Generator[tuple[str, Sequence[Any]], Rows, dict[str, Any]]


def limit_use(since_hour: str, since_day: str, rate_since: Mapping[str, str]) -> LimitUseView:
    """``rate_since``: for each rule with a rate limit, the start of its window (ISO)."""
    [(runs,)] = yield ("SELECT count(*) FROM runs WHERE kind = 'agent' AND started_at >= %s", [since_hour])
    [(cost,)] = yield ("SELECT coalesce(sum(cost_usd), 0) FROM runs WHERE started_at >= %s", [since_day])
    handled = yield (
        "SELECT server, slot_rule, count(*) FROM events WHERE state = 'processing'"
        " GROUP BY server, slot_rule ORDER BY server, slot_rule",
        [],
    )
    by_server: dict[str, int] = {}
    by_rule: dict[str, int] = {}
    for server, rule, count in handled:
        by_server[server] = by_server.get(server, 0) + int(count)
        if rule is not None:
            by_rule[rule] = by_rule.get(rule, 0) + int(count)
    busiest: dict[str, dict[str, Any]] = {}
    for rule, since in sorted(rate_since.items()):
        rows = yield (
            "SELECT key, count(*) AS used FROM flow_marks WHERE rule = %s AND kind = 'rate' AND at > %s"
            " GROUP BY key ORDER BY used DESC, key LIMIT 1",
            [rule, since],
        )
        busiest[rule] = {"key": rows[0][0], "used": int(rows[0][1])} if rows else {"key": None, "used": 0}
    return {
        "runs_last_hour": int(runs),
        "cost_last_day_usd": float(cost),
        "handled": sum(by_server.values()),
        "handled_by_server": by_server,
        "slots_by_rule": by_rule,
        "rate_by_rule": busiest,
    }
