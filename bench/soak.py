"""Soak: `agentwake run` with 1,000 subscriptions on one server and quiet traffic; its RSS and CPU at idle.

    .venv/bin/python bench/soak.py                       # 1,000 subscriptions, a 60 s window
    .venv/bin/python bench/soak.py --seconds 20 --json
    .venv/bin/python bench/soak.py --no-agent            # delivery alone: no [agent], litellm never loads

The process measured is the real service, ``agentwake run`` (the console script next to this
Python, else ``python -m agentwake.cli``), started on a temp config: the demo help desk
(``agentwake-demo`` over stdio, its own SQLite file, a new ticket every 1/``--rate`` s and no
alerts or load samples) and ``--subscriptions`` subscriptions to ``ticket.created``, half
``delivery = "poll"`` and half ``"push"``, spread over the 12 (queue, priority) filters so
that a ticket reaches one in twelve of them. Polls wait POLL_INTERVAL_MS (``poll_floor_ms``
and the server's ``nextPollMs``); push streams heartbeat every DEMO_HEARTBEAT_MS. With
``[agent]`` (the default) the model is ``agentwake/offline``: litellm is loaded, as in a real
deployment, but no LLM is called.

The window starts once every subscription has made its first round trip (the store shows it
active with a cursor: a poll answered, or a stream's ``active`` stored) and the process has
settled: with traffic, the first ticket is stored and handled (the agent's first run loads what
litellm loads lazily), and a SETTLE_PROBE_S probe of its CPU is under SETTLE_CPU_PERCENT
(litellm is imported in a thread after start-up). Over the window, /proc is read every
SAMPLE_S: VmRSS (the largest is the figure; VmHWM, the peak since start, is shown too) and
utime + stime of all its threads (CPU % of one core = CPU seconds / wall seconds). The server
process, its child, is measured alike and reported apart. MB here are MiB (2^20 bytes), as
``ps`` and ``top`` count them.

The baseline is the very same service and server with BASELINE_SUBSCRIPTIONS subscriptions
(one poll, one push, with no filter: they see every ticket, so that the baseline stores and
handles what the soak does), measured in the same run over an equal window: the ratios say
what the subscriptions cost over the process's fixed cost, on a machine whose absolute
figures move. The targets: up to 1,000 subscriptions (issue 16), RSS <= TARGET_RSS_MB and idle
CPU <= TARGET_CPU_PERCENT of a core; past that (issue 33, measured with ``--subscriptions
10000``), RSS <= TARGET_RSS_10K_MB; and always, the idle CPU the subscriptions add over the
baseline <= TARGET_CPU_PER_1000_PERCENT of a core per 1,000 subscriptions. A missed target is a
FAIL in the report; the bench fails (exit 1) when a subscription is not active at the end of the
window (or not all are active within READY_TIMEOUT_S: then it says which, and why). ``make bench`` runs it with a 30 s window (one whole poll and
heartbeat interval) to keep the whole target short; where the memory goes is shown by
``bench/soak_profile.py``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

from _harness import BenchFailure, busy_loops, finish, loadavg

DEFAULT_SUBSCRIPTIONS: Final = 1000
DEFAULT_SECONDS: Final = 60.0
# New tickets a second on the demo server: quiet traffic, a few events a minute.
DEFAULT_RATE: Final = 0.05
BASELINE_SUBSCRIPTIONS: Final = 2
POLL_INTERVAL_MS: Final = 30_000
HEARTBEAT_MS: Final = 30_000
QUEUES: Final = ("support", "billing", "ops")
PRIORITIES: Final = ("P1", "P2", "P3", "P4")
TARGET_RSS_MB: Final = 250.0
TARGET_CPU_PERCENT: Final = 2.0
# Issue 33: what idle subscriptions add, and the RSS of 10,000 (past DEFAULT_SUBSCRIPTIONS).
TARGET_CPU_PER_1000_PERCENT: Final = 0.5
TARGET_RSS_10K_MB: Final = 400.0
READY_TIMEOUT_S: Final = 300.0
READY_CHECK_S: Final = 0.25
SETTLE_PROBE_S: Final = 1.0
SETTLE_CPU_PERCENT: Final = 20.0
SETTLE_TIMEOUT_S: Final = 120.0
SAMPLE_S: Final = 0.5
STOP_TIMEOUT_S: Final = 30.0
LOG_TAIL_CHARS: Final = 3000
MIB: Final = 1024 * 1024
CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")
PAGE_BYTES: Final = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True, slots=True)
class Usage:
    """One service run over the window: the agentwake process, and its server apart."""

    subscriptions: int
    ready_s: float
    settle_s: float
    settled: bool
    window_s: float
    rss_mb: float
    rss_start_mb: float
    rss_end_mb: float
    hwm_mb: float
    cpu_s: float
    cpu_percent: float
    threads: int
    server_rss_mb: float
    server_cpu_percent: float
    events_stored: int
    events_received: int
    not_active: int


@dataclass(frozen=True, slots=True)
class Figures:
    subscriptions: int
    poll: int
    push: int
    agent: bool
    rate: float
    poll_interval_ms: int
    seconds: float
    soak: Usage
    baseline: Usage
    rss_ratio: float
    rss_per_subscription_kb: float
    cpu_ratio: float | None
    cpu_per_subscription_percent: float
    target_rss_mb: float
    target_cpu_percent: float | None
    """None past DEFAULT_SUBSCRIPTIONS: there the per-1,000 target is the one."""
    target_cpu_per_1000_percent: float
    pass_rss: bool
    pass_cpu: bool
    pass_cpu_per_1000: bool
    load: int = 0  # busy-looping processes beside both runs (--load)
    loadavg_before: list[float] = field(default_factory=list)
    loadavg_after: list[float] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.pass_rss and self.pass_cpu and self.pass_cpu_per_1000


@dataclass(frozen=True, slots=True)
class StoreView:
    """The service's store, read from beside it."""

    ready: int
    """Subscriptions active with a cursor: each has made its first round trip."""
    not_active: int
    stored: int
    unhandled: int
    """Events still pending or processing."""
    received: int
    """Events received by all subscriptions, duplicates included, as the store has counted them:
    a subscription holds back the duplicates of events another one stored (with its cursor) until
    its next write, at most QUIET_WRITE_S later, so a short window shows fewer."""


