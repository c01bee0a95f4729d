"""What the quick commands import: --help, status --help, status and inbox load no SDK, no HTTP
server, no LLM client and no part of the service.

Each command runs in a fresh interpreter (what was imported is per process) through a small
wrapper that calls ``agentwake.cli.main()`` and then writes ``sorted(sys.modules)`` to a
file. How fast they start is measured by ``bench/cli_startup.py``, not here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from _support import demo_server_toml
from conftest import REPO

from agentwake.cli.common import DEFAULT_CONFIG_PATH
from agentwake.config import DEFAULT_CONFIG_PATH as CONFIG_DEFAULT
from agentwake.config import load_config
from agentwake.store import IncomingEvent, SubscriptionKey, open_store

# Modules (and their submodules) the quick commands must not import.
FORBIDDEN = (
    "mcp",
    "aiohttp",
    "litellm",
    "agentwake.supervisor",
    "agentwake.mcp",
    "agentwake.delivery",
    "agentwake.agent",
)
CONFIG_ARG = "{config}"  # replaced by the test config's path
QUICK_COMMANDS = [["--help"], ["status", "--help"], ["status", "-c", CONFIG_ARG], ["inbox", "-c", CONFIG_ARG]]

WRAPPER = """
import importlib, json, sys

out, argv, preload = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
for name in preload:  # stands in for a top-level import in the CLI
    importlib.import_module(name)
sys.argv = ["agentwake", *argv]
import agentwake.cli

code = 0
try:
    agentwake.cli.main()
except SystemExit as exc:
    code = exc.code
with open(out, "w") as f:
    json.dump({"code": code, "modules": sorted(sys.modules)}, f)
"""


def config_text(folder: Path) -> str:
    return f"""
[store]
path = "aw.db"

[agent]
model = "agentwake/offline"
prompts = {json.dumps(str(REPO / "prompts"))}

{demo_server_toml(folder / "demo.db")}
[[subscriptions]]
name = "tickets"
server = "demo"
event = "ticket.created"
arguments = {{ queue = "support" }}
tools = ["demo__add_comment"]
"""


async def fill_store(config: Path) -> None:
    cfg = load_config(config)
    store = await open_store(cfg.store)
    try:
        key = SubscriptionKey("tickets", "demo", "ticket.created", {"queue": "support"})
        await store.register(key)
        event = IncomingEvent("T-000001", "ticket.created", "2026-01-01T00:00:00Z", {"ticketId": "T-000001"})
        await store.ingest(key, [event], "1")
    finally:
        await store.close()


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real config, and a real store with one subscription and one event."""
    folder = tmp_path_factory.mktemp("cli-imports")
    path = folder / "agentwake.toml"
    path.write_text(config_text(folder))
    anyio.run(fill_store, path)
    return path


