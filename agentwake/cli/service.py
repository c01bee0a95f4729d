"""The commands that run the service or talk to its servers: run, check and events."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agentwake.cli.checking import CheckReport, check_store
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
    without_ingress,
)
from agentwake.errors import AgentwakeError, ConfigError, EventsUnsupported

if TYPE_CHECKING:
    from pathlib import Path

    from agentwake import protocol
    from agentwake.config import AgentwakeConfig, SubscriptionConfig
    from agentwake.mcp import ServerConnection

CHECK_COLUMNS = ("subscription", "server", "event", "mode", "agent tools", "status")
EVENTS_COLUMNS = ("server", "event", "delivery", "arguments", "description")


@app.command()
def run(config: ConfigOption = DEFAULT_CONFIG_PATH) -> None:
    """Run the service in the foreground until SIGINT or SIGTERM.

    Connects to every configured server, polls each subscription into the SQLite
    inbox (cursor and events in one transaction) and hands new events to the
    processing stage. Stopping is clean: in-flight writes finish, cursors stay.
    Refuses to start (exit 2) when the agent's API key is not in the environment.
    """
    from agentwake.service import serve

    cfg = load(config)
    setup_logging(cfg.log.level, cfg.log.format)
    if cfg.agent is not None:
        from agentwake.agent.llm import require_api_keys

        try:
            require_api_keys(cfg)
        except ConfigError as exc:
            raise fail(exc, 2) from None
    try:
        serve(cfg)
    except AgentwakeError as exc:
        raise fail(exc) from None


@app.command()
def check(
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    as_json: Annotated[
        bool, typer.Option("--json", help='Print one JSON object: {"ok", "findings", "subscriptions"}.')
    ] = False,
) -> None:
    """Validate the config, connect to every server and show each subscription's delivery mode and tools.

    Exits non-zero, with one message per problem, if the config is invalid or
    empty, the store cannot be created or written, the agent's API key is not
    set, the model's api_base does not answer, the [service] listen port is
    taken, a prompt template or policy file is broken, a rule names a tool no
    server has, a server cannot be reached or does not implement MCP Events, or
    a subscription cannot run. A subscription's tool glob that matches no tool
    is a warning.

    Each stdio server is started with AGENTWAKE_NO_INGRESS=1: a bridge (agentwake
    bridge) then lists its tools and event types without binding --listen, opening
    Socket Mode or polling, so check runs beside a running service.
    """
    from agentwake.config import load_config

    try:
        cfg = load_config(config)
    except ConfigError as exc:
        if not as_json:
            raise fail(exc, 2) from None
        report = CheckReport()
        report.add("config", str(config), str(exc))
        _print_json(report)
        raise typer.Exit(2) from None
    setup_logging("WARNING")
    report = run_async(lambda: _check(cfg))
    if as_json:
        _print_json(report)
    else:
        _print_report(config, cfg, report)
    if not report.ok:
        raise typer.Exit(1)


def _print_json(report: CheckReport) -> None:
    sys.stdout.write(json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n")


def _print_report(path: Path, cfg: AgentwakeConfig, report: CheckReport) -> None:
    from agentwake.cli.tables import print_table, table_of

    out = stdout()
    if report.subscriptions:
        table = table_of(f"Subscriptions in {path}", CHECK_COLUMNS)
        for sub in report.subscriptions:
            tools = sub["tools"]
            shown = "(no agent)" if tools is None else "\n".join(tools) if tools else "none"
            table.add_row(sub["name"], sub["server"], sub["event"], sub["mode"] or "-", shown, sub["status"])
        print_table(table, out)
    for finding in report.findings:
        if finding.severity == "warning":
            warn(finding.message)
    for finding in report.findings:
        if finding.severity == "error":
            error(finding.message)
    if report.ok:
        model = f", agent model {cfg.agent.model}" if cfg.agent else ", no [agent]: events are only logged"
        out.print(
            f"config OK: {len(cfg.servers)} server(s), {len(cfg.subscriptions)} subscription(s){model}",
            highlight=False,
        )


async def _check(cfg: AgentwakeConfig) -> CheckReport:
    """Everything ``run`` needs, checked without starting it (or changing an existing store)."""
    import anyio

    from agentwake.delivery.identity import keys_problem

    report = CheckReport()
    _check_not_empty(cfg, report)
    _check_service(cfg, report)
    await anyio.to_thread.run_sync(check_store, cfg, report)
    rules = _check_prompts_and_policy(cfg, report)
    if cfg.agent is not None:
        # Without api_key_env, litellm says which variable a provider reads: a slow import.
        await anyio.to_thread.run_sync(_check_api_keys, cfg, [r.rule.model for r in rules], report)
        await _check_model_endpoint(cfg, [r.rule.model for r in rules], report)
    declared = Declared()
    catalogs = await _check_servers(cfg, report, declared)
    for name, server in cfg.servers.items():
        if server.webhook_identity != "off" and (problem := await keys_problem(name, server)):
            report.add("server", name, problem)
    if cfg.agent is not None:
        _check_tools(cfg, rules, catalogs, report)
        _check_args(cfg, rules, declared, report)
    return report


@dataclass
class Declared:
    """What the reached servers declare: tool input schemas and event payload schemas, by server."""

    tools: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    payloads: dict[str, dict[str, dict[str, Any] | None]] = field(default_factory=dict)


def _check_args(cfg: AgentwakeConfig, rules: list[Any], declared: Declared, report: CheckReport) -> None:
    """Each rule's and subscription's ``args`` against the tools' inputSchemas and the event types'
    payloadSchemas."""
    from agentwake.authority import args_problems

    for sub in cfg.subscriptions:
        for problem in args_problems(
            sub.args,
            tools=declared.tools,
            payloads=declared.payloads,
            match_server=sub.server,
            match_event=sub.event,
        ):
            report.add("subscription", sub.name, f"subscription {sub.name!r}: {problem}", server=sub.server)

    for loaded in rules:
        rule = loaded.rule
        if not rule.args:
            continue
        for problem in args_problems(
            rule.args,
            tools=declared.tools,
            payloads=declared.payloads,
            match_server=rule.match.server,
            match_event=rule.match.event,
        ):
            report.add(
                "policy",
                rule.name,
                f"{loaded.where}: rule {rule.name!r}: {problem}",
                rule=rule.name,
                file=str(loaded.file),
                line=loaded.line,
            )


def _check_service(cfg: AgentwakeConfig, report: CheckReport) -> None:
    """[service]: what ``run`` refuses (an endpoint reachable without a token, an unset token_env)."""
    if cfg.service.listen is None:
        return
    from agentwake.web.access import endpoint_settings

    try:
        settings = endpoint_settings(cfg.service)
    except ConfigError as exc:
        report.add("service", cfg.service.token_env or "listen", str(exc))
        return
    problem = _port_taken(settings.host, settings.port)
    if problem is not None:
        report.add(
            "service",
            "listen",
            f"[service] listen = {cfg.service.listen!r}: cannot listen there ({problem}); another"
            " process (an 'agentwake run' already?) has the port, or the address is not this host's",
        )


def _port_taken(host: str, port: int) -> str | None:
    """Why ``run`` could not listen on host:port (bound as aiohttp binds, then let go at once), or None."""
    import os
    import socket

    if port == 0:
        return None
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        return f"{host!r} does not resolve: {exc}"
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as sock:
            if os.name == "posix":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                return exc.strerror or str(exc)
    return None


# How long `check` waits for the model's endpoint to answer anything.
MODEL_PROBE_TIMEOUT_S = 5.0


async def _check_model_endpoint(
    cfg: AgentwakeConfig, rule_models: list[str | None], report: CheckReport
) -> None:
    """[agent] api_base: is anything answering there? One GET of its /models (no tokens spent); any
    HTTP answer, even 401 or 404, means it is up. Without api_base the provider's own API is not probed."""
    import httpx

    from agentwake.agent.llm import models_in_use
    from agentwake.config import OFFLINE_MODEL

    agent = cfg.agent
    if agent is None or not agent.api_base:
        return
    if not [m for m in models_in_use(cfg, rule_models) if m != OFFLINE_MODEL]:
        return
    url = agent.api_base.rstrip("/") + "/models"
    try:
        async with httpx.AsyncClient(timeout=MODEL_PROBE_TIMEOUT_S, trust_env=False) as client:
            await client.get(url)
    except httpx.HTTPError as exc:
        reason = str(exc) or type(exc).__name__
        report.add(
            "model",
            agent.api_base,
            f"[agent] api_base {agent.api_base}: the model's endpoint does not answer (GET {url}:"
            f" {type(exc).__name__}: {reason}); runs would fail until it does",
            model=agent.model,
        )


