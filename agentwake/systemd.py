"""systemd's notify protocol (``sd_notify``), with the standard library only.

Under a unit with ``Type=notify``, systemd passes ``$NOTIFY_SOCKET``: a datagram socket, given as
a path or, with a leading ``@``, as a name in Linux's abstract namespace. A message is one
datagram of newline-separated assignments:

    READY=1       startup is done: the loops run; `systemctl start` returns
    STOPPING=1    a stop signal came; the service is shutting down
    STATUS=...    one line, shown by `systemctl status`
    WATCHDOG=1    alive. With WatchdogSec= (passed as $WATCHDOG_USEC) systemd kills and restarts
                  a service silent for longer; sd_watchdog_enabled(3) advises pinging at half of it.

``$WATCHDOG_PID``, when set, names the one process meant to ping: a child that inherited the
variables must not. Without ``$NOTIFY_SOCKET`` (not under systemd) every call does nothing, and a
failure to send is logged (once until one succeeds) and otherwise ignored: notifying never stops
the service. The unit agentwake ships is ``agentwake/defaults/systemd/agentwake.service``.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

import anyio
import anyio.abc

logger = logging.getLogger(__name__)

NOTIFY_SOCKET_ENV: Final = "NOTIFY_SOCKET"
WATCHDOG_USEC_ENV: Final = "WATCHDOG_USEC"
WATCHDOG_PID_ENV: Final = "WATCHDOG_PID"
# Ping at this fraction of WatchdogSec=, as sd_watchdog_enabled(3) advises.
WATCHDOG_FRACTION: Final = 0.5


def socket_address(value: str) -> str | None:
    """Where to send for a ``$NOTIFY_SOCKET`` value: a path, or ``@name`` as the abstract ``\\0name``.
    None for anything else (empty, relative, or a newer systemd's ``vsock:`` form, not supported)."""
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None


def watchdog_interval(environ: Mapping[str, str], pid: int) -> float | None:
    """Seconds between two WATCHDOG=1 for process ``pid``, or None when no watchdog is asked of it."""
    try:
        usec = int(environ.get(WATCHDOG_USEC_ENV, ""))
    except ValueError:
        return None
    owner = environ.get(WATCHDOG_PID_ENV, "")
    if usec <= 0 or (owner and owner != str(pid)):
        return None
    return usec / 1_000_000 * WATCHDOG_FRACTION


@dataclass
class Notifier:
    """Sends sd_notify messages to ``address``; with None (not under systemd), does nothing."""

    address: str | None = None
    # Seconds between two WATCHDOG=1, or None when systemd asked for no watchdog.
    watchdog_s: float | None = None
    _failing: bool = field(default=False, repr=False)

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str] | None = None, *, pid: int | None = None
    ) -> Notifier:
        environ = os.environ if environ is None else environ
        pid = os.getpid() if pid is None else pid
        raw = environ.get(NOTIFY_SOCKET_ENV, "")
        address = socket_address(raw)
        if raw and address is None:
            logger.warning(
                "%s=%r is not a socket path or @name: systemd is not notified", NOTIFY_SOCKET_ENV, raw
            )
        return cls(address, watchdog_interval(environ, pid) if address else None)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *assignments: str) -> bool:
        """One datagram of ``KEY=value`` lines; whether it was sent."""
        if self.address is None or not assignments:
            return False
        message = "\n".join(assignments).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                # Never block the event loop: a full queue at systemd's end drops the message.
                sock.setblocking(False)
                sock.sendto(message, self.address)
        except OSError as exc:
            if not self._failing:
                logger.warning("could not notify systemd (%s): %s", self._shown_address(), exc)
            self._failing = True
            return False
        self._failing = False
        return True

    def ready(self, status: str) -> bool:
        return self.send("READY=1", _status(status))

    def stopping(self, status: str = "stopping") -> bool:
        return self.send("STOPPING=1", _status(status))

    def status(self, text: str) -> bool:
        return self.send(_status(text))

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    async def keep_alive(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """WATCHDOG=1 now and every ``watchdog_s`` until cancelled; without a watchdog, returns at once.

        It runs in the service's task group, so the pings stop when the event loop stalls or the
        service stops, which is what systemd's watchdog is there to notice."""
        task_status.started()
        if self.watchdog_s is None:
            return
        while True:
            self.watchdog()
            await anyio.sleep(self.watchdog_s)

    def _shown_address(self) -> str:
        address = self.address or ""
        return "@" + address[1:] if address.startswith("\0") else address


def _status(text: str) -> str:
    return "STATUS=" + " ".join(text.split())


__all__ = [
    "NOTIFY_SOCKET_ENV",
    "WATCHDOG_PID_ENV",
    "WATCHDOG_USEC_ENV",
    "Notifier",
    "socket_address",
    "watchdog_interval",
]
