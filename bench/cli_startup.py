"""How long the CLI takes to start and answer: --help, status --help, status and inbox on a real store.

    .venv/bin/python bench/cli_startup.py              # 5 timed runs of each, after one warm-up
    .venv/bin/python bench/cli_startup.py --repeat 9 --json
    .venv/bin/python bench/cli_startup.py --load 2     # the same, beside 2 busy-looping processes

Each command runs as a new process (the ``agentwake`` console script next to this Python,
else ``python -m agentwake.cli``), against a temp config and a store holding one
subscription and a few events, made before the clock starts. The wall time of the whole
process is measured, from spawn to exit; the commands take turns in every round, so load
from elsewhere hits them alike. Two baselines run in the same rounds: ``python -c pass``
(the interpreter with this environment's site-packages and the editable install's
finder) and ``python -c "import typer"`` (the floor for any typer CLI). The target is a
median of at most TARGET_S for every command, each judged PASS or FAIL; the figures are
noisy on a loaded machine, so the best run of each is reported too, and the median CPU time
(user + system) of each process, which load changes little: wall time under load is roughly
that CPU time times the share of a core the process gets.

``--load N`` makes the loaded figure reproducible: N processes spinning ``while True: pass``
(this Python) run for the timed rounds, started after the warm-up and stopped before the
report, which gives the load averages seen before and after the timed rounds. On a machine
with N cores, N of them are "a CPU-bound process beside each core": what a second bench, a
test run or a build does to a person typing ``agentwake status``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import anyio
from _harness import BenchFailure, busy_loops, finish, loadavg

DEFAULT_REPEAT: Final = 5
WARMUP: Final = 1
TARGET_S: Final = 0.3
EVENTS: Final = 5
COLUMNS: Final = 160
PYTHON_PASS: Final = "python -c pass"
IMPORT_TYPER: Final = "python -c 'import typer'"
CONFIG_TEXT: Final = """
[store]
path = "agentwake.db"

[servers.demo]
command = "python"
args = ["-m", "examples.demo_server"]

[[subscriptions]]
name = "tickets"
server = "demo"
event = "ticket.created"
arguments = { queue = "support" }
"""


@dataclass(frozen=True, slots=True)
class Timing:
    name: str
    argv: list[str]
    runs_s: list[float]
    median_s: float
    best_s: float
    cpu_runs_s: list[float]  # user + system time of each run's process
    cpu_median_s: float
    ratio_to_python: float
    ratio_to_typer: float
    within_target: bool


@dataclass(frozen=True, slots=True)
class Figures:
    repeat: int
    launcher: str
    target_s: float
    cpus: int | None
    load: int  # busy-looping processes beside the timed rounds (--load)
    loadavg_before: list[float]  # 1, 5 and 15 minutes, as the timed rounds began
    loadavg_after: list[float]  # ... and as they ended
    python_pass: Timing
    import_typer: Timing
    commands: list[Timing]
    slowest_median_s: float
    within_target: bool


async def make_store(config: Path) -> None:
    from agentwake.config import load_config
    from agentwake.store import IncomingEvent, SubscriptionKey, open_store

    cfg = load_config(config)
    store = await open_store(cfg.store)
    try:
        key = SubscriptionKey("tickets", "demo", "ticket.created", {"queue": "support"})
        await store.register(key)
        events = [
            IncomingEvent(f"T-{n:06d}", "ticket.created", "2026-01-01T00:00:00Z", {"ticketId": f"T-{n:06d}"})
            for n in range(1, EVENTS + 1)
        ]
        await store.ingest(key, events, str(EVENTS))
    finally:
        await store.close()


def launcher() -> list[str]:
    """How a person starts the CLI: the console script, if this environment has one."""
    script = Path(sys.executable).with_name("agentwake")
    return [str(script)] if script.exists() else [sys.executable, "-m", "agentwake.cli"]


def child_env() -> dict[str, str]:
    """This environment, but writing bytecode: the warm-up run leaves every module compiled, as an
    installed program has it (PYTHONDONTWRITEBYTECODE would make each run compile stale modules again)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    # Wide enough that rich lays the tables out as on a terminal, not as an 80-column pipe.
    env.setdefault("COLUMNS", str(COLUMNS))
    return env


