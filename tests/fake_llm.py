"""A real OpenAI-compatible chat-completions server on loopback, for tests.

Point litellm at it with ``model="openai/<anything>"``, ``api_base=fake.url``, ``api_key="sk-test"``::

    async with FakeLLM() as fake:
        fake.script(text("hi"), tool_calls(("lookup", {"id": 7})), error(429, "slow down"))
        reply = await litellm.acompletion(model="openai/fake", api_base=fake.url, api_key="sk-test",
                                          messages=[...], max_retries=0)

The server runs on the event loop that enters the context manager, so the client may be code in
the same loop or another process (the loop only has to keep running, e.g. awaiting the process).

What litellm 1.110 raises for each ``error(...)`` reply (OpenAI provider, ``max_retries=0``),
checked in test_fake_llm.py; the exact class, not just a subclass:

- 400 -> ``litellm.BadRequestError``, even with ``code="context_length_exceeded"``: litellm looks
  at the message text, not the code. Use OpenAI's wording to get
  ``litellm.ContextWindowExceededError`` (a BadRequestError subclass), e.g.
  ``error(400, "This model's maximum context length is 8192 tokens. However, ...",
  type="invalid_request_error", code="context_length_exceeded")``.
- 401 -> ``litellm.AuthenticationError``
- 429 -> ``litellm.RateLimitError``
- 500 -> ``litellm.InternalServerError``
- 503 -> ``litellm.ServiceUnavailableError`` (502 -> ``BadGatewayError``, 404 -> ``NotFoundError``,
  403 -> plain ``litellm.APIError``, not PermissionDeniedError)
- connection dropped (hold() at exit) or refused -> ``litellm.InternalServerError`` whose message
  says "Connection error.", not ``APIConnectionError``.

Without ``max_retries=0`` the OpenAI SDK itself retries 429 and 5xx (twice, with backoff).
"""

from __future__ import annotations

import itertools
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self

import anyio
from aiohttp import web

__all__ = [
    "FakeLLM",
    "Reply",
    "delay",
    "error",
    "hold",
    "no_choices",
    "text",
    "tool_calls",
    "trickle",
]

ReplyKind = Literal["text", "tool_calls", "error", "hold", "delay", "no_choices", "trickle"]


@dataclass(frozen=True)
class Reply:
    """One scripted answer; build it with text(), tool_calls(), error(), hold() or delay()."""

    kind: ReplyKind
    content: str | None = None
    # (function name, arguments already JSON-encoded): keeps the dataclass immutable and hashable.
    calls: tuple[tuple[str, str], ...] = ()
    prompt_tokens: int = 10
    completion_tokens: int = 5
    status: int = 200
    error_type: str = "server_error"
    code: str | None = None
    seconds: float = 0.0
    then: Reply | None = None
    # error(): extra response headers, e.g. (("Retry-After", "5"),)
    headers: tuple[tuple[str, str], ...] = ()


def text(content: str, *, prompt_tokens: int = 10, completion_tokens: int = 5) -> Reply:
    """A plain assistant message, finish_reason "stop"."""
    return Reply("text", content=content, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)


def tool_calls(*calls: tuple[str, dict[str, Any]], content: str | None = None) -> Reply:
    """An assistant message calling each (function name, arguments) in parallel, finish_reason "tool_calls"."""
    if not calls:
        raise ValueError("tool_calls() needs at least one (name, arguments) pair")
    return Reply("tool_calls", content=content, calls=tuple((name, json.dumps(args)) for name, args in calls))


def error(
    status: int,
    message: str,
    *,
    type: str = "server_error",
    code: str | None = None,
    retry_after: str | None = None,
) -> Reply:
    """An HTTP error with an OpenAI-style body; see the module docstring for what litellm raises.

    ``retry_after``: a ``Retry-After`` header (seconds, or an HTTP date) sent with it.
    """
    if status < 400:
        raise ValueError(f"error() needs a 4xx/5xx status, got {status}")
    headers = (("Retry-After", retry_after),) if retry_after is not None else ()
    return Reply("error", content=message, status=status, error_type=type, code=code, headers=headers)


def no_choices(*, prompt_tokens: int = 10, completion_tokens: int = 0) -> Reply:
    """A 200 chat.completion whose ``choices`` is empty, with its usage (as some proxies answer)."""
    return Reply("no_choices", prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)


def trickle(interval_s: float, then: Reply) -> Reply:
    """Send the headers at once, then ``then``'s JSON body one byte every ``interval_s`` seconds
    (a real wall-clock wait): a provider that never lets a per-read timeout fire."""
    return Reply("trickle", seconds=interval_s, then=then)


def hold() -> Reply:
    """Accept the request but answer only after release(), with the next reply; leaving FakeLLM drops it."""
    return Reply("hold")


def delay(seconds: float, then: Reply) -> Reply:
    """Wait `seconds` (a real wall-clock wait), then answer with `then`."""
    return Reply("delay", seconds=seconds, then=then)


