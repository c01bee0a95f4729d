"""Printing for a person: the consoles, tables that fall back to labelled lines on a narrow
terminal, and the status view.

The only module of the CLI that imports rich at its top; commands import it when they print.
"""

from __future__ import annotations

from typing import Any, Final

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

# No markup anywhere: events, tool results and error messages are untrusted text, and "[agent]" or
# "[/INST]" in them must print as written. Styles are applied with Text, not with tags. No emoji
# codes either: a Slack message's ":rotating_light:" prints as written, not as a picture (and
# rich's table of codes is never loaded).
out = Console(markup=False, emoji=False)
err = Console(stderr=True, markup=False, emoji=False)

UNBOUNDED_WIDTH: Final = 100_000


class PlainTable(Table):
    """A table whose cells and title are plain text, never rich markup (they hold upstream text)."""

    def __init__(self, *args: Any, title: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, title=Text(title) if title is not None else None, **kwargs)
        self.records: list[tuple[Any, ...]] = []

    def add_row(self, *cells: Any, **kwargs: Any) -> None:
        texts = tuple(Text(c) if isinstance(c, str) else c for c in cells)
        self.records.append(texts)
        super().add_row(*texts, **kwargs)


def table_of(title: str, columns: tuple[str, ...]) -> PlainTable:
    """A PlainTable with these columns, each folding its text rather than cutting it."""
    table = PlainTable(title=title)
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def fits(console: Console, table: Table) -> bool:
    """Whether the table prints at its natural width, with no cell folded."""
    unbounded = console.options.update(max_width=UNBOUNDED_WIDTH)  # measured as wide as it would like
    return Measurement.get(console, unbounded, table).maximum <= console.width


def print_table(table: PlainTable, console: Console) -> None:
    """The table, if the terminal is wide enough for it; else each row as a block of labelled lines
    (a table squeezed into 80 columns folds every word)."""
    if fits(console, table):
        console.print(table)
        return
    if table.title is not None:
        console.print(Text(str(table.title), style="bold"))
    first_column, *columns = table.columns
    for first, *rest in table.records:
        block = PlainTable.grid(padding=(0, 2))
        block.add_column(no_wrap=True)
        block.add_column(overflow="fold")
        for column, cell in zip(columns, rest, strict=False):
            if isinstance(cell, Text) and not cell.plain:
                continue
            block.add_row(f"  {column.header}", _with_style(cell, column.style))
        console.print()
        console.print(Text.assemble(f"{first_column.header} ", _with_style(first, "bold")))
        console.print(block)


def _with_style(cell: Any, style: Any) -> Any:
    if not isinstance(cell, Text) or not style:
        return cell
    styled = cell.copy()
    styled.stylize(style)
    return styled


# ---- status ------------------------------------------------------------------------------------

STATUS_COLUMNS: Final = (
    "subscription",
    "server",
    "event",
    "mode",
    "status",
    "cursor",
    "last activity",
    "received",
    "dups",
    "gaps",
    "done",
    "failed",
    "ignored",
    "webhook",
)


def print_status(rows: list[dict[str, Any]], console: Console) -> None:
    """`status` for a person: a table on a wide terminal, else a few labelled lines per subscription
    (fewer than print_table's one line per column)."""
    table = _status_table(rows)
    if fits(console, table):
        console.print(table)
        return
    console.print(Text("Subscriptions", style="bold"))
    for r in rows:
        console.print()
        console.print(_status_block(r))


def _status_table(rows: list[dict[str, Any]]) -> Table:
    table = table_of("Subscriptions", STATUS_COLUMNS)
    table.add_column("last error", overflow="fold", style="red")
    for r in rows:
        table.add_row(
            _subscription_label(r),
            r["server"],
            r["event"],
            r["mode"] or "-",
            _status_of(r),
            r["cursor"] or "-",
            r["last_activity_at"] or "never",
            str(r["events_received"]),
            str(r["duplicates"]),
            str(r["gaps"]) + (f" ({r['rejected']} rejected)" if r.get("rejected") else ""),
            str(r["events_done"]),
            str(r["events_failed"]) + (f" ({r['events_dead']} dead)" if r.get("events_dead") else ""),
            str(r.get("events_ignored", 0)),
            _describe_webhook(r["webhook"], r.get("identity")),
            _last_error(r),
        )
    return table


