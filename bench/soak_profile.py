"""Where the soak's memory goes: the service in-process under tracemalloc, by package and by line.

    .venv/bin/python bench/soak_profile.py                  # 1,000 subscriptions, a 60 s window
    .venv/bin/python bench/soak_profile.py --seconds 30 --no-agent --top 25

An investigation aid for bench/soak.py, not a benchmark: it runs ``run_service`` on the same
config (the same demo server, subscriptions and traffic) inside this process, with tracemalloc
on from before agentwake is imported. It prints the traced memory by package (a file under
site-packages, agentwake's modules one by one, the standard library as "stdlib") at three
points: after the imports, once every subscription is active with a cursor, and at the end of
the window; then the lines that grew most over the window. tracemalloc sees Python's own
allocations only (not SQLite's page cache, nor the interpreter's arenas left half-used), and
slows the process down: the figures are for the split, bench/soak.py's are the absolute ones.
For CPU, run ``py-spy record`` (``pip install py-spy``) on the process bench/soak.py starts.
"""

from __future__ import annotations

import argparse
import collections
import functools
import logging
import os
import re
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Final

from soak import (
    BASELINE_SUBSCRIPTIONS,
    DEFAULT_RATE,
    DEFAULT_SECONDS,
    DEFAULT_SUBSCRIPTIONS,
    READY_TIMEOUT_S,
    config_text,
    read_store,
)

DEFAULT_TOP: Final = 20
READY_CHECK_S: Final = 0.5
MIB: Final = 1024 * 1024
_SITE: Final = re.compile(r"site-packages/([^/]+)(?:/([^/]+))?")
_AGENTWAKE: Final = re.compile(r"/agentwake/(.+)$")


def rss_mb() -> float:
    resident = int(Path("/proc/self/statm").read_text().split()[1])
    return resident * os.sysconf("SC_PAGE_SIZE") / MIB


def package_of(filename: str) -> str:
    """A traced allocation's owner: agentwake's module, a site-packages package, or the stdlib."""
    if (match := _AGENTWAKE.search(filename)) and "site-packages" not in filename:
        return f"agentwake/{match.group(1)}"
    if match := _SITE.search(filename):
        top, sub = match.group(1), match.group(2)
        # The big ones, split one level down (litellm/llms, pydantic/_internal, ...).
        return f"{top}/{sub}" if sub and top in ("litellm", "pydantic", "openai", "mcp") else top
    if filename.startswith("<frozen importlib"):
        return "<imports: code objects>"
    if filename.startswith("<"):
        return filename
    return "stdlib"


def by_package(snapshot: tracemalloc.Snapshot) -> collections.Counter[str]:
    totals: collections.Counter[str] = collections.Counter()
    for stat in snapshot.statistics("filename"):
        totals[package_of(stat.traceback[0].filename)] += stat.size
    return totals


def print_packages(
    title: str, totals: collections.Counter[str], top: int, base: collections.Counter[str] | None
) -> None:
    print(f"\n== {title}: traced {sum(totals.values()) / MIB:.1f} MB, RSS {rss_mb():.1f} MB")
    rows = (
        totals.most_common(top)
        if base is None
        else sorted(((k, totals[k] - base.get(k, 0)) for k in totals | base), key=lambda kv: -abs(kv[1]))[
            :top
        ]
    )
    for name, size in rows:
        print(f"  {size / MIB:+9.2f} MB  {name}" if base is not None else f"  {size / MIB:9.2f} MB  {name}")


def print_grown_lines(
    at_end: tracemalloc.Snapshot, at_ready: tracemalloc.Snapshot, seconds: float, top: int
) -> None:
    print(f"\n== lines that grew most over {seconds:g} s")
    for diff in at_end.compare_to(at_ready, "lineno")[:top]:
        frame = diff.traceback[0]
        print(f"  {diff.size_diff / MIB:+8.2f} MB {diff.count_diff:+8d}  {frame.filename}:{frame.lineno}")


