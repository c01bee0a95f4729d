"""A stdio server ends with agentwake, however agentwake ends.

A real `agentwake run` spawns tests/eof_ignoring_server.py over stdio: a server that does not exit
when its stdin closes and goes on writing (a line every 50 ms).

* SIGKILL of agentwake (no stop sequence can run): the server, which here ignores SIGTERM too,
  is gone within seconds (PR_SET_PDEATHSIG, Linux).
* SIGTERM of agentwake: stdin closes, then SIGTERM ends the server, all inside the 2 s stop grace:
  no "delivery did not stop within 2s" warning, exit 0, the server gone.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import anyio
import pytest
from _support import agentwake_run
from conftest import REPO

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(sys.platform != "linux", reason="/proc and PR_SET_PDEATHSIG are Linux's"),
]

GONE_WITHIN_S = 5.0


def write_config(tmp_path: Path, sigterm: str) -> Path:
    env = {
        "STUBBORN_PIDFILE": str(tmp_path / "server.pid"),
        "STUBBORN_BEAT": str(tmp_path / "beat"),
        "STUBBORN_SIGTERM": sigterm,
        "FEED_ITEMS": "3",
    }
    path = tmp_path / "agentwake.toml"
    path.write_text(
        f"""
[store]
path = "aw.db"

[servers.stubborn]
command = {json.dumps(sys.executable)}
args = ["tests/eof_ignoring_server.py"]
cwd = {json.dumps(str(REPO))}
env = {{ {", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())} }}

[[subscriptions]]
name = "feed"
server = "stubborn"
event = "feed.item"
"""
    )
    return path


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: it is dead, waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


async def until_gone(pid: int, within_s: float) -> None:
    with anyio.fail_after(within_s):
        while alive(pid):  # noqa: ASYNC110 - nothing signals another process's death to us
            await anyio.sleep(0.02)


async def test_a_stdio_server_that_ignores_stdin_end_and_sigterm_dies_with_a_sigkilled_agentwake(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, sigterm="ignore")
    pid: int | None = None
    try:
        async with agentwake_run(config) as service:
            await service.wait_for("connected to stubborn over stdio")
            pid = int((tmp_path / "server.pid").read_text())
            assert alive(pid)
            service.process.send_signal(signal.SIGKILL)
            with anyio.fail_after(10):
                assert await service.process.wait() == -signal.SIGKILL
            killed = time.monotonic()
            await until_gone(pid, GONE_WITHIN_S)
            assert time.monotonic() - killed < GONE_WITHIN_S
    finally:
        if pid is not None and alive(pid):  # the failure being tested: do not leave it running
            os.kill(pid, signal.SIGKILL)


async def test_a_stdio_server_that_ignores_stdin_end_but_obeys_sigterm_stops_inside_the_grace(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, sigterm="exit")
    pid: int | None = None
    try:
        async with agentwake_run(config) as service:
            await service.wait_for("connected to stubborn over stdio")
            pid = int((tmp_path / "server.pid").read_text())
            stopping = len(service.lines)
            assert await service.stop(signal.SIGTERM, timeout=15) == 0
            with anyio.fail_after(10):  # the last lines may still be on their way from the pipe
                while not any("agentwake stopped" in line for line in service.lines[stopping:]):  # noqa: ASYNC110
                    await anyio.sleep(0.02)
            stop_log = service.lines[stopping:]
            assert not any("did not stop within" in line for line in stop_log), "\n".join(stop_log)
            assert any(
                "was killed by SIGTERM: it did not exit when its stdin closed" in line for line in stop_log
            ), "\n".join(stop_log)
            await until_gone(pid, GONE_WITHIN_S)
    finally:
        if pid is not None and alive(pid):
            os.kill(pid, signal.SIGKILL)
