"""What a rule's ``args`` cost per run and per tool call, against parsing the call's arguments.

    .venv/bin/python bench/authority_check.py              # 20000 rounds
    .venv/bin/python bench/authority_check.py --rounds 2000 --json

Every tool call the model asks for is already parsed from its JSON arguments (``json.loads``); that
parse, of the same arguments, is the baseline measured in the same run. Measured beside it:

- ``bind``: once per run, the bundled GitHub triage rule's ``args`` bound to a GitHub event (parse the
  table, fill the templates in);
- ``check``: once per call, a ``github__comment`` call checked against the bound constraints;
- ``schema``: once per run and tool, the tool's schema narrowed for the model.

The figures are medians of ``--repeat`` batches of ``--rounds`` operations each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from _harness import BenchFailure, finish

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from agentwake.authority import Authority  # noqa: E402
from agentwake.policy import load_file  # noqa: E402

RULE: Final = "github-triage-issues"
VIEW: Final = {
    "server": "github",
    "subscription": "github-issues",
    "name": "issues.opened",
    "event_id": "issues.opened:1",
    "data": {"repository": "acme/demo", "number": 42, "title": "Export does nothing", "labels": []},
}
CALL: Final = {"repository": "acme/demo", "number": 42, "body": "Thanks for the report. " * 20}
SCHEMA: Final = {
    "type": "object",
    "properties": {
        "repository": {"type": "string"},
        "number": {"type": "integer"},
        "body": {"type": "string", "maxLength": 65536},
        "allow_mentions": {"type": "boolean", "default": False},
    },
    "required": ["repository", "number", "body"],
}


@dataclass(frozen=True)
class Figures:
    rounds: int
    baseline_parse_us: float
    bind_us: float
    check_us: float
    schema_us: float
    check_over_parse: float


def per_op_us(operation: Callable[[], Any], rounds: int, repeat: int) -> float:
    batches = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(rounds):
            operation()
        batches.append((time.perf_counter() - start) / rounds * 1e6)
    return statistics.median(batches)


def measure(rounds: int, repeat: int) -> Figures:
    rules = {r.rule.name: r.rule for r in load_file(REPO_ROOT / "policies" / "github-triage.toml")}
    args = rules[RULE].args
    if not args:
        raise BenchFailure(f"rule {RULE} has no args to measure")
    authority = Authority.bind(args, VIEW, rule=RULE)
    sent, refused = authority.check("github__comment", SCHEMA, CALL)
    if refused is not None or sent.get("allow_mentions") is not False:
        raise BenchFailure(f"the bound rule does not check the call as expected: {refused or sent}")
    raw = json.dumps(CALL)
    parse = per_op_us(lambda: json.loads(raw), rounds, repeat)
    bind = per_op_us(lambda: Authority.bind(args, VIEW, rule=RULE), rounds, repeat)
    check = per_op_us(lambda: authority.check("github__comment", SCHEMA, CALL), rounds, repeat)
    schema = per_op_us(lambda: authority.schema("github__comment", SCHEMA), rounds, repeat)
    return Figures(
        rounds, round(parse, 2), round(bind, 2), round(check, 2), round(schema, 2), round(check / parse, 2)
    )


def report(figures: Figures) -> None:
    print(f"per operation, median of batches of {figures.rounds}:")
    print(f"  baseline: json.loads of the call's arguments  {figures.baseline_parse_us:8.2f} us")
    print(f"  bind the rule's args to the event (per run)   {figures.bind_us:8.2f} us")
    print(f"  check one call (per call)                      {figures.check_us:8.2f} us")
    print(f"  narrow the tool's schema (per run and tool)    {figures.schema_us:8.2f} us")
    print(f"  check / parse: {figures.check_over_parse:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=20000, help="operations per batch")
    parser.add_argument("--repeat", type=int, default=5, help="batches; the median is reported")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    options = parser.parse_args()
    return finish(lambda: measure(options.rounds, options.repeat), as_json=options.json, report=report)


if __name__ == "__main__":
    sys.exit(main())
