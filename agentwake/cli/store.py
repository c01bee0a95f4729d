"""``agentwake store copy``: move a SQLite store into PostgreSQL (``agentwake.store.copy``);
``agentwake store prune``: apply ``[store.retention]`` now (``agentwake.store.retention``)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from agentwake.cli.common import (
    DEFAULT_CONFIG_PATH,
    HELP_MARKUP,
    ConfigOption,
    HelpGroup,
    app,
    fail,
    load,
    run_async,
    stderr,
    stdout,
    warn,
)
from agentwake.errors import ConfigError, StoreError

if TYPE_CHECKING:
    from agentwake.store.copy import CopyReport
    from agentwake.store.retention import PruneReport

store_app = typer.Typer(
    help="Manage the store itself: copy a SQLite store into PostgreSQL, prune it by its retention.",
    no_args_is_help=True,
    rich_markup_mode=HELP_MARKUP,
    cls=HelpGroup,
)
app.add_typer(store_app, name="store")


@store_app.command("copy")
def copy(
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="The target: postgresql://user@host:port/dbname, an empty database (no password in it).",
        ),
    ],
    password_env: Annotated[
        str | None,
        typer.Option("--password-env", help="Environment variable holding the target's password."),
    ] = None,
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    source: Annotated[
        Path | None,
        typer.Option("--from", help="The SQLite store to copy, instead of the one the config names."),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print no progress on stderr.")] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help='Print the summary as one JSON object: {"source", "target", "tables", "rows"}.'
        ),
    ] = False,
) -> None:
    """Copy a SQLite store (cursors, inbox, runs, approvals, webhook secrets) into an empty PostgreSQL database.

    Everything is copied in one transaction, row ids kept: a failure leaves the target empty.
    A target that already holds rows is refused. The source is only read; its schema must be
    the one this agentwake writes. Then set [store] url (and password_env) in the config, and
    start the service on it. Secrets are copied, never printed.
    """
    from agentwake.config import StoreConfig
    from agentwake.store.copy import copy_store

    try:
        target = StoreConfig(url=to, password_env=password_env)
    except ValueError as exc:  # pydantic's ValidationError; the url is never quoted (it may hold a password)
        raise fail(f"invalid target (--to, --password-env): {_first_problem(exc)}", 2) from None
    path = source if source is not None else _configured_source(config)
    password = _password(password_env)

    def shown(table: str, copied: int, total: int) -> None:
        stderr().print(f"{table}: {copied} of {total} rows", highlight=False, soft_wrap=True)

    url = target.url
    assert url is not None
    _warn_if_running(path)
    try:
        report = run_async(
            lambda: copy_store(path, url, password=password, progress=None if quiet else shown)
        )
    except StoreError as exc:
        raise fail(exc) from None
    if as_json:
        sys.stdout.write(json.dumps(report.to_json()) + "\n")
        return
    _print_summary(report)


def _warn_if_running(path: Path) -> None:
    """A service still running on the source would go on writing there, after the copy's snapshot."""
    from agentwake.cli.views import service_state
    from agentwake.store.copy import source_services

    try:
        service = service_state(source_services(path))
    except StoreError as exc:
        raise fail(exc) from None
    if service is not None and service["running"]:
        warn(
            f"the service (pid {service['pid']} on {service['host']}) is running on {path}: what it writes"
            " after the copy began stays behind; stop it before the copy you keep"
        )


def _first_problem(exc: Exception) -> str:
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        return "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
    return str(exc)


def _configured_source(config: Path) -> Path:
    """The SQLite store the config names; refused when it is a PostgreSQL store already."""
    from agentwake.configfile import locate_store

    try:
        location = locate_store(config)
    except ConfigError as exc:
        raise fail(exc, 2) from None
    if location.url is not None:
        raise fail(
            f"the store of {config} is already in PostgreSQL ({location.name}): copy reads a SQLite store"
            " (pass --from PATH)",
            2,
        )
    return location.path


def _password(name: str | None) -> str | None:
    if name is None:
        return None
    password = os.environ.get(name)
    if not password:
        state = "is not set" if password is None else "is empty"
        raise fail(
            f"the environment variable {name} (--password-env) {state}: it must hold the target's password", 2
        )
    return password