def _last_error(r: dict[str, Any]) -> str:
    """The current error; else the latest one a later success cleared, marked so (it may come back)."""
    current = r["last_error"] or r["last_failure"]
    if current:
        return str(current)
    recent = r.get("recent_errors") or []
    if not recent:
        return ""
    latest = recent[-1]
    return f"{latest['error']} (at {latest['at']}, since recovered)"


def _status_block(r: dict[str, Any]) -> Table:
    block = PlainTable.grid(padding=(0, 2))
    block.add_column(no_wrap=True)
    block.add_column(overflow="fold")
    block.add_row(
        Text(_subscription_label(r), style="bold"),
        " · ".join((r["server"], r["event"], r["mode"] or "-", _status_of(r))),
    )
    block.add_row("  cursor", f"{r['cursor'] or '-'} (last activity {r['last_activity_at'] or 'never'})")
    block.add_row(
        "  events",
        f"{r['events_received']} received, {r['duplicates']} duplicates, {r['gaps']} gaps;"
        f" {r['events_done']} done, {r['events_failed']} failed"
        + (f", {r['events_dead']} dead (agentwake retry ID)" if r.get("events_dead") else "")
        + (f", {r['events_ignored']} ignored" if r.get("events_ignored") else "")
        + (f"; {r['rejected']} rejected" if r.get("rejected") else ""),
    )
    if r["webhook"] is not None:
        block.add_row("  webhook", _describe_webhook(r["webhook"], r.get("identity")).replace("\n", " · "))
    last_error = _last_error(r)
    if last_error:
        block.add_row("  last error", Text(last_error, style="red"))
    return block


def _status_of(r: dict[str, Any]) -> str:
    """The subscription's stored status; when the service is not running, said so: the status is
    what it was when the service stopped, not something live."""
    status = str(r["status"]) + (" (service stopped)" if r.get("service_running") is False else "")
    if r.get("driver_failing"):  # its driver cannot reach the server: another process may take it
        status += f" (driven by {r['driven_by']}: {r['driver_failing']})"
    return status


def describe_service(service: dict[str, Any] | None) -> str:
    """One line on the service (``views.service_state``): running, stopped, or gone without stopping."""
    if service is None:
        return "service: no record of 'agentwake run' in this store yet"
    if service["state"] == "running":
        line = (
            f"service: running (pid {service['pid']} on {service['host']}, since {service['started_at']},"
            f" last heartbeat {_ago(service['heartbeat_age_s'])} ago)"
        )
        if service.get("paused"):
            line += f"; the agent waits: {service['paused']} (events stay pending)"
        return line
    if service["state"] == "stopped":
        return f"service: not running (stopped at {service['stopped_at']})"
    line = f"service: not running (pid {service['pid']} on {service['host']}"
    if service["heartbeat_age_s"] is not None:
        line += f" last seen {_ago(service['heartbeat_age_s'])} ago"
    line += "; it did not stop cleanly"
    if service.get("pid_alive"):
        line += f"; pid {service['pid']} is alive but writes no heartbeat: hung, or another process"
    return line + ")"


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    whole = int(seconds)
    if whole < 120:
        return f"{whole}s"
    if whole < 7200:
        return f"{whole // 60}m"
    if whole < 172800:
        return f"{whole // 3600}h"
    return f"{whole // 86400}d"


def _subscription_label(r: dict[str, Any]) -> str:
    # A removed subscription's status says so already; one still live but gone from the config is flagged.
    flagged = not r["configured"] and r["status"] not in ("removed", "unsubscribed", "lingering")
    return str(r["subscription"]) + (" (not in config)" if flagged else "")


def _describe_webhook(webhook: dict[str, Any] | None, identity: str | None = None) -> str:
    if webhook is None:
        return "-"
    lines = [webhook["id"] or "not subscribed yet"]
    lines.append("no expiry" if webhook["no_expiry"] else f"refresh by {webhook['refresh_before'] or '-'}")
    status = webhook["delivery_status"]
    if status:
        state = "active" if status.get("active", True) else "suspended"
        if status.get("lastError"):
            state += f", {status['lastError']}"
        if status.get("throttled"):
            state += ", throttled"
        lines.append(state)
    if webhook["rotation_pending"]:
        lines.append("rotation pending")
    if identity:
        lines.append(f"server identity: {identity}")
    return "\n".join(lines)


__all__ = [
    "PlainTable",
    "describe_service",
    "err",
    "fits",
    "out",
    "print_status",
    "print_table",
    "table_of",
]