# ---- the config -------------------------------------------------------------------------------


def config_text(
    subscriptions: int, *, rate: float, agent: bool, filtered: bool, modes: tuple[str, ...] = ("poll", "push")
) -> str:
    """The service's config: the demo server over stdio, ``subscriptions`` subscriptions taking
    ``modes`` in turn (half poll, half push by default).

    ``filtered`` spreads them over the (queue, priority) filters; else each one sees every ticket,
    so that a baseline of a few subscriptions stores (and runs the agent on) what the soak does.
    """
    parts = [
        '[store]\npath = "agentwake.db"\n',
        '[log]\nlevel = "INFO"\n',
        f"""[servers.demo]
command = "agentwake-demo"
env = {{ DEMO_DB = "demo.db", DEMO_RATE = "{rate:g}", DEMO_ALERT_INTERVAL = "0", DEMO_LOAD_INTERVAL = "0",\
 DEMO_NEXT_POLL_MS = "{POLL_INTERVAL_MS}", DEMO_HEARTBEAT_MS = "{HEARTBEAT_MS}" }}
""",
    ]
    if agent:
        parts.append('[agent]\nmodel = "agentwake/offline"\n')
    filters = [(q, p) for q in QUEUES for p in PRIORITIES]
    for n in range(subscriptions):
        queue, priority = filters[n % len(filters)]
        arguments = f'{{ queue = "{queue}", priority = "{priority}" }}' if filtered else "{}"
        mode = modes[n % len(modes)]
        parts.append(
            f"""[[subscriptions]]
name = "{subscription_name(n)}"
server = "demo"
event = "ticket.created"
arguments = {arguments}
delivery = "{mode}"
poll_floor_ms = {POLL_INTERVAL_MS}
"""
        )
    return "\n".join(parts)


