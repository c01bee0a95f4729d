"""Test helpers that are not fixtures."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from conftest import REPO, demo_stdio

from agentwake.store import Store, SubscriptionKey


class SteppedSleep:
    """Stands in for anyio.sleep inside a loop: records each delay and waits for the test to release it."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self._taken = 0
        self._released = 0
        self._changed = anyio.Event()

    def _poke(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        mine = len(self.delays)
        self._poke()
        while self._released < mine:
            await self._changed.wait()

    async def next(self, limit_s: float = 20) -> float:
        """Wait until the loop asks to sleep; returns the delay it asked for."""
        with anyio.fail_after(limit_s):
            while len(self.delays) <= self._taken:
                await self._changed.wait()
        self._taken += 1
        return self.delays[self._taken - 1]

    def release(self) -> None:
        self._released += 1
        self._poke()


async def set_cursor(store: Store, key: SubscriptionKey, cursor: str) -> None:
    """Persist a cursor as if an earlier run had reached it."""
    await store.register(key)
    await store.ingest(key, [], cursor)


def fake_agent_toml(llm_url: str, **settings: object) -> str:
    """The ``[agent]`` table of a model served by tests/fake_llm.py at ``llm_url`` (key in FAKE_LLM_KEY),
    with the repository's prompts and ``settings`` on top."""
    lines = [
        "[agent]",
        'model = "openai/fake"',
        f"api_base = {json.dumps(llm_url)}",
        'api_key_env = "FAKE_LLM_KEY"',
        f"prompts = {json.dumps(str(REPO / 'prompts'))}",
        *(f"{key} = {json.dumps(value)}" for key, value in settings.items()),
    ]
    return "\n".join(lines) + "\n"


def start_from_cursor(config: Path, cursor: str = "0") -> Path:
    """Persist ``cursor`` for the config's first subscription, as an earlier run would have left it
    (with "0" the demo's backlog is delivered on start: a null cursor bootstraps at the head and
    replays nothing). Returns the store's path."""
    from agentwake.config import load_config
    from agentwake.delivery.common import subscription_key
    from agentwake.store.sqlite import SqliteCore

    loaded = load_config(config)
    core = SqliteCore.open(loaded.store.path)
    try:
        key = subscription_key(loaded.subscriptions[0])
        core.register(key)
        core.ingest(key, [], cursor)
    finally:
        core.close()
    return loaded.store.path


def demo_server_toml(db: Path, name: str = "demo", **env: str) -> str:
    """The TOML of a ``[servers.<name>]`` table that spawns the quiet demo server over stdio, as
    ``demo_stdio`` configures it: run from the repo, its tickets file at ``db`` (under the test's
    tmp_path: never the repo's own demo.db), ``env`` on top."""
    server = demo_stdio(db, **env)
    env_toml = ", ".join(f"{key} = {json.dumps(value)}" for key, value in server.env.items())
    return (
        f"[servers.{name}]\n"
        f"command = {json.dumps(server.command)}\n"
        f"args = {json.dumps(server.args)}\n"
        f"cwd = {json.dumps(str(server.cwd))}\n"
        f"env = {{ {env_toml} }}\n"
    )


@dataclass
class RunningService:
    """A real `agentwake run` subprocess, its stderr collected line by line."""

    process: anyio.abc.Process
    lines: list[str] = field(default_factory=list)
    _changed: anyio.Event = field(default_factory=anyio.Event)

    def log(self, last: int = 40) -> str:
        return "\n".join(self.lines[-last:])

    async def wait_for(self, *needles: str, after: int = 0, timeout: float = 60) -> int:  # noqa: ASYNC109
        """Index of the first stderr line from ``after`` on that holds every needle; fails the test,
        showing the log, if none comes in time or agentwake exits first."""
        index = after
        try:
            with anyio.fail_after(timeout):
                while True:
                    while index < len(self.lines):
                        if all(needle in self.lines[index] for needle in needles):
                            return index
                        index += 1
                    if self.process.returncode is not None:
                        raise AssertionError(f"agentwake exited ({self.process.returncode}):\n{self.log()}")
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"no log line with {needles!r} in {timeout:g}s:\n{self.log()}") from None

    async def stop(self, signum: signal.Signals = signal.SIGTERM, timeout: float = 30) -> int:  # noqa: ASYNC109
        """Send ``signum`` and wait for the exit; its return code."""
        self.process.send_signal(signum)
        with anyio.fail_after(timeout):
            return await self.process.wait()

    def _poke(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def _read(self) -> None:
        assert self.process.stderr is not None
        pending = b""
        async for chunk in self.process.stderr:
            pending += chunk
            *complete, pending = pending.split(b"\n")
            self.lines.extend(line.decode(errors="replace") for line in complete)
            self._poke()
        await self.process.wait()
        self._poke()


@asynccontextmanager
async def agentwake_run(config: Path, **env: str) -> AsyncIterator[RunningService]:
    """`agentwake run -c config` as a subprocess in the config's folder, ``env`` added to this one's;
    killed on the way out if the test did not stop it."""
    process = await anyio.open_process(
        [sys.executable, "-m", "agentwake.cli", "run", "-c", str(config)],
        cwd=config.parent,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )
    running = RunningService(process)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(running._read)
            try:
                yield running
            finally:
                if process.returncode is None:
                    process.kill()
                with anyio.CancelScope(shield=True), anyio.fail_after(30):
                    await process.wait()
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await process.aclose()


# -- the bridges end to end: `agentwake run` spawning `agentwake bridge <kind>` over stdio ----------

QUICK_BRIDGE = ["--next-poll-ms", "200", "--heartbeat-ms", "1000"]


def bridge_server_toml(kind: str, state_dir: Path, args: list[str], env: Iterable[str]) -> str:
    """The ``[servers.<kind>]`` table that spawns ``agentwake bridge <kind>`` with its state in
    ``state_dir``, ``args`` then short poll and heartbeat intervals; each of ``env`` is the inside of
    a ``${...}`` expansion (``NAME`` or ``NAME:-``) passed on as the variable it names."""
    argv = ["-m", "agentwake.cli", "bridge", kind, "--state-dir", str(state_dir), *args, *QUICK_BRIDGE]
    env_toml = ", ".join(f'{spec.split(":", 1)[0]} = "${{{spec}}}"' for spec in env)
    return (
        f"[servers.{kind}]\n"
        f"command = {json.dumps(sys.executable)}\n"
        f"args = {json.dumps(argv)}\n"
        f"env = {{ {env_toml} }}\n\n"
    )


def write_bridge_config(
    tmp_path: Path, servers: str, llm_url: str, subscriptions: str, *, policies: Path | tuple[str, str]
) -> Path:
    """agentwake.toml in ``tmp_path``: its store aw.db there, ``servers``, the fake LLM's agent and
    ``subscriptions``; ``policies`` a folder, or (file name, TOML) of the one file of a new one."""
    if isinstance(policies, tuple):
        name, policy = policies
        folder = tmp_path / "policies"
        folder.mkdir()
        (folder / name).write_text(policy)
        policies = folder
    config = tmp_path / "agentwake.toml"
    config.write_text(
        f'[store]\npath = "{tmp_path / "aw.db"}"\n\n'
        + servers
        + f'[policy]\ndir = {json.dumps(str(policies))}\ndefault = "log"\n\n'
        + fake_agent_toml(llm_url)
        + subscriptions
    )
    return config


def read_db(path: Path, query: str) -> list[tuple[Any, ...]]:
    """Rows from another process's SQLite file, read-only while it runs."""
    if not path.exists():
        return []
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute(query).fetchall()
    except sqlite3.OperationalError:  # not created yet
        return []
    finally:
        db.close()


async def until_rows(
    path: Path, query: str, done: Callable[[list[tuple[Any, ...]]], Any], service: RunningService
) -> list[tuple[Any, ...]]:
    """The rows of ``query`` once ``done(rows)`` holds. Another process's SQLite file: there is nothing
    to wait on but the file itself."""
    try:
        with anyio.fail_after(60):
            while not done(rows := read_db(path, query)):  # noqa: ASYNC110
                await anyio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"{query}: {read_db(path, query)}\n{service.log()}") from None
    return rows


