"""Webhook delivery on one machine, in one command (`make run-webhook`).

    python -m examples.webhook_demo                       # until Ctrl-C
    python -m examples.webhook_demo --stop-after-runs 3   # until the agent has run three times

It makes a throwaway certificate authority and a certificate for 127.0.0.1 (trustme), starts the
demo server over Streamable HTTP with a bearer token and webhook delivery on (its SSRF guard lets
loopback through and its TLS trusts that CA), writes an agentwake config whose [webhook] receiver
terminates TLS with that certificate, and runs `agentwake run` on it. The server subscribes the
receiver's URL, verifies it with a challenge, and POSTs each ticket to it, signed; the receiver
stores it and the agent (the offline stand-in model) comments on the ticket.

Everything is kept in --dir (default .webhook-demo): certificates, config, both SQLite files. The
token lives only in the two processes' environments. Nothing leaves this machine.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parent.parent
TOKEN_VARIABLE = "WEBHOOK_DEMO_TOKEN"
# The demo server prints this to stderr once it accepts connections.
LISTENING = re.compile(r"demo_server: listening on (http://\S+/mcp)")
RUN_COMPLETED = re.compile(r"agent: event \S+ \(\S+\) run \d+ completed")
STOP_GRACE_S = 10.0

CONFIG = """\
# Written by examples/webhook_demo.py: agentwake with a webhook receiver, against the demo server.
[store]
path = "agentwake.db"

[agent]
model = "agentwake/offline"
prompts = "{prompts}"

[servers.demo]
url = "{server_url}"
headers = {{ Authorization = "Bearer ${{{token_variable}}}" }}

[webhook]
listen = "127.0.0.1:{port}"
public_url = "https://127.0.0.1:{port}"
tls_cert = "receiver.pem"
tls_key = "receiver-key.pem"
ttl_ms = {ttl_ms}

[[subscriptions]]
name = "tickets"
server = "demo"
event = "ticket.created"
arguments = {{ queue = "support" }}
delivery = "webhook"
tools = ["demo__get_ticket", "demo__add_comment"]
"""


class DemoError(Exception):
    """Something the person running the demo can fix; printed without a traceback."""


def make_certificates(folder: Path) -> None:
    """A CA (ca.pem, which the demo server trusts) and the receiver's certificate for 127.0.0.1."""
    if all((folder / name).exists() for name in ("ca.pem", "receiver.pem", "receiver-key.pem")):
        return
    try:
        import trustme
    except ImportError:
        raise DemoError(
            "trustme is not installed: run `make run-webhook`, or pip install -e '.[dev]'"
        ) from None
    authority = trustme.CA()
    certificate = authority.issue_cert("127.0.0.1")
    authority.cert_pem.write_to_path(str(folder / "ca.pem"))
    certificate.cert_chain_pems[0].write_to_path(str(folder / "receiver.pem"))
    certificate.private_key_pem.write_to_path(str(folder / "receiver-key.pem"))
    (folder / "receiver-key.pem").chmod(0o600)


def relay(stream: IO[str], prefix: str, on_line: Callable[[str], None] | None = None) -> threading.Thread:
    """Copy a child's output to ours, line by line, each line labelled with the process it came from."""

    def pump() -> None:
        for line in stream:
            sys.stderr.write(f"{prefix}{line}")
            if on_line is not None:
                on_line(line)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


@contextmanager
def running(command: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """A child process that is stopped (SIGTERM, then SIGKILL) however the block ends."""
    child = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    try:
        yield child
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def demo_server_command(
    folder: Path, token: str, rate: float, ttl_ms: int
) -> tuple[list[str], dict[str, str]]:
    """The demo server over HTTP on a free port, with a bearer token and webhook delivery to loopback."""
    env = {
        **os.environ,
        "DEMO_TOKEN": token,
        "DEMO_DB": str(folder / "demo.db"),
        "DEMO_RATE": str(rate),
        "DEMO_ALERT_INTERVAL": "0",
        "DEMO_LOAD_INTERVAL": "0",
        "DEMO_WEBHOOK_TTL_MS": str(ttl_ms),
        "DEMO_WEBHOOK_ALLOW": "127.0.0.0/8",
        "DEMO_WEBHOOK_CA": str(folder / "ca.pem"),
    }
    return [sys.executable, "-m", "examples.demo_server", "--http", "127.0.0.1:0"], env


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.webhook_demo",
        description="Webhook delivery on one machine: the demo server POSTs signed tickets to agentwake's receiver.",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path(".webhook-demo"),
        help="where everything is kept (default .webhook-demo)",
    )
    parser.add_argument(
        "--port", type=positive, default=8787, help="the receiver's port on 127.0.0.1 (default 8787)"
    )
    parser.add_argument("--rate", type=float, default=1.0, help="new tickets per second (default 1)")
    parser.add_argument(
        "--ttl-ms",
        type=positive,
        default=20_000,
        help="subscription lifetime asked for, so refreshes show (default 20000)",
    )
    parser.add_argument(
        "--stop-after-runs", type=positive, help="stop once the agent has run this many times"
    )
    args = parser.parse_args(argv)
    try:
        return run(args)
    except DemoError as exc:
        print(f"webhook_demo: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


def run(args: argparse.Namespace) -> int:
    folder: Path = args.dir.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    make_certificates(folder)
    token = secrets.token_urlsafe(24)
    # The server grants at most a minute, so the asked-for TTL is what the refreshes follow.
    demo_command, demo_env = demo_server_command(folder, token, args.rate, max(args.ttl_ms, 60_000))
    with running(demo_command, demo_env) as demo:
        assert demo.stdout is not None
        server_url = wait_for_listening(demo.stdout)
        relay(demo.stdout, "demo      | ")
        config = folder / "agentwake.toml"
        config.write_text(
            CONFIG.format(
                prompts=REPO / "prompts",
                server_url=server_url,
                token_variable=TOKEN_VARIABLE,
                port=args.port,
                ttl_ms=args.ttl_ms,
            )
        )
        agent_env = {**os.environ, TOKEN_VARIABLE: token, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        enough = threading.Event()
        runs = 0

        def count_runs(line: str) -> None:
            nonlocal runs
            if RUN_COMPLETED.search(line):
                runs += 1
                if args.stop_after_runs is not None and runs >= args.stop_after_runs:
                    enough.set()

        agent_command = [sys.executable, "-m", "agentwake.cli", "run", "-c", str(config)]
        with running(agent_command, agent_env) as agent:
            assert agent.stdout is not None
            pump = relay(agent.stdout, "agentwake | ", count_runs)

            def watch_exit() -> None:
                agent.wait()
                enough.set()

            threading.Thread(target=watch_exit, daemon=True).start()
            enough.wait()
            if agent.poll() is not None:
                pump.join()
                raise DemoError(
                    f"agentwake stopped by itself (exit code {agent.returncode}); see its output above"
                )
        print(
            f"webhook_demo: the agent ran {runs} time(s); config and stores are in {folder}", file=sys.stderr
        )
    return 0


def wait_for_listening(output: IO[str]) -> str:
    """The demo server's MCP URL, once it listens; its earlier output is passed through."""
    for line in output:
        sys.stderr.write(f"demo      | {line}")
        found = LISTENING.search(line)
        if found:
            return found.group(1)
    raise DemoError("the demo server stopped before it listened; see its output above")


if __name__ == "__main__":
    sys.exit(main())
