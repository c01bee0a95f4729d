"""A signed webhook body nested too deep for ``json.loads`` is a 400 on every bridge, never a 500 (Slack
retries a 5xx), and a bridge's traceback chains no unrelated exception (issue 31).

Each bridge runs in process with its real webhook listener on loopback (the ``in_process`` helpers of
the bridges' own tests); the bodies are signed as each upstream signs them, so they reach the parser.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import aiohttp
import pytest
import test_github_bridge as github_tests
import test_pagerduty_bridge as pagerduty_tests
import test_slack_bridge as slack_tests

from agentwake.cli.common import run_async
from agentwake.fakes.github import FakeGitHub
from agentwake.fakes.pagerduty import FakePagerDuty, sign
from agentwake.fakes.slack import FakeSlack, signature

pytestmark = pytest.mark.anyio

# Far past the interpreter's recursion limit: json.loads raises RecursionError, not ValueError.
DEPTH = 100_000
DEEP_OBJECT = (b'{"a":' * DEPTH) + b"1" + (b"}" * DEPTH)
DEEP_LIST = (b"[" * DEPTH) + (b"]" * DEPTH)


@pytest.fixture(params=[DEEP_OBJECT, DEEP_LIST], ids=["object", "list"])
def deep(request: pytest.FixtureRequest) -> bytes:
    body: bytes = request.param
    return body


async def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.post(url, data=body, headers=headers) as answer:
        return answer.status, await answer.text()


async def test_github_answers_400_to_a_signed_body_nested_too_deep(tmp_path: Path, deep: bytes) -> None:
    async with (
        FakeGitHub(token=github_tests.TOKEN) as github,
        github_tests.in_process(tmp_path, github, max_body_bytes=2 * len(deep)) as bridge,
    ):
        for content_type, body in (
            ("application/json", deep),
            ("application/x-www-form-urlencoded", b"payload=" + deep),
        ):
            headers = github_tests.github_headers("issues", "d-1", github_tests.signed(body))
            headers["Content-Type"] = content_type
            status, text = await post(bridge.hook.url, body, headers)
            assert status == 400, text
            assert json.loads(text)["error"] == "unreadable issues payload: the JSON is nested too deeply"
        assert bridge.head() == 0


async def test_slack_answers_400_to_a_signed_body_nested_too_deep(tmp_path: Path, deep: bytes) -> None:
    async with FakeSlack() as slack, slack_tests.in_process(tmp_path, slack) as bridge:
        stamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "X-Slack-Request-Timestamp": stamp,
            "X-Slack-Signature": signature(slack.signing_secret, stamp, deep),
        }
        status, text = await post(bridge.url, deep, headers)
        assert status == 400, text
        assert bridge.head() == 0


async def test_pagerduty_answers_400_to_a_signed_body_nested_too_deep(tmp_path: Path, deep: bytes) -> None:
    async with FakePagerDuty() as pd, pagerduty_tests.in_process(tmp_path, pd) as bridge:
        headers = pagerduty_tests.headers(deep, sign(deep, pagerduty_tests.SECRET))
        status, text = await post(bridge.hook.url, deep, headers)
        assert status == 400, text
        assert "nested too deeply" in json.loads(text)["error"]
        assert bridge.head() == 0


def test_an_exception_from_run_async_chains_no_event_loop_error() -> None:
    async def fails() -> None:
        raise LookupError("the bridge's own failure")

    with pytest.raises(LookupError) as raised:
        run_async(fails)
    # Not "During handling of the above exception (RuntimeError: no running event loop)...".
    assert raised.value.__context__ is None
    assert raised.value.__cause__ is None


async def test_run_async_inside_a_running_loop_still_runs_in_a_thread_of_its_own() -> None:
    async def answer() -> int:
        return 42

    assert run_async(answer) == 42
