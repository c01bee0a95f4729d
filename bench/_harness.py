"""What every benchmark here shares: its failure, and how its figures are printed.

A bench is run as ``python bench/NAME.py`` (this folder is then first on sys.path); with
``--json`` it prints its figures as one JSON object, otherwise its own report.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TypeVar

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
