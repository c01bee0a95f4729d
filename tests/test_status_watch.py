"""`agentwake status --watch`: a real subprocess refreshing from a real store until Ctrl-C (exit 0),
as text on a pipe, as one JSON line per refresh, and redrawn in place on a terminal (a pty)."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from conftest import REPO

from agentwake.store import IncomingEvent, SubscriptionKey
from agentwake.store.sqlite import SqliteCore

WAIT_S = 30.0
KEY = SubscriptionKey("tickets", "demo", "ticket.created", {})
HEADER = "agentwake status at "


def make_store(tmp_path: Path) -> Path:
    """A config and its store, with one subscription registered and no events yet."""
    config = tmp_path / "agentwake.toml"
    config.write_text(
        '[store]\npath = "aw.db"\n\n[servers.demo]\ncommand = "agentwake-demo"\n\n'
        '[[subscriptions]]\nname = "tickets"\nserver = "demo"\nevent = "ticket.created"\n'
    )
    core = SqliteCore.open(tmp_path / "aw.db")
    try:
        core.register(KEY)
    finally:
        core.close()
    return config


def add_ticket(tmp_path: Path, ticket_id: str) -> None:
    core = SqliteCore.open(tmp_path / "aw.db", create=False)
    try:
        core.ingest(KEY, [IncomingEvent(ticket_id, "ticket.created", "2026-12-02T10:00:00Z", {})], ticket_id)
    finally:
        core.close()


def status_command(config: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "agentwake.cli", "status", "-c", str(config), "--watch", *args]


def status_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


@dataclass
class Watching:
    """A `status --watch` subprocess and the lines of its stdout so far."""

    process: anyio.abc.Process
    lines: list[str] = field(default_factory=list)
    _pending: bytes = b""

    async def line_where(self, ok: Callable[[str], bool], limit_s: float = WAIT_S) -> int:
        """Read stdout until a line (from the start) satisfies ``ok``; its index."""
        assert self.process.stdout is not None
        index = 0
        with anyio.fail_after(limit_s):
            while True:
                while index < len(self.lines):
                    if ok(self.lines[index]):
                        return index
                    index += 1
                chunk = await self.process.stdout.receive()
                self._pending += chunk
                *complete, self._pending = self._pending.split(b"\n")
                self.lines.extend(line.decode() for line in complete)

    async def interrupt(self) -> tuple[int, str]:
        """Ctrl-C: SIGINT, then the exit code and what it wrote to stderr."""
        self.process.send_signal(signal.SIGINT)
        assert self.process.stderr is not None
        with anyio.fail_after(WAIT_S):
            code = await self.process.wait()
            err = b"".join([chunk async for chunk in self.process.stderr])
        return code, err.decode()


@asynccontextmanager
async def watching(command: list[str]) -> AsyncIterator[Watching]:
    async with await anyio.open_process(command, env=status_env()) as process:
        try:
            yield Watching(process)
        finally:
            if process.returncode is None:
                process.kill()
                with anyio.CancelScope(shield=True):
                    await process.wait()


def headers(lines: list[str]) -> int:
    return sum(line.startswith(HEADER) for line in lines)


@pytest.mark.anyio
async def test_watch_on_a_pipe_prints_each_refresh_until_ctrl_c_then_exits_0(tmp_path: Path) -> None:
    config = make_store(tmp_path)
    async with watching(status_command(config, "--interval", "0.2")) as watch:
        await watch.line_where(lambda _: headers(watch.lines) >= 2)
        first, second = [line for line in watch.lines if line.startswith(HEADER)][:2]
        assert first.endswith("every 0.2s (Ctrl-C to stop)") and first != second  # a new time each
        text = "\n".join(watch.lines)
        assert "service: no record of 'agentwake run' in this store yet" in text and "tickets" in text
        code, err = await watch.interrupt()
    assert code == 0, err
    assert "Traceback" not in err and "Aborted" not in err


@pytest.mark.anyio
async def test_watch_json_prints_one_document_per_line_and_shows_what_changed(tmp_path: Path) -> None:
    config = make_store(tmp_path)
    async with watching(status_command(config, "--json", "--with-service", "--interval", "0.2")) as watch:
        await watch.line_where(bool)
        first: dict[str, Any] = json.loads(watch.lines[0])
        assert first["service"] is None
        assert [(r["subscription"], r["events_received"]) for r in first["subscriptions"]] == [("tickets", 0)]

        add_ticket(tmp_path, "T-1")

        def counts_it(line: str) -> bool:
            return bool(line) and json.loads(line)["subscriptions"][0]["events_received"] == 1

        await watch.line_where(counts_it)
        code, err = await watch.interrupt()
    assert code == 0, err
    assert all(json.loads(line) for line in watch.lines if line)  # every line a whole document
    assert "Traceback" not in err


def test_watch_on_a_terminal_redraws_in_place_until_ctrl_c(tmp_path: Path) -> None:
    config = make_store(tmp_path)
    leader, follower = pty.openpty()
    env = status_env(COLUMNS="160", LINES="40", TERM="xterm-256color")
    for forcing in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        env.pop(forcing, None)
    process = subprocess.Popen(
        status_command(config, "--interval", "0.2"), stdout=follower, stderr=subprocess.PIPE, env=env
    )
    os.close(follower)
    shown = b""
    try:
        deadline = time.monotonic() + WAIT_S
        # Rich's Live moves the cursor up over the last frame before drawing the next one.
        while shown.count(HEADER.encode()) < 2 or b"\x1b[" not in shown:
            remaining = deadline - time.monotonic()
            assert remaining > 0, shown.decode(errors="replace")
            readable, _, _ = select.select([leader], [], [], remaining)
            if readable:
                shown += os.read(leader, 65536)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=WAIT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(leader)
    assert process.returncode == 0, err.decode()
    assert b"Traceback" not in err
    assert b"\x1b[?25l" in shown  # Live hides the cursor while it draws (and shows it again on exit)


def test_interval_without_watch_is_an_error(tmp_path: Path) -> None:
    config = make_store(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "agentwake.cli", "status", "-c", str(config), "--interval", "1"],
        capture_output=True,
        text=True,
        env=status_env(),
        timeout=WAIT_S,
        check=False,
    )
    assert done.returncode == 2
    assert "--interval is for --watch" in done.stderr
