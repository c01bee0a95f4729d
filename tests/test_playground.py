"""The playground's commands from the checkout: `init --example`, `bridge send-test`, `fake`.

The playgrounds themselves run from an installed wheel in tests/test_install_anywhere.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO

from agentwake.fakes import deliver


def cli(*args: str | Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentwake.cli", *map(str, args)],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---- init --example ----------------------------------------------------------------------------


def test_init_example_writes_a_playground(tmp_path: Path) -> None:
    done = cli("init", "--example", "pagerduty", tmp_path / "pd", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    project = tmp_path / "pd"
    assert sorted(p.name for p in (project / "policies").iterdir()) == ["99-default.toml", "pagerduty.toml"]
    assert (project / "prompts" / "event.md.j2").is_file()
    assert '"--fake"' in (project / "agentwake.toml").read_text()
    assert "agentwake bridge send-test pagerduty incident.triggered" in done.stdout
    assert "delete agentwake.db and .agentwake-bridge/" in done.stdout


def test_init_example_refuses_an_unknown_example(tmp_path: Path) -> None:
    done = cli("init", "--example", "jira", tmp_path / "x", cwd=tmp_path)
    assert done.returncode == 2
    assert "github, slack, pagerduty, triage" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "x").exists()


def test_init_example_leaves_a_folder_with_a_config_alone(tmp_path: Path) -> None:
    (tmp_path / "agentwake.toml").write_text("# mine\n")
    done = cli("init", "--example", "slack", tmp_path, cwd=tmp_path)
    assert done.returncode == 1
    assert "nothing was written" in done.stderr
    assert (tmp_path / "agentwake.toml").read_text() == "# mine\n"
    assert not (tmp_path / "policies").exists()


# ---- bridge send-test ----------------------------------------------------------------------------


def test_send_test_names_what_it_knows(tmp_path: Path) -> None:
    unknown_bridge = cli("bridge", "send-test", "jira", "issue.created", cwd=tmp_path)
    assert unknown_bridge.returncode == 2 and "github, slack, pagerduty" in unknown_bridge.stderr
    unknown_event = cli("bridge", "send-test", "github", "issues.deleted", cwd=tmp_path)
    assert unknown_event.returncode == 2
    assert "issue_comment.created, issues.opened, pull_request.opened" in unknown_event.stderr
    nowhere = cli("bridge", "send-test", "github", "issues.opened", cwd=tmp_path)
    assert nowhere.returncode == 2 and "pass --url" in nowhere.stderr
    url = f"http://127.0.0.1:{free_port()}/webhook"
    closed = cli(
        "bridge",
        "send-test",
        "github",
        "issues.opened",
        "--url",
        url,
        cwd=tmp_path,
        GITHUB_WEBHOOK_SECRET="s",
    )
    assert closed.returncode == 1 and "no bridge answered" in closed.stderr
    for done in (unknown_bridge, unknown_event, nowhere, closed):
        assert "Traceback" not in done.stderr


def test_every_sample_is_fresh_json_without_placeholders() -> None:
    for upstream in deliver.UPSTREAMS:
        events = deliver.sample_events(upstream)
        assert events, upstream
        for event in events:
            first, second = (json.dumps(deliver.sample_body(upstream, event)) for _ in range(2))
            assert '"$' not in first, (upstream, event)
            assert first != second, (upstream, event)  # new ids each time: a new event each time


@pytest.mark.slow
def test_send_test_delivers_a_signed_sample_to_a_running_bridge(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "GITHUB_WEBHOOK_SECRET": "dev-secret"}
    bridge = subprocess.Popen(
        [sys.executable, "-m", "agentwake.cli", "bridge", "github", "--listen", "127.0.0.1:0"],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.PIPE,  # the MCP channel, held open: the bridge serves until it closes
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert bridge.stderr is not None
        url = None
        for line in bridge.stderr:  # ends if the bridge exits; the test's timeout guards the rest
            found = re.search(r"webhooks on (http://\S+)", line)
            if found:
                url = found.group(1)
                break
        assert url, "the bridge did not say where it listens"
        sent = cli(
            "bridge",
            "send-test",
            "github",
            "issues.opened",
            "--url",
            url,
            cwd=tmp_path,
            GITHUB_WEBHOOK_SECRET="dev-secret",
        )
        assert sent.returncode == 0, sent.stderr
        assert "HTTP 202" in sent.stdout and "accepted" in sent.stdout
        forged = cli(
            "bridge",
            "send-test",
            "github",
            "issues.opened",
            "--url",
            url,
            cwd=tmp_path,
            GITHUB_WEBHOOK_SECRET="wrong",
        )
        assert forged.returncode == 1 and "HTTP 401" in forged.stdout
        assert "dev-secret" not in sent.stdout + sent.stderr
    finally:
        assert bridge.stdin is not None
        bridge.stdin.close()
        try:
            bridge.wait(timeout=30)
        finally:
            if bridge.poll() is None:
                bridge.kill()
                bridge.wait()
            if bridge.stderr is not None:
                bridge.stderr.close()


# ---- fake ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_fake_serves_a_packaged_fake_and_prints_its_url(tmp_path: Path) -> None:
    fake = subprocess.Popen(
        [sys.executable, "-m", "agentwake.cli", "fake", "github", "--port", "0", "--repo", "octo/demo"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert fake.stdout is not None
        url = fake.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        request = urllib.request.Request(
            f"{url}/repos/octo/demo", headers={"Authorization": "Bearer test-token"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert json.load(answer)["full_name"] == "octo/demo"
        fake.send_signal(signal.SIGINT)
        assert fake.wait(timeout=30) == 0
    finally:
        if fake.poll() is None:
            fake.kill()
            fake.wait()
        if fake.stdout is not None:
            fake.stdout.close()
