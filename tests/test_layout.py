"""The package's shape: each stage imports only the stages before it, and no module grows unexplained.

The order, as a newcomer reads it (README, "Architecture"):

    foundations   config, wire names and models, errors, time, backoff, redaction, signing, _compat, logs
    mcp           connections to MCP servers
    store         the seam every stage writes through: records and the Store protocol (+ its backends)
    delivery      poll, push, webhook loops and the receiver: events into the store; which process drives them
    decide        sanitize, policy, decide: one event in, one outcome out
    agent         the LLM run and its tools; the action log is written through the store
    wiring        worker, supervisor, service
    cli           parse, load config, call the library

The store comes before delivery here although an event reaches it after: delivery writes
through the store's interface, so it must know it, and the store knows nothing of delivery.
The server toolkit (agentwake.server) is a separate branch on the foundations only, and the
demo server built on it (agentwake.demo, the agentwake-demo program) belongs to that branch, as
do the bridges (agentwake.bridges), which only the cli may import, to start them. So do the fake
upstreams (agentwake.fakes), which the cli serves for an offline playground.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "agentwake"
STAGES: list[tuple[str, tuple[str, ...]]] = [
    (
        "foundations",
        (
            "agentwake._compat",
            # Pure (no agentwake imports): the config validates a subscription's args with it.
            "agentwake.authority",
            "agentwake.backoff",
            "agentwake.clock",
            "agentwake.coarse_timers",
            "agentwake.codes",
            "agentwake.commands",
            "agentwake.config",
            "agentwake.configfile",
            "agentwake.errors",
            "agentwake.faults",
            "agentwake.identity",
            "agentwake.jsontext",
            "agentwake.logs",
            "agentwake.metrics",
            "agentwake.protocol",
            "agentwake.redaction",
            "agentwake.schemas",
            "agentwake.signing",
            "agentwake.systemd",
            "agentwake.text",
        ),
    ),
    (
        "mcp",
        (
            "agentwake.mcp",
            "agentwake.mcp_streams",
            "agentwake.ratelimit",
            "agentwake.streams",
            "agentwake.stdio",
            "agentwake.stdio_calls",
            "agentwake.stdio_limits",
            "agentwake.stdio_lines",
            "agentwake.stdio_process",
            "agentwake.stdio_stderr",
        ),
    ),
    ("store", ("agentwake.store",)),
    ("delivery", ("agentwake.delivery", "agentwake.ownership")),
    ("decide", ("agentwake.sanitize", "agentwake.policy", "agentwake.decide")),
    ("agent", ("agentwake.agent",)),
    (
        "wiring",
        (
            "agentwake.worker",
            "agentwake.pausing",
            "agentwake.server_signals",
            "agentwake.supervisor",
            "agentwake.webhook_bookkeeping",
            "agentwake.reload",
            "agentwake.service",
            "agentwake.web",
        ),
    ),
    ("cli", ("agentwake.cli",)),
]
SERVER = "agentwake.server"
DEMO = "agentwake.demo"
# Bridges are MCP servers built on the server toolkit; `agentwake bridge NAME` (the cli) starts them.
BRIDGES = "agentwake.bridges"
# Fake GitHub, Slack and PagerDuty APIs: the tests drive them, `agentwake fake NAME` serves them.
FAKES = "agentwake.fakes"
LONG_MODULE_LINES = 700


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def stage_of(module: str) -> str | None:
    if any(module == branch or module.startswith(branch + ".") for branch in (SERVER, DEMO, BRIDGES, FAKES)):
        return "server"
    for stage, prefixes in STAGES:
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return stage
    return None


def is_bridge(module: str) -> bool:
    return any(module == branch or module.startswith(branch + ".") for branch in (BRIDGES, FAKES))


def imports(path: Path) -> set[str]:
    """Every agentwake module a file imports, TYPE_CHECKING imports included, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "agentwake" or name.startswith("agentwake.")}


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_belongs_to_a_stage() -> None:
    unplaced = [
        module_name(p)
        for p in modules()
        if module_name(p) != "agentwake" and stage_of(module_name(p)) is None
    ]
    assert not unplaced, f"modules in no stage of tests/test_layout.py STAGES: {unplaced}"


def test_no_module_imports_a_later_stage() -> None:
    order = [stage for stage, _ in STAGES]
    problems = []
    for path in modules():
        name = module_name(path)
        mine = stage_of(name)
        if mine is None:
            continue
        for imported in imports(path):
            theirs = stage_of(imported)
            if theirs is None:
                continue
            if mine == "server":
                if theirs not in ("server", "foundations"):
                    problems.append(f"{name} (server toolkit) imports {imported} ({theirs})")
            elif theirs == "server":
                if not (mine == "cli" and is_bridge(imported)):
                    problems.append(f"{name} ({mine}) imports the server toolkit: {imported}")
            elif order.index(theirs) > order.index(mine):
                problems.append(f"{name} ({mine}) imports {imported}, a later stage ({theirs})")
    assert not problems, "\n".join(problems)


def test_no_module_is_long_without_saying_why() -> None:
    long = []
    for path in modules():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        if lines > LONG_MODULE_LINES and "lines" not in docstring:
            long.append(f"{module_name(path)}: {lines} lines")
    assert not long, f"over {LONG_MODULE_LINES} lines with no reason in the docstring: {long}"
