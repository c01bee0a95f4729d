"""``agentwake store copy``: move a SQLite store into PostgreSQL (``agentwake.store.copy``)."""

from __future__ import annotations

import json
import os
import sys
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
    run_async,
    stderr,
    stdout,
    warn,
)
from agentwake.errors import ConfigError, StoreError

if TYPE_CHECKING:
    from agentwake.store.copy import CopyReport

store_app = typer.Typer(
    help="Manage the store itself: copy a SQLite store into PostgreSQL.",
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


__all__ = ["copy", "store_app"]
