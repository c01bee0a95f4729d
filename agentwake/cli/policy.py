"""``agentwake policy check`` and ``agentwake policy test``: the rules, and what they decide for a sample."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agentwake.cli.common import (
    DEFAULT_CONFIG_PATH,
    ConfigOption,
    app,
    fail,
    load,
    load_rules,
    policy_app,
    run_async,
    stdout,
    warn,
    without_ingress,
)
from agentwake.errors import AgentwakeError, ConfigError

if TYPE_CHECKING:
    from agentwake.agent.runner import RunPlan
    from agentwake.config import AgentwakeConfig, SubscriptionConfig
    from agentwake.decide import Outcome
    from agentwake.policy import Policy, Rule
    from agentwake.store import InboxEvent

app.add_typer(policy_app, name="policy")

RULE_COLUMNS = ("#", "rule", "where", "action", "tools", "match")
# The verdicts that lead to an agent run, now or later; flow control only paces those.
RUN_VERDICTS = ("run", "batched", "delay")
# What each verdict means for a sample event, before any plan is shown.
VERDICT_NOTES = {
    "hold": "the event would be held until a person approves it (agentwake approve); then:",
    "batched": "the event would open a debounce batch; when it closes the agent runs on the batch:",
}


@policy_app.command("check")
def policy_check(
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    offline: Annotated[
        bool,
        typer.Option(
            "--offline",
            help="Do not ask the servers for their tools and event types: rules' args are then checked"
            " for form only, not against the tools' arguments and the events' fields.",
        ),
    ] = False,
) -> None:
    """Validate every policy file; errors name the file, the line and the rule.

    Rules with args are also checked against what their servers declare (each tool's
    inputSchema, each event type's payloadSchema), unless --offline or a server's secrets are
    missing from the environment; a server that cannot be reached is left unjudged, with a warning.
    """
    cfg = load(config, secrets=False)
    policy = load_rules(cfg)
    if not offline and any(loaded.rule.args for loaded in policy.rules):
        problems = run_async(lambda: _args_against_servers(config, policy))
        if problems:
            for problem in problems:
                stdout().print(problem, markup=False, highlight=False)
            raise fail(AgentwakeError(f"{len(problems)} problem(s) with the rules' args"), 2)
    out = stdout()
    if not policy.rules:
        out.print(
            f"no policy rules in {cfg.policy.dir} (nor among the packaged policies): "
            f"every event gets the default action {policy.default!r}",
            markup=False,
            highlight=False,
        )
        return
    from agentwake.cli.tables import print_table, table_of

    table = table_of(f"Rules in {cfg.policy.dir}, in evaluation order", RULE_COLUMNS)
    for index, loaded in enumerate(policy.rules, start=1):
        rule = loaded.rule
        conditions = [f"{c.field} {c.op} {c.value!r}" for c in rule.match.conditions()]
        table.add_row(
            str(index),
            rule.name,
            loaded.where,
            rule.action,
            _rule_tools(rule),
            "\n".join(conditions) or "(every event)",
        )
    print_table(table, out)
    out.print(
        f"policy OK: {len(policy.rules)} rule(s) in {policy.files_summary()}; {policy.who_decides_the_rest()}",
        markup=False,
        highlight=False,
    )


async def _args_against_servers(config: Path, policy: Policy) -> list[str]:
    """The rules' ``args`` problems against the tools and event types of the servers they name."""
    import fnmatch

    from agentwake.authority import args_problems
    from agentwake.config import load_config
    from agentwake.mcp import ServerConnection

    try:
        cfg = load_config(config, secrets=True)
    except ConfigError:
        warn(
            "the servers were not asked for their tools (their ${VAR}s are missing): args checked for form only"
        )
        return []
    wanted: set[str] = set()
    for loaded in policy.rules:
        rule = loaded.rule
        if rule.args:
            wanted.update(tool.split("__", 1)[0] for tool in rule.args)
            wanted.update(
                n
                for n in cfg.servers
                if rule.match.server is None or fnmatch.fnmatchcase(n, rule.match.server)
            )
    tools: dict[str, dict[str, dict[str, Any]]] = {}
    payloads: dict[str, dict[str, dict[str, Any] | None]] = {}
    from agentwake.agent.tools import exposed_name

    for name in sorted(wanted & set(cfg.servers)):
        try:
            async with ServerConnection(name, without_ingress(cfg.servers[name])) as conn:
                try:
                    listed = await conn.list_tools()
                except AgentwakeError:
                    listed = []
                tools[name] = {exposed_name(name, t.name): dict(t.input_schema or {}) for t in listed}
                try:
                    conn.require_events()
                    payloads[name] = {d.name: d.payload_schema for d in await conn.list_events()}
                except AgentwakeError:
                    pass
        except AgentwakeError as exc:
            warn(f"{exc}; args naming its tools or events are not checked against them")
    problems: list[str] = []
    for loaded in policy.rules:
        rule = loaded.rule
        for problem in args_problems(
            rule.args,
            tools=tools,
            payloads=payloads,
            match_server=rule.match.server,
            match_event=rule.match.event,
        ):
            problems.append(f"{loaded.file}:{loaded.line}: rule {rule.name!r}: {problem}")
    return problems


def _rule_tools(rule: Rule) -> str:
    if rule.action not in ("agent", "approve"):
        return "-"
    return ", ".join(rule.tools) if rule.tools is not None else "(subscription's)"


@policy_app.command("test")
def policy_test(
    event_file: Annotated[
        Path,
        typer.Argument(
            help="A JSON file: an event ({name, data, ...}) or just its data (then pass --event)."
        ),
    ],
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            help="The server it came from (a name from [servers]); needed unless --subscription,"
            ' or "server" in the file, gives it.',
        ),
    ] = None,
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
            "--offline",
            help="Do not ask the servers for their tools (the prompt then lists none);"
            " their secrets ${VAR} need not be set.",
        ),
    ] = False,
) -> None:
    """Show which rule matches a sample event and why, the exact sanitized prompt, and the tools allowed.

    No LLM is called and no tool runs. The configured servers are asked for their
    tool lists (as a run would see them), unless --offline. They are started with
    AGENTWAKE_NO_INGRESS=1: a bridge (agentwake bridge) then binds no --listen port,
    opens no Socket Mode connection and does not poll, so it runs beside a running
    service.
    """
    from agentwake.clock import utc_now
    from agentwake.decide import NoHistory, decide

    # --offline talks to no server, so it needs none of their secrets (an unset ${VAR} stays as written).
    cfg = load(config, secrets=not offline)
    policy = load_rules(cfg)
    sub = None
    if subscription is not None:
        try:
            sub = cfg.subscription(subscription)
        except ConfigError as exc:
            raise fail(exc, 2) from None
    event = _sample_event(event_file, sub, server, event_name)
    if event.server not in cfg.servers:
        known = ", ".join(cfg.servers) or "none are configured"
        raise fail(
            ConfigError(f"no server named {event.server!r} in {config} (known: {known}); pass --server NAME"),
            2,
        )

    async def decided() -> Outcome:
        # NoHistory: the sample is the first event its rule's flow control has seen.
        return await decide(event, config=cfg, policy=policy, now=utc_now(), flow=NoHistory())

    outcome = run_async(decided)
    _print_decision(outcome, policy.rule(outcome.rule))
    if outcome.verdict in ("ignore", "log"):
        stdout().print("the agent would not run for this event")
        return
    if outcome.verdict in VERDICT_NOTES:
        stdout().print(VERDICT_NOTES[outcome.verdict])
    plan, unreachable = run_async(lambda: _plan_for_test(cfg, outcome, offline))
    _print_plan(cfg, plan, unreachable, offline)


