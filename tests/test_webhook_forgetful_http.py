"""A webhook subscription a real HTTP server forgot (it restarted with empty memory) is subscribed again
within ``[webhook] max_refresh_s``, and the deliveries after that reach the inbox (issue 29).

``tests/forgetful_http_server.py`` is a minimal hand-written MCP Events server over Streamable HTTP
(no SDK, no agentwake.server) that keeps webhook subscriptions in memory, grants an hour whatever is
asked, verifies the endpoint and POSTs signed deliveries when the test asks. A real `agentwake run`
(a subprocess, its receiver on loopback over TLS) subscribes to it; the test starts a fresh server
on the same port (SO_REUSEPORT) and kills the old one, far within one ping interval: the pings keep
being answered, and nothing but a refresh can tell that the subscription is gone. With the grant
alone the next refresh would be 30 to 45 minutes away; ``max_refresh_s`` brings it within seconds.
Every wait is for a condition, under a deadline.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import anyio.abc
import pytest
import trustme
from _support import RunningService, agentwake_run, read_db
from conftest import REPO, free_port

from agentwake.delivery.webhook import refresh_delay

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
SERVER = Path(__file__).resolve().parent / "forgetful_http_server.py"
TOKEN = "forgetful-token-for-tests"
MAX_REFRESH_S = 3.0
PING_INTERVAL_S = 60.0
GRANT_S = 3600.0
# Scheduling on a busy machine: a refresh planned for max_refresh_s may come this much later.
SLACK_S = 10.0
WAIT = 60.0


@dataclass
class ForgetfulServer:
    """One process of tests/forgetful_http_server.py; its stdout lines (JSON), as they come."""

    process: anyio.abc.Process
    lines: list[dict[str, Any]] = field(default_factory=list)
    _changed: anyio.Event = field(default_factory=anyio.Event)

    async def _read(self) -> None:
        assert self.process.stdout is not None
        pending = b""
        async for chunk in self.process.stdout:
            pending += chunk
            *complete, pending = pending.split(b"\n")
            self.lines.extend(json.loads(line) for line in complete if line.strip())
            changed, self._changed = self._changed, anyio.Event()
            changed.set()

    async def until(
        self, found: Callable[[dict[str, Any]], bool], limit_s: float = WAIT, after: int = 0
    ) -> dict[str, Any]:
        """The first line from ``after`` on for which ``found`` holds."""
        try:
            with anyio.fail_after(limit_s):
                while True:
                    for line in self.lines[after:]:
                        if found(line):
                            return line
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"no such line in {limit_s:g}s: {self.lines[-20:]}") from None

    def subscribes(self) -> list[dict[str, Any]]:
        return [line for line in self.lines if line.get("method") == "events/subscribe"]


@asynccontextmanager
async def forgetful(port: int, ca: Path, tg: anyio.abc.TaskGroup) -> AsyncIterator[ForgetfulServer]:
    """A server process on ``port``, ready; killed on the way out if the test did not kill it."""
    process = await anyio.open_process(
        [sys.executable, str(SERVER), "--port", str(port), "--token", TOKEN, "--ca", str(ca)],
        stderr=None,
    )
    server = ForgetfulServer(process)
    tg.start_soon(server._read)
    try:
        await server.until(lambda line: line.get("ready") == port, limit_s=30)
        yield server
    finally:
        if process.returncode is None:
            process.kill()
        with anyio.CancelScope(shield=True):
            await process.wait()
            await process.aclose()


def write_config(tmp_path: Path, server_port: int, receiver_port: int, cert: Path) -> Path:
    config = tmp_path / "agentwake.toml"
    config.write_text(
        f'[store]\npath = "{tmp_path / "aw.db"}"\n\n'
        f'[policy]\ndir = "{tmp_path / "no-policies"}"\n\n'
        "[servers.forgetful]\n"
        f'url = "http://127.0.0.1:{server_port}/mcp"\n'
        f'headers = {{ Authorization = "Bearer {TOKEN}" }}\n'
        f"ping_interval_s = {PING_INTERVAL_S}\n\n"
        "[webhook]\n"
        f'listen = "127.0.0.1:{receiver_port}"\n'
        f'public_url = "https://127.0.0.1:{receiver_port}/hooks"\n'
        f'tls_cert = "{cert}"\ntls_key = "{cert}"\n'
        f"max_refresh_s = {MAX_REFRESH_S}\n\n"
        '[[subscriptions]]\nname = "ticks"\nserver = "forgetful"\nevent = "f.tick"\ndelivery = "webhook"\n'
    )
    return config


async def emit(port: int) -> list[dict[str, Any]]:
    """Ask the server on ``port`` to deliver its next tick to every subscription it holds."""
    async with aiohttp.ClientSession() as http, http.post(f"http://127.0.0.1:{port}/control/emit") as answer:
        assert answer.status == 200
        sent: list[dict[str, Any]] = (await answer.json())["sent"]
        return sent


async def in_inbox(store: Path, event_id: str, service: RunningService) -> None:
    """Until ``event_id`` is stored. Another process's SQLite file: nothing to wait on but the file."""
    try:
        with anyio.fail_after(WAIT):
            while not read_db(store, f"SELECT 1 FROM events WHERE event_id = '{event_id}'"):  # noqa: ASYNC110
                await anyio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"{event_id} never reached the inbox:\n{service.log()}") from None