class FakeLLM:
    """async context manager: `async with FakeLLM() as fake:` starts the server, exit stops it."""

    def __init__(self) -> None:
        self.url: str = ""
        self.requests: list[dict[str, Any]] = []
        self.arrivals: list[float] = []
        self.model_lists = 0  # GET /v1/models requests (a reachability probe spends no tokens)
        self.responder: Callable[[dict[str, Any]], Reply] | None = None
        # The usage of an answer from the request and the reply (e.g. fake_anthropic.OpenAIPrefixCache).
        self.usage_for: Callable[[dict[str, Any], Reply], dict[str, Any]] | None = None
        self._queue: deque[Reply] = deque()
        self._call_ids = itertools.count(1)
        self._completion_ids = itertools.count(1)
        self._releases = 0
        self._stopping = False
        self._changed: anyio.Event | None = None
        self._runner: web.AppRunner | None = None

    # -- scripting -----------------------------------------------------------------------------

    def script(self, *replies: Reply) -> None:
        """Append replies to the FIFO queue; each chat request consumes one."""
        self._queue.extend(replies)

    def release(self) -> None:
        """Let every request currently held by hold() go on to the next reply."""
        self._releases += 1
        self._poke()

    # ASYNC109: the agreed interface takes a timeout argument.
    async def wait_for_requests(self, n: int, timeout: float = 60.0) -> None:  # noqa: ASYNC109
        """Wait until at least `n` chat requests have arrived; TimeoutError after `timeout` seconds.

        The default guards against a hang, not a slow start: on a busy machine an `agentwake run`
        subprocess takes many seconds to import litellm before its first request.
        """
        try:
            with anyio.fail_after(timeout):
                while len(self.requests) < n:
                    await self._event().wait()
        except TimeoutError:
            raise TimeoutError(
                f"the fake LLM got {len(self.requests)} of the {n} chat request(s) awaited in {timeout:g} s"
            ) from None

    # -- lifecycle -----------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        # handler_cancellation: a client that goes away mid-hold() must not consume a later reply.
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=5.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, host="127.0.0.1", port=0)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        port = runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/v1"
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stopping = True
        self._poke()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            with anyio.CancelScope(shield=True):
                await runner.cleanup()

    # -- internals -----------------------------------------------------------------------------

    def _event(self) -> anyio.Event:
        # Created lazily so it belongs to the loop that first waits on it.
        if self._changed is None:
            self._changed = anyio.Event()
        return self._changed

    def _poke(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def _next_reply(self, body: dict[str, Any]) -> Reply:
        if self._queue:
            return self._queue.popleft()
        if self.responder is not None:
            return self.responder(body)
        return text("ok")

    async def _models(self, request: web.Request) -> web.Response:
        self.model_lists += 1
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": "fake", "object": "model", "created": 0, "owned_by": "fake-llm"}],
            }
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter()
        try:
            body = await request.json()
        except ValueError:
            return _error_response(error(400, "request body is not JSON", type="invalid_request_error"))
        if not isinstance(body, dict):
            return _error_response(
                error(400, "request body is not a JSON object", type="invalid_request_error")
            )
        self.arrivals.append(arrived)
        self.requests.append(body)
        self._poke()
        if body.get("stream"):
            return _error_response(error(400, "FakeLLM does not stream", type="invalid_request_error"))

        reply = self._next_reply(body)
        while reply.kind in ("hold", "delay"):
            if reply.kind == "hold":
                seen = self._releases
                while self._releases == seen and not self._stopping:
                    await self._event().wait()
                if self._stopping:
                    return _drop(request)
                reply = self._next_reply(body)
            else:
                assert reply.then is not None
                with anyio.move_on_after(reply.seconds):
                    while not self._stopping:
                        await self._event().wait()
                if self._stopping:
                    return _drop(request)
                reply = reply.then

        if reply.kind == "error":
            return _error_response(reply)
        if reply.kind == "trickle":
            assert reply.then is not None
            return await self._trickle(request, reply.seconds, self._completion(body, reply.then))
        return web.json_response(self._completion(body, reply))

    async def _trickle(
        self, request: web.Request, interval_s: float, payload: dict[str, Any]
    ) -> web.StreamResponse:
        data = json.dumps(payload).encode()
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(data)
        await response.prepare(request)
        for index in range(len(data)):
            with anyio.move_on_after(interval_s):
                while not self._stopping:
                    await self._event().wait()
            if self._stopping:
                if request.transport is not None:
                    request.transport.abort()
                return response
            await response.write(data[index : index + 1])
        await response.write_eof()
        return response

    def _completion(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.content, "tool_calls": None}
        finish_reason = "stop"
        if reply.kind == "tool_calls":
            message["tool_calls"] = [
                {
                    "id": f"call_{next(self._call_ids)}",
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
                for name, arguments in reply.calls
            ]
            finish_reason = "tool_calls"
        return {
            "id": f"chatcmpl-fake-{next(self._completion_ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "fake"),
            "choices": []
            if reply.kind == "no_choices"
            else [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
            "usage": self.usage_for(body, reply)
            if self.usage_for is not None
            else {
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens,
                "total_tokens": reply.prompt_tokens + reply.completion_tokens,
            },
        }


def _error_response(reply: Reply) -> web.Response:
    payload = {
        "error": {"message": reply.content, "type": reply.error_type, "param": None, "code": reply.code}
    }
    return web.json_response(payload, status=reply.status, headers=dict(reply.headers))


def _drop(request: web.Request) -> web.StreamResponse:
    """Close the connection without an answer, as a server that dies mid-request would."""
    if request.transport is not None:
        request.transport.abort()
    # aiohttp wants a response object; it finds the transport gone and writes nothing.
    return web.Response(status=503)
