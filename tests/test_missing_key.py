"""A missing or refused API key: `run` refuses to start, and at run time the event fails at once.

The run-time tests drive the agent as the service does (tests/_rig.py: a real demo server over
stdio, a real store) with litellm talking over loopback to tests/fake_llm.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _rig import KEY_ENV, Rig
from _support import demo_server_toml
from conftest import REPO
from fake_llm import error, text
from typer.testing import CliRunner

from agentwake.agent.llm import missing_api_keys, require_api_keys
from agentwake.config import AgentwakeConfig, parse_config
from agentwake.errors import ConfigError

# See test_agent_units.py: pydantic warns once about a litellm model it builds lazily.
pytestmark = pytest.mark.filterwarnings("ignore:.*ReadOnly. qualifier:UserWarning")

runner = CliRunner()
MY_KEY = "AGENTWAKE_TEST_MY_KEY"


def flat(value: str) -> str:
    return " ".join(value.split())


def write_config(tmp_path: Path, agent: str) -> Path:
    path = tmp_path / "agentwake.toml"
    path.write_text(
        f"""
[store]
path = "aw.db"

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


# ---- at the start of `agentwake run` ---------------------------------------------------------------


def test_run_refuses_to_start_without_the_variable_api_key_env_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentwake.cli import app

    monkeypatch.delenv(MY_KEY, raising=False)
    config = write_config(tmp_path, f'model = "openai/gpt-4o-mini"\napi_key_env = "{MY_KEY}"')
    result = runner.invoke(app, ["run", "-c", str(config)])
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error:") and f"{MY_KEY} is not set" in lines[0]
    assert "OPENAI_API_KEY" not in result.stderr
    assert not (tmp_path / "aw.db").exists()  # nothing started


def test_run_names_the_providers_variable_without_api_key_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentwake.cli import app

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    config = write_config(tmp_path, 'model = "openai/gpt-4o-mini"')
    result = runner.invoke(app, ["run", "-c", str(config)])
    assert result.exit_code == 2
    assert "OPENAI_API_KEY" in flat(result.stderr) and "api_key_env" in flat(result.stderr)
    assert not (tmp_path / "aw.db").exists()


def config_with(agent: dict[str, object], **subscription: object) -> AgentwakeConfig:
    return parse_config(
        {
            "agent": agent,
            "servers": {"demo": {"command": "x"}},
            "subscriptions": [{"server": "demo", "event": "e", **subscription}],
        },
        env={},
    )


def test_require_api_keys_checks_every_model_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MY_KEY, raising=False)
    offline = config_with({"model": "agentwake/offline", "api_key_env": MY_KEY})
    require_api_keys(offline)  # no key needed
    overridden = config_with(
        {"model": "agentwake/offline", "api_key_env": MY_KEY}, model="openai/gpt-4o-mini"
    )
    with pytest.raises(ConfigError, match=f"{MY_KEY} is not set"):
        require_api_keys(overridden)
    monkeypatch.setenv(MY_KEY, "sk-x")
    require_api_keys(overridden)


def test_missing_api_keys_asks_litellm_for_the_provider_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    cfg = config_with({"model": "anthropic/claude-3-5-haiku-latest"})
    assert cfg.agent is not None
    [missing] = missing_api_keys(cfg.agent, ["anthropic/claude-3-5-haiku-latest"])
    assert missing.variables == ("ANTHROPIC_API_KEY",) and not missing.named
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-x")
    assert missing_api_keys(cfg.agent, ["anthropic/claude-3-5-haiku-latest"]) == []


# ---- at run time ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_refused_key_fails_the_event_at_once_naming_the_variable(rig: Rig) -> None:
    runner_ = rig.runner(tools=[])
    rig.fake.script(error(401, "Incorrect API key provided", type="invalid_request_error"), text("never"))
    result = await rig.run(runner_)
    assert (result.status, result.event_state) == ("failed", "failed")
    assert len(rig.fake.requests) == 1  # not retried
    reason = result.reason or ""
    assert "AuthenticationError" in reason and KEY_ENV in reason and "refused" in reason
    stored = rig.stored()
    assert stored["state"] == "failed" and KEY_ENV in stored["last_error"]


@pytest.mark.anyio
async def test_an_unset_key_at_run_time_fails_at_once_without_a_request(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner_ = rig.runner(tools=[])
    monkeypatch.delenv(KEY_ENV)
    rig.fake.script(text("never"))
    result = await rig.run(runner_)
    assert (result.status, result.event_state) == ("failed", "failed")
    assert rig.fake.requests == []
    reason = result.reason or ""
    assert f"{KEY_ENV} is not set" in reason and "OPENAI_API_KEY" not in reason


@pytest.mark.anyio
async def test_no_key_at_all_is_an_authentication_error_not_a_transient_one(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # No api_key_env: the provider's variable, unset. litellm raises a 500 "Missing credentials"
    # before any request; that must not be retried as a server error.
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    runner_ = rig.runner(tools=[], api_key_env=None, llm_retries=4)
    rig.fake.script(text("never"))
    result = await rig.run(runner_)
    assert (result.status, result.event_state) == ("failed", "failed")
    assert rig.fake.requests == []
    reason = result.reason or ""
    assert reason.startswith("LLM call failed: AuthenticationError") and "OPENAI_API_KEY" in reason
    assert "api_key_env" in reason
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]  # failed at the first try
