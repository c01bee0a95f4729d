"""The commands that run the service or talk to its servers: run, check and events."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agentwake.cli.common import (
    DEFAULT_CONFIG_PATH,
    ConfigOption,
    JsonOption,
    app,
    error,
    fail,
    load,
    run_async,
    setup_logging,
    stdout,
    warn,
)
from agentwake.errors import AgentwakeError, ConfigError, EventsUnsupported

if TYPE_CHECKING:
    from agentwake import protocol
    from agentwake.config import AgentwakeConfig, SubscriptionConfig

CHECK_COLUMNS = ("subscription", "server", "event", "mode", "agent tools", "status")
EVENTS_COLUMNS = ("server", "event", "delivery", "arguments", "description")


@app.command()
def run(config: ConfigOption = DEFAULT_CONFIG_PATH) -> None:
    """Run the service in the foreground until SIGINT or SIGTERM.

    Connects to every configured server, polls each subscription into the SQLite
    inbox (cursor and events in one transaction) and hands new events to the
    processing stage. Stopping is clean: in-flight writes finish, cursors stay.
    """
    from agentwake.service import serve

    cfg = load(config)
    setup_logging(cfg.log.level)
    try:
        serve(cfg)
    except AgentwakeError as exc:
        raise fail(exc) from None


@app.command()
def check(config: ConfigOption = DEFAULT_CONFIG_PATH) -> None:
    """Validate the config, connect to every server and show each subscription's delivery mode and tools.

    Exits non-zero, with one message per problem, if the config is invalid, a
    prompt template is broken, a server cannot be reached, or a subscription
    cannot run. A tool glob that matches no tool is reported as a warning.
    """
    from agentwake.cli.tables import print_table, table_of

    cfg = load(config)
    setup_logging("WARNING")
    problems, warnings, rows = run_async(lambda: _check(cfg))
    table = table_of(f"Subscriptions in {config}", CHECK_COLUMNS)
    for row in rows:
        table.add_row(*row)
    out = stdout()
    print_table(table, out)
    for warning in warnings:
        warn(warning)
    for problem in problems:
        error(problem)
    if problems:
        raise typer.Exit(1)
    model = f", agent model {cfg.agent.model}" if cfg.agent else ", no [agent]: events are only logged"
    out.print(f"config OK: {len(cfg.servers)} server(s), {len(cfg.subscriptions)} subscription(s){model}")


async def _check(cfg: AgentwakeConfig) -> tuple[list[str], list[str], list[tuple[str, ...]]]:
    from agentwake.delivery.select import plan_subscription
    from agentwake.mcp import ServerConnection

    problems: list[str] = []
    warnings: list[str] = []
    rows: list[tuple[str, ...]] = []
    if cfg.agent is not None:
        from agentwake.agent.prompts import PromptRenderer

        renderer = PromptRenderer(cfg.agent)
        try:
            renderer.check([renderer.template_for(s, s.event) for s in cfg.subscriptions if s.agent])
        except AgentwakeError as exc:
            problems.append(str(exc))
    for server_name, server in cfg.servers.items():
        subs = [s for s in cfg.subscriptions if s.server == server_name]
        try:
            async with ServerConnection(server_name, server) as conn:
                conn.require_events()
                descriptors = {d.name: d for d in await conn.list_events()}
                tools = await conn.list_tools() if cfg.agent is not None else []
        except EventsUnsupported as exc:
            if subs:
                problems.append(str(exc))
            rows.extend((s.name, s.server, s.event, "-", "-", "unsupported") for s in subs)
            continue
        except AgentwakeError as exc:
            problems.append(str(exc))
            rows.extend((s.name, s.server, s.event, "-", "-", "server unreachable") for s in subs)
            continue
        catalog = _tool_catalog(server_name, tools)
        for sub in subs:
            allowed = _allowed_tools(sub, catalog, cfg, warnings)
            try:
                plan = plan_subscription(sub, descriptors, receiver=cfg.webhook is not None)
            except ConfigError as exc:
                problems.append(str(exc))
                rows.append((sub.name, sub.server, sub.event, "-", allowed, "invalid"))
                continue
            rows.append((sub.name, sub.server, sub.event, plan.mode, allowed, "ok"))
    return problems, warnings, rows


def _tool_catalog(server: str, tools: list[Any]) -> list[str]:
    from agentwake.agent.tools import exposed_name

    return [exposed_name(server, tool.name) for tool in tools]


def _allowed_tools(
    sub: SubscriptionConfig, catalog: list[str], cfg: AgentwakeConfig, warnings: list[str]
) -> str:
    if cfg.agent is None or not sub.agent:
        return "(no agent)"
    import fnmatch

    # Tools may live on other servers too; this checks the globs aimed at this one.
    for glob in sub.tools:
        if glob.split("__", 1)[0] in (sub.server, "*") and not fnmatch.filter(catalog, glob):
            warnings.append(
                f"subscription {sub.name!r}: tool glob {glob!r} matches no tool on {sub.server!r}"
            )
    allowed = [name for name in catalog if any(fnmatch.fnmatchcase(name, g) for g in sub.tools)]
    return "\n".join(allowed) if allowed else "none"


@app.command()
def events(
    server: Annotated[str | None, typer.Argument(help="Only this server (a name from [servers]).")] = None,
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    as_json: JsonOption = False,
) -> None:
    """List the event types each server offers: delivery modes and argument schemas."""
    cfg = load(config)
    setup_logging("WARNING")
    if server is not None and server not in cfg.servers:
        raise fail(
            ConfigError(f"no server named {server!r} in {config} (known: {', '.join(cfg.servers)})"), 2
        )
    names = [server] if server else list(cfg.servers)
    try:
        listing = run_async(lambda: _list_events(cfg, names))
    except AgentwakeError as exc:
        raise fail(exc) from None
    out = stdout()
    if as_json:
        payload = [
            {"server": name, **d.model_dump(by_alias=True, exclude_none=True)}
            for name, ds in listing
            for d in ds
        ]
        out.print_json(json.dumps(payload))
        return
    from agentwake.cli.tables import print_table, table_of

    table = table_of("Event types", EVENTS_COLUMNS)
    for name, descriptors in listing:
        for d in descriptors:
            table.add_row(
                name, d.name, ", ".join(d.delivery), _describe_schema(d.input_schema), d.description or ""
            )
    print_table(table, out)


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
    from agentwake.mcp import ServerConnection

    listing = []
    for name in names:
        async with ServerConnection(name, cfg.servers[name]) as conn:
            if len(names) > 1 and not conn.advertises_events:
                warn(
                    f"server {name!r} does not implement MCP Events (no events extension in its capabilities)"
                )
                continue
            conn.require_events()
            listing.append((name, await conn.list_events()))
    return listing


__all__ = ["check", "events", "run"]
