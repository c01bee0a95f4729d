"""Stopping on SIGTERM or SIGINT: open push streams are cancelled on the server, then a clean exit.

`agentwake run` in a real subprocess, one stdio server (tests/push_server.py) with two push
subscriptions on it, no [agent] section. The server traces each stream it opens
("open <request id>") and each notifications/cancelled it receives ("cancel <request id>").
The second-signal and grace-timeout tests run the service in this process and signal it.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc
import pytest
from conftest import REPO
from test_server_stream import Hooks, incident_extension, serving_http

from agentwake import service as service_module
from agentwake.config import parse_config
from agentwake.service import run_service
from agentwake.store import Store
from agentwake.supervisor import Supervisor

pytestmark = pytest.mark.anyio


def write_config(tmp_path: Path, **env: str) -> Path:
    server_env = {
        "PUSH_ITEMS": "3",
        "PUSH_HEARTBEAT_MS": "100",
        "PUSH_LOG": str(tmp_path / "push.log"),
        "PUSH_TRACE": str(tmp_path / "trace.log"),
        **env,
    }
    path = tmp_path / "agentwake.toml"
    path.write_text(
        f"""
[store]
path = "aw.db"

[servers.push]
command = "{sys.executable}"
args = ["tests/push_server.py"]
cwd = "{REPO}"
protocol = "legacy"
env = {{ {", ".join(f'{k} = "{v}"' for k, v in server_env.items())} }}

[[subscriptions]]
name = "feed-a"
server = "push"
event = "feed.item"
delivery = "push"
arguments = {{ prefix = "a" }}

[[subscriptions]]
name = "feed-b"
server = "push"
event = "feed.item"
delivery = "push"
arguments = {{ prefix = "b" }}
"""
    )
    return path


def traced(tmp_path: Path, kind: str) -> list[str]:
    """The request ids of the server's trace lines of one kind, in order."""
    path = tmp_path / "trace.log"
    lines = [line.split(" ") for line in path.read_text().splitlines()] if path.exists() else []
    return [parts[2] for parts in lines if parts[1] == kind]


@dataclass
class Service:
    process: anyio.abc.Process
    stderr: Path

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.stderr.read_bytes().decode(errors="replace").splitlines()[-lines:])

    async def until(self, done: Callable[[], bool], what: str, limit_s: float = 60.0) -> None:
        try:
            with anyio.fail_after(limit_s):
                while not done():
                    if self.process.returncode is not None:
                        raise AssertionError(f"agentwake exited ({self.process.returncode}):\n{self.tail()}")
                    await anyio.sleep(0.02)
        except TimeoutError:
            raise AssertionError(f"not within {limit_s:g}s: {what}\n{self.tail()}") from None

    async def exit_code(self, limit_s: float) -> int:
        try:
            with anyio.fail_after(limit_s):
                return await self.process.wait()
        except TimeoutError:
            raise AssertionError(f"agentwake did not exit within {limit_s:g}s:\n{self.tail()}") from None


@asynccontextmanager
async def service(tmp_path: Path) -> AsyncIterator[Service]:
    config = write_config(tmp_path)
    stderr = tmp_path / "stderr.txt"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with stderr.open("wb") as err:
        process = await anyio.open_process(
            [sys.executable, "-m", "agentwake.cli", "run", "-c", str(config)],
            cwd=tmp_path,
            env=env,
            stdin=None,
            stdout=None,
            stderr=err,
        )
    try:
        yield Service(process, stderr)
    finally:
        if process.returncode is None:
            process.kill()
            with anyio.CancelScope(shield=True):
                await process.wait()
        await process.aclose()


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_a_signal_cancels_every_open_stream_on_the_server_then_exits_0(
    tmp_path: Path, signum: signal.Signals
) -> None:
    async with service(tmp_path) as svc:
        await svc.until(lambda: len(traced(tmp_path, "open")) == 2, "both streams open")
        opened = traced(tmp_path, "open")
        svc.process.send_signal(signum)
        code = await svc.exit_code(limit_s=30)  # a hang guard: how soon it stops is the stop tests' business
    assert code == 0, svc.tail()
    assert sorted(traced(tmp_path, "cancel")) == sorted(opened), svc.tail()
    log = svc.stderr.read_text()
    assert f"received {signum.name}: stopping" in log
    assert "agentwake stopped; cursors are saved in" in log


