"""``agentwake replay``: the agent again on a stored event, through the same decision as the service."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agentwake.cli.common import (
    DEFAULT_CONFIG_PATH,
    ConfigOption,
    ServerOption,
    app,
    fail,
    find_event,
    load,
    load_rules,
    setup_logging,
    short_look,
    stdout,
    warn,
    with_store,
)
from agentwake.errors import AgentwakeError, ConfigError

if TYPE_CHECKING:
    from agentwake.agent.replay import Replay
    from agentwake.config import AgentwakeConfig
    from agentwake.store import Store


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
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Run the agent even if the policy ignores, only logs or holds this event."
        ),
    ] = False,
) -> None:
    """Run the agent again on a stored event and print the transcript; recorded in the action log.

    The event's state is not changed. With --dry-run every tool call the model
    asks for is recorded as planned and answered "not sent"; nothing reaches a server.
    The policy decides again, as for a new event (flow control aside): an event it
    ignores, only logs or holds for approval is refused unless --force.
    """
    cfg = load(config)
    setup_logging(cfg.log.level if cfg.log.level != "INFO" else "WARNING")
    if cfg.agent is None:
        raise fail(ConfigError(f"{config} has no [agent] section; add one with at least 'model'"), 2)
    policy = load_rules(cfg)

    async def replay_it(store: Store) -> tuple[Replay, dict[str, Any]]:
        from agentwake.agent.replay import replay as replay_event

        row = await find_event(store, event_id, server)
        # A short run: the bridges it starts take no events (agentwake.cli.common.NO_INGRESS_ENV).
        done = await replay_event(short_look(cfg), store, policy, row["id"], dry_run=dry_run, force=force)
        detail = await store.event_detail(row["id"]) or {"runs": []}
        run = next(r for r in detail["runs"] if r["run_id"] == done.result.run_id)
        return done, run

    try:
        done, run = with_store(cfg, replay_it)
    except AgentwakeError as exc:  # refused by the policy, among others
        raise fail(exc) from None
    print_plan(cfg, done)
    from agentwake.cli.views import print_run

    print_run(run)
    if dry_run:
        out = stdout()
        planned = [c for c in run["tool_calls"] if c["status"] == "planned"]
        out.print(f"dry run: {len(planned)} planned tool call(s), none sent:")
        for call in planned:
            out.print(
                f"  {call['tool']}({json.dumps(call['arguments'], ensure_ascii=False)})",
                markup=False,
                highlight=False,
            )
    if run["status"] != "completed":
        raise typer.Exit(1)


def print_plan(cfg: AgentwakeConfig, done: Replay) -> None:
    """What the replay decided and what its run started from: model, tools, prompt templates."""
    out = stdout()
    outcome, plan = done.outcome, done.plan
    out.rule("decision")
    forced = " (forced past the policy with --force)" if done.forced else ""
    out.print(f"verdict: {outcome.verdict}{forced}", highlight=False)
    where = f" ({outcome.decision.where})" if outcome.decision.where else ""
    out.print(f"rule: {outcome.rule}{where}", highlight=False)
    out.print(f"why: {outcome.why}", highlight=False)
    if outcome.hook:
        out.print(f"hook: {outcome.hook}", highlight=False)
    out.rule("plan")
    out.print(f"model: {plan.model}", highlight=False)
    out.print(f"allowlist: {', '.join(plan.allowlist.globs) or 'none'}", highlight=False)
    out.print(f"allowed tools: {', '.join(s.exposed for s in plan.allowed) or 'none'}", highlight=False)
    system = cfg.agent.system_prompt if cfg.agent else "-"
    user = plan.prompt.template if plan.prompt else "-"
    out.print(f"prompts: system {system}, user {user}", highlight=False)
    if plan.prompt_error:
        warn(plan.prompt_error)


__all__ = ["print_plan", "replay"]
