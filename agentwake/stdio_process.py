"""The server process's life: spawned so that it dies with agentwake, and stopped within bounds.

Shutdown is the SDK's sequence: close stdin, wait, SIGTERM the process group, wait, SIGKILL, every
wait bounded and shielded from cancellation so no server process outlives the context. The waits
are shorter than the SDK's (1.5 s and 0.4 s, not 2 s each; an SDK server takes 0.5 to 1 s to exit
on stdin's end): stdin closing and SIGTERM together fit inside the service's 2 s stop grace (``agentwake.service.STOP_GRACE_S``), so a server that ignores
stdin's end but exits on SIGTERM stops cleanly, without the grace running out.

A server must not outlive agentwake either when agentwake itself dies (SIGKILL, OOM kill) and
cannot run that sequence: on Linux it is started through a tiny wrapper (``python -I -S -c``) that
sets ``PR_SET_PDEATHSIG`` to SIGKILL and execs the server in place (same pid, same process group),
so the kernel kills the server when agentwake's process (the thread that spawned it: the event
loop's) dies. A wrapper rather than ``preexec_fn``: anyio's ``open_process`` takes none, and a
``preexec_fn`` runs Python between fork and exec in a process with threads (the store's), which
the subprocess docs warn may deadlock. Neither a reaper process (one more process to keep alive,
and the same question of who kills it) nor a process group watched from outside is needed for the
server itself; the signal reaches the server only, not children it started in its group (those
see their pipes close). The wrapper costs one short interpreter start per spawn (about 20 ms).
Elsewhere than Linux servers are spawned directly.

``ServerExit`` says how it ended. The transport (``agentwake.stdio``) runs the sequence, with these.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import sys
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Final

import anyio
from anyio.abc import AsyncResource, ByteReceiveStream, Process
from mcp.os.posix.utilities import terminate_posix_process_tree

_EXIT_POLL_S: Final = 0.01


@dataclass(frozen=True, slots=True)
class ServerExit:
    """How a server process ended."""

    server: str
    returncode: int
    stopped_by_agentwake: bool = False
    """We sent SIGTERM (then SIGKILL) because it did not exit when its stdin closed."""
    during_shutdown: bool = False
    """It ended while we were closing the connection, not on its own mid-session."""

    @property
    def signal(self) -> str | None:
        """The name of the signal that killed it, if one did."""
        if self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    def describe(self) -> str:
        """``exited with code 3`` or ``was killed by SIGKILL``."""
        name = self.signal
        return f"was killed by {name}" if name else f"exited with code {self.returncode}"

    def __str__(self) -> str:
        return f"server {self.server!r} {self.describe()}"


async def drain(stream: ByteReceiveStream) -> None:
    """Discards the rest of stdout until EOF or until the shutdown closes it, so a server
    flushing output can still exit; shielded."""
    with (
        anyio.CancelScope(shield=True),
        suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError),
    ):
        while True:
            await stream.receive()


async def close_quietly(stream: AsyncResource | None) -> None:
    if stream is not None:
        with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await stream.aclose()


async def wait_for_exit(process: Process, within_s: float) -> bool:
    """Whether the process died within ``within_s``, polling its returncode.

    Not ``process.wait()``: on some anyio/asyncio versions it also waits for the pipes to
    close, and a child holding them would make an exited server look hung.
    """
    with anyio.move_on_after(within_s):
        while process.returncode is None:  # noqa: ASYNC110 - no event fires on exit alone everywhere
            await anyio.sleep(_EXIT_POLL_S)
        return True
    return False


# Run by ``python -I -S -c``: argv is [-c, parent pid, program path, argv[0], args...]. 1 is
# PR_SET_PDEATHSIG; the parent check closes the race of a parent that died before the prctl.
_PDEATHSIG_WRAPPER: Final = """\
import ctypes, os, signal, sys
if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0) != 0:
    sys.stderr.write("agentwake: prctl(PR_SET_PDEATHSIG) failed\\n")
    os._exit(127)
if os.getppid() != int(sys.argv[1]):
    os._exit(1)
try:
    os.execv(sys.argv[2], sys.argv[3:])
except OSError as exc:
    sys.stderr.write(f"agentwake: cannot run {sys.argv[2]}: {exc.strerror}\\n")
    os._exit(127)
"""


def spawn_command(command: str, args: list[str], env: Mapping[str, str], cwd: Any) -> list[str]:
    """What to spawn for ``command args``: on Linux the PR_SET_PDEATHSIG wrapper around it, so the
    server dies with this process (see the module docstring); elsewhere the command itself.

    The program is looked up here, on the server's PATH and relative to its ``cwd``, so that a
    missing or non-executable one still raises (FileNotFoundError, PermissionError) at spawn, as
    without the wrapper, rather than becoming an exit code.
    """
    if sys.platform != "linux" or not sys.executable or not command:
        return [command, *args]
    if os.sep in command:
        program = os.path.join(os.fspath(cwd), command) if cwd is not None else command
        if not os.path.exists(program):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)
        if os.path.isdir(program) or not os.access(program, os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), command)
    else:
        found = shutil.which(command, path=env.get("PATH", os.defpath))
        if found is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)
        program = found
    # Absolute: the wrapper runs in ``cwd``, and a relative ``cwd`` is itself taken from here.
    program = os.path.abspath(program)
    return [sys.executable, "-I", "-S", "-c", _PDEATHSIG_WRAPPER, str(os.getpid()), program, command, *args]


async def terminate_tree(process: Process, terminate_wait_s: float) -> None:
    """SIGTERM the process group, SIGKILL what is left after ``terminate_wait_s``."""
    if sys.platform == "win32":  # pragma: no cover - agentwake runs servers on POSIX
        process.kill()
    else:
        await terminate_posix_process_tree(process, terminate_wait_s)
