"""A throwaway PostgreSQL server for tests: Debian's binaries, a private data dir, a loopback port.

``postgres_server`` (one server per pytest process: per xdist worker) and ``postgres_url`` (a fresh
database per test) are fixtures, registered for every test module by ``tests/conftest.py``
(``pytest_plugins = ["_postgres"]``). A module that still imports them by name,

    from _postgres import postgres_server, postgres_url  # noqa: F401 - fixtures

gets the same server: pytest sees a second session fixture there, but both hand out the one
server of this process (``shared_server``), started at the first use and stopped after the last.

Besides the trusted user ``agentwake``, every server has the role ``locked`` (``PASSWORD_USER``),
which must give its password (``PASSWORD``, scram-sha-256) over TCP: for tests of password handling.

A server whose test process was killed (a crashed xdist worker, a killed run) outlives it, but not
for long: ``sweep_orphans`` stops and removes every server whose owner process is gone, before each
new server starts and at the end of each run (in the xdist controller, after every worker), so
nothing piles up and nothing of it is in the next run's way. Servers of live processes (another
run going on at the same time) are never touched.

The server trusts every local connection (no password) and runs with fsync off: fast, and nothing in
it outlives the session. PostgreSQL refuses to run as root, so under root (CI) ``initdb`` and
``pg_ctl`` run as the ``postgres`` OS user, in a directory it owns.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

USER = "agentwake"
PREFIX = "agentwake-pg-"
OS_USER = "postgres"
START_TIMEOUT_S = 30
PASSWORD_USER = "locked"
PASSWORD = "s3cret-Pa55word-xyzzy"
# First match wins: the password user must give its password over TCP; the rest is trusted.
HBA = (
    "local all all trust\n"
    f"host all {PASSWORD_USER} 127.0.0.1/32 scram-sha-256\n"
    "host all all 127.0.0.1/32 trust\n"
)
MISSING = (
    "PostgreSQL's server binaries (initdb, pg_ctl) are not installed:"
    " run `make test`, which installs Debian's postgresql package when run as root"
)


def find_bindir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin`` with initdb and pg_ctl, or one on PATH."""
    candidates = []
    for found in glob.glob("/usr/lib/postgresql/*/bin"):
        version = Path(found).parent.name
        if version.replace(".", "").isdigit():
            candidates.append((tuple(int(p) for p in version.split(".")), Path(found)))
    for _, bindir in sorted(candidates, reverse=True):
        if (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file():
            return bindir
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).parent
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresError(RuntimeError):
    pass


