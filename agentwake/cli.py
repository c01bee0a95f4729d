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
import anyio.abc
import typer
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

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
# No markup anywhere: events, tool results and error messages are untrusted text, and "[agent]" or
# "[/INST]" in them must print as written. Styles are applied with Text, not with tags.
out = Console(markup=False)
err = Console(stderr=True, markup=False)


class PlainTable(Table):
    """A table whose cells and title are plain text, never rich markup (they hold upstream text)."""

    def __init__(self, *args: Any, title: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, title=Text(title) if title is not None else None, **kwargs)
        self.records: list[tuple[Any, ...]] = []

    def add_row(self, *cells: Any, **kwargs: Any) -> None:
        texts = tuple(Text(c) if isinstance(c, str) else c for c in cells)
        self.records.append(texts)
        super().add_row(*texts, **kwargs)


UNBOUNDED_WIDTH = 100_000


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


def _styled(label: str, style: str, rest: object) -> Text:
    return Text.assemble((label, style), f" {rest}")


ConfigOption = Annotated[
    Path,
    typer.Option("--config", "-c", help="Config file; relative paths in it resolve against its folder."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON array instead of a table.")]


def _load(path: Path) -> AgentwakeConfig:
    try:
        return load_config(path)
    except ConfigError as exc:
        err.print(_styled("error:", "red", exc), highlight=False)
        raise typer.Exit(2) from None


def _fail(exc: AgentwakeError, code: int = 1) -> typer.Exit:
    err.print(_styled("error:", "red", exc), highlight=False)
    return typer.Exit(code)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
    )
    from agentwake.logs import install_redaction

    for handler in logging.getLogger().handlers:
        install_redaction(handler)
    # The SDK and HTTP clients are chatty at INFO; their problems reach us as errors anyway.
    for noisy in ("mcp", "httpx", "httpx2", "httpcore", "LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
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
    except BaseExceptionGroup as group:
        # A start-up failure inside a task group (say the webhook port is taken) comes out wrapped.
        leaf = _single_leaf(group)
        if isinstance(leaf, AgentwakeError):
            raise _fail(leaf) from None
        raise


def _single_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _config_dir(cfg: AgentwakeConfig) -> Path:
    return cfg.source.parent.resolve() if cfg.source else Path.cwd()


def _agent_for(cfg: AgentwakeConfig, store: Store) -> tuple[Any, Any, Any]:
    """The agent runner, its connection pool and the policy, or Nones without an [agent] section.

    Imports stay inside, so ``agentwake --help`` stays quick; litellm itself is only ever
    imported by the agent stage (``agentwake.agent.llm``).
    """
    if cfg.agent is None:
        return None, None, None
    from agentwake.agent.prompts import PromptRenderer
    from agentwake.agent.runner import AgentRunner
    from agentwake.agent.tools import ConnectionPool
    from agentwake.policy import load_policy

    renderer = PromptRenderer(cfg.agent, cfg.sanitize)
    policy = load_policy(cfg.policy.dir, cfg.policy.default, base=_config_dir(cfg))
    renderer.check(
        [renderer.template_for(s, s.event) for s in cfg.subscriptions if s.agent]
        + [r.rule.prompt for r in policy.rules if r.rule.prompt]
    )
    pool = ConnectionPool(call_timeout_s=cfg.agent.request_timeout_s)
    return AgentRunner(cfg, cfg.agent, store, pool, renderer), pool, policy


async def _run_service(cfg: AgentwakeConfig) -> None:
    store = await Store.open(cfg.store.path, synchronous=cfg.store.synchronous)
    try:
        runner, pool, policy = _agent_for(cfg, store)
    except AgentwakeError:
        await store.close()
        raise
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
    if runner is None:
        logger.warning("no [agent] section: events are logged and marked done, no agent runs")
    else:
        logger.info(
            "agent: model %s, up to %d run(s) at a time",
            cfg.agent.model if cfg.agent else "-",
            runner.agent.concurrency,
        )
    try:
        async with anyio.create_task_group() as tg:

            async def stop_on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for signum in signals:
                        logger.info("received %s: stopping", signal.Signals(signum).name)
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(stop_on_signal)
            supervisor = Supervisor(cfg, store, agent=runner, pool=pool)
            if policy is not None:
                supervisor.policy = policy
                # Started (SIGHUP handled) before the log line that says the policy is in force.
                await tg.start(_watch_policy, cfg, supervisor, runner)
                logger.info(
                    "policy: %d rule(s) from %d file(s) in %s; default %s",
                    len(policy.rules),
                    len(policy.files),
                    cfg.policy.dir,
                    policy.default,
                )
            await tg.start(supervisor.run)
    finally:
        with anyio.CancelScope(shield=True):
            await store.close()
        logger.info("agentwake stopped; cursors are saved in %s", cfg.store.path)


POLICY_POLL_S = 2.0


async def _watch_policy(
    cfg: AgentwakeConfig,
    supervisor: Supervisor,
    runner: Any,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Reload the policy on SIGHUP, and when a policy file changes (checked every POLICY_POLL_S)."""
    from agentwake.policy import PolicyReloader, load_policy

    def load() -> Any:
        policy = load_policy(cfg.policy.dir, cfg.policy.default, base=_config_dir(cfg))
        runner.renderer.check([r.rule.prompt for r in policy.rules if r.rule.prompt])
        return policy

    def apply(policy: Any) -> None:
        supervisor.policy = policy

    reloader = PolicyReloader(cfg.policy.dir, load, apply, supervisor.policy, base=_config_dir(cfg))
    with anyio.open_signal_receiver(signal.SIGHUP) as signals:
        async with anyio.create_task_group() as tg:

            async def on_sighup() -> None:
                async for _ in signals:
                    reloader.reload(reason="SIGHUP")

            tg.start_soon(on_sighup)
            task_status.started()
            await _poll_policy(reloader)


async def _poll_policy(reloader: Any) -> None:
    while True:
        await anyio.sleep(POLICY_POLL_S)
        if reloader.changed():
            reloader.reload(reason="a policy file changed")


@app.command()
def check(config: ConfigOption = DEFAULT_CONFIG_PATH) -> None:
    """Validate the config, connect to every server and show each subscription's delivery mode and tools.

    Exits non-zero, with one message per problem, if the config is invalid, a
    prompt template is broken, a server cannot be reached, or a subscription
    cannot run. A tool glob that matches no tool is reported as a warning.
    """
    cfg = _load(config)
    _setup_logging("WARNING")
    problems, warnings, rows = anyio.run(_check, cfg)
    table = PlainTable(title=f"Subscriptions in {config}")
    for column in ("subscription", "server", "event", "mode", "agent tools", "status"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    print_table(table, out)
    for warning in warnings:
        err.print(_styled("warning:", "yellow", warning), highlight=False)
    for problem in problems:
        err.print(_styled("error:", "red", problem), highlight=False)
    if problems:
        raise typer.Exit(1)
    model = f", agent model {cfg.agent.model}" if cfg.agent else ", no [agent]: events are only logged"
    out.print(f"config OK: {len(cfg.servers)} server(s), {len(cfg.subscriptions)} subscription(s){model}")


async def _check(cfg: AgentwakeConfig) -> tuple[list[str], list[str], list[tuple[str, ...]]]:
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
                descriptors = {d.name: d for d in await conn.list_events()}
                tools = await conn.list_tools() if cfg.agent is not None else []
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


def _allowed_tools(sub: Any, catalog: list[str], cfg: AgentwakeConfig, warnings: list[str]) -> str:
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
    table = PlainTable(title="Event types")
    for column in ("server", "event", "delivery", "arguments", "description"):
        table.add_column(column, overflow="fold")
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
    """Show each subscription: server, event, mode, cursor, last poll, counts, gaps, failed events, last error
    and, for webhook delivery, the subscription id, when it is refreshed next and the delivery status.
    """
    cfg = _load(config)
    store = _open_store(cfg)
    try:
        rows = store.subscriptions_sync()
        counts = store.run_counts_sync()
    finally:
        store.close_sync()
    configured = {s.name for s in cfg.subscriptions}
    for row in rows:
        row["configured"] = row["subscription"] in configured
        mine = counts.get(row["subscription"], {})
        for state in ("pending", "processing", "done", "failed", "ignored"):
            row[f"events_{state}"] = mine.get(f"events_{state}", 0)
        for run_status in ("completed", "failed", "interrupted", "running"):
            row[f"runs_{run_status}"] = mine.get(f"runs_{run_status}", 0)
        row["last_failure"] = mine.get("last_failure")
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    print_status(rows, out)


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
    table = PlainTable(title="Subscriptions")
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
        "done",
        "failed",
        "webhook",
    )
    for column in columns:
        table.add_column(column, overflow="fold")
    table.add_column("last error", overflow="fold", style="red")
    for r in rows:
        table.add_row(
            _subscription_label(r),
            r["server"],
            r["event"],
            r["mode"] or "-",
            r["status"],
            r["cursor"] or "-",
            r["last_poll_at"] or "never",
            str(r["events_received"]),
            str(r["duplicates"]),
            str(r["gaps"]),
            str(r["events_done"]),
            str(r["events_failed"]),
            _describe_webhook(r["webhook"]),
            r["last_error"] or r["last_failure"] or "",
        )
    return table


def _status_block(r: dict[str, Any]) -> Table:
    block = PlainTable.grid(padding=(0, 2))
    block.add_column(no_wrap=True)
    block.add_column(overflow="fold")
    block.add_row(
        Text(_subscription_label(r), style="bold"),
        " · ".join((r["server"], r["event"], r["mode"] or "-", r["status"])),
    )
    block.add_row("  cursor", f"{r['cursor'] or '-'} (last poll {r['last_poll_at'] or 'never'})")
    block.add_row(
        "  events",
        f"{r['events_received']} received, {r['duplicates']} duplicates, {r['gaps']} gaps;"
        f" {r['events_done']} done, {r['events_failed']} failed",
    )
    if r["webhook"] is not None:
        block.add_row("  webhook", _describe_webhook(r["webhook"]).replace("\n", " · "))
    last_error = r["last_error"] or r["last_failure"]
    if last_error:
        block.add_row("  last error", Text(last_error, style="red"))
    return block


def _subscription_label(r: dict[str, Any]) -> str:
    return str(r["subscription"]) + ("" if r["configured"] else " (not in config)")


def _describe_webhook(webhook: dict[str, Any] | None) -> str:
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
    return "\n".join(lines)


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
    table = PlainTable(title=f"Inbox (newest {limit})")
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
    print_table(table, out)


@app.command()
def actions(
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="How many runs, newest first.")] = 20,
    as_json: JsonOption = False,
) -> None:
    """Show the action log: the most recent agent runs, with their tool calls and outcome."""
    cfg = _load(config)
    store = _open_store(cfg)
    try:
        rows = store.actions_sync(limit)
    finally:
        store.close_sync()
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2, ensure_ascii=False) + "\n")
        return
    table = PlainTable(title=f"Agent runs (newest {limit})")
    for column in (
        "run",
        "started",
        "subscription",
        "event id",
        "kind",
        "try",
        "status",
        "tools",
        "tokens",
        "ms",
    ):
        table.add_column(column, overflow="fold")
    table.add_column("reason", overflow="fold", style="red")
    for r in rows:
        tools = ", ".join(r["tools"]) or "-"
        if r["refused"]:
            tools += f" ({r['refused']} refused)"
        table.add_row(
            str(r["run_id"]),
            r["started_at"],
            r["subscription"],
            r["event_id"],
            r["kind"],
            str(r["attempt"]),
            r["status"],
            tools,
            str(r["prompt_tokens"] + r["completion_tokens"]),
            str(r["duration_ms"] if r["duration_ms"] is not None else "-"),
            r["reason"] or "",
        )
    print_table(table, out)


ServerOption = Annotated[
    str | None,
    typer.Option("--server", "-s", help="The server the event came from, if the id is on several."),
]


def _find_event(store: Store, event_id: str, server: str | None) -> dict[str, Any]:
    found = store.find_events_sync(event_id, server)
    if not found:
        raise _fail(
            AgentwakeError(
                f"no event with id {event_id!r} in the inbox" + (f" from {server!r}" if server else "")
            )
        )
    if len(found) > 1:
        servers = ", ".join(e["server"] for e in found)
        raise _fail(
            AgentwakeError(f"event id {event_id!r} is on several servers ({servers}); pass --server"), 2
        )
    return found[0]


@app.command()
def show(
    event_id: Annotated[
        str, typer.Argument(help="The eventId, as in 'agentwake inbox' or 'agentwake actions'.")
    ],
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    server: ServerOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Show one event: its data, the decision taken, and the full transcript of every agent run."""
    cfg = _load(config)
    store = _open_store(cfg)
    try:
        event = _find_event(store, event_id, server)
    finally:
        store.close_sync()
    if as_json:
        sys.stdout.write(json.dumps(event, indent=2, ensure_ascii=False) + "\n")
        return
    out.rule(f"event {event['event_id']}")
    out.print(
        f"{event['event']} from {event['server']} (subscription {event['subscription']}), "
        f"at {event['timestamp']}, received {event['received_at']}",
        highlight=False,
    )
    out.print(
        f"state: {event['state']}, attempts: {event['attempts']}"
        + (f", error: {event['last_error']}" if event["last_error"] else ""),
        highlight=False,
    )
    out.print_json(json.dumps(event["data"], ensure_ascii=False))
    if not event["runs"]:
        out.print("no agent run yet")
    for run in event["runs"]:
        _print_run(run)


def _print_run(run: dict[str, Any]) -> None:
    out.rule(f"run {run['run_id']} ({run['kind']}, attempt {run['attempt']}): {run['status']}")
    decision = run["decision"]
    out.print(f"decision: {decision.get('action')}: {decision.get('why')}", highlight=False)
    out.print(
        f"model: {run['model']}; allowed tools: {', '.join(decision.get('tools') or []) or 'none'}",
        highlight=False,
    )
    cost = f", cost ${run['cost_usd']:.6f}" if run.get("cost_usd") is not None else ""
    out.print(
        f"steps: {run['steps']}, tokens: {run['prompt_tokens']} in / {run['completion_tokens']} out{cost}, "
        f"duration: {run['duration_ms'] if run['duration_ms'] is not None else '-'} ms",
        highlight=False,
    )
    if run["reason"]:
        out.print(_styled("reason:", "red", run["reason"]), highlight=False)
    for message in run["messages"]:
        role = message.get("role", "?")
        out.print(
            Text.assemble(
                (str(role), "bold"), f" ({message['tool_call_id']})" if message.get("tool_call_id") else ""
            )
        )
        if message.get("content"):
            out.print(message["content"], markup=False, highlight=False)
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            out.print(
                f"  -> {function.get('name')}({function.get('arguments')})  [{call.get('id')}]",
                markup=False,
                highlight=False,
            )
    if run["tool_calls"]:
        table = PlainTable(title="tool calls")
        for column in ("step", "tool", "status", "arguments", "result", "ms"):
            table.add_column(column, overflow="fold")
        for call in run["tool_calls"]:
            result = call["result"] or ""
            table.add_row(
                str(call["step"]),
                call["tool"],
                call["status"],
                json.dumps(call["arguments"], ensure_ascii=False),
                result if len(result) <= 200 else result[:199] + "…",
                str(call["duration_ms"] if call["duration_ms"] is not None else "-"),
            )
        print_table(table, out)


@app.command()
def replay(
    event_id: Annotated[str, typer.Argument(help="The eventId of a stored event.")],
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    server: ServerOption = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Call the LLM but send no tool call to any server; print the planned calls."
        ),
    ] = False,
) -> None:
    """Run the agent again on a stored event and print the transcript; recorded in the action log.

    The event's state is not changed. With --dry-run every tool call the model
    asks for is recorded as planned and answered "not sent"; nothing reaches a server.
    """
    cfg = _load(config)
    _setup_logging(cfg.log.level if cfg.log.level != "INFO" else "WARNING")
    if cfg.agent is None:
        raise _fail(ConfigError(f"{config} has no [agent] section; add one with at least 'model'"), 2)
    store = _open_store(cfg)
    try:
        row = _find_event(store, event_id, server)
    except typer.Exit:
        store.close_sync()
        raise
    store.close_sync()
    try:
        result = anyio.run(_replay, cfg, row["id"], dry_run)
    except AgentwakeError as exc:
        raise _fail(exc) from None
    _print_run(result)
    if dry_run:
        planned = [c for c in result["tool_calls"] if c["status"] == "planned"]
        out.print(f"dry run: {len(planned)} planned tool call(s), none sent:")
        for call in planned:
            out.print(
                f"  {call['tool']}({json.dumps(call['arguments'], ensure_ascii=False)})",
                markup=False,
                highlight=False,
            )
    if result["status"] != "completed":
        raise typer.Exit(1)


async def _replay(cfg: AgentwakeConfig, row_id: int, dry_run: bool) -> dict[str, Any]:
    from agentwake.agent.replay import replay as replay_event

    store = await Store.open(cfg.store.path, synchronous=cfg.store.synchronous)
    try:
        result = await replay_event(cfg, store, row_id, dry_run=dry_run)
        run: dict[str, Any] = next(
            r
            for e in store.find_events_sync_by_row(row_id)
            for r in e["runs"]
            if r["run_id"] == result.run_id
        )
    finally:
        await store.close()
    return run


policy_app = typer.Typer(
    help="Check policy files, and see what they decide for a sample event.", no_args_is_help=True
)
app.add_typer(policy_app, name="policy")


def _load_policy(cfg: AgentwakeConfig) -> Any:
    from agentwake.policy import load_policy

    try:
        return load_policy(cfg.policy.dir, cfg.policy.default, base=_config_dir(cfg))
    except AgentwakeError as exc:
        raise _fail(exc, 2) from None


@policy_app.command("check")
def policy_check(config: ConfigOption = DEFAULT_CONFIG_PATH) -> None:
    """Validate every policy file; errors name the file, the line and the rule."""
    cfg = _load(config)
    policy = _load_policy(cfg)
    if not policy.files:
        out.print(
            f"no policy files in {cfg.policy.dir}: every event gets the default action {policy.default!r}"
        )
        return
    table = PlainTable(title=f"Rules in {cfg.policy.dir}, in evaluation order")
    for column in ("#", "rule", "where", "action", "tools", "match"):
        table.add_column(column, overflow="fold")
    for index, loaded in enumerate(policy.rules, start=1):
        rule = loaded.rule
        conditions = [f"{c.field} {c.op} {c.value!r}" for c in rule.match.conditions()]
        table.add_row(
            str(index),
            rule.name,
            loaded.where,
            rule.action,
            "-"
            if rule.action not in ("agent", "approve")
            else ", ".join(rule.tools)
            if rule.tools is not None
            else "(subscription's)",
            "\n".join(conditions) or "(every event)",
        )
    print_table(table, out)
    out.print(
        f"policy OK: {len(policy.rules)} rule(s) in {len(policy.files)} file(s); default action {policy.default!r}"
    )


@policy_app.command("test")
def policy_test(
    event_file: Annotated[
        Path,
        typer.Argument(
            help="A JSON file: an event ({name, data, ...}) or just its data (then pass --event)."
        ),
    ],
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    server: Annotated[str | None, typer.Option("--server", help="The server it came from.")] = None,
    subscription: Annotated[
        str | None,
        typer.Option("--subscription", help="The subscription it came through (sets server and event)."),
    ] = None,
    event_name: Annotated[
        str | None, typer.Option("--event", help="Its event name, if the file holds only data.")
    ] = None,
    offline: Annotated[
        bool,
        typer.Option(
            "--offline", help="Do not ask the servers for their tools (the prompt then lists none)."
        ),
    ] = False,
) -> None:
    """Show which rule matches a sample event and why, the exact sanitized prompt, and the tools allowed.

    No LLM is called and no tool runs. The configured servers are asked for their
    tool lists (as a run would see them), unless --offline.
    """
    cfg = _load(config)
    policy = _load_policy(cfg)
    try:
        raw = json.loads(event_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _fail(AgentwakeError(f"no such file: {event_file}"), 2) from None
    except ValueError as exc:
        raise _fail(AgentwakeError(f"{event_file} is not valid JSON: {exc}"), 2) from None
    if not isinstance(raw, dict):
        raise _fail(AgentwakeError(f"{event_file} must hold a JSON object"), 2)
    sub = None
    if subscription is not None:
        try:
            sub = cfg.subscription(subscription)
        except ConfigError as exc:
            raise _fail(exc, 2) from None
    is_event = "data" in raw and isinstance(raw.get("data"), dict)
    data = raw["data"] if is_event else raw
    name = event_name or (raw.get("name") if is_event else None) or (sub.event if sub else None)
    if not name:
        raise _fail(
            AgentwakeError(
                'the event has no name: put "name" in the file, or pass --event or --subscription'
            ),
            2,
        )
    from agentwake.agent.prompts import PromptRenderer
    from agentwake.store import InboxEvent
    from agentwake.supervisor import policy_view

    event = InboxEvent(
        0,
        server or (sub.server if sub else str(raw.get("server", "?"))),
        sub.name if sub else str(raw.get("subscription", "?")),
        str(name),
        str(raw.get("eventId") or raw.get("event_id") or "sample"),
        str(raw.get("timestamp") or "1970-01-01T00:00:00Z"),
        data,
        1,
    )
    agent_cfg = cfg.agent
    renderer = PromptRenderer(agent_cfg, cfg.sanitize) if agent_cfg else None
    from agentwake.sanitize import sanitize as clean

    cleaned = renderer.clean(data) if renderer else clean(data)
    decision = policy.decide(policy_view(event, cleaned.injection_score))
    out.rule("decision")
    out.print(Text.assemble("action: ", (decision.action, "bold")), highlight=False)
    out.print(f"rule: {decision.rule}" + (f" ({decision.where})" if decision.where else ""), highlight=False)
    out.print(f"why: {decision.why}", highlight=False)
    out.print(
        f"injection score: {cleaned.injection_score}"
        + (f" ({', '.join(cleaned.injection_signals)})" if cleaned.injection_signals else ""),
        highlight=False,
    )
    if cleaned.cuts or cleaned.redactions or cleaned.removed_characters:
        out.print(
            f"sanitized: {cleaned.removed_characters} invisible/control character(s) removed; "
            f"redactions {cleaned.redactions or 'none'}; cuts {cleaned.cuts or 'none'}",
            highlight=False,
        )
    if decision.action not in ("agent", "approve"):
        out.print("the agent would not run for this event")
        return
    if decision.action == "approve":
        out.print("the event would be held until a person approves it (agentwake approve); then:")
    globs = decision.tools if decision.tools is not None else (sub.tools if sub else [])
    if renderer is None or agent_cfg is None:
        out.rule("tools allowed")
        out.print(", ".join(globs) if globs else "none", highlight=False)
        out.print("no [agent] section: no prompt to show")
        return
    plan, unreachable = anyio.run(_plan_for_test, cfg, renderer, event, decision, cleaned, offline)
    out.rule("tools allowed")
    out.print(f"allowlist: {', '.join(globs) if globs else 'none'}", highlight=False)
    if offline:
        out.print("--offline: no server was asked for its tools; the prompt lists none", highlight=False)
    else:
        out.print(f"matching tools: {', '.join(s.exposed for s in plan.allowed) or 'none'}", highlight=False)
    for problem in unreachable:
        err.print(_styled("warning:", "yellow", f"{problem}; its tools are missing above"), highlight=False)
    out.print(f"model: {plan.model}", highlight=False)
    if plan.prompt is None:
        raise _fail(AgentwakeError(plan.prompt_error or "the prompt could not be rendered"))
    # The prompts exactly as the model would get them: no wrapping, no markup.
    out.rule(f"system prompt ({agent_cfg.system_prompt})")
    sys.stdout.write(plan.prompt.system)
    out.rule(f"user prompt ({plan.prompt.template})")
    sys.stdout.write(plan.prompt.user)


async def _plan_for_test(
    cfg: AgentwakeConfig, renderer: Any, event: Any, decision: Any, cleaned: Any, offline: bool
) -> tuple[Any, list[str]]:
    """The runner's own preparation, with the servers' live tools unless offline."""
    from contextlib import AsyncExitStack
    from typing import cast

    from agentwake.agent.runner import AgentRunner
    from agentwake.agent.tools import ConnectionPool

    assert cfg.agent is not None
    pool = ConnectionPool()
    unreachable: list[str] = []
    async with AsyncExitStack() as stack:
        if not offline:
            for name, server in cfg.servers.items():
                try:
                    conn = await stack.enter_async_context(ServerConnection(name, server))
                except AgentwakeError as exc:
                    unreachable.append(str(exc))
                    continue
                await pool.attach(conn)
        # prepare() reads config, tools and templates only; it never touches the store.
        runner = AgentRunner(cfg, cfg.agent, cast(Store, None), pool, renderer)
        return runner.prepare(event, rule=decision, cleaned=cleaned), unreachable


@app.command()
def approvals(
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    as_json: JsonOption = False,
) -> None:
    """List the events held for approval by an 'approve' rule, oldest first."""
    cfg = _load(config)
    store = _open_store(cfg)
    try:
        held = store.approvals_sync()
    finally:
        store.close_sync()
    if as_json:
        sys.stdout.write(json.dumps(held, indent=2, ensure_ascii=False) + "\n")
        return
    if not held:
        out.print("no event is waiting for approval")
        return
    table = PlainTable(title="Held for approval")
    for column in ("event id", "server", "subscription", "event", "received", "rule", "why", "data"):
        table.add_column(column, overflow="fold")
    for h in held:
        data = json.dumps(h["data"], ensure_ascii=False)
        decision = h["decision"] or {}
        table.add_row(
            h["event_id"],
            h["server"],
            h["subscription"],
            h["event"],
            h["received_at"],
            str(decision.get("rule")),
            str(decision.get("why")),
            data if len(data) <= 120 else data[:119] + "…",
        )
    print_table(table, out)


def _answer(config: Path, event_id: str, server: str | None, *, approve: bool, note: str | None) -> None:
    cfg = _load(config)
    store = _open_store(cfg)
    try:
        row = _find_event(store, event_id, server)
        try:
            store.answer_sync(row["id"], approve=approve, note=note)
        except AgentwakeError as exc:
            raise _fail(AgentwakeError(f"event {event_id!r}: {exc}")) from None
    finally:
        store.close_sync()
    if approve:
        out.print(f"approved {event_id}: the running service will run the agent on it")
    else:
        out.print(f"denied {event_id}" + (f": {note}" if note else ""))


@app.command()
def approve(
    event_id: Annotated[str, typer.Argument(help="The eventId of a held event (see 'agentwake approvals').")],
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    server: ServerOption = None,
    note: Annotated[str | None, typer.Option("--note", help="Recorded with the approval.")] = None,
) -> None:
    """Approve a held event: it goes back to the inbox and the agent runs on it, with the rule's tools."""
    _answer(config, event_id, server, approve=True, note=note)


@app.command()
def deny(
    event_id: Annotated[str, typer.Argument(help="The eventId of a held event (see 'agentwake approvals').")],
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    server: ServerOption = None,
    reason: Annotated[str | None, typer.Option("--reason", help="Why; recorded with the event.")] = None,
) -> None:
    """Deny a held event: the agent never runs on it, and the reason is recorded."""
    _answer(config, event_id, server, approve=False, note=reason)


@app.command("rotate-secret")
def rotate_secret(
    subscription: Annotated[
        str | None,
        typer.Argument(help="The webhook subscription to rotate; every webhook subscription when omitted."),
    ] = None,
    config: ConfigOption = DEFAULT_CONFIG_PATH,
) -> None:
    """Give webhook subscriptions a new signing secret.

    The new secret is stored now and sent on the next refresh (the running service
    looks every few seconds); deliveries signed with the old secret are still
    accepted for [webhook] rotation_grace_s after that. Secrets are never printed.
    """
    from agentwake.signing import generate_secret

    cfg = _load(config)
    store = _open_store(cfg)
    try:
        names = None if subscription is None else [subscription]
        rotated = store.request_rotation_sync(names, generate_secret)
    finally:
        store.close_sync()
    if not rotated:
        what = (
            f"no webhook subscription named {subscription!r}" if subscription else "no webhook subscription"
        )
        raise _fail(AgentwakeError(f"{what} in {cfg.store.path} (see 'agentwake status')"), 2)
    grace = cfg.webhook.rotation_grace_s if cfg.webhook else 0
    for name in rotated:
        out.print(
            f"{name}: new secret stored; sent on the next refresh, the old one accepted {grace:g}s after that",
            highlight=False,
        )


def main() -> None:
    app()


if __name__ == "__main__":
    main()