def _print_summary(report: CopyReport) -> None:
    out = stdout()
    out.print(
        f"copied {report.rows} rows from {report.source} into {report.target}:",
        highlight=False,
        soft_wrap=True,
    )
    width = max((len(t) for t in report.tables), default=0)
    for table, rows in report.tables.items():
        out.print(f"  {table.ljust(width)}  {rows:>8}", highlight=False)
    out.print("set [store] url (and password_env) in the config to use it", highlight=False)


# Progress lines on stderr: at most one per this many seconds of a long prune.
PROGRESS_EVERY_S = 2.0


@store_app.command("prune")
def prune(
    config: ConfigOption = DEFAULT_CONFIG_PATH,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Count what would be deleted or cleared; change nothing."),
    ] = False,
    vacuum: Annotated[
        bool,
        typer.Option(
            "--vacuum",
            help="Then compact the store: SQLite VACUUM (and incremental auto-vacuum from then on; it"
            " holds the write lock while it runs: best with the service stopped); PostgreSQL VACUUM (ANALYZE).",
        ),
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print no progress on stderr.")] = False,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help='Print the summary as one JSON object: {"dry_run", "deleted", "transcripts_cleared",'
            ' "dedup_keys_kept", "batches", "seconds", "reclaimed_bytes", "skipped", "store"}.',
        ),
    ] = False,
) -> None:
    """Delete now what [store.retention] says may go (the service does it every prune_interval_s).

    Per table, what was deleted (with --dry-run, what would be): events and their runs, tool calls,
    answers and flow marks; run transcripts cleared; gaps; expired dedup keys. Pending, processing,
    held and dead events are always kept. In small batches: a running service goes on meanwhile.
    """
    from agentwake.store.retention import Retention, open_target
    from agentwake.store.retention import prune as prune_store

    if dry_run and vacuum:
        raise fail("--vacuum changes the store: it cannot go with --dry-run", 2)
    cfg = load(config, secrets=False)
    retention = Retention.from_config(cfg.store.retention)
    shown = [time.monotonic()]

    def progress(table: str, report: PruneReport) -> None:
        if quiet or time.monotonic() - shown[0] < PROGRESS_EVERY_S:
            return
        shown[0] = time.monotonic()
        stderr().print(
            f"{table}: {report.total} rows so far, {report.batches} batches", highlight=False, soft_wrap=True
        )

    async def run() -> tuple[PruneReport, dict[str, object], int | None]:
        target = await open_target(cfg.store)
        try:
            report = await prune_store(target, retention, dry_run=dry_run, progress=progress)
            freed: int | None = None
            if not dry_run and report.skipped is None:
                report.reclaimed_bytes = await target.reclaim(retention.pause_s)
                if vacuum:
                    if not quiet:
                        stderr().print("vacuuming the store…", highlight=False)
                    freed = await target.vacuum()
            return report, await target.storage(), freed
        finally:
            await target.close()

    try:
        report, storage, freed = run_async(run)
    except StoreError as exc:
        raise fail(exc) from None
    if as_json:
        document = {**report.to_json(), "vacuumed_bytes": freed, "store": storage}
        sys.stdout.write(json.dumps(document) + "\n")
        return
    _print_prune(report, storage, freed)


def _print_prune(report: PruneReport, storage: dict[str, object], freed: int | None) -> None:
    from agentwake.cli.views import describe_storage

    out = stdout()
    if report.skipped is not None:
        out.print(f"nothing pruned: {report.skipped}", highlight=False)
        return
    verb = "would delete" if report.dry_run else "deleted"
    out.print(
        f"{verb} ({report.batches} batches, {report.seconds:.1f} s):",
        highlight=False,
        soft_wrap=True,
    )
    for table, count in report.counts.items():
        if table == "transcripts":
            continue
        label = "dedup keys (expired)" if table == "seen" else table
        out.print(f"  {label:<22}{count:>10}", highlight=False)
    cleared = "would be cleared" if report.dry_run else "cleared"
    out.print(
        f"  {'run transcripts ' + cleared:<22}{report.counts.get('transcripts', 0):>10}", highlight=False
    )
    kept = "would be kept" if report.dry_run else "kept"
    out.print(f"  {'dedup keys ' + kept:<22}{report.keys_kept:>10}", highlight=False)
    if report.reclaimed_bytes:
        out.print(f"gave {report.reclaimed_bytes} bytes back to the file system", highlight=False)
    if freed is not None:
        out.print(f"vacuum gave {freed} bytes back", highlight=False)
    out.print(describe_storage(storage), highlight=False, soft_wrap=True)


__all__ = ["copy", "prune", "store_app"]
