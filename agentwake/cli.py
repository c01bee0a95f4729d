"""The agentwake command line: parse, load config, call the library."""

from __future__ import annotations

import gc
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import anyio
import typer
from rich.console import Console
from rich.table import Table

from agentwake import protocol
from agentwake.config import DEFAULT_CONFIG_PATH, AgentwakeConfig, load_config
from agentwake.delivery.select import plan_subscription
from agentwake.errors import AgentwakeError, ConfigError
from agentwake.mcp import ServerConnection
from agentwake.store import Store
from agentwake.supervisor import Supervisor

logger = logging.getLogger("agentwake")

app = typer.Typer(
    name="agentwake",
    help="Wake an LLM agent when something happens upstream, through MCP Events.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)

ConfigOption = Annotated[
    Path,
    typer.Option("--config", "-c", help="Config file; relative paths in it resolve against its folder."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON array instead of a table.")]


def _load(path: Path) -> AgentwakeConfig:
    try:
        return load_config(path)
    except ConfigError as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None


def _fail(exc: AgentwakeError, code: int = 1) -> typer.Exit:
    err.print(f"[red]error:[/red] {exc}", highlight=False)
    return typer.Exit(code)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
    )
    # The SDK and HTTP clients are chatty at INFO; their problems reach us as errors anyway.
    for noisy in ("mcp", "httpx", "httpx2", "httpcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, getattr(logging, level)))


@app.command()
def run(config: ConfigOption = DEFAULT_CONFIG_PATH) -> None:
    """Run the service in the foreground until SIGINT or SIGTERM.

    Connects to every configured server, polls each subscription into the SQLite
    inbox (cursor and events in one transaction) and hands new events to the
    processing stage. Stopping is clean: in-flight writes finish, cursors stay.
    """
    cfg = _load(config)
    _setup_logging(cfg.log.level)
    try:
        anyio.run(_run_service, cfg)
    except AgentwakeError as exc:
        raise _fail(exc) from None


async def _run_service(cfg: AgentwakeConfig) -> None:
    store = await Store.open(cfg.store.path, synchronous=cfg.store.synchronous)
    # The SDK's import leaves a large heap of long-lived objects; keep the collector from rescanning it.
    gc.collect()
    gc.freeze()
    logger.info(
        "agentwake starting: %d server(s), %d subscription(s), store %s",
        len(cfg.servers),
        len(cfg.subscriptions),
        cfg.store.path,
    )
    if not cfg.subscriptions:
        logger.warning("no [[subscriptions]] configured: nothing to do until you add one")
    try:
        async with anyio.create_task_group() as tg:

            async def stop_on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for signum in signals:
                        logger.info("received %s: stopping", signal.Signals(signum).name)
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(stop_on_signal)
            await tg.start(Supervisor(cfg, store).run)
    finally:
        with anyio.CancelScope(shield=True):
            await store.close()
        logger.info("agentwake stopped; cursors are saved in %s", cfg.store.path)


@app.command()
def check(config: ConfigOption = DEFAULT_CONFIG_PATH) -> None:
    """Validate the config, connect to every server and show each subscription's delivery mode.

    Exits non-zero, with one message per problem, if the config is invalid, a
    server cannot be reached, or a subscription cannot run.
    """
    cfg = _load(config)
    _setup_logging("WARNING")
    problems, rows = anyio.run(_check, cfg)
    table = Table(title=f"Subscriptions in {config}")
    for column in ("subscription", "server", "event", "mode", "status"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    out.print(table)
    for problem in problems:
        err.print(f"[red]error:[/red] {problem}", highlight=False)
    if problems:
        raise typer.Exit(1)
    out.print(f"config OK: {len(cfg.servers)} server(s), {len(cfg.subscriptions)} subscription(s)")


async def _check(cfg: AgentwakeConfig) -> tuple[list[str], list[tuple[str, str, str, str, str]]]:
    problems: list[str] = []
    rows: list[tuple[str, str, str, str, str]] = []
    for server_name, server in cfg.servers.items():
        subs = [s for s in cfg.subscriptions if s.server == server_name]
        try:
            async with ServerConnection(server_name, server) as conn:
                descriptors = {d.name: d for d in await conn.list_events()}
        except AgentwakeError as exc:
            problems.append(str(exc))
            rows.extend((s.name, s.server, s.event, "-", "server unreachable") for s in subs)
            continue
        for sub in subs:
            try:
                plan = plan_subscription(sub, descriptors)
            except ConfigError as exc:
                problems.append(str(exc))
                rows.append((sub.name, sub.server, sub.event, "-", "invalid"))
                continue
            rows.append((sub.name, sub.server, sub.event, plan.mode, "ok"))
    return problems, rows


@app.command()
def events(
    server: Annotated[str | None, typer.Argument(help="Only this server (a name from [servers]).")] = None,
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    as_json: JsonOption = False,
) -> None:
    """List the event types each server offers: delivery modes and argument schemas."""
    cfg = _load(config)
    _setup_logging("WARNING")
    if server is not None and server not in cfg.servers:
        raise _fail(
            ConfigError(f"no server named {server!r} in {config} (known: {', '.join(cfg.servers)})"), 2
        )
    names = [server] if server else list(cfg.servers)
    try:
        listing = anyio.run(_list_events, cfg, names)
    except AgentwakeError as exc:
        raise _fail(exc) from None
    if as_json:
        payload = [
            {"server": name, **d.model_dump(by_alias=True, exclude_none=True)}
            for name, ds in listing
            for d in ds
        ]
        out.print_json(json.dumps(payload))
        return
    table = Table(title="Event types")
    for column in ("server", "event", "delivery", "arguments", "description"):
        table.add_column(column, overflow="fold")
    for name, descriptors in listing:
        for d in descriptors:
            table.add_row(
                name, d.name, ", ".join(d.delivery), _describe_schema(d.input_schema), d.description or ""
            )
    out.print(table)


def _describe_schema(schema: dict[str, Any]) -> str:
    properties = schema.get("properties") or {}
    if not properties:
        return "(none)"
    required = set(schema.get("required") or [])
    parts = []
    for key, prop in properties.items():
        kind = "|".join(map(str, prop["enum"])) if "enum" in prop else str(prop.get("type", "any"))
        parts.append(f"{key}{'' if key in required else '?'}: {kind}")
    return "\n".join(parts)


async def _list_events(
    cfg: AgentwakeConfig, names: list[str]
) -> list[tuple[str, list[protocol.EventDescriptor]]]:
    listing = []
    for name in names:
        async with ServerConnection(name, cfg.servers[name]) as conn:
            listing.append((name, await conn.list_events()))
    return listing


def _open_store(cfg: AgentwakeConfig) -> Store:
    try:
        return Store.open_existing(cfg.store.path)
    except AgentwakeError as exc:
        raise _fail(exc) from None


@app.command()
def status(config: ConfigOption = DEFAULT_CONFIG_PATH, as_json: JsonOption = False) -> None:
    """Show each subscription: server, event, mode, cursor, last poll, counts, gaps and last error."""
    cfg = _load(config)
    store = _open_store(cfg)
    try:
        rows = store.subscriptions_sync()
    finally:
        store.close_sync()
    configured = {s.name for s in cfg.subscriptions}
    for row in rows:
        row["configured"] = row["subscription"] in configured
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    table = Table(title="Subscriptions")
    columns = (
        "subscription",
        "server",
        "event",
        "mode",
        "status",
        "cursor",
        "last poll",
        "received",
        "dups",
        "gaps",
    )
    for column in columns:
        table.add_column(column, overflow="fold")
    table.add_column("last error", overflow="fold", style="red")
    for r in rows:
        table.add_row(
            r["subscription"] + ("" if r["configured"] else " (not in config)"),
            r["server"],
            r["event"],
            r["mode"] or "-",
            r["status"],
            r["cursor"] or "-",
            r["last_poll_at"] or "never",
            str(r["events_received"]),
            str(r["duplicates"]),
            str(r["gaps"]),
            r["last_error"] or "",
        )
    out.print(table)


@app.command()
def inbox(
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="How many events, newest first.")] = 20,
    state: Annotated[
        str | None, typer.Option(help="Only events in this state (pending, done, failed, ...).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Show the most recent events in the inbox, newest first."""
    cfg = _load(config)
    store = _open_store(cfg)
    try:
        rows = store.inbox_sync(limit, state=state)
    finally:
        store.close_sync()
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2, ensure_ascii=False) + "\n")
        return
    table = Table(title=f"Inbox (newest {limit})")
    for column in ("received", "subscription", "event", "event id", "state", "data"):
        table.add_column(column, overflow="fold")
    for r in rows:
        data = json.dumps(r["data"], ensure_ascii=False)
        table.add_row(
            r["received_at"],
            r["subscription"],
            r["event"],
            r["event_id"],
            r["state"],
            data if len(data) <= 120 else data[:119] + "…",
        )
    out.print(table)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