def subscription_name(n: int) -> str:
    return f"s{n:05d}"


def launcher() -> list[str]:
    """How a person starts the service: the console script, if this environment has one."""
    script = Path(sys.executable).with_name("agentwake")
    return [str(script)] if script.exists() else [sys.executable, "-m", "agentwake.cli"]


# ---- /proc ------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid`` so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def status_kb(pid: int, *keys: str) -> dict[str, int]:
    """Numeric lines of /proc/PID/status (VmRSS, VmHWM in kB; Threads)."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in keys:
            found[key] = int(value.split()[0])
    return found


def rss_mb(pid: int) -> float:
    """Resident set size now, from /proc/PID/statm (cheaper to read than status)."""
    resident = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return resident * PAGE_BYTES / MIB


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (the stdio server agentwake spawned)."""
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def read_store(path: Path, subscriptions: int) -> StoreView:
    """What a running service's store shows now, read-only from beside it."""
    if not path.exists():
        return StoreView(0, subscriptions, 0, 0, 0)
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        subs = db.execute(
            "SELECT"
            " count(*) FILTER (WHERE status = 'active' AND cursor IS NOT NULL),"
            " count(*) FILTER (WHERE status != 'active'),"
            " coalesce(sum(events_received + duplicates), 0)"
            " FROM subscriptions"
        ).fetchone()
        events = db.execute(
            "SELECT count(*), count(*) FILTER (WHERE state IN ('pending', 'processing')) FROM events"
        ).fetchone()
    except sqlite3.OperationalError:  # the schema is not there yet
        return StoreView(0, subscriptions, 0, 0, 0)
    finally:
        db.close()
    return StoreView(int(subs[0]), int(subs[1]), int(events[0]), int(events[1]), int(subs[2]))


# ---- one run of the service -------------------------------------------------------------------


