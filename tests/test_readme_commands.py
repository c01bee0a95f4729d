"""Every shell command in README.md runs, as written, without an activated venv ("A newcomer's first hour").

The commands are parsed from README.md's ```sh / ```bash / ```shell / ```console blocks (in ``console``
blocks only the ``$ `` lines), so a README change is tested. Each command is one test, its README line in
the id. A block runs as a newcomer would type it: in order, each command once, with PATH=/usr/bin:/bin
(no venv on it, nothing activated), and ``cd`` moves the rest of the block.

- A block that contains ``agentwake init`` starts a new project: it runs in an empty folder.
- Every other block is the "look around" after ``make run``: the ``bundled`` fixture copies agentwake.toml,
  policies/ and prompts/ into a temporary folder (every relative path in the config, the store and the
  demo's DEMO_DB included, resolves there), runs ``agentwake run -c agentwake.toml`` in it as ``make run``
  does, waits until the agent has acted and the ticket ids the README names have arrived (or the demo is
  past them), and stops it with SIGINT, like Ctrl-C. The block's commands then run in that folder.
- ``.venv/bin/X`` and a bare ``agentwake`` (what ``pip install`` puts on PATH) become the absolute path
  of this venv's script; nothing else is rewritten.
- ``agentwake run`` in a block runs until the agent has acted, then gets SIGINT; it must exit 0.
- A command must exit 0, unless its comment says ``exit N``.
- Skipped, by an explicit rule: commands whose first words are in ``SKIP_RULES`` (set-up, network,
  servers that run until stopped), and commands on another config than the bundled ``agentwake.toml``
  (``-c .webhook-demo/agentwake.toml``: another demo writes it). A plain ``` block may hold no command.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
SCRIPTS = Path(sysconfig.get_path("scripts"))
AGENTWAKE = SCRIPTS / "agentwake"

COMMAND_LANGS = {"sh", "bash", "shell", "console"}
AGENTWAKE_PROGRAMS = {"agentwake", ".venv/bin/agentwake"}
# The first words (after `.venv/bin/agentwake` and `agentwake` are read as one program) of commands a
# test cannot run, and why. Every other command in a command block runs.
SKIP_RULES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("make",), "set-up or long-running: the `bundled` fixture does what `make run` does"),
    (("git",), "needs the network"),
    (("pip",), "needs the network; this venv's agentwake stands for the installed one"),
    (("pipx",), "needs the network; this venv's agentwake stands for the installed one"),
    (("agentwake-demo",), "a server: it runs until stopped"),
    (("python", "-m"), "a server or demo script: it runs until stopped"),
)
BUNDLED_CONFIG = "agentwake.toml"
SHELL_OPERATORS = re.compile(r"[|&;<>`]|\$\(")
TICKET_ID = re.compile(r"\bT-\d{6}\b")

# What a newcomer has: no venv on PATH, nothing of ours in the environment.
ENV = {
    key: value
    for key, value in os.environ.items()
    if not key.startswith(("AGENTWAKE_", "DEMO_", "LITELLM_"))
    and key not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX"}
}
ENV["PATH"] = "/usr/bin:/bin"
# The init template's endpoint on any free port: 9464 may be taken on this machine.
ENV["AGENTWAKE_LISTEN"] = "127.0.0.1:0"

COMMAND_TIMEOUT_S = 30  # each command takes under 10 s here; this only bounds a hung one
SERVICE_WAIT_S = 45  # the bundled demo sends a ticket every 2 s; the README's ids come in seconds
SERVICE_STOP_S = 20


@dataclass(frozen=True)
class Command:
    line: int  # in README.md
    block: int  # the line of its block's opening fence
    text: str  # as written, without its comment
    argv: tuple[str, ...]
    comment: str

    @property
    def words(self) -> tuple[str, ...]:
        """argv with the agentwake program as one word, `agentwake`."""
        if self.argv and self.argv[0] in AGENTWAKE_PROGRAMS:
            return ("agentwake", *self.argv[1:])
        return self.argv

    @property
    def id(self) -> str:
        return f"L{self.line} {' '.join(self.words)}"

    @property
    def is_service(self) -> bool:
        return self.words[:2] == ("agentwake", "run")

    @property
    def config(self) -> str | None:
        for i, word in enumerate(self.argv):
            if word in ("-c", "--config") and i + 1 < len(self.argv):
                return self.argv[i + 1]
            if word.startswith("--config="):
                return word.removeprefix("--config=")
        return None

    @property
    def expected_exit(self) -> int:
        said = re.search(r"\bexit (\d+)\b", self.comment)
        return int(said.group(1)) if said else 0

    def skip_reason(self) -> str | None:
        for prefix, reason in SKIP_RULES:
            if self.words[: len(prefix)] == prefix:
                return reason
        if self.config is not None and self.config != BUNDLED_CONFIG:
            return f"runs on another config than the bundled one: {self.config}"
        return None

    def resolved_argv(self) -> list[str]:
        program = self.argv[0]
        if program in AGENTWAKE_PROGRAMS:
            program = str(AGENTWAKE)
        elif program.startswith(".venv/bin/"):
            program = str(SCRIPTS / program.removeprefix(".venv/bin/"))
        return [program, *self.argv[1:]]


def _split(source: str) -> tuple[tuple[str, ...], str, str]:
    """(argv, the command as written, its comment) of one shell line."""
    argv = tuple(shlex.split(source, comments=True))
    for match in re.finditer(r"(?:^|\s)#", source):
        head = source[: match.start()]
        try:
            if tuple(shlex.split(head)) == argv:
                return argv, head.strip(), source[match.start() :].strip()
        except ValueError:  # the '#' is inside quotes
            continue
    return argv, source.strip(), ""


def readme_blocks(text: str) -> list[tuple[int, str, list[tuple[int, str]]]]:
    """Every fenced block: (line of the opening fence, language, [(line, text)])."""
    blocks: list[tuple[int, str, list[tuple[int, str]]]] = []
    current: tuple[int, str, list[tuple[int, str]]] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if current is None:
            if stripped.startswith("```"):
                current = (number, stripped[3:].strip().lower(), [])
        elif stripped.startswith("```"):
            blocks.append(current)
            current = None
        else:
            current[2].append((number, line))
    return blocks


def readme_commands(text: str) -> list[Command]:
    commands: list[Command] = []
    for start, lang, lines in readme_blocks(text):
        if lang not in COMMAND_LANGS:
            continue
        pending: list[str] = []
        first = 0
        for number, line in lines:
            stripped = line.strip()
            if not pending:
                if lang == "console":
                    if not stripped.startswith("$ "):
                        continue  # output
                    stripped = stripped[2:]
                if not stripped or stripped.startswith("#"):
                    continue
                first = number
            if stripped.endswith("\\"):
                pending.append(stripped[:-1])
                continue
            source = " ".join([*pending, stripped])
            pending = []
            argv, written, comment = _split(source)
            commands.append(Command(first, start, written, argv, comment))
    return commands


COMMANDS = readme_commands(README.read_text(encoding="utf-8"))
RUNNABLE = [command for command in COMMANDS if command.skip_reason() is None]


def _starts_project(block: int) -> bool:
    return any(c.words[:2] == ("agentwake", "init") for c in COMMANDS if c.block == block)


def _readme_ids() -> list[str]:
    """The ticket ids the bundled-config commands name."""
    found = {
        ticket
        for command in RUNNABLE
        if not _starts_project(command.block)
        for ticket in TICKET_ID.findall(command.text)
    }
    return sorted(found)


README_IDS = _readme_ids()


# ---- running ---------------------------------------------------------------------------------------


@dataclass
class Result:
    returncode: int
    output: str
    seconds: float
    notes: list[str] = field(default_factory=list)


def _run(argv: list[str], cwd: Path) -> Result:
    started = time.monotonic()
    done = subprocess.run(
        argv,
        cwd=cwd,
        env=ENV,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    return Result(done.returncode, done.stdout + done.stderr, time.monotonic() - started)


def _json(args: list[str], cwd: Path) -> Any:
    """A quick reader's --json answer, or None while there is no store yet."""
    done = subprocess.run(
        [str(AGENTWAKE), *args, "--json"],
        cwd=cwd,
        env=ENV,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    return json.loads(done.stdout) if done.returncode == 0 else None


def _config_args(argv: list[str]) -> list[str]:
    for i, word in enumerate(argv):
        if word in ("-c", "--config") and i + 1 < len(argv):
            return [word, argv[i + 1]]
        if word.startswith("--config="):
            return [word]
    return []


def agent_acted(cwd: Path, config: list[str]) -> bool:
    runs = _json(["actions", *config], cwd) or []
    return any(run["status"] == "completed" for run in runs)


def ids_settled(cwd: Path, config: list[str], ids: list[str]) -> bool:
    """Each id's event is decided for good, or the demo is past it (events come in order)."""
    inbox = _json(["inbox", "-n", "1000", *config], cwd) or []
    tickets = {row["event_id"]: row["state"] for row in inbox if row["event"] == "ticket.created"}
    for ticket in ids:
        state = tickets.get(ticket)
        if state in {"pending", "processing", "batched"}:
            return False
        if state is None and not any(other > ticket for other in tickets):
            return False
    return True


def run_service(argv: list[str], cwd: Path, ready: Callable[[], bool], log: Path) -> tuple[Result, bool]:
    """`agentwake run` until ``ready()`` (polled) or SERVICE_WAIT_S, then SIGINT, as Ctrl-C."""
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=ENV, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            deadline = started + SERVICE_WAIT_S
            ok = False
            while proc.poll() is None and time.monotonic() < deadline:
                if ready():
                    ok = True
                    break
                time.sleep(0.2)  # polling interval between checks
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            returncode = proc.wait(timeout=SERVICE_STOP_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return Result(returncode, log.read_text(), time.monotonic() - started), ok


@dataclass
class Bundled:
    folder: Path
    service: Result
    settled: bool
    acted_on: set[str]  # ticket ids the agent completed a run for


@pytest.fixture(scope="module")
def bundled(tmp_path_factory: pytest.TempPathFactory) -> Bundled:
    """What `make run` leaves behind, from a fresh clone: the bundled config, run until the agent acted."""
    folder = tmp_path_factory.mktemp("bundled")
    shutil.copy(REPO / "agentwake.toml", folder / "agentwake.toml")
    shutil.copytree(REPO / "policies", folder / "policies")
    shutil.copytree(REPO / "prompts", folder / "prompts")
    config = ["-c", BUNDLED_CONFIG]
    service, settled = run_service(
        [str(AGENTWAKE), "run", *config],
        folder,
        lambda: agent_acted(folder, config) and ids_settled(folder, config, README_IDS),
        folder / "run.log",
    )
    assert service.returncode == 0, f"agentwake run exited {service.returncode}:\n{service.output}"
    runs = _json(["actions", "-n", "1000", *config], folder) or []
    assert any(run["status"] == "completed" for run in runs), f"the agent never acted:\n{service.output}"
    acted_on = {run["event_id"] for run in runs if run["status"] == "completed"}
    return Bundled(folder, service, settled, acted_on)


class Blocks:
    """Runs each README block once, lazily, in order; keeps every command's result."""

    def __init__(self, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._request = request
        self._tmp = tmp_path_factory
        self._results: dict[int, dict[int, Result]] = {}

    def result(self, command: Command) -> Result:
        if command.block not in self._results:
            self._results[command.block] = self._run_block(command.block)
        return self._results[command.block][command.line]

    def _run_block(self, block: int) -> dict[int, Result]:
        if _starts_project(block):
            cwd = self._tmp.mktemp("project")
        else:
            cwd = self._request.getfixturevalue("bundled").folder
        results: dict[int, Result] = {}
        for command in COMMANDS:
            if command.block != block or command.skip_reason() is not None:
                continue
            if SHELL_OPERATORS.search(command.text):
                results[command.line] = Result(-1, "shell operators: teach this test to run them", 0)
            elif command.argv[0] == "cd":
                cwd = cwd / command.argv[1]
                results[command.line] = Result(0 if cwd.is_dir() else 1, f"cd {cwd}", 0)
            elif command.is_service:
                config = _config_args(list(command.argv))
                result, acted = run_service(
                    command.resolved_argv(),
                    cwd,
                    lambda here=cwd, config=config: agent_acted(here, config),
                    cwd / "run.log",
                )
                if not acted:
                    result.notes.append(f"the agent did not act within {SERVICE_WAIT_S} s")
                results[command.line] = result
            else:
                results[command.line] = _run(command.resolved_argv(), cwd)
        return results


@pytest.fixture(scope="module")
def blocks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Blocks:
    return Blocks(request, tmp_path_factory)


# ---- the tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_readme_command(command: Command, blocks: Blocks, request: pytest.FixtureRequest) -> None:
    reason = command.skip_reason()
    if reason is not None:
        pytest.skip(f"README line {command.line}: {reason}")
    result = blocks.result(command)
    expected = command.expected_exit
    missing: list[str] = []
    if not _starts_project(command.block):
        bundled: Bundled = request.getfixturevalue("bundled")
        missing = [ticket for ticket in TICKET_ID.findall(command.text) if ticket not in bundled.acted_on]
        if missing and not bundled.settled:
            result.notes.append(
                f"the demo did not get past {', '.join(missing)} within {SERVICE_WAIT_S} s:"
                " name a ticket a fresh `make run` makes in its first seconds"
            )
    assert result.returncode == expected, (
        f"README line {command.line}: `{command.text}` exited {result.returncode}, not {expected}"
        f" ({result.seconds:.1f} s){''.join(f'; {note}' for note in result.notes)}:\n{result.output}"
    )
    assert not result.notes, f"README line {command.line}: `{command.text}`: {result.notes}"


def test_readme_has_commands_to_run() -> None:
    """The parser found the README's commands, and most of them run: this test cannot test nothing."""
    assert len(RUNNABLE) >= 10, [c.id for c in COMMANDS]
    assert README_IDS, "the look-around block names no ticket id: is `show T-…` gone?"


def test_no_command_hides_in_an_unmarked_block() -> None:
    """A command in a ``` block without a shell language would never be tested."""
    programs = {"agentwake", "agentwake-demo", "make", "pip", "pipx", "git", "cd"}
    hidden = [
        (number, line)
        for _, lang, lines in readme_blocks(README.read_text(encoding="utf-8"))
        if lang == ""
        for number, line in lines
        if line.split() and (line.split()[0] in programs or line.split()[0].startswith(".venv/bin/"))
    ]
    assert not hidden, f"commands in a plain ``` block: mark it ```sh: {hidden}"