def _check_not_empty(cfg: AgentwakeConfig, report: CheckReport) -> None:
    if not cfg.servers:
        report.add(
            "config",
            "servers",
            "no servers are configured: add a [servers.NAME] table with 'command' (stdio) or 'url'"
            " (Streamable HTTP); 'run' would have nothing to connect to",
        )
    if not cfg.subscriptions:
        report.add(
            "config",
            "subscriptions",
            "no subscriptions are configured: add a [[subscriptions]] table with 'server' and 'event'"
            " ('agentwake events' lists what the servers offer); 'run' would receive nothing",
        )


def _check_api_keys(cfg: AgentwakeConfig, rule_models: list[str | None], report: CheckReport) -> None:
    """Each model's API key; and, as warnings, a model litellm cannot price or drive with native tools."""
    from agentwake.agent.llm import missing_api_keys, model_warnings, models_in_use

    assert cfg.agent is not None
    for missing in missing_api_keys(cfg.agent, models_in_use(cfg, rule_models)):
        report.add("api_key", ", ".join(missing.variables), str(missing), model=missing.model)
    for model, why in model_warnings(models_in_use(cfg, rule_models)):
        report.add("model_support", model, f"model {model}: {why}", severity="warning", model=model)


def _check_prompts_and_policy(cfg: AgentwakeConfig, report: CheckReport) -> list[Any]:
    """The prompt templates and policy files; the rules loaded (none when a file is broken)."""
    from agentwake.policy import load_policy

    renderer = None
    if cfg.agent is not None:
        from agentwake.agent.prompts import PromptRenderer

        renderer = PromptRenderer(cfg.agent, cfg.sanitize)
        try:
            renderer.check([renderer.template_for(s, s.event) for s in cfg.subscriptions if s.agent])
        except AgentwakeError as exc:
            report.add("prompt", str(cfg.agent.prompts), str(exc))
    from agentwake.service import config_dir

    try:
        policy = load_policy(cfg.policy.dir, cfg.policy.default, base=config_dir(cfg))
    except AgentwakeError as exc:
        for line in str(exc).splitlines():
            file = line.split(":", 1)[0]
            report.add("policy", file if file.endswith(".toml") else str(cfg.policy.dir), line)
        return []
    if renderer is not None:
        prompts = [(r, r.rule.prompt) for r in policy.rules if r.rule.prompt]
        _check_cache_points(cfg, renderer, [p for _, p in prompts], report)
        for loaded, prompt in prompts:
            try:
                renderer.check([prompt])
            except AgentwakeError as exc:
                report.add(
                    "policy",
                    loaded.rule.name,
                    f"{loaded.file}:{loaded.line}: rule {loaded.rule.name!r}: {exc}",
                    file=str(loaded.file),
                    line=loaded.line,
                )
    return list(policy.rules)


