"""What every command shares: the typer apps, the common options, loading the config, opening the
store, and printing an error.

Nothing heavy is imported here (no pydantic, no rich, no store backend): ``agentwake --help``
loads this module and typer only. Each helper imports what it needs when it runs.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final, TypeVar

import typer
from typer.core import TyperGroup

from agentwake.configfile import CONFIG_ENV, DEFAULT_CONFIG_PATH
from agentwake.errors import AgentwakeError, ConfigError, StoreError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

    from agentwake.config import AgentwakeConfig, ServerConfig, StoreConfig
    from agentwake.configfile import StoreLocation
    from agentwake.policy import Policy
    from agentwake.store import Store, StoreReader

T = TypeVar("T")

# Longer JSON previews in tables are cut here.
PREVIEW_CHARS: Final = 120

# Help is plain text, as written: with typer's default rich markup, a bracketed word in a help
# text ("a name from [servers]") is taken for a style and vanishes. Plain help also loads no rich:
# `agentwake --help` stays quick. Help texts and command docstrings are what a person reads, so
# they carry no reST (``literal``) markup either; tests/test_help_text.py checks both.
HELP_MARKUP: Final = None


class HelpGroup(TyperGroup):
    """A command group whose help lists each command with its docstring's whole first sentence,
    wrapped to the terminal, where click would cut it to one line with "..."."""

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=sys.maxsize)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


app = typer.Typer(
    name="agentwake",
    help="Wake an LLM agent when something happens upstream, through MCP Events.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=HELP_MARKUP,
    cls=HelpGroup,
)
policy_app = typer.Typer(
    help="Check policy files, and see what they decide for a sample event.",
    no_args_is_help=True,
    rich_markup_mode=HELP_MARKUP,
    cls=HelpGroup,
)

ConfigOption = Annotated[
    Path,
    typer.Option(
        "--config",
        "-c",
        envvar=CONFIG_ENV,
        show_envvar=True,
        help="Config file; relative paths in it resolve against its folder.",
    ),
]
# The commands that never talk to a server, by their path under `agentwake`: they load the config
# without secrets (an unset ${VAR} in [servers.*] stays as written), so they work without them.
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON array instead of a table.")]
ServerOption = Annotated[
    str | None,
    typer.Option("--server", "-s", help="The server the event came from, if the id is on several."),
]


# ---- output ------------------------------------------------------------------------------------


def stdout() -> Console:
    """The console commands print to, ``agentwake.cli.out``: looked up on every call, so a test
    (or a program embedding the CLI) can swap it for a wider one."""
    import agentwake.cli as package

    return package.out


def stderr() -> Console:
    """The console for errors and warnings, ``agentwake.cli.err`` (see ``stdout``)."""
    import agentwake.cli as package

    return package.err


def styled(label: str, style: str, rest: object) -> Text:
    from rich.text import Text

    return Text.assemble((label, style), f" {rest}")


def error(message: object) -> None:
    # soft_wrap: one message stays one line (the terminal folds it), so it can be grepped.
    stderr().print(styled("error:", "red", message), highlight=False, soft_wrap=True)


def fail(exc: BaseException | str, code: int = 1) -> typer.Exit:
    """Print ``error: ...`` (one line, no traceback) and return the exit to raise."""
    error(exc)
    return typer.Exit(code)


def warn(message: object) -> None:
    stderr().print(styled("warning:", "yellow", message), highlight=False, soft_wrap=True)


def clip(text: str, limit: int = PREVIEW_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def setup_logging(level: str, form: str = "text") -> None:
    """Log to stderr at ``level``, secrets redacted; ``form`` "json" is one JSON object per line
    (agentwake.logs), stray stderr text included."""
    import logging

    from agentwake.logs import JsonFormatter, StderrToLog, install_redaction

    if form == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        logging.basicConfig(level=getattr(logging, level), handlers=[handler])
        # Only where our handler is the one writing (basicConfig adds none to a configured root).
        if handler in logging.getLogger().handlers and not isinstance(sys.stderr, StderrToLog):
            sys.stderr = StderrToLog(sys.stderr)
    else:
        logging.basicConfig(
            level=getattr(logging, level),
            stream=sys.stderr,
            format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
            datefmt="%Y-%m-%d %H:%M:%S",
        )
    for root_handler in logging.getLogger().handlers:
        install_redaction(root_handler)
    # The SDK and HTTP clients are chatty at INFO; their problems reach us as errors anyway.
    for noisy in ("mcp", "httpx", "httpx2", "httpcore", "LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, getattr(logging, level)))


# ---- config, policy and store ----------------------------------------------------------------------


def load(path: Path, *, secrets: bool = True) -> AgentwakeConfig:
    """The config at ``path``; an invalid one exits 2 with every problem listed.

    ``secrets``: whether an unset variable in ``[servers.*]`` is an error. It is for every command
    that talks to a server; the read-only ones pass False and the ``${VAR}`` stays as written.
    """
    from agentwake.config import load_config

    try:
        return load_config(path, secrets=secrets)
    except ConfigError as exc:
        raise fail(exc, 2) from None


# Set in the environment of the stdio servers a short look starts (check, events, policy check and
# test, replay): a bridge then serves its tools and event types but no ingress. It does not bind
# --listen (the running service's bridge has that port), open Socket Mode (Slack would hand it
# events meant for the service) or poll.
NO_INGRESS_ENV: Final = "AGENTWAKE_NO_INGRESS"


def without_ingress(server: ServerConfig) -> ServerConfig:
    """``server`` to start for a short look: a stdio server gets NO_INGRESS_ENV=1 in its environment
    (an HTTP server runs on its own; nothing to tell it)."""
    if server.transport != "stdio":
        return server
    return server.model_copy(update={"env": {**server.env, NO_INGRESS_ENV: "1"}})


def short_look(cfg: AgentwakeConfig) -> AgentwakeConfig:
    """``cfg`` with every server as ``without_ingress`` starts it."""
    servers = {name: without_ingress(server) for name, server in cfg.servers.items()}
    return cfg.model_copy(update={"servers": servers})


def load_rules(cfg: AgentwakeConfig) -> Policy:
    """The policy files, as the service loads them; a bad file exits 2 naming file, line and rule."""
    from agentwake.service import load_service_policy

    try:
        return load_service_policy(cfg)
    except AgentwakeError as exc:
        raise fail(exc, 2) from None


def run_async(fn: Callable[[], Awaitable[T]]) -> T:
    """``await fn()`` in a new event loop. Called from inside a running one (a test, a program that
    embeds the CLI), where loops cannot nest, the new loop gets a thread of its own."""
    import asyncio

    import anyio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        nested = False
    else:
        nested = True
    if not nested:
        # Outside the except block: an exception fn raises must not chain "no running event loop".
        return anyio.run(fn)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: anyio.run(fn)).result()


def with_store(cfg: AgentwakeConfig, use: Callable[[Store], Awaitable[T]]) -> T:
    """``await use(store)`` on the configured store, opened (never created: the service does that)
    and closed here. Any store failure, a locked or corrupt file included, is one ``error:`` line
    and exit code 1."""
    from agentwake.store import open_store

    async def opened() -> T:
        store = await open_store(cfg.store, create=False)
        try:
            return await use(store)
        finally:
            await store.close()

    try:
        return run_async(opened)
    except StoreError as exc:
        raise fail(exc) from None


def read_store(path: Path, use: Callable[[StoreLocation, StoreReader], T]) -> T:
    """``use(location, reader)`` for the quick read-only commands (status, inbox, actions, show,
    approvals): the store is found without validating the rest of the config (``check`` does that)
    and read without an event loop, so they start in a blink. A bad config file exits 2; a store
    failure, a locked or corrupt file or an unreachable database included, exits 1; either as one
    ``error:`` line. A SQLite store loads neither pydantic nor psycopg; a PostgreSQL one
    (``[store] url``) is read through ``open_config_reader``."""
    from agentwake.configfile import locate_store

    try:
        location = locate_store(path)
    except ConfigError as exc:
        raise fail(exc, 2) from None
    try:
        reader = open_location(location)
        try:
            return use(location, reader)
        finally:
            reader.close()
    except StoreError as exc:
        raise fail(exc) from None


def open_location(location: StoreLocation) -> StoreReader:
    """A synchronous reader of the store at ``location``, whichever its backend; never created."""
    if location.url is None:
        from agentwake.store import open_reader

        return open_reader(location.path)
    from agentwake.config import StoreConfig
    from agentwake.store import open_config_reader

    return open_config_reader(StoreConfig(url=location.url, password_env=location.password_env))


def store_name(store: StoreConfig) -> str:
    """The configured store as output names it: the SQLite file, or the PostgreSQL database by host,
    port and name (never its password)."""
    from agentwake.configfile import postgres_name

    return str(store.path) if store.url is None else postgres_name(store.url)


def one_event(found: list[dict[str, Any]], event_id: str, server: str | None) -> dict[str, Any]:
    """The one stored event among ``found``; else exit 1 (none), or 2 (on several servers)."""
    if not found:
        where = f" from {server!r}" if server else ""
        raise fail(f"no event with id {event_id!r} in the inbox{where}")
    if len(found) > 1:
        servers = ", ".join(e["server"] for e in found)
        raise fail(f"event id {event_id!r} is on several servers ({servers}); pass --server", 2)
    return found[0]


async def find_event(store: Store, event_id: str, server: str | None) -> dict[str, Any]:
    """The one stored event with this eventId (on ``server``); else exit 1, or 2 if it is on several."""
    return one_event(await store.find_events(event_id, server), event_id, server)


__all__ = [
    "CONFIG_ENV",
    "DEFAULT_CONFIG_PATH",
    "ConfigOption",
    "JsonOption",
    "ServerOption",
    "app",
    "clip",
    "error",
    "fail",
    "find_event",
    "load",
    "load_rules",
    "one_event",
    "open_location",
    "policy_app",
    "read_store",
    "run_async",
    "setup_logging",
    "stderr",
    "stdout",
    "store_name",
    "styled",
    "warn",
    "with_store",
]