def _process_key(pid: int) -> str | None:
    """``"<pid> <start time>"``: a process, told apart from a later one given the same pid."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return None
    return f"{pid} {fields[19]}"  # after the command, the 20th field is starttime


def _owner_alive(owner: str) -> bool:
    """Whether the process an ``owner`` file names (``_process_key``, or a bare pid) still runs."""
    pid = int(owner.split()[0])
    if " " in owner.strip():
        return _process_key(pid) == owner.strip()
    return _pid_alive(pid)


def servers_parent() -> Path:
    # /tmp rather than pytest's tmp_path: /tmp/pytest-of-root is root's alone.
    return Path("/tmp") if os.geteuid() == 0 else Path(tempfile.gettempdir())


def sweep_orphans(parent: Path | None = None, bindir: Path | None = None) -> None:
    """Stop and remove the servers of test processes that died before their teardown (a killed
    run, a crashed xdist worker), so they do not pile up and are in no later run's way."""
    for base in (parent or servers_parent()).glob(f"{PREFIX}*"):
        try:
            if _owner_alive((base / "owner").read_text()):
                continue
        except (OSError, ValueError, IndexError):
            continue  # being set up (no owner yet), or not ours
        try:
            orphan = PostgresServer(bindir)
        except PostgresError:  # no binaries to stop it politely: killed, then removed
            orphan = PostgresServer(Path("/nonexistent"))
        orphan.base = base
        try:
            orphan.stop()
        except (OSError, PostgresError, subprocess.SubprocessError):
            continue  # another process's (a user's we may not signal): left alone


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process is in process group ``pgid``."""
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        # After the command: state, ppid, pgrp.
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


class PostgresServer:
    """One PostgreSQL server in its own temporary directory: ``start()``, ``url(db)``, ``stop()``."""

    def __init__(self, bindir: Path | None = None) -> None:
        found = bindir or find_bindir()
        if found is None:
            raise PostgresError(MISSING)
        self.bindir = found
        self.as_root = os.geteuid() == 0
        self.base: Path | None = None
        self.port = 0
        self._names = itertools.count(1)

    # ---- paths and commands -------------------------------------------------------------------

    @property
    def data(self) -> Path:
        assert self.base is not None, "the server was never started"
        return self.base / "data"

    @property
    def sockets(self) -> Path:
        assert self.base is not None, "the server was never started"
        return self.base / "sock"

    @property
    def log(self) -> Path:
        assert self.base is not None, "the server was never started"
        return self.base / "server.log"

    def _env(self) -> dict[str, str]:
        # The caller's PG* variables (PGDATA, PGPORT, PGHOST, ...) must not point the tools elsewhere.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        env["LANG"] = "C"
        return env

    def _run(self, tool: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        command = [str(self.bindir / tool), *args]
        if self.as_root:
            command = ["runuser", "-u", OS_USER, "--", *command]
        return subprocess.run(
            command,
            env=self._env(),
            cwd=self.base,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def _check(self, done: subprocess.CompletedProcess[str], what: str) -> None:
        if done.returncode != 0:
            log = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise PostgresError(
                f"{what} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}"
                + (f"\nserver log:\n{log}" if log else "")
            )

    # ---- life cycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """initdb (first time only) and start the server; on the same port when started again."""
        fresh = self.base is None
        if fresh:
            self._init()
        self._start()
        if fresh:
            self._psql(f"CREATE ROLE {PASSWORD_USER} LOGIN SUPERUSER PASSWORD '{PASSWORD}'")

    def _start(self) -> None:
        attempts = 1 if self.port else 5
        for attempt in range(attempts):
            if not self.port or attempt:
                self.port = free_port()
            done = self._run(
                "pg_ctl",
                "-w",
                "-t",
                str(START_TIMEOUT_S),
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-o",
                f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1 -c fsync=off"
                " -c synchronous_commit=off -c full_page_writes=off -c shared_buffers=32MB",
                "start",
                timeout=START_TIMEOUT_S + 10,
            )
            if done.returncode == 0:
                return
            # Another process took the port between free_port() and the bind: try another one.
            if attempt + 1 == attempts or "already in use" not in self.log.read_text(errors="replace"):
                self._check(done, "pg_ctl start")

    def _init(self) -> None:
        # /tmp rather than pytest's tmp_path: /tmp/pytest-of-root is root's alone.
        parent = servers_parent()
        sweep_orphans(parent, self.bindir)
        # mkdtemp makes it 0700: PostgreSQL, as another user, must traverse and own what is inside.
        self.base = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
        (self.base / "owner").write_text(_process_key(os.getpid()) or str(os.getpid()))
        self.sockets.mkdir()
        if self.as_root:
            self.base.chmod(0o755)
            shutil.chown(self.base, OS_USER, OS_USER)
            shutil.chown(self.sockets, OS_USER, OS_USER)
        done = self._run(
            "initdb",
            "-D",
            str(self.data),
            "-A",
            "trust",
            "-U",
            USER,
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        )
        self._check(done, "initdb")
        # Overwritten in place: the file keeps its owner (the postgres user under root).
        (self.data / "pg_hba.conf").write_text(HBA)

    def stop(self) -> None:
        """Stop at once (nothing in it is kept) and remove its directory.

        The directory goes only once no server runs from it: should stopping fail, it stays for
        ``sweep_orphans`` to find after this process is gone."""
        if self.base is None:
            return
        if self.running():
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        if self.running():  # pg_ctl could not stop it
            self.kill()
        if self.running():
            raise PostgresError(f"the PostgreSQL server in {self.base} would not stop")
        shutil.rmtree(self.base, ignore_errors=True)
        self.base = None

    def kill(self) -> None:
        """SIGKILL the server and its backends, as a crash would; ``start()`` brings it back on the same port."""
        pid = self.pid()
        if pid is None:
            return
        # pg_ctl starts the postmaster in a session of its own: its backends share its process group.
        # All of them go, or a restart finds the old shared memory still attached and refuses.
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while _group_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        # A zombie postmaster (until init reaps it) would still pass PostgreSQL's check of its lock
        # files: they are stale now, and go.
        for lock in [self.data / "postmaster.pid", *self.sockets.glob(".s.PGSQL.*.lock")]:
            lock.unlink(missing_ok=True)

    def pid(self) -> int | None:
        """The postmaster's pid, from its lock file."""
        if self.base is None:
            return None
        try:
            first = (self.data / "postmaster.pid").read_text().split("\n", 1)[0]
        except OSError:
            return None
        return int(first) if first.strip().isdigit() else None

    def running(self) -> bool:
        pid = self.pid()
        return pid is not None and _group_alive(pid)

    # ---- databases -----------------------------------------------------------------------------

    def url(self, dbname: str = "postgres", user: str = USER) -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, prefix: str = "test", template: str | None = None) -> str:
        """A new database with a name unique to this server (empty, or a copy of the database
        ``template``, which nobody may be connected to); its URL."""
        name = f"{prefix}_{os.getpid()}_{next(self._names)}"
        copy = f' TEMPLATE "{template}"' if template else ""
        self._psql(f'CREATE DATABASE "{name}"{copy}')
        return self.url(name)

    @staticmethod
    def dbname(url: str) -> str:
        return url.rsplit("/", 1)[1]

    def drop_database(self, url: str) -> None:
        name = self.dbname(url)
        self._psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _psql(self, sql: str) -> None:
        done = subprocess.run(
            [
                str(self.bindir / "psql"),
                "-X",
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                USER,
                "-d",
                "postgres",
                "-c",
                sql,
            ],
            env=self._env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        self._check(done, f"psql {sql!r}")


# The server of this process, and how many session fixtures hold it (see the module docstring).
_shared: PostgresServer | None = None
_holders = 0


def shared_server() -> PostgresServer:
    """This process's server, started at the first call; ``release_server()`` once per call."""
    global _shared, _holders
    if _shared is None:
        if find_bindir() is None:
            pytest.fail(MISSING, pytrace=False)
        server = PostgresServer()
        try:
            server.start()
        except (PostgresError, OSError, subprocess.TimeoutExpired) as exc:
            server.stop()
            pytest.fail(f"could not start a throwaway PostgreSQL server: {exc}", pytrace=False)
        except BaseException:
            server.stop()
            raise
        _shared = server
    _holders += 1
    return _shared


def release_server() -> None:
    """The last holder gone, the server stops and its directory goes."""
    global _shared, _holders
    _holders -= 1
    if _holders == 0 and _shared is not None:
        server, _shared = _shared, None
        server.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """The PostgreSQL server of this pytest process (each xdist worker starts its own)."""
    server = shared_server()
    try:
        yield server
    finally:
        release_server()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """After the run (in the xdist controller: after every worker), the servers of workers that
    were killed on the way go too."""
    if not hasattr(session.config, "workerinput"):
        sweep_orphans(bindir=find_bindir())


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh, empty database of ``postgres_server`` for one test; dropped after it."""
    if not postgres_server.running():
        postgres_server.start()  # a test killed it
    url = postgres_server.create_database()
    try:
        yield url
    finally:
        if postgres_server.running():
            postgres_server.drop_database(url)
