"""The model's failures, one LLM call at a time: a provider that trickles its answer, a 429 with
Retry-After, an answer without choices, an endpoint that needs no key. litellm talks to
tests/fake_llm.py over loopback."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import anyio
import pytest
from _rig import Rig
from fake_llm import FakeLLM, error, no_choices, text, trickle

from agentwake.agent.llm import (
    RETRY_AFTER_CAP_S,
    LLMError,
    LLMSettings,
    complete,
    load_litellm,
    missing_api_keys,
    retry_after_s,
)
from agentwake.config import AgentConfig
from agentwake.errors import ConfigError

# pydantic builds some of litellm's models lazily and warns about a ReadOnly TypedDict item inside
# litellm; as an error it would leave the model half-built for every later test in the process.
pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore:.*ReadOnly. qualifier:UserWarning")]

MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture(autouse=True)
def litellm_imported() -> None:
    """litellm's import takes seconds (many more on a busy machine): never inside a test's deadline."""
    load_litellm()


def settings(fake: FakeLLM, **changes: Any) -> LLMSettings:
    values: dict[str, Any] = {
        "model": "openai/fake",
        "api_base": fake.url,
        "api_key": "sk-test",
        "max_tokens": 16,
        "temperature": None,
        "request_timeout_s": 30.0,
        "retries": 0,
        "retry_initial_s": 0.01,
        "retry_max_s": 0.05,
    }
    values.update(changes)
    return LLMSettings(**values)


async def test_a_trickling_answer_is_cut_off_at_request_timeout_s_and_is_transient() -> None:
    async with FakeLLM() as fake:
        # ~300 bytes at one every 0.2 s: a minute, though no single read ever waits 0.5 s.
        fake.script(trickle(0.2, text("too slow")))
        started = time.perf_counter()
        with anyio.fail_after(60), pytest.raises(LLMError) as failed:
            await complete(settings(fake, request_timeout_s=0.5), MESSAGES, [])
        # The trickle lasts a minute; cut off at 0.5 s (far less than the minute, even on a busy machine).
        assert time.perf_counter() - started < 30
    assert failed.value.transient
    assert "request_timeout_s=0.5s" in str(failed.value)


async def test_a_trickled_call_that_times_out_is_retried() -> None:
    async with FakeLLM() as fake:
        fake.script(trickle(0.2, text("too slow")), text("quick"))
        with anyio.fail_after(60):
            # 3 s: room for the quick answer on a busy machine, nothing like the trickle's minute.
            done = await complete(settings(fake, request_timeout_s=3, retries=1), MESSAGES, [])
    assert done.message["content"] == "quick" and done.attempts == 2


async def test_retry_after_on_a_429_is_waited() -> None:
    async with FakeLLM() as fake:
        fake.script(error(429, "slow down", type="rate_limit_error", retry_after="1"), text("fine"))
        with anyio.fail_after(60):
            done = await complete(settings(fake, retries=2), MESSAGES, [])
        assert done.message["content"] == "fine"
        # The backoff alone would be 0.01-0.02 s.
        assert fake.arrivals[1] - fake.arrivals[0] >= 1.0


async def test_a_retry_after_past_the_run_s_deadline_fails_at_once_and_transiently() -> None:
    async with FakeLLM() as fake:
        fake.script(error(429, "slow down", type="rate_limit_error", retry_after="30"), text("fine"))
        started = time.perf_counter()
        # The deadline is the run's: the 30 s asked for would go past it.
        with anyio.fail_after(20), pytest.raises(LLMError) as failed:
            await complete(settings(fake, retries=2), MESSAGES, [])
        # At once, not after the 30 s asked for (the margin is for a busy machine).
        assert time.perf_counter() - started < 15
        assert len(fake.requests) == 1
    assert failed.value.transient
    assert "RateLimitError" in str(failed.value) and "deadline" in str(failed.value)


class _Headers(dict[str, str]):
    pass


class _Raised(Exception):
    def __init__(self, headers: dict[str, str]) -> None:
        super().__init__("x")
        self.litellm_response_headers = _Headers(headers)


def test_retry_after_reads_seconds_milliseconds_and_an_http_date() -> None:
    assert retry_after_s(_Raised({"retry-after": "5"})) == 5.0
    assert retry_after_s(_Raised({"retry-after-ms": "1500", "retry-after": "9"})) == 1.5
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=60), usegmt=True)
    assert 50 <= (retry_after_s(_Raised({"retry-after": when})) or 0) <= 61
    assert retry_after_s(_Raised({"retry-after": "soon"})) is None
    assert retry_after_s(_Raised({})) is None
    assert retry_after_s(ValueError("no headers")) is None
    assert RETRY_AFTER_CAP_S <= 300


async def test_an_answer_without_choices_is_a_transient_llm_error_that_keeps_its_usage() -> None:
    async with FakeLLM() as fake:
        fake.script(no_choices(prompt_tokens=7, completion_tokens=2))
        with anyio.fail_after(60), pytest.raises(LLMError) as failed:
            await complete(settings(fake), MESSAGES, [])
    assert failed.value.transient
    assert "no choices" in str(failed.value)
    assert (failed.value.prompt_tokens, failed.value.completion_tokens) == (7, 2)


async def test_an_answer_without_choices_is_retried_and_its_tokens_count() -> None:
    async with FakeLLM() as fake:
        fake.script(no_choices(prompt_tokens=7), text("there", prompt_tokens=10, completion_tokens=5))
        with anyio.fail_after(60):
            done = await complete(settings(fake, retries=1), MESSAGES, [])
    assert done.message["content"] == "there"
    assert (done.prompt_tokens, done.completion_tokens, done.attempts) == (17, 5, 2)


async def test_an_endpoint_without_auth_needs_no_invented_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    async with FakeLLM() as fake:
        agent = AgentConfig(model="openai/local", api_base=fake.url, api_key_env="")
        assert missing_api_keys(agent, [agent.model]) == []
        fake.script(text("no key needed"))
        with anyio.fail_after(60):
            done = await complete(settings(fake, api_key=None, api_key_env=""), MESSAGES, [])
    assert done.message["content"] == "no key needed"


def test_no_api_key_is_only_for_a_model_at_api_base() -> None:
    with pytest.raises((ConfigError, ValueError), match="api_base"):
        AgentConfig(model="openai/gpt-4o-mini", api_key_env="")


async def test_a_run_that_fails_on_answers_without_choices_records_their_tokens(rig: Rig) -> None:
    runner = rig.runner(tools=[], llm_retries=1, max_attempts=5)
    rig.fake.script(
        no_choices(prompt_tokens=7, completion_tokens=2), no_choices(prompt_tokens=8, completion_tokens=3)
    )
    result = await rig.run(runner)
    assert (result.status, result.event_state) == ("failed", "pending")
    [run] = rig.stored()["runs"]
    assert (run["prompt_tokens"], run["completion_tokens"]) == (15, 5)
