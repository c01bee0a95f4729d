"""The read-only commands: status, inbox, actions and show. They read the store and print."""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Final, NoReturn

import typer

from agentwake.cli.common import (
    DEFAULT_CONFIG_PATH,
    ConfigOption,
    JsonOption,
    ServerOption,
    app,
    clip,
    fail,
    one_event,
    read_store,
    stdout,
    styled,
)
from agentwake.clock import now_iso, parse_iso, utc_now

if TYPE_CHECKING:
    from pathlib import Path

    from rich.console import Console

    from agentwake.configfile import StoreLocation
    from agentwake.store import StoreReader

# Every state an event can be in (store.records.EVENT_STATES, not imported: `agentwake --help` loads no
# store module): events that wait (pending, held) or were refused (denied, rejected) count too.
EVENT_STATES_SHOWN = (
    "pending",
    "processing",
    "done",
    "failed",
    "dead",
    "ignored",
    "held",
    "denied",
    "batched",
    "rejected",
)
RUN_STATUSES_SHOWN = ("completed", "failed", "interrupted", "running")
# A subscription no longer in the config shows one of these (supervisor.REMOVED_STATUSES).
REMOVED_STATUSES = ("removed", "unsubscribed", "lingering")
RESULT_CHARS = 200
# `status --watch`: seconds between two refreshes, unless --interval says otherwise.
WATCH_INTERVAL_S: Final = 2.0


def print_json(value: object) -> None:
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


WithServiceOption = Annotated[
    bool,
    typer.Option(
        "--with-service",
        help="With --json: print one object, {service, subscriptions}, instead of the array of"
        " subscriptions; service is the running (or last) 'agentwake run': pid, host, times, state.",
    ),
]


WatchOption = Annotated[
    bool,
    typer.Option(
        "--watch",
        "-w",
        help="Refresh in place every --interval seconds, until Ctrl-C (which exits 0). With --json:"
        " one JSON document per refresh, each on one line (as --json prints it, compacted).",
    ),
]
IntervalOption = Annotated[
    float | None,
    typer.Option(
        "--interval",
        min=0.1,
        help=f"With --watch: seconds between refreshes [default: {WATCH_INTERVAL_S:g}].",
    ),
]


@app.command()
def status(
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    as_json: JsonOption = False,
    with_service: WithServiceOption = False,
    watch: WatchOption = False,
    interval: IntervalOption = None,
) -> None:
    """Show each subscription: server, event, mode, cursor, counts, gaps and failed events.

    Also its last activity, its last errors and, for webhook delivery, the subscription id,
    when it is refreshed next and the delivery status. --json adds recent_errors: the last
    few errors with their times.

    First, whether the service runs: its pid and host, since when, its last heartbeat; or when it
    stopped, or that it did not stop cleanly. While it is not running, a subscription's status is
    the one it had (shown as, e.g., "active (service stopped)"; --json: service_running).
    """
    if interval is not None and not watch:
        raise fail("--interval is for --watch; pass both", 2)
    if watch:
        watch_status(config, as_json, with_service, WATCH_INTERVAL_S if interval is None else interval)
        return
    service, rows, storage = status_reading(config)
    if as_json:
        document = status_document(service, rows, with_service, storage)
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return
    print_status_view(service, rows, stdout(), storage)


