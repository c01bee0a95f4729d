"""The agentwake command line: parse, load config, call the library.

    common      the typer app, shared options, config, store and error helpers
    init        init: a new project from the packaged defaults (agentwake/defaults/)
    service     run, check, events
    views       status, inbox, actions, show
    replay      replay
    policy      policy check, policy test
    approvals   approvals, approve, deny, retry, rotate-secret
    pause       pause, resume: the kill switch
    limits      limits: each limit and its use now
    store       store copy: a SQLite store into PostgreSQL
    bridge      bridge github: the bridges (agentwake/bridges/) as MCP servers;
                bridge_pagerduty, bridge_slack: theirs; bridge_send: bridge send-test
    fake        fake github|slack|pagerduty: the packaged fake upstreams (agentwake/fakes)
    tables      printing (the only module that imports rich at its top)

Starting fast matters (``agentwake status`` is typed by hand): importing this package
loads typer and agentwake.errors only. Every command imports what it needs when it runs,
and pydantic, the store backend, rich, the MCP SDK, aiohttp and litellm only when it does.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Annotated, Any

import typer

# The command modules register their commands on import, in the order --help lists them.
# isort: off
from agentwake.cli import init, service, views, replay, approvals, pause, limits, policy, store, bridge  # noqa: F401
from agentwake.cli import bridge_pagerduty, bridge_slack, bridge_send, fake  # noqa: F401
from agentwake.cli.common import app

# isort: on

if TYPE_CHECKING:
    from agentwake.cli.tables import PlainTable, err, out, print_status, print_table

# Loaded from agentwake.cli.tables on first use: they need rich.
_PRINTING = frozenset({"PlainTable", "err", "out", "print_status", "print_table"})


def __getattr__(name: str) -> Any:
    if name in _PRINTING:
        from agentwake.cli import tables

        value = getattr(tables, name)
        # Kept here from now on, so that swapping agentwake.cli.out (tests do) is what commands see.
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def version() -> str:
    """The installed distribution's version (importlib.metadata), or "unknown" when not installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("agentwake")
    except PackageNotFoundError:
        return "unknown"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"agentwake {version()}")
        raise typer.Exit()


@app.callback()
def _options(
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    # The top-level help is the app's (agentwake.cli.common), not this docstring-less callback's.
    pass


def main() -> None:
    """The ``agentwake`` program."""
    try:
        app()
    finally:
        # The process ends here. Frozen, the heap of imported modules is not walked once more by a
        # last collection on the way out: that walk took longer (~70 ms) than `agentwake status`'s own work.
        gc.freeze()


__all__ = ["PlainTable", "app", "err", "main", "out", "print_status", "print_table", "version"]
