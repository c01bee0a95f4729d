"""Fake providers that cache prompts the way the real APIs document, on loopback, for tests and benches.

``FakeAnthropic``: a real HTTP server answering ``POST /v1/messages`` as Anthropic's Messages API
does. Point litellm at it with ``model="anthropic/<model>"``, ``api_base=fake.url``. It honours
``cache_control`` breakpoints as Anthropic documents prompt caching:

- the prompt is the blocks of ``tools``, then ``system``, then each message's content, in order;
- a breakpoint (a block with ``cache_control``) caches the prefix up to and including its block,
  if that prefix is at least ``min_cacheable`` tokens (1024 for Sonnet and Opus);
- a request reads the longest cached prefix that ends at one of its breakpoints or at one of the
  20 blocks before one (Anthropic's lookback), and writes the prefix up to its last breakpoint;
- ``usage`` says ``input_tokens`` (the tokens after the last cache breakpoint, neither read nor
  written), ``cache_creation_input_tokens``, ``cache_read_input_tokens`` and ``output_tokens``.

``OpenAIPrefixCache``: the usage an OpenAI-style provider with automatic prefix caching reports,
for ``FakeLLM.usage_for``: prompts of 1024 tokens or more are cached in 128-token steps, and a
request whose first tokens match an earlier request's reports them as
``prompt_tokens_details.cached_tokens`` (included in ``prompt_tokens``).

Tokens are counted as the characters of each block's canonical JSON divided by four, rounded up:
not a real tokenizer, but deterministic and proportional to what is sent. The caches never expire
(the real ones live five minutes after their last use).

Replies are scripted with tests/fake_llm.py's ``text()``, ``tool_calls()`` and ``error()``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections import deque
from types import TracebackType
from typing import Any, Final, Self

from aiohttp import web
from fake_llm import Reply, text

__all__ = ["FakeAnthropic", "OpenAIPrefixCache", "tokens_of"]

LOOKBACK_BLOCKS: Final = 20
OPENAI_MIN_CACHED: Final = 1024
OPENAI_CACHE_STEP: Final = 128


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def tokens_of(value: Any) -> int:
    """The fake providers' token count of a value: its canonical JSON's characters / 4, rounded up."""
    return math.ceil(len(value if isinstance(value, str) else canonical(value)) / 4)


def _without_cache_control(block: Any) -> Any:
    if isinstance(block, dict):
        return {k: v for k, v in block.items() if k != "cache_control"}
    return block


def anthropic_blocks(body: dict[str, Any]) -> list[tuple[Any, bool]]:
    """(block, carries cache_control) for each block of a Messages request, in cache order."""
    blocks: list[tuple[Any, bool]] = [(tool, "cache_control" in tool) for tool in body.get("tools") or []]
    system = body.get("system")
    if isinstance(system, str):
        blocks.append(({"type": "text", "text": system}, False))
    elif isinstance(system, list):
        blocks += [(block, "cache_control" in block) for block in system]
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            blocks.append(({"role": message.get("role"), "text": content}, False))
            continue
        for block in content or []:
            marked = isinstance(block, dict) and "cache_control" in block
            blocks.append(({"role": message.get("role"), **_without_cache_control(block)}, marked))
    return blocks


class FakeAnthropic:
    """async context manager: ``async with FakeAnthropic() as fake:`` starts the server, exit stops it."""

    def __init__(self, *, min_cacheable: int = 1024) -> None:
        self.url = ""
        self.min_cacheable = min_cacheable
        self.requests: list[dict[str, Any]] = []
        self.usages: list[dict[str, int]] = []
        self._cache: set[str] = set()
        self._queue: deque[Reply] = deque()
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None

    def script(self, *replies: Reply) -> None:
        """Append replies to the FIFO queue; each request consumes one (``text("ok")`` when empty)."""
        self._queue.extend(replies)

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_post("/v1/messages", self._messages)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, host="127.0.0.1", port=0)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    def usage(self, body: dict[str, Any]) -> dict[str, int]:
        """What the request costs in tokens, and the cache it reads and writes (as Anthropic does)."""
        blocks = anthropic_blocks(body)
        model = str(body.get("model"))
        digest = hashlib.sha256(model.encode())
        keys: list[str] = []
        ends: list[int] = []
        total = 0
        for block, _ in blocks:
            digest.update(canonical(_without_cache_control(block)).encode() + b"\0")
            keys.append(digest.hexdigest())
            total += tokens_of(_without_cache_control(block))
            ends.append(total)
        marks = [i for i, (_, marked) in enumerate(blocks) if marked]
        read = 0
        for mark in marks:
            for index in range(mark, max(mark - LOOKBACK_BLOCKS, -1), -1):
                if keys[index] in self._cache:
                    read = max(read, ends[index])
                    break
        written = 0
        cacheable = [mark for mark in marks if ends[mark] >= self.min_cacheable]
        if cacheable:
            last = cacheable[-1]
            if ends[last] > read:
                written = ends[last] - read
            self._cache.update(keys[mark] for mark in cacheable)
        return {
            "input_tokens": total - read - written,
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read,
        }

    async def _messages(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        reply = self._queue.popleft() if self._queue else text("ok")
        if reply.kind == "error":
            return web.json_response(
                {"type": "error", "error": {"type": "api_error", "message": reply.content}},
                status=reply.status,
            )
        content: list[dict[str, Any]] = []
        if reply.content:
            content.append({"type": "text", "text": reply.content})
        for name, arguments in reply.calls:
            content.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_{next(self._ids):04d}",
                    "name": name,
                    "input": json.loads(arguments),
                }
            )
        usage = {**self.usage(body), "output_tokens": reply.completion_tokens}
        self.usages.append(usage)
        return web.json_response(
            {
                "id": f"msg_fake_{next(self._ids):04d}",
                "type": "message",
                "role": "assistant",
                "model": body.get("model"),
                "content": content,
                "stop_reason": "tool_use" if reply.calls else "end_turn",
                "stop_sequence": None,
                "usage": usage,
            }
        )


class OpenAIPrefixCache:
    """Usage as OpenAI reports it with automatic prefix caching; ``FakeLLM.usage_for = cache.usage``."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled  # False: no prefix is ever cached (what the same requests cost without)
        self._seen: set[str] = set()

    def usage(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        # Tools and the system message come first in what the model reads, then the messages.
        prompt = canonical(body.get("tools") or []) + "".join(
            canonical(message) for message in body.get("messages") or []
        )
        prompt_tokens = tokens_of(prompt)
        cached = 0
        digest = hashlib.sha256(str(body.get("model")).encode())
        step_chars = OPENAI_CACHE_STEP * 4
        boundaries: list[tuple[int, str]] = []
        for end in range(step_chars, len(prompt) + 1, step_chars):
            digest.update(prompt[end - step_chars : end].encode())
            if end // 4 >= OPENAI_MIN_CACHED:
                boundaries.append((end // 4, digest.hexdigest()))
        for tokens, key in boundaries:
            if self.enabled and key in self._seen:
                cached = tokens
        self._seen.update(key for _, key in boundaries)
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": prompt_tokens + reply.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