def _sample_event(
    path: Path, sub: SubscriptionConfig | None, server: str | None, event_name: str | None
) -> InboxEvent:
    """The event in ``path`` as the inbox would hold it; a missing or bad file, no name or no server exits 2."""
    from agentwake.store import InboxEvent

    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise fail(AgentwakeError(f"no such file: {path}"), 2) from None
    except ValueError as exc:
        raise fail(AgentwakeError(f"{path} is not valid JSON: {exc}"), 2) from None
    if not isinstance(raw, dict):
        raise fail(AgentwakeError(f"{path} must hold a JSON object"), 2)
    is_event = "data" in raw and isinstance(raw.get("data"), dict)
    data = raw["data"] if is_event else raw
    name = event_name or (raw.get("name") if is_event else None) or (sub.event if sub else None)
    if not name:
        raise fail(
            AgentwakeError(
                'the event has no name: put "name" in the file, or pass --event or --subscription'
            ),
            2,
        )
    if not server and sub is not None:
        server = sub.server
    if not server and is_event and raw.get("server"):
        server = str(raw["server"])
    if not server:
        raise fail(
            AgentwakeError(
                "the event has no server: pass --server NAME (the server it came from), or --subscription,"
                ' or put "server" in the file'
            ),
            2,
        )
    return InboxEvent(
        0,
        server,
        sub.name if sub else str(raw.get("subscription", "?")),
        str(name),
        str(raw.get("eventId") or raw.get("event_id") or "sample"),
        str(raw.get("timestamp") or "1970-01-01T00:00:00Z"),
        data,
        1,
    )


