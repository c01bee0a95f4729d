"""agentwake under systemd: sd_notify over a real datagram socket (READY, WATCHDOG, STOPPING, STATUS),
the unit file agentwake ships, and the one `agentwake init --systemd` writes."""

from __future__ import annotations

import configparser
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from _support import agentwake_run, demo_server_toml
from typer.testing import CliRunner

from agentwake.cli import app
from agentwake.cli.init import UNIT_TEMPLATE, agentwake_command, systemd_unit
from agentwake.config import parse_config
from agentwake.service import run_service
from agentwake.store import open_reader
from agentwake.systemd import Notifier, socket_address, watchdog_interval

WAIT_S = 60.0
runner = CliRunner()


@dataclass
class NotifySocket:
    """The datagram socket systemd listens on for sd_notify, bound by the test; messages as lists of lines."""

    sock: socket.socket
    path: str
    messages: list[list[str]] = field(default_factory=list)

    async def until(self, assignment: str, limit_s: float = WAIT_S) -> list[list[str]]:
        """Receive until a message holds ``assignment``; the messages received up to it, it included."""
        received: list[list[str]] = []
        with anyio.fail_after(limit_s):
            while True:
                try:
                    data = self.sock.recv(4096)
                except BlockingIOError:
                    await anyio.wait_readable(self.sock)
                    continue
                message = data.decode().split("\n")
                self.messages.append(message)
                received.append(message)
                if assignment in message:
                    return received

    def drain(self) -> list[list[str]]:
        received = []
        while True:
            try:
                received.append(self.sock.recv(4096).decode().split("\n"))
            except BlockingIOError:
                self.messages.extend(received)
                return received


@contextmanager
def notify_socket() -> Iterator[NotifySocket]:
    # A short folder: a socket path must fit in 108 bytes, which pytest's tmp_path may not.
    with (
        tempfile.TemporaryDirectory(prefix="aw-") as folder,
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock,
    ):
        path = os.path.join(folder, "notify")
        sock.bind(path)
        sock.setblocking(False)
        yield NotifySocket(sock, path)


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "agentwake.toml"
    path.write_text(
        f"""
[store]
path = "aw.db"

{demo_server_toml(tmp_path / "demo.db")}
[[subscriptions]]
name = "tickets"
server = "demo"
event = "ticket.created"
"""
    )
    return path


# ---- a real `agentwake run` under a stand-in for systemd ------------------------------------------


@pytest.mark.slow
@pytest.mark.anyio
async def test_agentwake_run_says_ready_once_serving_pings_the_watchdog_and_says_stopping(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path)
    with notify_socket() as notify:
        async with agentwake_run(config, NOTIFY_SOCKET=notify.path, WATCHDOG_USEC="200000") as service:
            before_ready = await notify.until("READY=1")
            assert "STATUS=running: 1 subscription(s) on 1 server(s)" in before_ready[-1]
            # The watchdog is pinged only once the loops run.
            assert not any("WATCHDOG=1" in message for message in before_ready)

            # READY=1 means serving: the service has recorded itself and registered its subscription.
            reader = open_reader(tmp_path / "aw.db")
            try:
                [newest, *_] = reader.services()
                assert (newest["pid"], newest["stopped_at"]) == (service.process.pid, None)
                assert [row["subscription"] for row in reader.subscriptions()] == ["tickets"]
            finally:
                reader.close()
            await service.wait_for("agentwake starting")

            await notify.until("WATCHDOG=1")
            await notify.until("WATCHDOG=1")

            assert await service.stop(signal.SIGTERM, timeout=WAIT_S) == 0
            after_stop = notify.drain()
            assert ["STOPPING=1", "STATUS=stopping"] in after_stop
            assert "could not notify systemd" not in service.log(200)


