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
    keygen      keygen: a server identity key (ed25519) for signed webhook deliveries
    store       store copy: a SQLite store into PostgreSQL
    bridge      bridge github: the bridges (agentwake/bridges/) as MCP servers;
                bridge_pagerduty, bridge_slack: theirs; bridge_send: bridge send-test
    fake        fake github|slack|pagerduty: the packaged fake upstreams (agentwake/fakes)
    tables      printing (the only module that imports rich at its top)

Starting fast matters (``agentwake status`` is typed by hand): importing this package loads
typer, agentwake.cli.common and agentwake.errors only. ``main()`` imports the module of the one
command it runs (COMMANDS) and builds that command alone, so ``agentwake status`` neither
imports nor builds the others; ``agentwake --help`` imports them all but builds none (it shows
their names and help only), and anything else gets the whole app. ``app``, the whole app, is
loaded on first use. Every command imports what it needs when it runs, and
pydantic, the store backend, rich, the MCP SDK, aiohttp and litellm only when it does.
"""

from __future__ import annotations

import copy
import gc
import importlib
import inspect
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer
from typer.main import get_command_name

from agentwake.cli.common import app as _app

if TYPE_CHECKING:
    from agentwake.cli.common import app
    from agentwake.cli.tables import PlainTable, err, out, print_status, print_table

# Each command (or group of commands) under `agentwake`, in the order --help lists them, and the
# modules under agentwake.cli that register it (and its subcommands) when imported. A test checks
# this against what the modules register.
COMMANDS: Final[dict[str, tuple[str, ...]]] = {
    "init": ("init",),
    "run": ("service",),
    "check": ("service",),
    "events": ("service",),
    "status": ("views",),
    "inbox": ("views",),
    "actions": ("views",),
    "show": ("views",),
    "replay": ("replay",),
    "approvals": ("approvals",),
    "approve": ("approvals",),
    "deny": ("approvals",),
    "retry": ("approvals",),
    "rotate-secret": ("approvals",),
    "pause": ("pause",),
    "resume": ("pause",),
    "limits": ("limits",),
    "keygen": ("keygen",),
    "policy": ("policy",),
    "store": ("store",),
    "bridge": ("bridge", "bridge_pagerduty", "bridge_slack", "bridge_send"),
    "fake": ("fake",),
}
_ORDER: Final = {name: index for index, name in enumerate(COMMANDS)}
# The commands that read a little, print and exit (status --watch, the one that does not, turns the
# collector back on), and the app's own options: they run without the cyclic garbage collector,
# whose passes over the heap of freshly imported modules cost more than anything they free.
QUICK: Final = frozenset({"status", "inbox", "actions", "show", "approvals", "limits", "--help", "--version"})

# Loaded from agentwake.cli.tables on first use: they need rich.
_PRINTING = frozenset({"PlainTable", "err", "out", "print_status", "print_table"})


def __getattr__(name: str) -> Any:
    if name == "app":
        value: Any = load_commands()
    elif name in _PRINTING:
        from agentwake.cli import tables

        value = getattr(tables, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # Kept here from now on, so that swapping agentwake.cli.out (tests do) is what commands see.
    globals()[name] = value
    return value


def load_commands(names: Iterable[str] | None = None) -> typer.Typer:
    """The app, with these commands (by default all of them) registered: their modules imported.

    Registered in COMMANDS' order whatever order the modules were imported in (a program may
    import agentwake.cli.views before the rest), so --help lists them as ever.
    """
    wanted = COMMANDS if names is None else names
    for name in wanted:
        for module in COMMANDS[name]:
            importlib.import_module(f"{__name__}.{module}")
    _app.registered_commands.sort(key=lambda info: _ORDER.get(command_name(info), len(_ORDER)))
    _app.registered_groups.sort(key=lambda info: _ORDER.get(info.name or "", len(_ORDER)))
    return _app


def command_name(info: Any) -> str:
    """The name a registered command goes by: its own, or its function's as typer derives it."""
    return str(info.name or get_command_name(info.callback.__name__))


def only(name: str) -> typer.Typer:
    """The app reduced to one top-level command (or group) and the app's own options: what
    ``agentwake NAME ...`` runs, without building the click commands of all the others."""
    load_commands([name])
    one = copy.copy(_app)
    one.registered_commands = [info for info in _app.registered_commands if command_name(info) == name]
    one.registered_groups = [info for info in _app.registered_groups if info.name == name]
    return one


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


@_app.callback()
def _options(
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    # The top-level help is the app's (agentwake.cli.common), not this docstring-less callback's.
    pass


def listing() -> typer.Typer:
    """The app as ``agentwake --help`` shows it: every command and group by its name and help, built
    without its parameters (building them all costs more than the rest of ``--help``)."""
    load_commands()
    shown = copy.copy(_app)
    shown.registered_commands = [_listed(info) for info in _app.registered_commands]
    shown.registered_groups = []
    for group in _app.registered_groups:
        assert group.typer_instance is not None
        bare = copy.copy(group.typer_instance)
        bare.registered_commands, bare.registered_groups = [], []
        listed = copy.copy(group)
        listed.typer_instance = bare
        shown.registered_groups.append(listed)
    return shown


def _listed(info: Any) -> Any:
    """A registered command as --help lists it: its name and help, and a callback with no parameter."""
    listed = copy.copy(info)
    listed.name = command_name(info)
    listed.help = inspect.getdoc(info.callback) if info.help is None else info.help
    listed.callback = _listed_only
    return listed


def _listed_only() -> None:
    raise AssertionError("a command of agentwake.cli.listing() is listed, never run")


# What main() answers with listing(): the app's own help (asked for, or for want of a command), its version.
_LISTING_ARGV: Final[tuple[list[str], ...]] = ([], ["--help"], ["--version"])


def main() -> None:
    """The ``agentwake`` program: the command named first on the command line alone, if it is one
    of COMMANDS (anything else, an option such as --help included, goes to the whole app)."""
    first = sys.argv[1] if len(sys.argv) > 1 else None
    collecting = gc.isenabled()
    if first in QUICK:
        gc.disable()
    try:
        if first in COMMANDS:
            only(first)()
        elif sys.argv[1:] in _LISTING_ARGV:
            listing()()
        else:
            load_commands()()
    finally:
        # The process ends here. Frozen, the heap of imported modules is not walked once more by a
        # last collection on the way out: that walk took longer (~70 ms) than `agentwake status`'s own work.
        gc.freeze()
        if collecting:  # as it was, for a program that called main() (after the freeze: nothing to walk)
            gc.enable()


__all__ = [
    "COMMANDS",
    "PlainTable",
    "app",
    "command_name",
    "err",
    "listing",
    "load_commands",
    "main",
    "only",
    "out",
    "print_status",
    "print_table",
    "version",
]
