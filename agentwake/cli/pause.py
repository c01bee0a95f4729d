"""pause, resume: the kill switch. What is paused starts no agent run, on every process sharing the
store and across restarts; its events keep arriving and wait in 'pending'."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, cast

import typer

from agentwake.cli.approvals import cli_answerer
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
    from agentwake.store.pauses import Pause, PauseScope

ServerFlag = Annotated[
    str | None, typer.Option("--server", metavar="NAME", help="Only this configured server's events.")
]
SubscriptionFlag = Annotated[
    str | None, typer.Option("--subscription", metavar="NAME", help="Only this subscription's events.")
]
RuleFlag = Annotated[
    str | None, typer.Option("--rule", metavar="NAME", help="Only events a rule of this name decides to run.")
]


def _scope(
    cfg: AgentwakeConfig, server: str | None, subscription: str | None, rule: str | None
) -> tuple[PauseScope, str]:
    """The one scope the flags name (none: everything); a name the config does not know is an error."""
    given = [
        (scope, name)
        for scope, name in (("server", server), ("subscription", subscription), ("rule", rule))
        if name is not None
    ]
    if len(given) > 1:
        raise fail("give at most one of --server, --subscription and --rule", code=2)
    if not given:
        return "all", ""
    scope, name = given[0]
    known: list[str]
    if scope == "server":
        known = list(cfg.servers)
    elif scope == "subscription":
        known = [s.name for s in cfg.subscriptions]
    else:
        from agentwake.errors import AgentwakeError
        from agentwake.service import load_service_policy

        try:
            known = [r.rule.name for r in load_service_policy(cfg).rules]
        except AgentwakeError as exc:
            raise fail(f"cannot check the rule's name: {exc}") from None
    if name not in known:
        listed = ", ".join(sorted(known)) or "none"
        raise fail(f"no {scope} named {name!r} in the configuration (known: {listed})", code=2)
    return cast("PauseScope", scope), name


def _said(pause: Pause) -> str:
    return "everything" if pause.scope == "all" else f"{pause.scope} {pause.name}"


@app.command()
def pause(
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    server: ServerFlag = None,
    subscription: SubscriptionFlag = None,
    rule: RuleFlag = None,
    reason: Annotated[str | None, typer.Option("--reason", help="Why; shown by status and the page.")] = None,
    now: Annotated[
        bool,
        typer.Option(
            "--now", help="Also cut short the runs under way for it (their events go back to pending)."
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Stop the agent starting runs: for everything, or one server, subscription or rule.

    Events keep arriving and wait in 'pending'; nothing is lost. Runs under way finish, unless
    --now. It holds across restarts and for every process on a shared store, within a second or
    two, until 'agentwake resume' with the same flag.
    """
    from agentwake.store.pauses import as_dict, checked

    cfg = load(config, secrets=False)
    scope, name = _scope(cfg, server, subscription, rule)
    try:
        scope, name, why = checked(scope, name, reason)
    except ValueError as exc:
        raise fail(str(exc), code=2) from None
    by = cli_answerer().who

    async def write(store: Store) -> Pause:
        return await store.pause(scope, name, reason=why, by=by, cut_short=now)

    stored = with_store(cfg, write)
    if as_json:
        typer.echo(json.dumps(as_dict(stored)))
        return
    then = "; runs under way for it are cut short" if now else "; runs under way finish"
    stdout().print(
        f"paused {_said(stored)}: no agent run starts for it{then}. 'agentwake resume' lifts it.",
        highlight=False,
        soft_wrap=True,
    )


@app.command()
def resume(
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    server: ServerFlag = None,
    subscription: SubscriptionFlag = None,
    rule: RuleFlag = None,
    as_json: JsonOption = False,
) -> None:
    """Lift a pause set by 'agentwake pause' with the same flag (none: the pause of everything).

    The running service claims the waiting events again within a second or two ('agentwake status'
    lists what is still paused).
    """
    cfg = load(config, secrets=False)
    scope, name = _scope(cfg, server, subscription, rule)

    async def write(store: Store) -> tuple[Pause | None, list[Pause]]:
        lifted = await store.resume(scope, name)
        return lifted, await store.pauses()

    lifted, left = with_store(cfg, write)
    what = "everything" if scope == "all" else f"{scope} {name}"
    if as_json:
        from agentwake.store.pauses import as_dict

        typer.echo(
            json.dumps({"resumed": as_dict(lifted) if lifted else None, "paused": [as_dict(p) for p in left]})
        )
        return
    out = stdout()
    out.print(f"resumed {what}" if lifted else f"{what} was not paused", highlight=False, soft_wrap=True)
    for other in left:
        out.print(f"still paused: {_said(other)}", highlight=False, soft_wrap=True)
