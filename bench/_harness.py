"""What every benchmark here shares: its failure, and how its figures are printed.

A bench is run as ``python bench/NAME.py`` (this folder is then first on sys.path); with
``--json`` it prints its figures as one JSON object, otherwise its own report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any, Final, TypeVar

F = TypeVar("F")


class BenchFailure(Exception):
    """The benchmark did not measure what it claims to (a duplicate, a missing event, a wrong count)."""


def finish(measure: Callable[[], F], *, as_json: bool, report: Callable[[F], None]) -> int:
    """Measure, then print the figures; the exit code: 1 if the bench failed its own checks."""
    try:
        figures = measure()
    except BenchFailure as exc:
        print(f"FAILURE: {exc}", file=sys.stderr)
        return 1
    if as_json:
        data: Any = asdict(figures)  # type: ignore[call-overload]
        print(json.dumps(data))
    else:
        report(figures)
    return 0


BUSY_LOOP: Final = "while True: pass"
# How long the busy loops spin before the measured part: long enough to be running on a core.
LOAD_SETTLE_S: Final = 0.5


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages ([] where the platform has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


@contextmanager
def busy_loops(count: int) -> Iterator[None]:
    """``count`` processes spinning on a core each for as long as the block runs (``--load N``: a
    loaded machine, reproducibly); stopped and reaped on the way out, whatever happens in the block."""
    spinning = [
        subprocess.Popen([sys.executable, "-c", BUSY_LOOP], stdin=subprocess.DEVNULL) for _ in range(count)
    ]
    try:
        if spinning:
            time.sleep(LOAD_SETTLE_S)
            for process in spinning:
                if process.poll() is not None:
                    raise BenchFailure(f"a busy loop exited {process.returncode} before the measurement")
        yield
    finally:
        for process in spinning:
            process.kill()
        for process in spinning:
            process.wait()
