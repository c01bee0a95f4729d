"""Server identity end to end: the demo server over Streamable HTTP signs with its identity key, agentwake
(``webhook_identity = "require"``) fetches the key from the demo's own origin and accepts its verification
and its deliveries; ``agentwake check`` says when a server's keys cannot be had.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import free_port
from test_webhook_e2e import TICKETS, Tls, config, delivering, ticket_arrives, wait_refreshes, webhook_demo
from test_webhook_e2e import tls as tls  # the fixture
from typer.testing import CliRunner

from agentwake import cli, metrics
from agentwake.config import AgentwakeConfig
from agentwake.identity import IDENTITY_KEY_ENV, IdentityKey

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


def requiring(cfg: AgentwakeConfig) -> AgentwakeConfig:
    demo = cfg.servers["demo"].model_copy(update={"webhook_identity": "require"})
    return cfg.model_copy(update={"servers": {"demo": demo}})


def verified() -> float:
    return (
        metrics.REGISTRY.get_sample_value("agentwake_webhook_identity_verified_total", {"server": "demo"})
        or 0.0
    )


async def test_a_server_signing_with_its_published_key_is_verified_end_to_end(
    tmp_path: Path, tls: Tls, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = IdentityKey.generate("demo-2026")
    before = verified()
    async with webhook_demo(tmp_path, tls, env={IDENTITY_KEY_ENV: json.dumps(key.to_private_jwk())}) as demo:
        cfg = requiring(config(tmp_path, demo, tls, free_port(), subscriptions=[TICKETS]))
        async with delivering(cfg) as (store, supervisor):
            with anyio.fail_after(30):  # subscribed (from now on): the ticket comes after
                await wait_refreshes(supervisor, store, "tickets", 0)
            await ticket_arrives(demo, store, supervisor, "signed ticket")
            receiver = supervisor.receiver
            assert receiver is not None
            assert receiver.counts["verifications"] == 1
            assert not [name for name in receiver.counts if name.startswith("identity_")]
            keys = receiver.identities.servers["demo"]
            assert [k.kid for k in keys.keys] == ["demo-2026"]
    # The verification POST and the delivery: both carried a v1a from the published key.
    assert verified() - before >= 2
    # `agentwake status` says which subscriptions are identity-checked.
    path = tmp_path / "status.toml"
    path.write_text(
        f'[store]\npath = "{cfg.store.path}"\n[servers.demo]\nurl = "{demo.url}"\nwebhook_identity = "require"\n'
        '[[subscriptions]]\nname = "tickets"\nserver = "demo"\nevent = "ticket.created"\n'
    )
    shown = CliRunner().invoke(cli.app, ["status", "--json", "-c", str(path)])
    assert shown.exit_code == 0, shown.output
    [row] = json.loads(shown.output)
    assert (row["mode"], row["identity"]) == ("webhook", "require")
    table = CliRunner().invoke(cli.app, ["status", "-c", str(path)])
    assert "server identity: require" in " ".join(table.output.split())


def check(tmp_path: Path, cfg: AgentwakeConfig, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    path = tmp_path / "check.toml"
    server = cfg.servers["demo"]
    path.write_text(
        f'[store]\npath = "{tmp_path / "check.db"}"\n'
        f'[servers.demo]\nurl = "{server.url}"\nheaders = {{ Authorization = "{server.headers["Authorization"]}" }}\n'
        'webhook_identity = "require"\n'
        '[[subscriptions]]\nname = "tickets"\nserver = "demo"\nevent = "ticket.created"\ndelivery = "poll"\n'
    )
    result = CliRunner().invoke(cli.app, ["check", "--json", "-c", str(path)])
    report: dict[str, Any] = json.loads(result.output)
    return report


async def test_check_says_when_a_servers_identity_keys_cannot_be_fetched(
    tmp_path: Path, tls: Tls, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with webhook_demo(tmp_path, tls) as demo:  # no identity key: nothing published
        report = check(
            tmp_path, config(tmp_path, demo, tls, free_port(), subscriptions=[TICKETS]), monkeypatch
        )
    assert report["ok"] is False
    [finding] = [f for f in report["findings"] if f["kind"] == "server"]
    assert finding["what"] == "demo"
    assert "identity keys could not be fetched" in finding["message"] and "HTTP 404" in finding["message"]
    assert "/.well-known/mcp-webhook-jwks.json" in finding["message"]


async def test_check_passes_a_server_that_publishes_its_keys(
    tmp_path: Path, tls: Tls, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = IdentityKey.generate()
    async with webhook_demo(tmp_path, tls, env={IDENTITY_KEY_ENV: json.dumps(key.to_private_jwk())}) as demo:
        report = check(
            tmp_path, config(tmp_path, demo, tls, free_port(), subscriptions=[TICKETS]), monkeypatch
        )
    assert report["ok"] is True, report["findings"]