def status_snapshot(config: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """What one `status` shows, read from the store: the service (service_state) and the subscriptions."""
    service, rows, _ = status_reading(config)
    return service, rows


def status_reading(
    config: Path,
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], dict[str, Any]]:
    """``status_snapshot`` and the store's size and oldest kept event (``StoreReader.storage``)."""

    def read(location: StoreLocation, store: StoreReader) -> tuple[Any, ...]:
        return (
            store.subscriptions(),
            store.run_counts(),
            set(location.subscriptions),
            store.services(),
            store.subscription_owners(),
            store.pauses(),
            store.storage(),
            location.identities,
        )

    rows, counts, configured, services, owners, pauses, storage, identities = read_store(config, read)
    service = service_state(services)
    from agentwake.store.pauses import as_dict

    now = now_iso()
    from agentwake.store.sqlite.owners import is_process_row

    # A lease in the past is free: nobody drives that subscription now.
    live = [o for o in owners if o["lease_until"] and o["lease_until"] > now]
    held = {o["subscription"]: o for o in live if not is_process_row(o["subscription"])}
    unreachable = servers_out_of_reach(live)
    for row in rows:
        row["configured"] = row["subscription"] in configured
        # Whether its webhook deliveries are checked for the server's identity (v1a): "verify" or "require".
        row["identity"] = identities.get(str(row.get("server"))) if row.get("mode") == "webhook" else None
        owner = held.get(row["subscription"])
        # Several processes on one PostgreSQL store: which one drives this subscription's loop.
        row["driven_by"] = None if owner is None else owner["owner"]
        row["lease_until"] = None if owner is None else owner["lease_until"]
        # Its driver cannot reach the subscription's server (it gives it back if another process can).
        since = None if owner is None else unreachable.get((owner["owner"], str(row.get("server"))))
        row["driver_failing"] = None if since is None else f"server unreachable since {since}"
        # None: no service ever recorded itself in this store (one older than this field).
        row["service_running"] = None if service is None else service["running"]
        if not row["configured"] and not row["service_running"] and row["status"] not in REMOVED_STATUSES:
            # Taken out of the config while no service ran: the state its loop last had is over.
            row["status"] = "removed"
        mine = counts.get(row["subscription"], {})
        for state in EVENT_STATES_SHOWN:
            row[f"events_{state}"] = mine.get(f"events_{state}", 0)
        for run_status in RUN_STATUSES_SHOWN:
            row[f"runs_{run_status}"] = mine.get(f"runs_{run_status}", 0)
        row["last_failure"] = mine.get("last_failure")
        # What keeps the agent from starting runs for its events (agentwake pause), if anything.
        covering = next(
            (
                p
                for p in pauses
                if p.covers(server=row["server"], subscription=row["subscription"], rule=None)
            ),
            None,
        )
        row["pause"] = None if covering is None else as_dict(covering)
    if service is not None:
        service["pauses"] = [as_dict(p) for p in pauses]
    return service, rows, storage


def status_document(
    service: dict[str, Any] | None,
    rows: list[dict[str, Any]],
    with_service: bool,
    storage: dict[str, Any] | None = None,
) -> object:
    """`status --json`: the array of subscriptions, or with ``with_service`` {service, subscriptions,
    store} (``store``: the store's size and oldest kept event)."""
    if not with_service:
        return rows
    return {"service": service, "subscriptions": rows, "store": storage}


def describe_storage(storage: dict[str, Any]) -> str:
    """``store: 12.3 MB (file 12.0 MB, WAL 320 kB, 1.1 MB free inside), oldest event received ...``."""
    parts = []
    if storage.get("file_bytes") is not None:
        parts.append(f"file {_size(storage['file_bytes'])}, WAL {_size(storage.get('wal_bytes') or 0)}")
    if storage.get("free_bytes"):
        parts.append(f"{_size(storage['free_bytes'])} free inside")
    detail = f" ({', '.join(parts)})" if parts else ""
    oldest = storage.get("oldest_event_at")
    since = f"oldest event received {oldest}" if oldest else "no event kept"
    return f"store: {_size(storage.get('size_bytes') or 0)}{detail}, {since}"


