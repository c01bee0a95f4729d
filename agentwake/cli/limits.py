"""limits: each limit the service counts under, with what counts against it right now."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from agentwake.cli.common import (
    DEFAULT_CONFIG_PATH,
    ConfigOption,
    JsonOption,
    app,
    fail,
    load,
    stdout,
    with_store,
)

if TYPE_CHECKING:
    from agentwake.config import AgentwakeConfig
    from agentwake.store import Store


def _rows(cfg: AgentwakeConfig, rules: list[Any], use: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per limit: where it is set, its value, its use now, and whether it holds events back."""
    rows: list[dict[str, Any]] = []

    def row(limit: str, where: str, value: float | int | None, used: float | int, unit: str = "") -> None:
        rows.append(
            {
                "limit": limit,
                "set_in": where,
                "value": value,
                "in_use": used,
                "unit": unit,
                "reached": value is not None and used >= value,
            }
        )

    agent = cfg.agent
    if agent is not None:
        row(
            "max_runs_per_hour",
            "[agent]",
            agent.max_runs_per_hour,
            use["runs_last_hour"],
            "runs in the last hour",
        )
        row(
            "max_cost_per_day_usd",
            "[agent]",
            agent.max_cost_per_day_usd,
            round(use["cost_last_day_usd"], 6),
            "USD in the last 24 hours",
        )
        row(
            "concurrency",
            "[agent]",
            agent.concurrency,
            use["handled"],
            "events being handled (all processes)",
        )
    for name, server in cfg.servers.items():
        if server.max_concurrent_runs is not None:
            row(
                "max_concurrent_runs",
                f"[servers.{name}]",
                server.max_concurrent_runs,
                use["handled_by_server"].get(name, 0),
                "events being handled",
            )
    for loaded in rules:
        rule = loaded.rule
        if rule.max_concurrent is not None:
            row(
                "max_concurrent",
                f"rule {rule.name}",
                rule.max_concurrent,
                use["slots_by_rule"].get(rule.name, 0),
                "runs under way",
            )
        if rule.rate_limit is not None:
            busiest = use["rate_by_rule"].get(rule.name, {"key": None, "used": 0})
            per = f" (busiest key {busiest['key']!r})" if rule.rate_limit.key and busiest["key"] else ""
            row(
                "rate_limit",
                f"rule {rule.name}",
                rule.rate_limit.max,
                busiest["used"],
                f"runs in the last {rule.rate_limit.window_s:g} s{per}",
            )
    return rows


@app.command()
def limits(config: ConfigOption = DEFAULT_CONFIG_PATH, as_json: JsonOption = False) -> None:
    """Show each limit and what counts against it now.

    [agent] max_runs_per_hour, max_cost_per_day_usd and concurrency, [servers.NAME]
    max_concurrent_runs, and the rules' max_concurrent and rate_limit (for a rate limit per key,
    the busiest key). Use is counted over every process on the store. A reload of agentwake.toml
    applies changed limits without a restart; unset limits show as none.
    """
    from agentwake.clock import iso, utc_now
    from agentwake.errors import AgentwakeError
    from agentwake.service import load_service_policy

    cfg = load(config, secrets=False)
    try:
        rules = list(load_service_policy(cfg).rules)
    except AgentwakeError as exc:
        raise fail(f"cannot read the policy's limits: {exc}") from None
    now = utc_now()
    rate_since = {
        loaded.rule.name: iso(now - timedelta(seconds=loaded.rule.rate_limit.window_s))
        for loaded in rules
        if loaded.rule.rate_limit is not None
    }

    async def read(store: Store) -> dict[str, Any]:
        return await store.limit_use(iso(now - timedelta(hours=1)), iso(now - timedelta(days=1)), rate_since)

    rows = _rows(cfg, rules, with_store(cfg, read))
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    from agentwake.cli.tables import print_table, table_of

    out = stdout()
    if not rows:
        out.print("no limit is set", highlight=False)
        return
    table = table_of("limits", ("limit", "set in", "value", "in use", "counts"))
    for r in rows:
        value = "none" if r["value"] is None else f"{r['value']:g}"
        used = f"{r['in_use']:g}" + (" (reached)" if r["reached"] else "")
        table.add_row(r["limit"], r["set_in"], value, used, r["unit"])
    print_table(table, out)
