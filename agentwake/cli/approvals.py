"""The commands a person answers the service with: approvals, approve, deny, retry, and rotate-secret."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agentwake.cli.common import (
    DEFAULT_CONFIG_PATH,
    ConfigOption,
    JsonOption,
    ServerOption,
    app,
    clip,
    fail,
    find_event,
    load,
    read_store,
    stdout,
    store_name,
    with_store,
)
from agentwake.errors import AgentwakeError

if TYPE_CHECKING:
    from agentwake.store import Store
    from agentwake.store.records import Answerer

APPROVALS_COLUMNS = ("event id", "server", "subscription", "event", "received", "rule", "why", "data")
HeldEventId = Annotated[str, typer.Argument(help="The eventId of a held event (see 'agentwake approvals').")]


AUTHORITY_HEADING = "If approved, the agent may:"
ANSWERS_COLUMNS = ("when", "event id", "answer", "who", "via", "from", "rule", "tools granted", "note")


def authority_of(decision: dict[str, Any] | None) -> list[str] | None:
    """The decision's "authority" lines (what approving lets the agent do); None when not recorded."""
    lines = (decision or {}).get("authority")
    return [str(line) for line in lines] if isinstance(lines, list) else None


@app.command()
def approvals(
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    as_json: JsonOption = False,
    answered: Annotated[
        int | None,
        typer.Option(
            "--answered",
            min=1,
            help="Instead, the audit trail: the last N answers, who gave them, from where, when, granting what.",
        ),
    ] = None,
) -> None:
    """List the events held for approval by an 'approve' rule, oldest first (with --answered: the answers)."""
    if answered is not None:
        _print_answers(read_store(config, lambda location, store: store.answers(answered)), as_json)
        return
    held = read_store(config, lambda location, store: store.approvals())
    if as_json:
        for h in held:  # the lines a person reads before approving, at the top level too
            lines = authority_of(h["decision"])
            if lines is not None:
                h["authority"] = lines
        sys.stdout.write(json.dumps(held, indent=2, ensure_ascii=False) + "\n")
        return
    out = stdout()
    if not held:
        out.print("no event is waiting for approval")
        return
    from agentwake.cli.tables import print_table, table_of

    table = table_of("Held for approval", APPROVALS_COLUMNS)
    for h in held:
        decision = h["decision"] or {}
        table.add_row(
            h["event_id"],
            h["server"],
            h["subscription"],
            h["event"],
            h["received_at"],
            str(decision.get("rule")),
            str(decision.get("why")),
            clip(json.dumps(h["data"], ensure_ascii=False)),
        )
    print_table(table, out)
    for h in held:
        lines = authority_of(h["decision"])
        if lines is not None:
            out.print(f"{h['event_id']}: {AUTHORITY_HEADING}", markup=False, highlight=False)
            for line in lines:
                out.print(f"  - {line}", markup=False, highlight=False)


def _print_answers(answers: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(answers, indent=2, ensure_ascii=False) + "\n")
        return
    out = stdout()
    if not answers:
        out.print("no held event has been answered")
        return
    from agentwake.cli.tables import print_table, table_of

    table = table_of("Answers (newest first)", ANSWERS_COLUMNS)
    for a in answers:
        table.add_row(
            a["at"],
            a["event_id"],
            a["answer"],
            a["who"],
            a["via"],
            a["address"] or "",
            a["rule"] or "",
            ", ".join(a["tools"]) or "none",
            a["note"] or "",
        )
    print_table(table, out)


def cli_answerer() -> Answerer:
    """Who answers from the CLI: the local user (whoever can open the store can answer)."""
    import getpass
    import socket

    from agentwake.store.records import Answerer  # not at import: `--help` loads no store module

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid {os.getuid()}"
    return Answerer(f"cli:{user}", "agentwake CLI", socket.gethostname())


def _answer(config: Path, event_id: str, server: str | None, *, approve: bool, note: str | None) -> None:
    cfg = load(config, secrets=False)

    async def answer(store: Store) -> None:
        row = await find_event(store, event_id, server)
        try:
            event = await store.event(row["id"])
            rule_tools = (event.decision or {}).get("rule_tools")
            sub = next((s for s in cfg.subscriptions if s.name == event.subscription), None)
            tools = rule_tools if isinstance(rule_tools, list) else (sub.tools if sub is not None else [])
            await store.answer(row["id"], approve=approve, note=note, by=cli_answerer(), tools=tools)
        except AgentwakeError as exc:
            raise fail(AgentwakeError(f"event {event_id!r}: {exc}")) from None

    with_store(cfg, answer)
    if approve:
        stdout().print(f"approved {event_id}: the running service will run the agent on it")
    else:
        stdout().print(f"denied {event_id}" + (f": {note}" if note else ""))


@app.command()
def approve(
    event_id: HeldEventId,
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    server: ServerOption = None,
    note: Annotated[str | None, typer.Option("--note", help="Recorded with the approval.")] = None,
) -> None:
    """Approve a held event: it goes back to the inbox and the agent runs on it, with the rule's tools."""
    _answer(config, event_id, server, approve=True, note=note)


@app.command()
def deny(
    event_id: HeldEventId,
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    server: ServerOption = None,
    reason: Annotated[str | None, typer.Option("--reason", help="Why; recorded with the event.")] = None,
) -> None:
    """Deny a held event: the agent never runs on it, and the reason is recorded."""
    _answer(config, event_id, server, approve=False, note=reason)


@app.command()
def retry(
    event_id: Annotated[
        str, typer.Argument(help="The eventId of a failed or dead event (see 'agentwake inbox').")
    ],
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    server: ServerOption = None,
    resend_unknown: Annotated[
        bool,
        typer.Option(
            "--resend-unknown",
            help="Send again the tool calls whose outcome is unknown (sent, no answer recorded), with"
            " the same idempotency key. Check on their server first that they did not happen.",
        ),
    ] = False,
) -> None:
    """Requeue a failed or dead event: pending again, with a fresh count of attempts.

    The agent goes on from where the event's last run stopped; tool calls it already
    made are not made again. If that run sent a call whose outcome is unknown (the
    service died before the answer), the retry is refused unless --resend-unknown.
    The running service picks the event up within a few seconds.
    """
    cfg = load(config, secrets=False)

    async def requeue(store: Store) -> int:
        row = await find_event(store, event_id, server)
        try:
            return await store.retry(row["id"], resend_unknown=resend_unknown)
        except AgentwakeError as exc:
            raise fail(AgentwakeError(f"event {event_id!r}: {exc}")) from None

    resent = with_store(cfg, requeue)
    then = f"; {resent} tool call(s) of unknown outcome will be sent again" if resent else ""
    stdout().print(
        f"requeued {event_id}: the running service will run the agent on it{then}",
        highlight=False,
        soft_wrap=True,
    )


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

    cfg = load(config, secrets=False)
    names = None if subscription is None else [subscription]

    async def rotate(store: Store) -> list[str]:
        return await store.request_rotation(names, generate_secret)

    rotated = with_store(cfg, rotate)
    if not rotated:
        what = (
            f"no webhook subscription named {subscription!r}" if subscription else "no webhook subscription"
        )
        raise fail(AgentwakeError(f"{what} in {store_name(cfg.store)} (see 'agentwake status')"), 2)
    grace = cfg.webhook.rotation_grace_s if cfg.webhook else 0
    for name in rotated:
        stdout().print(
            f"{name}: new secret stored; sent on the next refresh, the old one accepted {grace:g}s after that",
            highlight=False,
        )


__all__ = ["approvals", "approve", "deny", "retry", "rotate_secret"]