class Service:
    """`agentwake run` on a temp folder, as a subprocess; stopped with SIGTERM like a service manager does."""

    def __init__(self, folder: Path, subscriptions: int, *, rate: float, agent: bool, filtered: bool) -> None:
        self.folder = folder
        self.subscriptions = subscriptions
        folder.mkdir(parents=True)
        text = config_text(subscriptions, rate=rate, agent=agent, filtered=filtered)
        (folder / "agentwake.toml").write_text(text)
        self.log = folder / "service.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Service:
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [*launcher(), "run", "-c", "agentwake.toml"],
                cwd=self.folder,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def __exit__(self, *exc: object) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> None:
        assert self.proc is not None
        code = self.proc.poll()
        if code is not None:
            raise BenchFailure(f"agentwake run exited with {code}: {self.log_tail()}")

    def log_tail(self) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text[-LOG_TAIL_CHARS:]

    def store_view(self) -> StoreView:
        return read_store(self.folder / "agentwake.db", self.subscriptions)

    def wait_ready(self) -> float:
        """Seconds from spawn until every subscription is active with a cursor (its first round trip)."""
        start = time.monotonic()
        deadline = start + READY_TIMEOUT_S
        while True:
            self.alive()
            ready = self.store_view().ready
            if ready >= self.subscriptions:
                return time.monotonic() - start
            if time.monotonic() > deadline:
                raise BenchFailure(
                    f"{ready} of {self.subscriptions} subscriptions active after {READY_TIMEOUT_S:g}s;"
                    f" not yet: {self.not_ready()}; log: {self.log_tail()}"
                )
            time.sleep(READY_CHECK_S)

    def not_ready(self, shown: int = 10) -> str:
        """The first subscriptions not active with a cursor: name, mode, status, last error."""
        db = sqlite3.connect(f"file:{self.folder / 'agentwake.db'}?mode=ro", uri=True, timeout=5)
        try:
            rows = db.execute(
                "SELECT name, mode, status, cursor IS NOT NULL, last_error FROM subscriptions"
                " WHERE NOT (status = 'active' AND cursor IS NOT NULL) ORDER BY name LIMIT ?",
                (shown,),
            ).fetchall()
        except sqlite3.Error as exc:
            return f"(the store could not be read: {exc})"
        finally:
            db.close()
        return "; ".join(
            f"{name} {mode} {status} {'with' if cursor else 'without'} a cursor, last error {error!r}"
            for name, mode, status, cursor, error in rows
        )

    def wait_settled(self, *, first_event: bool) -> tuple[float, bool]:
        """Seconds until the process is in its steady state; whether it got there within SETTLE_TIMEOUT_S.

        Steady: with ``first_event``, a ticket has been stored and handled (the agent's first run
        loads what litellm loads lazily), and one SETTLE_PROBE_S of its CPU is under
        SETTLE_CPU_PERCENT (litellm's import in a thread after start-up, the first runs).
        """
        start = time.monotonic()
        while time.monotonic() - start < SETTLE_TIMEOUT_S:
            self.alive()
            view = self.store_view()
            if first_event and (view.stored == 0 or view.unhandled):
                time.sleep(READY_CHECK_S)
                continue
            cpu, wall = cpu_seconds(self.pid), time.monotonic()
            time.sleep(SETTLE_PROBE_S)
            if (cpu_seconds(self.pid) - cpu) / (time.monotonic() - wall) * 100 < SETTLE_CPU_PERCENT:
                return time.monotonic() - start, True
        return time.monotonic() - start, False

    def measure(self, seconds: float, *, first_event: bool) -> Usage:
        ready_s = self.wait_ready()
        settle_s, settled = self.wait_settled(first_event=first_event)
        pid = self.pid
        servers = children(pid)
        rss_start = rss_mb(pid)
        samples = [rss_start]
        server_rss = [sum(rss_mb(s) for s in servers)]
        server_cpu = sum(cpu_seconds(s) for s in servers)
        before = self.store_view()
        start, cpu = time.monotonic(), cpu_seconds(pid)
        end = start + seconds
        while (now := time.monotonic()) < end:
            time.sleep(min(SAMPLE_S, end - now))
            self.alive()
            samples.append(rss_mb(pid))
            server_rss.append(sum(rss_mb(s) for s in servers))
        wall = time.monotonic() - start
        used = cpu_seconds(pid) - cpu
        server_used = sum(cpu_seconds(s) for s in servers) - server_cpu
        status = status_kb(pid, "VmHWM", "Threads")
        after = self.store_view()
        return Usage(
            subscriptions=self.subscriptions,
            ready_s=round(ready_s, 2),
            settle_s=round(settle_s, 2),
            settled=settled,
            window_s=round(wall, 2),
            rss_mb=round(max(samples), 1),
            rss_start_mb=round(rss_start, 1),
            rss_end_mb=round(samples[-1], 1),
            hwm_mb=round(status["VmHWM"] / 1024, 1),
            cpu_s=round(used, 2),
            cpu_percent=round(used / wall * 100, 2),
            threads=status["Threads"],
            server_rss_mb=round(max(server_rss), 1),
            server_cpu_percent=round(server_used / wall * 100, 2),
            events_stored=after.stored - before.stored,
            events_received=after.received - before.received,
            not_active=after.not_active,
        )


def soak(
    folder: Path, subscriptions: int, seconds: float, *, rate: float, agent: bool, filtered: bool
) -> Usage:
    with Service(folder, subscriptions, rate=rate, agent=agent, filtered=filtered) as service:
        usage = service.measure(seconds, first_event=rate > 0)
    if usage.not_active:
        raise BenchFailure(
            f"{usage.not_active} of {subscriptions} subscriptions were not active at the end of the window:"
            f" {service.log_tail()}"
        )
    return usage