# ---- run_service with a notifier, in process ------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("watchdog", [True, False])
async def test_the_watchdog_is_pinged_only_when_the_config_allows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, watchdog: bool
) -> None:
    monkeypatch.setattr("agentwake.service.HEARTBEAT_S", 0.02)
    config = parse_config(
        {"store": {"path": str(tmp_path / "aw.db")}, "service": {"watchdog": watchdog}}, env={}
    )

    def beats() -> int:
        reader = open_reader(tmp_path / "aw.db")
        try:
            [newest, *_] = reader.services()
            return int(newest["heartbeat_at"] != newest["started_at"])
        finally:
            reader.close()

    with notify_socket() as notify:
        notifier = Notifier(socket_address(notify.path), watchdog_s=0.01)
        async with anyio.create_task_group() as tg:
            await tg.start(
                lambda task_status: run_service(
                    config, handle_signals=False, notifier=notifier, task_status=task_status
                )
            )
            ready = await notify.until("READY=1")
            assert ready[-1] == ["READY=1", "STATUS=running: 0 subscription(s) on 0 server(s)"]
            if watchdog:
                await notify.until("WATCHDOG=1")
            else:
                # Long enough for a ping due at once: the heartbeat task has slept and written since.
                with anyio.fail_after(WAIT_S):
                    while not beats():  # noqa: ASYNC110 - the store signals nothing
                        await anyio.sleep(0.01)
                assert not any("WATCHDOG=1" in message for message in notify.drain())
            tg.cancel_scope.cancel()


# ---- the notifier -------------------------------------------------------------------------------


def test_an_abstract_socket_name_is_reached_through_its_at_sign() -> None:
    name = f"agentwake-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(10)
        notifier = Notifier.from_environment({"NOTIFY_SOCKET": "@" + name})
        assert notifier.enabled
        assert notifier.ready("running: 2 subscription(s)")
        assert sock.recv(4096) == b"READY=1\nSTATUS=running: 2 subscription(s)"
        assert notifier.status("a status\nof two lines")
        assert sock.recv(4096) == b"STATUS=a status of two lines"


def test_without_notify_socket_every_call_does_nothing() -> None:
    notifier = Notifier.from_environment({"WATCHDOG_USEC": "200000"})
    assert not notifier.enabled and notifier.watchdog_s is None
    assert not notifier.ready("running") and not notifier.watchdog() and not notifier.stopping()