def run_cli(config: Path, argv: list[str], *preload: str) -> dict[str, Any]:
    """The command's exit code and every module loaded by the time it ended."""
    wrapper = config.parent / "wrapper.py"
    wrapper.write_text(WRAPPER)
    found = config.parent / "modules.json"
    args = [str(config) if arg == CONFIG_ARG else arg for arg in argv]
    done = subprocess.run(
        [sys.executable, str(wrapper), str(found), json.dumps(args), *preload],
        cwd=config.parent,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    probed: dict[str, Any] = json.loads(found.read_text())
    return probed


def forbidden_in(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]


@pytest.mark.parametrize(
    "argv", QUICK_COMMANDS, ids=lambda argv: " ".join(a for a in argv if a not in ("-c", CONFIG_ARG))
)
def test_the_quick_commands_import_no_sdk_no_http_server_no_llm_and_no_service(
    config: Path, argv: list[str]
) -> None:
    probed = run_cli(config, argv)
    assert probed["code"] == 0
    assert forbidden_in(probed["modules"]) == []


def test_help_loads_neither_the_config_models_nor_the_store_nor_the_tables(config: Path) -> None:
    modules = run_cli(config, ["--help"])["modules"]
    assert not {
        "agentwake.config",
        "agentwake.store",
        "agentwake.cli.tables",
        "pydantic",
        "sqlite_utils",
    } & set(modules)


def test_the_probe_notices_a_forbidden_module_imported_with_the_cli(config: Path) -> None:
    # What a top-level `import agentwake.mcp` in the CLI would do: the check above must catch it.
    probed = run_cli(config, ["status", "-c", CONFIG_ARG], "agentwake.mcp")
    assert "agentwake.mcp" in forbidden_in(probed["modules"])
    assert "mcp" in forbidden_in(probed["modules"])


# The modules under agentwake.cli that register commands, but none that `status` or `inbox` runs.
OTHER_COMMANDS = tuple(
    f"agentwake.cli.{m}"
    for m in (
        "init",
        "service",
        "replay",
        "approvals",
        "pause",
        "limits",
        "policy",
        "store",
        "bridge",
        "bridge_pagerduty",
        "bridge_slack",
        "bridge_send",
        "fake",
    )
)


@pytest.mark.parametrize(
    "argv",
    [["status", "--help"], ["status", "-c", CONFIG_ARG], ["inbox", "-c", CONFIG_ARG]],
    ids=lambda argv: " ".join(a for a in argv if a not in ("-c", CONFIG_ARG)),
)
def test_a_command_loads_its_own_module_only_not_every_commands(config: Path, argv: list[str]) -> None:
    modules = set(run_cli(config, argv)["modules"])
    assert "agentwake.cli.views" in modules
    assert set(OTHER_COMMANDS) & modules == set()


def test_importing_the_cli_registers_no_command() -> None:
    code = (
        "import sys, agentwake.cli; print(sorted(m for m in sys.modules if m.startswith('agentwake.cli.')))"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert shown.stdout.split() == ["['agentwake.cli.common']"]


def test_the_whole_app_loads_every_command_module() -> None:
    code = "import sys, agentwake.cli; agentwake.cli.app; print(' '.join(sorted(sys.modules)))"
    shown = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert set(OTHER_COMMANDS) | {"agentwake.cli.views"} <= set(shown.stdout.split())


@pytest.mark.parametrize("argv", [["--help"], ["status", "--help"]], ids=" ".join)
def test_help_sets_up_no_logging(config: Path, argv: list[str]) -> None:
    assert "logging" not in run_cli(config, argv)["modules"]


def test_status_loads_no_emoji_table(config: Path) -> None:
    """The consoles replace no ``:name:`` code (stored text prints as written), so rich's table of
    codes is never loaded; nor is socket while no service ever recorded itself in the store."""
    modules = set(run_cli(config, ["status", "-c", CONFIG_ARG])["modules"])
    assert not {"rich._emoji_codes", "socket"} & modules


def test_the_cli_default_config_path_is_the_config_modules() -> None:
    assert DEFAULT_CONFIG_PATH == CONFIG_DEFAULT


@pytest.mark.parametrize("command", ["status", "inbox"])
def test_the_quick_readers_need_neither_pydantic_nor_sqlite_utils_nor_an_event_loop(
    config: Path, command: str
) -> None:
    """They find the store without validating the whole config, and read it synchronously; they
    encode no JSON, so pydantic-core's encoder (agentwake.jsontext) is not loaded either."""
    modules = set(run_cli(config, [command, "-c", CONFIG_ARG])["modules"])
    assert not {"pydantic", "pydantic_core", "agentwake.config", "sqlite_utils", "asyncio"} & modules


OFFLINE_RUN = """
import asyncio, json, sys
from agentwake.agent.llm import LLMSettings, complete

settings = LLMSettings(model="agentwake/offline", api_base=None, api_key=None, max_tokens=100,
    temperature=None, request_timeout_s=5, retries=0, retry_initial_s=0.1, retry_max_s=0.1, api_key_env=None)
messages = [{"role": "user", "content": '<event-data boundary="ab12">\\n{"ticketId": "T-1"}\\n</event-data boundary="ab12">'}]
tools = [{"type": "function", "function": {"name": "demo__get_ticket", "parameters": {"type": "object",
    "properties": {"ticket_id": {"type": "string"}}, "required": ["ticket_id"]}}}]
done = asyncio.run(complete(settings, messages, tools))
print(json.dumps({"message": done.message, "cost": done.cost_usd, "litellm": "litellm" in sys.modules}))
"""


def test_the_offline_model_answers_without_loading_litellm() -> None:
    """agentwake/offline is no LLM: a config that uses only it never pays litellm's import (~190 MB)."""
    shown = subprocess.run([sys.executable, "-c", OFFLINE_RUN], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    said = json.loads(shown.stdout)
    assert said["litellm"] is False
    [call] = said["message"]["tool_calls"]
    assert call["function"]["name"] == "demo__get_ticket"
    assert json.loads(call["function"]["arguments"]) == {"ticket_id": "T-1"}
    assert said["cost"] == 0.0