def run(subscriptions: int, seconds: float, rate: float, agent: bool) -> Figures:
    with tempfile.TemporaryDirectory(prefix="agentwake-bench-soak-") as tmpdir:
        tmp = Path(tmpdir)
        # Unfiltered, the baseline's few subscriptions store (and wake the agent for) what the soak does.
        baseline = soak(
            tmp / "baseline", BASELINE_SUBSCRIPTIONS, seconds, rate=rate, agent=agent, filtered=False
        )
        measured = soak(tmp / "soak", subscriptions, seconds, rate=rate, agent=agent, filtered=True)
    extra = subscriptions - BASELINE_SUBSCRIPTIONS
    cpu_per_subscription = (measured.cpu_percent - baseline.cpu_percent) / max(1, extra)
    many = subscriptions > DEFAULT_SUBSCRIPTIONS
    target_rss = TARGET_RSS_10K_MB if many else TARGET_RSS_MB
    return Figures(
        subscriptions=subscriptions,
        poll=(subscriptions + 1) // 2,
        push=subscriptions // 2,
        agent=agent,
        rate=rate,
        poll_interval_ms=POLL_INTERVAL_MS,
        seconds=seconds,
        soak=measured,
        baseline=baseline,
        rss_ratio=round(measured.rss_mb / baseline.rss_mb, 3),
        rss_per_subscription_kb=round((measured.rss_mb - baseline.rss_mb) * 1024 / max(1, extra), 1),
        cpu_ratio=round(measured.cpu_percent / baseline.cpu_percent, 2) if baseline.cpu_percent else None,
        cpu_per_subscription_percent=round(cpu_per_subscription, 5),
        target_rss_mb=target_rss,
        target_cpu_percent=None if many else TARGET_CPU_PERCENT,
        target_cpu_per_1000_percent=TARGET_CPU_PER_1000_PERCENT,
        pass_rss=measured.rss_mb <= target_rss,
        pass_cpu=many or measured.cpu_percent <= TARGET_CPU_PERCENT,
        pass_cpu_per_1000=cpu_per_subscription * 1000 <= TARGET_CPU_PER_1000_PERCENT,
    )


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def report(f: Figures) -> None:
    s, b = f.soak, f.baseline
    print(
        f"soak: {f.subscriptions:,} subscriptions ({f.poll} poll every {f.poll_interval_ms / 1000:g} s,"
        f" {f.push} push) on one demo server, {f.rate:g} tickets/s,"
        f" agent {'agentwake/offline' if f.agent else 'none'}"
    )

    def row(name: str, soak: str, baseline: str, ratio: str = "") -> None:
        print(f"{name:36} {soak:>12} {baseline:>12} {ratio:>8}")

    row("", "soak", "baseline", "ratio")
    row("subscriptions", f"{s.subscriptions:,}", f"{b.subscriptions:,}")
    row("all active after (s)", f"{s.ready_s:.1f}", f"{b.ready_s:.1f}")
    row("then settled after (s)", f"{s.settle_s:.1f}", f"{b.settle_s:.1f}")
    row("window (s)", f"{s.window_s:.1f}", f"{b.window_s:.1f}")
    row("agentwake RSS, max in window (MB)", f"{s.rss_mb:.1f}", f"{b.rss_mb:.1f}", f"{f.rss_ratio:.2f}x")
    row(
        "agentwake RSS, start -> end (MB)",
        f"{s.rss_start_mb:.0f} -> {s.rss_end_mb:.0f}",
        f"{b.rss_start_mb:.0f} -> {b.rss_end_mb:.0f}",
    )
    row("agentwake peak RSS, VmHWM (MB)", f"{s.hwm_mb:.1f}", f"{b.hwm_mb:.1f}")
    cpu_ratio = f"{f.cpu_ratio:.1f}x" if f.cpu_ratio is not None else "-"
    row("agentwake CPU (% of a core)", f"{s.cpu_percent:.2f}", f"{b.cpu_percent:.2f}", cpu_ratio)
    row("agentwake threads", str(s.threads), str(b.threads))
    row("server RSS (MB)", f"{s.server_rss_mb:.1f}", f"{b.server_rss_mb:.1f}")
    row("server CPU (% of a core)", f"{s.server_cpu_percent:.2f}", f"{b.server_cpu_percent:.2f}")
    row(
        "events stored / received in window",
        f"{s.events_stored} / {s.events_received}",
        f"{b.events_stored} / {b.events_received}",
    )
    print(
        f"per 1,000 subscriptions over the baseline: {f.rss_per_subscription_kb * 1000 / 1024:+.1f} MB RSS,"
        f" {f.cpu_per_subscription_percent * 1000:+.2f} % of a core"
    )
    if not (s.settled and b.settled):
        print(
            f"note: a run was not settled (CPU under {SETTLE_CPU_PERCENT:g}%) within {SETTLE_TIMEOUT_S:g} s"
        )
    print(f"start-up: all {s.subscriptions:,} subscriptions active {s.ready_s:.1f} s after the spawn")
    if f.load:
        print(
            f"load: {f.load} busy loop(s) beside both runs; load average"
            f" {' '.join(map(str, f.loadavg_before))} before, {' '.join(map(str, f.loadavg_after))} after"
        )
    at = f"at {s.subscriptions:,} subscriptions"
    print(f"target RSS <= {f.target_rss_mb:g} MB {at}: {verdict(f.pass_rss)} ({s.rss_mb:.1f} MB)")
    if f.target_cpu_percent is not None:
        print(
            f"target CPU <= {f.target_cpu_percent:g}% of a core {at}: {verdict(f.pass_cpu)}"
            f" ({s.cpu_percent:.2f}%)"
        )
    print(
        f"target idle CPU <= {f.target_cpu_per_1000_percent:g}% of a core per 1,000 subscriptions over"
        f" the baseline: {verdict(f.pass_cpu_per_1000)} ({f.cpu_per_subscription_percent * 1000:+.2f}%:"
        f" {s.cpu_percent:.2f}% at {s.subscriptions:,}, {b.cpu_percent:.2f}% at {b.subscriptions:,})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--subscriptions",
        type=int,
        default=DEFAULT_SUBSCRIPTIONS,
        help=f"subscriptions, half poll and half push (default {DEFAULT_SUBSCRIPTIONS})",
    )
    parser.add_argument(
        "--seconds", type=float, default=DEFAULT_SECONDS, help="the measured window (default 60)"
    )
    parser.add_argument(
        "--rate", type=float, default=DEFAULT_RATE, help="new tickets a second (default 0.05)"
    )
    parser.add_argument("--no-agent", action="store_true", help="no [agent] section: litellm is never loaded")
    parser.add_argument(
        "--load",
        type=int,
        default=0,
        help="busy-looping processes beside both runs: a loaded machine (default 0)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    if args.subscriptions < BASELINE_SUBSCRIPTIONS or args.seconds <= 0 or args.rate < 0 or args.load < 0:
        parser.error(
            f"--subscriptions must be at least {BASELINE_SUBSCRIPTIONS}; --seconds positive; --load 0 or more"
        )
    figures: list[Figures] = []

    def measure() -> Figures:
        with busy_loops(args.load):
            before = loadavg()
            measured = run(args.subscriptions, args.seconds, args.rate, not args.no_agent)
            figures.append(replace(measured, load=args.load, loadavg_before=before, loadavg_after=loadavg()))
        return figures[0]

    # A missed target is a FAIL in the report, as in the other benches; exit 1 is for a bench that
    # could not measure (BenchFailure).
    return finish(measure, as_json=args.json, report=report)


if __name__ == "__main__":
    sys.exit(main())
