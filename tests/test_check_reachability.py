"""`agentwake check` finds what `run` would trip on at once: the model's endpoint down (api_base, probed
without spending tokens) and the [service] port already taken. A real demo server over stdio."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import anyio
import pytest
from _support import demo_server_toml
from conftest import REPO
from fake_llm import FakeLLM
from typer.testing import CliRunner

from agentwake.cli import app

pytestmark = pytest.mark.filterwarnings("ignore:.*ReadOnly. qualifier:UserWarning")

runner = CliRunner()


def write_config(tmp_path: Path, agent: str, service: str = "") -> Path:
    path = tmp_path / "agentwake.toml"
    path.write_text(
        f"""
[store]
path = "aw.db"

{service}

[agent]
{agent}
prompts = {json.dumps(str(REPO / "prompts"))}

{demo_server_toml(tmp_path / "demo.db")}
[[subscriptions]]
name = "tickets"
server = "demo"
event = "ticket.created"
"""
    )
    return path


def closed_port() -> int:
    """A loopback port nobody listens on (bound for a moment, then let go)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def check(config: Path) -> dict[str, object]:
    result = runner.invoke(app, ["check", "--json", "-c", str(config)])
    report: dict[str, object] = json.loads(result.stdout)
    assert result.exit_code == (0 if report["ok"] else 1), result.output
    return report


def findings(report: dict[str, object], kind: str) -> list[dict[str, object]]:
    return [f for f in report["findings"] if f["kind"] == kind]  # type: ignore[attr-defined,index]


def test_check_fails_when_the_model_s_endpoint_does_not_answer(tmp_path: Path) -> None:
    base = f"http://127.0.0.1:{closed_port()}/v1"
    config = write_config(tmp_path, f'model = "openai/local"\napi_base = "{base}"\napi_key_env = ""')
    report = check(config)
    assert report["ok"] is False
    [down] = findings(report, "model")
    assert base in str(down["message"]) and "does not answer" in str(down["message"])


@pytest.mark.anyio
async def test_check_passes_a_model_endpoint_that_answers_and_spends_no_tokens(tmp_path: Path) -> None:
    async with FakeLLM() as fake:
        config = write_config(tmp_path, f'model = "openai/local"\napi_base = "{fake.url}"\napi_key_env = ""')
        report = await anyio.to_thread.run_sync(check, config)
        assert fake.model_lists == 1  # probed with GET /models ...
        assert fake.requests == []  # ... not a chat completion: nothing spent
    assert findings(report, "model") == []
    assert report["ok"] is True, report["findings"]


def test_check_fails_when_the_service_port_is_taken(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_config(
            tmp_path, 'model = "agentwake/offline"', f'[service]\nlisten = "127.0.0.1:{port}"'
        )
        report = check(config)
    assert report["ok"] is False
    [service] = findings(report, "service")
    assert f"127.0.0.1:{port}" in str(service["message"]) and "cannot listen there" in str(service["message"])
    # Free again: check says nothing.
    assert findings(check(config), "service") == []