async def bootstrapped(store: Path, names: Iterable[str], service: RunningService) -> None:
    """Until every subscription has its first cursor: an event sent before would predate it."""
    wanted = set(names)

    def started() -> set[str]:
        return {name for name, cursor in read_db(store, "SELECT name, cursor FROM subscriptions") if cursor}

    # Another process's SQLite file: there is nothing to wait on but the file itself.
    try:
        with anyio.fail_after(60):
            while not started() >= wanted:  # noqa: ASYNC110
                await anyio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"subscriptions not started: {wanted - started()}\n{service.log()}") from None


async def settled(store: Path, count: int) -> list[tuple[str, str]]:
    """Until ``count`` events are in the inbox and none is still being handled; (subscription, state)."""
    with anyio.fail_after(60):
        while True:
            rows = [(sub, state) for sub, state in read_db(store, "SELECT subscription, state FROM events")]
            if len(rows) >= count and all(state not in ("pending", "processing") for _, state in rows):
                return rows
            await anyio.sleep(0.05)


@asynccontextmanager
async def serving_mcp_http(events: Any, name: str = "t") -> AsyncIterator[str]:
    """``events`` (an EventsExtension, running) in an MCPServer served over Streamable HTTP by uvicorn
    on a loopback socket; yields its origin (the MCP endpoint is ``<origin>/mcp``)."""
    import socket

    import uvicorn
    from mcp.server.mcpserver import MCPServer

    server = MCPServer(name, extensions=[events])
    events.install(server)
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    http_server = uvicorn.Server(
        uvicorn.Config(server.streamable_http_app(), log_level="warning", lifespan="on")
    )
    try:
        async with events.running(), anyio.create_task_group() as tg:
            tg.start_soon(lambda: http_server.serve(sockets=[sock]))
            try:
                yield f"http://127.0.0.1:{port}"
            finally:
                http_server.should_exit = True
    finally:
        sock.close()
