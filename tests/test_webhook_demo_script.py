"""`make run-webhook` (examples/webhook_demo.py): webhook delivery on one machine, run as a user runs it."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

from conftest import REPO, free_port

from agentwake.store.sqlite import SqliteCore

# Generous: the demo creates a ticket a second and the script stops after the agent's second run.
RUN_TIMEOUT_S = 120
DEMO_ARGS = ("--rate", "5", "--stop-after-runs", "2")


def run_demo(folder: Path, port: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "examples.webhook_demo",
            "--dir",
            str(folder),
            "--port",
            str(port),
            *DEMO_ARGS,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def test_the_webhook_demo_delivers_tickets_to_the_agent_and_runs_again_on_the_same_folder(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "demo"
    first = run_demo(folder, free_port())
    assert first.returncode == 0, first.stderr
    assert "webhook endpoint verification answered" in first.stderr
    ran = re.search(r"the agent ran (\d+) time\(s\)", first.stderr)
    assert ran is not None and int(ran.group(1)) >= 2
    # The second run finds the certificates and stores, and subscribes again from the stored cursor.
    second = run_demo(folder, free_port())
    assert second.returncode == 0, second.stderr
    for output in (first.stderr, second.stderr):
        assert "whsec_" not in output and "Bearer" not in output
    assert "Bearer" not in (folder / "agentwake.toml").read_text().replace("Bearer ${", "")
    store = SqliteCore.open(folder / "agentwake.db")
    try:
        [row] = store.subscriptions()
        assert row["mode"] == "webhook"
        assert row["webhook"]["id"].startswith("sub_")
        assert store.state_counts()["done"] >= 4
    finally:
        store.close()


def test_a_receiver_port_in_use_stops_the_demo_with_a_clear_message(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = run_demo(tmp_path / "demo", taken.getsockname()[1])
    assert result.returncode == 2
    assert "cannot listen on 127.0.0.1:" in result.stderr
    assert "webhook_demo: agentwake stopped by itself" in result.stderr