def _size(count: int) -> str:
    value = float(count)
    for unit in ("bytes", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def print_status_view(
    service: dict[str, Any] | None,
    rows: list[dict[str, Any]],
    out: Console,
    storage: dict[str, Any] | None = None,
) -> None:
    from agentwake.cli.tables import describe_service, print_status

    out.print(describe_service(service), highlight=False)
    if storage is not None:
        out.print(describe_storage(storage), highlight=False, soft_wrap=True)
    for pause in (service or {}).get("pauses") or []:
        what = "everything" if pause["scope"] == "all" else f"{pause['scope']} {pause['name']}"
        why = f": {pause['reason']}" if pause["reason"] else ""
        out.print(
            f"paused: {what}, by {pause['by']} since {pause['at']}{why} (agentwake resume)",
            markup=False,
            highlight=False,
        )
    totals = event_totals(rows)
    if totals:
        out.print(totals, highlight=False)
    out.print()
    print_status(rows, out)
    drivers: dict[str, list[str]] = {}
    failing: dict[str, set[str]] = {}
    for row in rows:
        if row.get("driven_by"):
            drivers.setdefault(row["driven_by"], []).append(row["subscription"])
            if row.get("driver_failing"):
                failing.setdefault(row["driven_by"], set()).add(f"{row['server']}: {row['driver_failing']}")
    for owner, names in sorted(drivers.items()):
        trouble = "; ".join(sorted(failing.get(owner, ())))
        out.print(
            f"{owner} drives {len(names)} subscription(s): {', '.join(names)}"
            + (f" ({trouble})" if trouble else ""),
            highlight=False,
        )


def servers_out_of_reach(live: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """{(process, server): since} from the live lease rows: the servers each process says it cannot
    reach (``agentwake.ownership`` publishes them as ``!owner server since``)."""
    from agentwake.store.sqlite.owners import UNREACHABLE

    found: dict[tuple[str, str], str] = {}
    for o in live:
        name = str(o["subscription"])
        if name.startswith(UNREACHABLE) and name.count(" ") == 2:
            owner, server, since = name[1:].split(" ")
            found[(owner, server)] = since
    return found


def event_totals(rows: list[dict[str, Any]]) -> str | None:
    """One line of every subscription's events by state, and the failed runs (a retried event's
    failures are runs, its state stays pending); None when there is nothing to count."""
    counts = {state: sum(int(r.get(f"events_{state}") or 0) for r in rows) for state in EVENT_STATES_SHOWN}
    events = ", ".join(f"{count} {state}" for state, count in counts.items() if count)
    failed_runs = sum(int(r.get("runs_failed") or 0) for r in rows)
    if not events and not failed_runs:
        return None
    line = f"events: {events or 'none'}"
    return line + (f"; {failed_runs} failed run(s)" if failed_runs else "")


def watch_status(config: Path, as_json: bool, with_service: bool, interval_s: float) -> None:
    """`status --watch`: on a terminal, the view redrawn in place (rich's Live); on a pipe, each
    refresh printed after the last under a header line; with --json, one line per refresh.
    Ctrl-C ends it with exit 0. A store or config error ends it as `status` would."""
    # `status` runs without the cyclic garbage collector (agentwake.cli.QUICK): a watch runs until
    # Ctrl-C, so it collects as any long-running program does.
    gc.enable()
    try:
        if as_json:
            while True:
                service, rows, storage = status_reading(config)
                sys.stdout.write(json.dumps(status_document(service, rows, with_service, storage)) + "\n")
                sys.stdout.flush()
                time.sleep(interval_s)
        out = stdout()
        if out.is_terminal and not out.is_dumb_terminal:  # a dumb one cannot redraw
            _watch_live(config, interval_s, out)
        while True:
            out.print(_watch_header(interval_s), highlight=False)
            service, rows, storage = status_reading(config)
            print_status_view(service, rows, out, storage)
            out.print()
            time.sleep(interval_s)
    except KeyboardInterrupt:
        return  # Ctrl-C is how a watch ends
    except BrokenPipeError:  # the reader went away (`| head`): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _watch_live(config: Path, interval_s: float, out: Console) -> NoReturn:
    import io

    from rich.console import Console as RichConsole
    from rich.live import Live
    from rich.text import Text

    def frame() -> Text:
        # Drawn on a console of its own: printing to `out` under Live would draw the live view into it.
        page = RichConsole(
            file=io.StringIO(),
            width=out.width,
            force_terminal=True,
            color_system=out.color_system,  # type: ignore[arg-type]
            markup=False,
            emoji=False,
        )
        page.print(_watch_header(interval_s), highlight=False)
        service, rows, storage = status_reading(config)
        print_status_view(service, rows, page, storage)
        assert isinstance(page.file, io.StringIO)
        return Text.from_ansi(page.file.getvalue())

    with Live(frame(), console=out, auto_refresh=False, vertical_overflow="ellipsis") as live:
        while True:
            time.sleep(interval_s)
            live.update(frame(), refresh=True)


def _watch_header(interval_s: float) -> str:
    return f"agentwake status at {now_iso()}, every {interval_s:g}s (Ctrl-C to stop)"


# `status` counts a service whose last heartbeat is older than this many of its intervals as gone.
STALE_HEARTBEATS = 3


def service_state(
    records: list[dict[str, Any]], *, now: datetime | None = None, host: str | None = None
) -> dict[str, Any] | None:
    """The service as `status` shows it, from its recorded starts (newest first): the newest one
    still running, else the newest; None when no service ever recorded itself in the store.

    Not running: stopped cleanly (``stopped_at``), or its heartbeat is older than STALE_HEARTBEATS
    intervals, or it was on this host and its pid is gone ("unclean_stop").
    """
    if not records:
        return None
    now = now or utc_now()
    if not host:
        import socket

        host = socket.gethostname()
    judged = [_judge_service(record, now, host) for record in records]
    return next((j for j in judged if j["running"]), judged[0])


def _judge_service(record: dict[str, Any], now: datetime, host: str) -> dict[str, Any]:
    beat = parse_iso(record["heartbeat_at"])
    age = max(0.0, (now - beat).total_seconds()) if beat else None
    alive = _pid_alive(record["pid"]) if record["host"] == host else None
    if record["stopped_at"]:
        state = "stopped"
    elif alive is False or age is None or age > STALE_HEARTBEATS * record["heartbeat_s"]:
        state = "unclean_stop"
    else:
        state = "running"
    return {
        "running": state == "running",
        "state": state,
        "pid": record["pid"],
        "host": record["host"],
        "version": record["version"],
        "started_at": record["started_at"],
        "heartbeat_at": record["heartbeat_at"],
        "heartbeat_age_s": None if age is None else round(age, 1),
        "heartbeat_s": record["heartbeat_s"],
        "stopped_at": record["stopped_at"],
        # Why the agent waits ([agent] max_runs_per_hour, max_cost_per_day_usd), while running.
        "paused": record.get("paused") if state == "running" else None,
        # None on another host (or where we cannot tell).
        "pid_alive": alive,
    }


def _pid_alive(pid: int) -> bool | None:
    if os.name != "posix":
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OSError:
        return None
    return True


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
    if state is not None:
        from agentwake.store.records import EVENT_STATES

        if state not in EVENT_STATES:
            raise fail(f"unknown state {state!r} for --state; the states are: {', '.join(EVENT_STATES)}", 2)
    rows = read_store(config, lambda location, store: store.inbox(limit, state=state))
    if as_json:
        print_json(rows)
        return
    from agentwake.cli.tables import print_table, table_of

    table = table_of(
        f"Inbox (newest {limit})", ("received", "subscription", "event", "event id", "state", "data")
    )
    for r in rows:
        table.add_row(
            r["received_at"],
            r["subscription"],
            r["event"],
            r["event_id"],
            r["state"],
            clip(json.dumps(r["data"], ensure_ascii=False)),
        )
    print_table(table, stdout())


ACTIONS_COLUMNS = (
    "run",
    "started",
    "subscription",
    "event id",
    "kind",
    "try",
    "status",
    "tools",
    "tokens",
    "cached",
    "cost",
    "ms",
)


@app.command()
def actions(
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="How many runs, newest first.")] = 20,
    as_json: JsonOption = False,
) -> None:
    """Show the action log: the most recent agent runs, with their tool calls and outcome."""
    rows = read_store(config, lambda location, store: store.actions(limit))
    if as_json:
        print_json(rows)
        return
    from agentwake.cli.tables import print_table, table_of

    table = table_of(f"Agent runs (newest {limit})", ACTIONS_COLUMNS)
    table.add_column("reason", overflow="fold", style="red")
    table.add_column("summary", overflow="fold")
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
            str(r.get("cached_tokens") or 0),
            "-" if r["cost_usd"] is None else f"${r['cost_usd']:.4f}",
            str(r["duration_ms"] if r["duration_ms"] is not None else "-"),
            r["reason"] or "",
            r.get("summary") or "",
        )
    print_table(table, stdout())


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
    event = read_store(
        config, lambda location, store: one_event(store.find_events(event_id, server), event_id, server)
    )
    if as_json:
        print_json(event)
        return
    out = stdout()
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
    decision = event.get("decision") or {}
    if decision:
        out.print(decision_line(event["state"], decision), markup=False, highlight=False)
    authority = decision.get("authority")
    if event["state"] == "held" and isinstance(authority, list):
        out.print("If approved, the agent may:", highlight=False)
        for line in authority:
            out.print(f"  - {line}", markup=False, highlight=False)
    for answer in event.get("answers") or []:
        tools = ", ".join(answer["tools"]) or "none"
        out.print(
            f"{answer['answer']} by {answer['who']} ({answer['via']}, from {answer['address'] or 'unknown'})"
            f" at {answer['at']}; rule {answer['rule']}, tools granted: {tools}"
            + (f"; note: {answer['note']}" if answer["note"] else ""),
            markup=False,
            highlight=False,
        )
    if event.get("approved_at"):
        note = event.get("approval_note")
        out.print(
            f"approved at {event['approved_at']}" + (f"; note: {note}" if note else ""),
            markup=False,
            highlight=False,
        )
    if not event["runs"]:
        out.print(NO_RUN_BECAUSE.get(event["state"], "no agent run yet"), highlight=False)
    for run in event["runs"]:
        print_run(run)