def children_cpu_s() -> float:
    """User + system time of every child process waited for so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """The process's wall time, from spawn to exit, and its CPU time."""
    cpu = children_cpu_s()
    start = time.perf_counter()
    done = subprocess.run(
        argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise BenchFailure(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()[-500:]}")
    return elapsed, children_cpu_s() - cpu


def measure(folder: Path, repeat: int, load: int = 0) -> Figures:
    config = folder / "agentwake.toml"
    config.write_text(CONFIG_TEXT)
    anyio.run(make_store, config)
    cli = launcher()
    cases = {
        PYTHON_PASS: [sys.executable, "-c", "pass"],
        IMPORT_TYPER: [sys.executable, "-c", "import typer"],
        "agentwake --help": [*cli, "--help"],
        "agentwake status --help": [*cli, "status", "--help"],
        "agentwake status": [*cli, "status", "-c", str(config)],
        "agentwake inbox": [*cli, "inbox", "-c", str(config)],
    }
    runs: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    env = child_env()
    for _ in range(WARMUP):  # compiles every module once, unloaded: then the timed rounds
        for argv in cases.values():
            timed(argv, folder, env)
    with busy_loops(load):
        before = loadavg()
        for _ in range(repeat):
            for name, argv in cases.items():
                elapsed, used = timed(argv, folder, env)
                runs[name].append(elapsed)
                cpu[name].append(used)
        after = loadavg()
    python_s = statistics.median(runs[PYTHON_PASS])
    typer_s = statistics.median(runs[IMPORT_TYPER])

    def timing(name: str) -> Timing:
        median = statistics.median(runs[name])
        return Timing(
            name,
            cases[name],
            runs[name],
            median,
            min(runs[name]),
            cpu[name],
            statistics.median(cpu[name]),
            median / python_s,
            median / typer_s,
            median <= TARGET_S,
        )

    commands = [timing(name) for name in cases if name.startswith("agentwake")]
    slowest = max(t.median_s for t in commands)
    return Figures(
        repeat,
        " ".join(cli),
        TARGET_S,
        os.cpu_count(),
        load,
        before,
        after,
        timing(PYTHON_PASS),
        timing(IMPORT_TYPER),
        commands,
        slowest,
        slowest <= TARGET_S,
    )


def report(f: Figures) -> None:
    print(f"CLI start-up, median and best of {f.repeat} runs each (after {WARMUP} warm-up), via {f.launcher}")
    beside = f"{f.load} busy-looping process(es)" if f.load else "no load of its own"
    print(
        f"{f.cpus} CPU(s), {beside}; load average {_loads(f.loadavg_before)} before the timed rounds,"
        f" {_loads(f.loadavg_after)} after"
    )
    print(f"{'':28} {'median':>8} {'best':>8} {'cpu':>8} {'x python':>9} {'x typer':>8}")
    for t in (f.python_pass, f.import_typer):
        print(_row(t))
    for t in f.commands:
        print(f"{_row(t)}  {'PASS' if t.within_target else 'FAIL'}")
    verdict = "PASS" if f.within_target else "FAIL"
    print(
        f"target: every median <= {f.target_s * 1000:.0f}ms: {verdict} (slowest {f.slowest_median_s * 1000:.0f}ms)"
    )


def _row(t: Timing) -> str:
    return (
        f"{t.name:28} {t.median_s * 1000:6.0f}ms {t.best_s * 1000:6.0f}ms {t.cpu_median_s * 1000:6.0f}ms"
        f" {t.ratio_to_python:8.2f}x {t.ratio_to_typer:7.2f}x"
    )


def _loads(figures: list[float]) -> str:
    return " ".join(f"{x:.2f}" for x in figures) if figures else "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--repeat", type=int, default=DEFAULT_REPEAT, help="timed runs of each command (default 5)"
    )
    parser.add_argument(
        "--load",
        type=int,
        default=0,
        metavar="N",
        help="run N busy-looping processes beside the timed rounds (default 0; N = cores: fully loaded)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.load < 0:
        parser.error("--load must be 0 or more")
    with tempfile.TemporaryDirectory(prefix="agentwake-cli-bench-") as folder:
        return finish(lambda: measure(Path(folder), args.repeat, args.load), as_json=args.json, report=report)


if __name__ == "__main__":
    sys.exit(main())