def _check_cache_points(
    cfg: AgentwakeConfig, renderer: Any, rule_prompts: list[str], report: CheckReport
) -> None:
    """A warning for each user prompt template without ``{{ cache_point }}`` while caching is on."""
    assert cfg.agent is not None
    if cfg.agent.prompt_cache != "auto":
        return
    names = [renderer.template_for(s, s.event) for s in cfg.subscriptions if s.agent] + rule_prompts
    try:
        missing = renderer.without_cache_point([n for n in names if renderer.has_template(n)])
    except Exception:  # a broken template is reported by the checks above
        return
    for name in missing:
        report.add(
            "prompt",
            name,
            f"prompt template {name!r} has no {{{{ cache_point }}}}: no run shares any of its text with the"
            " last, so providers cache none of the rule's instructions; put them first and the event after"
            ' {{ cache_point }} (README, "Prompt caching")',
            severity="warning",
        )


async def _check_servers(
    cfg: AgentwakeConfig, report: CheckReport, declared: Declared | None = None
) -> dict[str, list[str]]:
    """Connect to each server: its event types against its subscriptions, and its tools (the
    catalog of exposed names, by server; a server not reached has none)."""
    from agentwake.delivery.select import plan_subscription
    from agentwake.mcp import ServerConnection

    catalogs: dict[str, list[str]] = {}
    for server_name, server in cfg.servers.items():
        subs = [s for s in cfg.subscriptions if s.server == server_name]

        def row(sub: SubscriptionConfig, mode: str | None, status: str, message: str | None = None) -> None:
            tools: list[str] | None = None if cfg.agent is None or not sub.agent else []
            report.subscriptions.append(
                {
                    "name": sub.name,
                    "server": sub.server,
                    "event": sub.event,
                    "mode": mode,
                    "tools": tools,
                    "status": status,
                    **({"message": message} if message else {}),
                }
            )

        try:
            async with ServerConnection(server_name, without_ingress(server)) as conn:
                # Its tools stay usable by the agent even when it offers no events.
                tools = await _list_tools(conn, report) if cfg.agent is not None else {}
                catalogs[server_name] = list(tools)
                if declared is not None and cfg.agent is not None:
                    declared.tools[server_name] = tools
                conn.require_events()
                descriptors = {d.name: d for d in await conn.list_events()}
                if declared is not None:
                    declared.payloads[server_name] = {d.name: d.payload_schema for d in descriptors.values()}
        except EventsUnsupported as exc:
            if subs:
                report.add("server", server_name, str(exc))
            for sub in subs:
                row(sub, None, "unsupported", str(exc))
            continue
        except AgentwakeError as exc:
            report.add("server", server_name, str(exc))
            for sub in subs:
                row(sub, None, "server unreachable", str(exc))
            continue
        for sub in subs:
            try:
                plan = plan_subscription(sub, descriptors, receiver=cfg.webhook is not None)
            except ConfigError as exc:
                report.add("subscription", sub.name, str(exc), server=server_name)
                row(sub, None, "invalid", str(exc))
                continue
            row(sub, plan.mode, "ok")
    return catalogs