def _print_decision(outcome: Outcome, rule: Rule | None) -> None:
    from rich.text import Text

    out = stdout()
    decision, cleaned = outcome.decision, outcome.cleaned
    out.rule("decision")
    out.print(Text.assemble("action: ", (decision.action, "bold")), highlight=False)
    out.print(f"verdict: {outcome.verdict}", highlight=False)
    out.print(f"rule: {decision.rule}" + (f" ({decision.where})" if decision.where else ""), highlight=False)
    out.print(f"why: {outcome.why}", highlight=False)
    if outcome.hook:
        out.print(f"hook: {outcome.hook}", highlight=False)
    if outcome.verdict in RUN_VERDICTS:
        flow = describe_flow(rule)
        out.print(f"flow control: {'; '.join(flow) or 'none'}", highlight=False)
        if flow:
            out.print(
                "  (a sample event is the first in its window: no earlier event counts against it)",
                highlight=False,
            )
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


def describe_flow(rule: Rule | None) -> list[str]:
    """A rule's flow control in words, one item per kind; empty without any."""
    if rule is None:
        return []
    found: list[str] = []
    if rule.dedup:
        found.append(f"dedup on {rule.dedup.key} within {rule.dedup.window_s:g}s")
    if rule.rate_limit:
        limit = rule.rate_limit
        per = f" per {limit.key}" if limit.key else ""
        found.append(f"at most {limit.max} run(s) per {limit.window_s:g}s{per}, then {limit.over_limit}")
    if rule.debounce:
        bounce = rule.debounce
        per = f" per {bounce.key}" if bounce.key else ""
        found.append(f"debounce {bounce.window_s:g}s{per} (up to {bounce.max_events} events in one run)")
    if rule.max_concurrent:
        found.append(f"at most {rule.max_concurrent} run(s) at a time")
    return found


async def _plan_for_test(cfg: AgentwakeConfig, outcome: Outcome, offline: bool) -> tuple[RunPlan, list[str]]:
    """The runner's own preparation, with the servers' live tools unless offline."""
    from contextlib import AsyncExitStack
    from typing import cast

    from agentwake.agent.runner import AgentRunner
    from agentwake.agent.tools import ConnectionPool
    from agentwake.mcp import ServerConnection
    from agentwake.store import Store

    pool = ConnectionPool()
    unreachable: list[str] = []
    async with AsyncExitStack() as stack:
        if not offline:
            for name, server in cfg.servers.items():
                try:
                    conn = await stack.enter_async_context(ServerConnection(name, without_ingress(server)))
                except AgentwakeError as exc:
                    unreachable.append(str(exc))
                    continue
                await pool.attach(conn)
        # prepare() reads config, tools and templates only; it never touches the store.
        runner = AgentRunner.build(cfg, cast(Store, None), pool)
        return runner.prepare(outcome), unreachable


def _print_plan(cfg: AgentwakeConfig, plan: RunPlan, unreachable: list[str], offline: bool) -> None:
    out = stdout()
    out.rule("tools allowed")
    out.print(f"allowlist: {', '.join(plan.allowlist.globs) or 'none'}", highlight=False)
    if offline:
        out.print("--offline: no server was asked for its tools; the prompt lists none", highlight=False)
    else:
        out.print(f"matching tools: {', '.join(s.exposed for s in plan.allowed) or 'none'}", highlight=False)
    for problem in unreachable:
        warn(f"{problem}; its tools are missing above")
    # What each tool may be called with for this event: the rule's args, their pins filled in.
    names = [s.exposed for s in plan.allowed] if not offline else list(plan.allowlist.globs)
    schemas = {s.exposed: s.input_schema for s in plan.allowed}
    out.rule("arguments allowed")
    for line in plan.authority.describe(names, schemas):
        out.print(line, markup=False, highlight=False)
    out.print(f"model: {plan.model}", highlight=False)
    if plan.prompt is None:
        raise fail(AgentwakeError(plan.prompt_error or "the prompt could not be rendered"))
    # The prompts exactly as the model would get them: no wrapping, no markup.
    system = cfg.agent.system_prompt if cfg.agent else "-"
    out.rule(f"system prompt ({system})")
    sys.stdout.write(plan.prompt.system)
    out.rule(f"user prompt ({plan.prompt.template})")
    sys.stdout.write(plan.prompt.user)


__all__ = ["describe_flow", "policy_check", "policy_test"]