async def stop_in_process(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    *,
    grace_s: float,
    signals: list[signal.Signals],
) -> float:
    """Run the service here, with delivery that never finishes stopping; send ``signals`` one after
    another (each once the previous one is logged). Returns how long it took to stop after the last."""

    async def never_stops(self: Supervisor) -> None:
        await anyio.sleep_forever()

    monkeypatch.setattr(Supervisor, "stop_delivery", never_stops)
    monkeypatch.setattr(service_module, "STOP_GRACE_S", grace_s)
    monkeypatch.setattr(service_module.gc, "freeze", lambda: None)  # keep this process's heap collectable
    config = parse_config({"store": {"path": str(tmp_path / "aw.db")}}, env={})
    async with anyio.create_task_group() as tg:
        # Started: the signal handlers are installed (a signal before that would end pytest itself).
        await tg.start(run_service, config)
        # Started, it lets the collector's young generation grow (a backlog's queue is not rescanned).
        assert gc.get_threshold()[0] == service_module.COLLECTOR_YOUNG_THRESHOLD
        for n, signum in enumerate(signals):
            os.kill(os.getpid(), signum)
            logged = (
                "received %s: stopping"
                if n == 0
                else "received %s during the graceful stop: stopping at once"
            )
            with anyio.fail_after(5):
                while logged % signum.name not in caplog.text:  # noqa: ASYNC110
                    await anyio.sleep(0.02)
        sent = anyio.current_time()
        with anyio.fail_after(10):
            while "agentwake stopped" not in caplog.text:  # noqa: ASYNC110
                await anyio.sleep(0.02)
        stopped = anyio.current_time() - sent
        tg.cancel_scope.cancel()
    return stopped


async def test_a_second_signal_during_the_grace_stops_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="agentwake")
    stopped = await stop_in_process(
        tmp_path, monkeypatch, caplog, grace_s=60, signals=[signal.SIGTERM, signal.SIGINT]
    )
    assert stopped < 2  # not the 60 s grace
    assert "did not stop within" not in caplog.text


async def test_delivery_that_does_not_stop_within_the_grace_is_cancelled_with_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="agentwake")
    stopped = await stop_in_process(tmp_path, monkeypatch, caplog, grace_s=0.3, signals=[signal.SIGINT])
    assert stopped < 2
    assert "delivery did not stop within 0.3s; stopping the rest without waiting" in caplog.text


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_over_http_stopping_delivery_ends_each_open_stream_on_the_server(
    tmp_path: Path, store: Store, mode: str
) -> None:
    """On HTTP there is no notifications/cancelled on a 2026-era connection: the request is aborted.

    Either way the server's stream must end (its on_unsubscribe hook runs) when delivery stops.
    """
    events = incident_extension(heartbeat_ms=50)
    hooks = Hooks()
    hooks.attach(events, "incident.created")
    async with serving_http(events) as url:
        config = parse_config(
            {
                "servers": {"inc": {"url": url, "protocol": mode}},
                "subscriptions": [
                    {
                        "name": "p1",
                        "server": "inc",
                        "event": "incident.created",
                        "delivery": "push",
                        "arguments": {"severity": "P1"},
                    }
                ],
            },
            env={},
        )
        supervisor = Supervisor(config, store)
        async with anyio.create_task_group() as tg:
            tg.start_soon(supervisor.run)
            with anyio.fail_after(10):
                while not events.open_streams():  # noqa: ASYNC110 - the server signals nothing
                    await anyio.sleep(0.02)
                await supervisor.stop_delivery()
                await hooks.wait_gone()
            tg.cancel_scope.cancel()
    assert events.open_streams() == 0
    [(_, arguments, _)] = hooks.unsubscribed
    assert arguments == {"severity": "P1"}