async def _list_tools(conn: ServerConnection, report: CheckReport) -> dict[str, dict[str, Any]]:
    """The server's tools as the agent sees them (input schemas by exposed name); a server that offers
    none (tools/list refused) has none."""
    from agentwake.agent.tools import exposed_name
    from agentwake.errors import ConnectionLost, DeliveryError

    try:
        tools = await conn.list_tools()
    except ConnectionLost:
        raise
    except DeliveryError as exc:
        report.add("server", conn.name, f"{exc}; its tools are not available to the agent", "warning")
        return {}
    return {exposed_name(conn.name, tool.name): dict(tool.input_schema or {}) for tool in tools}


def _unmatched(glob: str, cfg: AgentwakeConfig, catalogs: dict[str, list[str]]) -> tuple[str, str] | None:
    """Why ``glob`` matches no tool (and the server it is aimed at), or None when it matches one
    or cannot be judged (its server was not reached)."""
    import difflib
    import fnmatch

    aimed = glob.split("__", 1)[0] if "__" in glob else "*"
    servers = [name for name in cfg.servers if fnmatch.fnmatchcase(name, aimed)]
    if not servers:
        known = ", ".join(cfg.servers) or "none are configured"
        return aimed, f"names server {aimed!r}, which is not in [servers] ({known})"
    reached = [name for name in servers if name in catalogs]
    if any(fnmatch.filter(catalogs[name], glob) for name in reached):
        return None
    if len(reached) < len(servers):
        return None  # the tool may be on a server not reached (reported on its own)
    where = servers[0] if len(servers) == 1 else "any server"
    names = sorted(n for name in reached for n in catalogs[name])
    close = difflib.get_close_matches(glob, names, n=1, cutoff=0.6)
    if close:
        return where, f"matches no tool on {where!r}; did you mean {close[0]!r}?"
    return where, f"matches no tool on {where!r} (its tools: {', '.join(names[:8]) or 'none'})"


def _check_tools(
    cfg: AgentwakeConfig, rules: list[Any], catalogs: dict[str, list[str]], report: CheckReport
) -> None:
    """Each rule's tool globs must name tools that exist; a subscription's that match nothing warn.

    A rule whose ``match.server`` names no configured server can never match, so its tools are
    not checked: one policy folder may hold rules for servers only some configs have.
    """
    import fnmatch

    for loaded in rules:
        server_glob = loaded.rule.match.server
        if server_glob is not None and not any(
            fnmatch.fnmatchcase(name, server_glob) for name in cfg.servers
        ):
            continue
        for glob in loaded.rule.tools or []:
            unmatched = _unmatched(glob, cfg, catalogs)
            if unmatched is not None:
                server, why = unmatched
                report.add(
                    "tool",
                    glob,
                    f"{loaded.where}: rule {loaded.rule.name!r}: tool glob {glob!r} {why}",
                    rule=loaded.rule.name,
                    file=str(loaded.file),
                    line=loaded.line,
                    server=server,
                )
    by_name = {s["name"]: s for s in report.subscriptions}
    for sub in cfg.subscriptions:
        if not sub.agent:
            continue
        for glob in sub.tools:
            unmatched = _unmatched(glob, cfg, catalogs)
            if unmatched is not None:
                server, why = unmatched
                report.add(
                    "tool",
                    glob,
                    f"subscription {sub.name!r}: tool glob {glob!r} {why}",
                    "warning",
                    subscription=sub.name,
                    server=server,
                )
        shown = by_name.get(sub.name)
        if shown is not None:
            everything = [name for names in catalogs.values() for name in names]
            shown["tools"] = [n for n in everything if any(fnmatch.fnmatchcase(n, g) for g in sub.tools)]


@app.command()
def events(
    server: Annotated[str | None, typer.Argument(help="Only this server (a name from [servers]).")] = None,
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    as_json: JsonOption = False,
) -> None:
    """List the event types each server offers: delivery modes and argument schemas.

    Stdio servers are started with AGENTWAKE_NO_INGRESS=1, as by check: a bridge
    takes no events meanwhile.
    """
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
        async with ServerConnection(name, without_ingress(cfg.servers[name])) as conn:
            if len(names) > 1 and not conn.advertises_events:
                warn(
                    f"server {name!r} does not implement MCP Events (no events extension in its capabilities)"
                )
                continue
            conn.require_events()
            listing.append((name, await conn.list_events()))
    return listing


__all__ = ["CheckReport", "check", "events", "run"]