def status_json(config: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "agentwake.cli", "status", "--json", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    parsed: list[dict[str, Any]] = json.loads(done.stdout)
    return parsed


def ticks_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    [row] = [row for row in rows if row["subscription"] == "ticks"]
    return row


def test_with_an_hours_grant_alone_the_next_refresh_would_be_half_an_hour_away() -> None:
    """What the bound changes: the plan after a refresh that granted an hour (the fix off, and on)."""
    now = datetime.now(UTC)
    grant = now + timedelta(seconds=GRANT_S)
    rng = random.Random(29)
    unbounded = [
        refresh_delay(grant, now, requested_ttl_s=None, health_refresh_s=300, rng=rng) for _ in range(50)
    ]
    bounded = [
        refresh_delay(
            grant, now, requested_ttl_s=None, health_refresh_s=300, rng=rng, max_refresh_s=MAX_REFRESH_S
        )
        for _ in range(50)
    ]
    assert min(unbounded) >= GRANT_S / 2
    assert max(bounded) <= MAX_REFRESH_S


async def test_a_server_that_restarts_and_forgets_is_subscribed_again_within_max_refresh_s(
    tmp_path: Path,
) -> None:
    ca = trustme.CA()
    cert = tmp_path / "receiver.pem"
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(cert))
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    port, receiver_port = free_port(), free_port()
    config = write_config(tmp_path, port, receiver_port, cert)
    store = tmp_path / "aw.db"

    async with anyio.create_task_group() as tg:
        async with forgetful(port, ca_file, tg) as first, agentwake_run(config) as run:
            # Subscribed (the endpoint verified), then refreshed: a refresh of one it holds, with a status.
            await first.until(lambda line: line.get("method") == "events/subscribe" and not line["held"])
            await first.until(lambda line: line.get("method") == "events/subscribe" and line["held"])
            [sent] = await emit(port)
            assert sent["status"] in (200, 202, 204), sent
            await in_inbox(store, sent["eventId"], run)

            # Just after a refresh: the next one is max_refresh_s away at most (the grant: an hour).
            mark = len(first.lines)
            await first.until(
                lambda line: line.get("method") == "events/subscribe" and line["held"], after=mark
            )
            async with forgetful(port, ca_file, tg) as second:
                first.process.kill()
                await first.process.wait()
                forgot_at = time.time()
                resubscribed = await second.until(
                    lambda line: line.get("method") == "events/subscribe" and not line["held"],
                    limit_s=MAX_REFRESH_S + SLACK_S,
                )
                took = resubscribed["t"] - forgot_at
                assert took <= MAX_REFRESH_S + SLACK_S < GRANT_S / 2
                await run.wait_for("it had lost ours", timeout=WAIT)

                # Deliveries made after the re-subscription reach the inbox.
                [after] = await emit(port)
                assert after["status"] in (200, 202, 204), after
                await in_inbox(store, after["eventId"], run)

                # The next refresh is of one it holds: its deliveryStatus reaches `status`.
                mark = len(second.lines)
                await second.until(
                    lambda line: line.get("method") == "events/subscribe" and line["held"], after=mark
                )
                with anyio.fail_after(WAIT):
                    while True:
                        webhook = ticks_row(await anyio.to_thread.run_sync(status_json, config))["webhook"]
                        if (webhook.get("delivery_status") or {}).get("lastDeliveryAt"):
                            break
                        await second.until(
                            lambda line: line.get("method") == "events/subscribe",
                            after=len(second.lines),
                        )
                assert webhook["delivery_status"]["active"] is True
                assert webhook["delivery_status"].get("lastError") is None
                assert await run.stop(signal.SIGTERM) == 0
                assert second.process.returncode is None  # the same process delivered all along
        tg.cancel_scope.cancel()

    log = "\n".join(run.lines)
    # Nothing but the refresh noticed: no connection was lost, no ping went unanswered.
    assert "reconnect" not in log.lower() and "connection lost" not in log.lower(), run.log()