def print_held_lines(snapshot: tracemalloc.Snapshot, top: int) -> None:
    """The lines of agentwake, the SDK and anyio holding most: what each subscription costs."""
    print("\n== lines holding most at the end (agentwake's, the SDK's, anyio's, asyncio's)")
    mine = [
        stat
        for stat in snapshot.statistics("lineno")
        if any(part in stat.traceback[0].filename for part in ("/agentwake/", "/mcp", "/anyio/", "/asyncio/"))
    ]
    for stat in mine[:top]:
        frame = stat.traceback[0]
        print(f"  {stat.size / MIB:8.2f} MB {stat.count:8d}  {frame.filename}:{frame.lineno}")
    if snapshot.traceback_limit > 1:
        print(
            f"\n== the allocations holding most at the end, with their callers (--frames {snapshot.traceback_limit})"
        )
        for stat in snapshot.statistics("traceback")[:top]:
            print(f"  {stat.size / MIB:8.2f} MB {stat.count:8d}")
            for frame in stat.traceback:
                print(f"        {_short(frame.filename)}:{frame.lineno}")


def _short(filename: str) -> str:
    """A frame's file without the interpreter's or the venv's prefix."""
    if "/agentwake/" in filename and "site-packages" not in filename:
        return "agentwake/" + filename.split("/agentwake/", 1)[1]
    for marker in ("site-packages/", "/lib/python3."):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return filename


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--subscriptions", type=int, default=DEFAULT_SUBSCRIPTIONS)
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS)
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE)
    parser.add_argument("--no-agent", action="store_true")
    parser.add_argument("--top", type=int, default=DEFAULT_TOP, help="rows per table (default 20)")
    parser.add_argument("--frames", type=int, default=1, help="tracemalloc frames kept (default 1)")
    parser.add_argument(
        "--mode",
        choices=("both", "poll", "push"),
        default="both",
        help="the subscriptions' delivery: half poll and half push (default), or all one",
    )
    args = parser.parse_args(argv)
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    tracemalloc.start(args.frames)

    import anyio

    from agentwake.config import load_config
    from agentwake.service import run_service

    imported = tracemalloc.take_snapshot()
    print_packages("after the imports", by_package(imported), args.top, None)
    with tempfile.TemporaryDirectory(prefix="agentwake-soak-profile-") as tmpdir:
        folder = Path(tmpdir)
        filtered = args.subscriptions > BASELINE_SUBSCRIPTIONS
        modes = ("poll", "push") if args.mode == "both" else (args.mode,)
        text = config_text(
            args.subscriptions, rate=args.rate, agent=not args.no_agent, filtered=filtered, modes=modes
        )
        (folder / "agentwake.toml").write_text(text)
        logging.basicConfig(filename=folder / "service.log", level=logging.INFO)
        os.chdir(folder)
        config = load_config(folder / "agentwake.toml")

        async def profile() -> None:
            async with anyio.create_task_group() as tg:
                await tg.start(functools.partial(run_service, config, handle_signals=False))
                start = time.monotonic()
                with anyio.fail_after(READY_TIMEOUT_S):
                    # Read from beside the service, as bench/soak.py does: no event says "all active".
                    db = folder / "agentwake.db"
                    while read_store(db, args.subscriptions).ready < args.subscriptions:  # noqa: ASYNC110
                        await anyio.sleep(READY_CHECK_S)
                print(f"\nready after {time.monotonic() - start:.1f} s")
                at_ready = tracemalloc.take_snapshot()
                packages = by_package(at_ready)
                print_packages("ready: every subscription active", packages, args.top, None)
                await anyio.sleep(args.seconds)  # the window: what an idle service does meanwhile
                at_end = tracemalloc.take_snapshot()
                print_packages(f"growth over {args.seconds:g} s", by_package(at_end), args.top, packages)
                print_grown_lines(at_end, at_ready, args.seconds, args.top)
                print_held_lines(at_end, args.top)
                tg.cancel_scope.cancel()

        anyio.run(profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