def test_a_socket_nobody_listens_on_is_reported_once_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = Notifier.from_environment({"NOTIFY_SOCKET": str(tmp_path / "gone")})
    with caplog.at_level(logging.WARNING, logger="agentwake.systemd"):
        assert not notifier.watchdog()
        assert not notifier.watchdog()
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "could not notify systemd (" + str(tmp_path / "gone") + ")"
    ]


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"WATCHDOG_USEC": "60000000"}, 30.0),
        ({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": "4242"}, 0.1),
        ({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": "1"}, None),  # meant for another process
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({}, None),
    ],
)
def test_the_watchdog_interval_is_half_of_watchdog_usec_for_our_pid_only(
    environ: dict[str, str], expected: float | None
) -> None:
    assert watchdog_interval(environ, 4242) == expected


@pytest.mark.parametrize(
    ("value", "address"),
    [
        ("/run/systemd/notify", "/run/systemd/notify"),
        ("@x", "\0x"),
        ("", None),
        ("relative", None),
        ("vsock:2:1", None),
    ],
)
def test_notify_socket_values(value: str, address: str | None) -> None:
    assert socket_address(value) == address


# ---- the unit files -----------------------------------------------------------------------------


def unit_settings(text: str) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, comment_prefixes=("#", ";"))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(text)
    return parser


def test_the_packaged_unit_is_a_hardened_notify_service() -> None:
    unit = unit_settings(UNIT_TEMPLATE.read_text())
    service = unit["Service"]
    assert (service["Type"], service["NotifyAccess"], service["Restart"]) == ("notify", "main", "on-failure")
    assert service["ExecStart"] == "/usr/local/bin/agentwake run -c /etc/agentwake/agentwake.toml"
    assert int(service["WatchdogSec"]) >= 10
    # Longer than a graceful stop: the delivery grace plus [service] stop_timeout_s's default.
    assert int(service["TimeoutStopSec"]) > 30 + 2
    assert (service["KillSignal"], service["KillMode"]) == ("SIGTERM", "mixed")
    assert (service["StateDirectory"], service["ReadWritePaths"]) == ("agentwake", "/var/lib/agentwake")
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "read-only",
        "PrivateTmp": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectControlGroups": "yes",
        "LockPersonality": "yes",
        "MemoryDenyWriteExecute": "yes",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
    }.items():
        assert service[key] == value, key
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_init_systemd_writes_a_unit_that_runs_this_agentwake_on_the_projects_config(tmp_path: Path) -> None:
    project = tmp_path / "my agent"  # a space: quoted where systemd splits words
    result = runner.invoke(app, ["init", "--systemd", str(project)])
    assert result.exit_code == 0, result.output
    assert "agentwake.service" in result.output and "sudo systemctl daemon-reload" in result.output
    assert "PrivateTmp=yes hides" in result.output  # tmp_path is under /tmp
    text = (project / "agentwake.service").read_text()
    service = unit_settings(text)["Service"]
    [program] = agentwake_command()  # installed: the agentwake beside this Python
    assert Path(program).is_absolute() and os.access(program, os.X_OK)
    assert service["ExecStart"] == f'{program} run -c "{project}/agentwake.toml"'
    assert service["WorkingDirectory"] == str(project)
    assert service["ReadWritePaths"] == f'"{project}"'
    assert service["EnvironmentFile"] == f"-{project}/agentwake.env"
    assert service["Type"] == "notify" and service["ProtectSystem"] == "strict"
    if os.geteuid() != 0:
        assert service["User"]  # whoever ran init
    if shutil.which("systemd-analyze"):
        verified = subprocess.run(
            ["systemd-analyze", "verify", str(project / "agentwake.service")],
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            check=False,
        )
        assert verified.returncode == 0, verified.stderr
        assert "agentwake.service" not in verified.stderr, verified.stderr


def test_init_systemd_on_an_existing_project_writes_only_the_unit(tmp_path: Path) -> None:
    assert runner.invoke(app, ["init", str(tmp_path)]).exit_code == 0
    config = tmp_path / "agentwake.toml"
    config.write_text(config.read_text().replace('path = "agentwake.db"', 'path = "/srv/aw/agentwake.db"'))
    kept = config.read_bytes()
    result = runner.invoke(app, ["init", "--systemd", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "Wrote a systemd unit for the agentwake project" in result.output
    assert config.read_bytes() == kept
    # The store's folder, outside the project, is writable too.
    service = unit_settings((tmp_path / "agentwake.service").read_text())["Service"]
    assert service["ReadWritePaths"] == f"{tmp_path} /srv/aw"
    again = runner.invoke(app, ["init", "--systemd", str(tmp_path)])
    assert again.exit_code == 1 and "already has agentwake.service" in again.output


@pytest.mark.parametrize(
    ("part", "word"),
    [
        ("/opt/a b/agentwake", '"/opt/a b/agentwake"'),
        ("/srv/100%", "/srv/100%%"),
        ("/srv/$HOME", "/srv/$$HOME"),
    ],
)
def test_command_words_are_quoted_for_systemd(part: str, word: str) -> None:
    text = systemd_unit(
        UNIT_TEMPLATE.read_text(),
        command=[part],
        config=Path("/srv/agentwake.toml"),
        directory=Path("/srv"),
        writable=[Path("/srv")],
        user=("alice", "staff"),
    )
    service = unit_settings(text)["Service"]
    assert service["ExecStart"] == f"{word} run -c /srv/agentwake.toml"
    assert (service["User"], service["Group"]) == ("alice", "staff")
