"""`[log] format = "json"`: one JSON object per line, structured fields when a record has them,
secrets redacted as in the text form, and stray stderr text wrapped too; the text form unchanged."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _support import agentwake_run, demo_server_toml
from conftest import REPO

from agentwake.logs import JsonFormatter, event_fields, install_redaction

WAIT_S = 60.0
ISO_MS_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
WHSEC = "whsec_" + "A1b2C3d4E5f6G7h8I9j0K1l2"
BEARER = "abcdefghijklmnop0123456789"


@pytest.fixture
def json_log() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger writing JSON lines to a buffer through the redaction filter, as `agentwake run` sets it up."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    install_redaction(handler)
    logger = logging.getLogger("agentwake.test_json_logs")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield logger, stream
    finally:
        logger.removeHandler(handler)
        logger.propagate = True


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_record_is_one_json_line_with_time_level_logger_message_and_its_fields(
    json_log: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = json_log
    logger.info(
        "agent: event %s run %d started\nsecond line",
        "T-1",
        7,
        extra=event_fields(subscription="tickets", server="demo", event_id="T-1", run_id=7),
    )
    assert stream.getvalue().count("\n") == 1  # the message's newline is escaped
    [line] = lines(stream)
    assert ISO_MS_UTC.match(line.pop("time"))
    assert line == {
        "level": "INFO",
        "logger": "agentwake.test_json_logs",
        "message": "agent: event T-1 run 7 started\nsecond line",
        "subscription": "tickets",
        "server": "demo",
        "event_id": "T-1",
        "run_id": 7,
    }


def test_fields_appear_only_when_the_record_has_them(json_log: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = json_log
    logger.warning("plain")
    logger.info("some", extra=event_fields(subscription="tickets", run_id=None))
    plain, some = lines(stream)
    assert set(plain) == {"time", "level", "logger", "message"}
    assert plain["level"] == "WARNING"
    assert set(some) == {"time", "level", "logger", "message", "subscription"}


def test_secrets_are_redacted_in_the_message_the_fields_and_the_traceback(
    json_log: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = json_log
    logger.info("subscribed with secret %s; Authorization: Bearer %s", WHSEC, BEARER)
    logger.info("odd id", extra=event_fields(event_id=f"id-{WHSEC}"))
    try:
        raise ValueError(f"the server said Bearer {BEARER}")
    except ValueError:
        logger.exception("refresh failed", extra=event_fields(subscription="tickets"))
    text = stream.getvalue()
    assert WHSEC not in text and BEARER not in text
    message, odd, failed = lines(stream)
    assert message["message"].count("[REDACTED]") == 2
    assert odd["event_id"] == "id-[REDACTED]"
    assert failed["message"] == "refresh failed" and failed["subscription"] == "tickets"
    assert (
        failed["exc"].startswith("Traceback")
        and "ValueError: the server said Bearer [REDACTED]" in failed["exc"]
    )


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=WAIT_S,
        check=False,
    )


def test_setup_logging_json_writes_every_stderr_line_as_json_stray_text_included() -> None:
    done = run_python(
        "import logging, sys, warnings\n"
        "from agentwake.cli.common import setup_logging\n"
        "from agentwake.logs import event_fields\n"
        "setup_logging('WARNING', 'json')\n"
        "logging.getLogger('agentwake.worker').info('below the level: not shown')\n"
        f"logging.getLogger('agentwake.worker').error('event failed: %s', 'Bearer {BEARER}',"
        " extra=event_fields(event_id='T-1', server='demo'))\n"
        f"sys.stderr.write('[demo] a server line with {WHSEC}\\n')\n"
        "print('half a ', end='', file=sys.stderr); print('line', file=sys.stderr)\n"
    )
    assert done.returncode == 0, done.stderr
    assert BEARER not in done.stderr and WHSEC not in done.stderr
    shown = [json.loads(line) for line in done.stderr.splitlines()]
    assert [(s["level"], s["logger"], s["message"]) for s in shown] == [
        ("ERROR", "agentwake.worker", "event failed: Bearer [REDACTED]"),
        ("INFO", "agentwake.stderr", "[demo] a server line with [REDACTED]"),
        ("INFO", "agentwake.stderr", "half a line"),
    ]
    assert (shown[0]["event_id"], shown[0]["server"]) == ("T-1", "demo")


def test_setup_logging_text_is_the_format_it_always_was() -> None:
    done = run_python(
        "import logging\n"
        "from agentwake.cli.common import setup_logging\n"
        "setup_logging('INFO')\n"
        f"logging.getLogger('agentwake').info('starting with Bearer {BEARER}', extra={{'run_id': 3}})\n"
    )
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d INFO    agentwake: starting with Bearer \[REDACTED\]\n", done.stderr
    ), done.stderr


def test_a_refusal_to_start_is_a_json_line_at_error_level(tmp_path: Path) -> None:
    config = tmp_path / "agentwake.toml"
    config.write_text(
        '[log]\nformat = "json"\n\n[agent]\nmodel = "openai/gpt-4o-mini"\napi_key_env = "AW_TEST_UNSET_KEY"\n'
    )
    env = {k: v for k, v in os.environ.items() if k != "AW_TEST_UNSET_KEY"}
    done = subprocess.run(
        [sys.executable, "-m", "agentwake.cli", "run", "-c", str(config)],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(REPO)},
        timeout=WAIT_S,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    [shown] = [json.loads(line) for line in done.stderr.splitlines()]
    assert (shown["level"], shown["logger"]) == ("ERROR", "agentwake.stderr")
    assert shown["message"].startswith("error: ") and "AW_TEST_UNSET_KEY" in shown["message"]


@pytest.mark.slow
@pytest.mark.anyio
async def test_agentwake_run_with_json_logs_writes_only_json_lines(tmp_path: Path) -> None:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "log.toml").write_text(
        '[[rules]]\nname = "log-tickets"\naction = "log"\nmatch.event = "ticket.created"\n'
    )
    config = tmp_path / "agentwake.toml"
    config.write_text(
        f"""
[store]
path = "aw.db"

[log]
format = "json"

[policy]
dir = "policies"

{demo_server_toml(tmp_path / "demo.db", DEMO_RATE="20")}
[[subscriptions]]
name = "tickets"
server = "demo"
event = "ticket.created"
"""
    )
    async with agentwake_run(config) as service:
        await service.wait_for('"message": "agentwake starting: 1 server(s), 1 subscription(s)')
        await service.wait_for('"message": "event ticket.created ')  # a ticket, stored and decided
        assert await service.stop(signal.SIGTERM, timeout=WAIT_S) == 0
    shown = [json.loads(line) for line in service.lines if line]
    assert shown[-1]["message"].startswith("agentwake stopped")
    assert {"time", "level", "logger", "message"} <= set(shown[0])
    # Every line about the subscription carries it as a field, for a log shipper to filter on.
    about = [line for line in shown if "subscription tickets" in line["message"]]
    assert len(about) >= 2
    assert [line for line in about if line.get("subscription") != "tickets"] == []
    # The line of a logged event names the rule that chose "log", in its text and as a field.
    logged = [line for line in shown if "logged by rule log-tickets" in line["message"]]
    assert logged and all(line["rule"] == "log-tickets" for line in logged)