# Why an event in a settled state has no run, for `show`; other states may still get one.
NO_RUN_BECAUSE = {
    "ignored": "no agent run: the rule ignores the event",
    "held": "no agent run yet: waiting for a person's approval",
    "denied": "no agent run: a person denied it",
    "rejected": "no agent run: the event was rejected before a decision",
    "dead": "no agent run: the event gave up (see error)",
    "batched": "no agent run of its own: it went into a batch",
}


def decision_line(state: str, decision: dict[str, Any]) -> str:
    """The decision taken on an event, as one line naming its rule and why."""
    action = decision.get("action") or ("approve" if state in ("held", "denied") else "decided")
    action = "hold for approval" if action == "approve" else action
    rule = decision.get("rule")
    line = f"decision: {action}" + (f" by rule {rule}" if rule else " (no rule matched)")
    why = decision.get("why")
    return line + (f": {why}" if why else "")


def print_run(run: dict[str, Any]) -> None:
    """One run of the action log: its decision, counters, transcript and tool calls."""
    from rich.text import Text

    from agentwake.cli.tables import print_table, table_of

    out = stdout()
    out.rule(f"run {run['run_id']} ({run['kind']}, attempt {run['attempt']}): {run['status']}")
    decision = run["decision"]
    out.print(f"decision: {decision.get('action')}: {decision.get('why')}", highlight=False)
    out.print(
        f"model: {run['model']}; allowed tools: {', '.join(decision.get('tools') or []) or 'none'}",
        highlight=False,
    )
    cost = f", cost ${run['cost_usd']:.6f}" if run.get("cost_usd") is not None else ""
    # Of the input tokens, those the provider read from its prompt cache (billed at its cached rate).
    cached = f" ({run['cached_tokens']} cached)" if run.get("cached_tokens") else ""
    out.print(
        f"steps: {run['steps']}, tokens: {run['prompt_tokens']} in{cached} / {run['completion_tokens']} out{cost}, "
        f"duration: {run['duration_ms'] if run['duration_ms'] is not None else '-'} ms",
        highlight=False,
    )
    if run["reason"]:
        out.print(styled("reason:", "red", run["reason"]), highlight=False)
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
        table = table_of("tool calls", ("step", "tool", "status", "arguments", "result", "ms"))
        for call in run["tool_calls"]:
            table.add_row(
                str(call["step"]),
                call["tool"],
                call["status"],
                json.dumps(call["arguments"], ensure_ascii=False),
                clip(call["result"] or "", RESULT_CHARS),
                str(call["duration_ms"] if call["duration_ms"] is not None else "-"),
            )
        print_table(table, out)
    if run.get("summary"):  # the final answer, in one line, under its transcript
        out.print(styled("summary:", "bold", run["summary"]), highlight=False)


__all__ = [
    "actions",
    "describe_storage",
    "inbox",
    "print_run",
    "print_status_view",
    "show",
    "status",
    "status_document",
    "status_reading",
    "status_snapshot",
    "watch_status",
]
