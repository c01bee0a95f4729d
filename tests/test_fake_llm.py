"""The fake OpenAI server, exercised through real litellm over loopback HTTP."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import anyio
import httpx
import pytest
from fake_llm import FakeLLM, Reply, error, hold, text, tool_calls

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "hello"}]


async def complete(fake: FakeLLM, **kwargs: Any) -> Any:
    # litellm takes ~5 s to import, so only the tests that need it pay for it.
    import litellm

    return await litellm.acompletion(
        model="openai/fake",
        api_base=fake.url,
        api_key="sk-test",
        messages=kwargs.pop("messages", MESSAGES),
        max_retries=0,
        **kwargs,
    )


async def test_text_reply() -> None:
    async with FakeLLM() as fake:
        fake.script(text("hi there", prompt_tokens=7, completion_tokens=3))
        before = time.perf_counter()
        response = await complete(fake)

    assert response.choices[0].message.content == "hi there"
    assert response.choices[0].finish_reason == "stop"
    assert response.usage.prompt_tokens == 7
    assert response.usage.completion_tokens == 3
    assert response.usage.total_tokens == 10
    assert len(fake.requests) == 1
    assert fake.requests[0]["model"] == "fake"
    assert fake.requests[0]["messages"] == MESSAGES
    assert len(fake.arrivals) == 1
    assert before <= fake.arrivals[0] <= time.perf_counter()


async def test_parallel_tool_calls() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"{name} something",
                "parameters": {"type": "object", "properties": {"id": {"type": "integer"}}},
            },
        }
        for name in ("get_ticket", "close_ticket")
    ]
    async with FakeLLM() as fake:
        fake.script(
            tool_calls(("get_ticket", {"id": 7}), ("close_ticket", {"id": 8, "note": "dup"})),
            tool_calls(("get_ticket", {"id": 9})),
        )
        first = await complete(fake, tools=tools)
        second = await complete(fake, tools=tools)

    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert [c.function.name for c in calls] == ["get_ticket", "close_ticket"]
    assert [json.loads(c.function.arguments) for c in calls] == [{"id": 7}, {"id": 8, "note": "dup"}]
    ids = [c.id for c in calls] + [c.id for c in second.choices[0].message.tool_calls]
    assert ids == ["call_1", "call_2", "call_3"]
    assert fake.requests[0]["tools"] == tools


@pytest.mark.parametrize(
    ("reply", "exception_name"),
    [
        (
            error(429, "Rate limit reached", type="rate_limit_error", code="rate_limit_exceeded"),
            "RateLimitError",
        ),
        (
            error(401, "Incorrect API key", type="invalid_request_error", code="invalid_api_key"),
            "AuthenticationError",
        ),
        (error(500, "The server had an error"), "InternalServerError"),
        (error(503, "Overloaded"), "ServiceUnavailableError"),
        (error(400, "bad", type="invalid_request_error"), "BadRequestError"),
        # The code alone is not enough: litellm matches OpenAI's wording of the message.
        (
            error(400, "too long", type="invalid_request_error", code="context_length_exceeded"),
            "BadRequestError",
        ),
        (
            error(
                400,
                "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
                type="invalid_request_error",
                code="context_length_exceeded",
            ),
            "ContextWindowExceededError",
        ),
    ],
)
async def test_errors_map_to_litellm_exceptions(reply: Reply, exception_name: str) -> None:
    import litellm

    expected = getattr(litellm, exception_name)
    async with FakeLLM() as fake:
        fake.script(reply)
        with pytest.raises(expected) as raised:
            await complete(fake)
        # The queue is drained: the next request gets the default reply.
        assert (await complete(fake)).choices[0].message.content == "ok"

    assert type(raised.value) is expected
    assert raised.value.status_code == reply.status
    assert reply.content is not None and reply.content in str(raised.value)


async def test_hold_answers_each_held_request_with_the_next_reply_after_release() -> None:
    results: list[str] = []

    async def call() -> None:
        results.append((await complete(fake)).choices[0].message.content)

    async with FakeLLM() as fake, anyio.create_task_group() as tg:
        fake.script(hold(), hold(), text("first"), text("second"))
        tg.start_soon(call)
        tg.start_soon(call)
        await fake.wait_for_requests(2)
        assert results == []
        fake.release()

    assert sorted(results) == ["first", "second"]
    assert len(fake.arrivals) == 2


async def test_exit_drops_a_request_that_is_still_held() -> None:
    from litellm.exceptions import InternalServerError

    outcome: list[BaseException] = []

    async def call(fake: FakeLLM) -> None:
        try:
            await complete(fake)
        except InternalServerError as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        async with FakeLLM() as fake:
            fake.script(hold())
            tg.start_soon(call, fake)
            await fake.wait_for_requests(1)
            exiting = time.perf_counter()
        # aiohttp would otherwise wait its shutdown timeout for the held handler.
        assert time.perf_counter() - exiting < 2

    # litellm reports a dropped connection as InternalServerError("Connection error."), not APIConnectionError.
    assert len(outcome) == 1
    assert "Connection error" in str(outcome[0])


async def test_responder_answers_when_the_queue_is_empty() -> None:
    async with FakeLLM() as fake:
        assert (await complete(fake)).choices[0].message.content == "ok"
        fake.responder = lambda body: text(f"echo {body['messages'][-1]['content']}")
        fake.script(text("scripted"))
        assert (await complete(fake)).choices[0].message.content == "scripted"
        assert (await complete(fake)).choices[0].message.content == "echo hello"
    assert len(fake.requests) == 3


async def test_wait_for_requests_times_out() -> None:
    async with FakeLLM() as fake:
        with pytest.raises(TimeoutError):
            await fake.wait_for_requests(1, timeout=0.05)


async def test_plain_http_models_stream_and_unknown_paths() -> None:
    async with FakeLLM() as fake, httpx.AsyncClient(base_url=fake.url) as client:
        models = await client.get("/models")
        assert models.status_code == 200
        assert models.json()["object"] == "list"

        streamed = await client.post("/chat/completions", json={"model": "m", "messages": [], "stream": True})
        assert streamed.status_code == 400
        assert streamed.json()["error"]["param"] is None

        assert (await client.get("/nope")).status_code == 404
        assert (await client.post("/chat/completions", content=b"{not json")).status_code == 400

        fake.script(text("x"))
        reply = await client.post("/chat/completions", json={"model": "echo-me", "messages": []})
        body = reply.json()
        assert body["object"] == "chat.completion"
        assert body["model"] == "echo-me"
        assert set(body) >= {"id", "created", "choices", "usage"}

    # The stream request is recorded but consumed no reply; the bad JSON body is not recorded.
    assert [r["model"] for r in fake.requests] == ["m", "echo-me"]


async def test_a_subprocess_can_be_the_client() -> None:
    script = (
        "import json, sys, urllib.request\n"
        "req = urllib.request.Request(sys.argv[1] + '/chat/completions',"
        " data=json.dumps({'model': 'sub', 'messages': []}).encode(),"
        " headers={'Content-Type': 'application/json'})\n"
        "print(json.load(urllib.request.urlopen(req, timeout=10))['choices'][0]['message']['content'])\n"
    )
    async with FakeLLM() as fake:
        fake.script(text("from the parent"))
        with anyio.fail_after(20):
            result = await anyio.run_process([sys.executable, "-c", script, fake.url])
    assert result.stdout.decode().strip() == "from the parent"
    assert fake.requests[0]["model"] == "sub"
