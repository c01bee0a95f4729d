"""litellm, loaded on first use, and one LLM call with retries on transient errors.

litellm takes seconds to import and would fetch its model price map from the
internet on import unless ``LITELLM_LOCAL_MODEL_COST_MAP`` is set, so it is only
imported here, the first time an agent runs, with the local map forced on.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Final

import anyio
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
)

from agentwake.backoff import tenacity_wait
from agentwake.config import OFFLINE_MODEL

logger = logging.getLogger(__name__)

OFFLINE_PROVIDER: Final = OFFLINE_MODEL.split("/", 1)[0]
_TRANSIENT_NAMES: Final = (
    "RateLimitError",
    "Timeout",
    "APIConnectionError",
    "InternalServerError",
    "ServiceUnavailableError",
    "BadGatewayError",
)
_TRANSIENT_STATUS: Final = frozenset({408, 409, 425, 429})

_lock = threading.Lock()
_litellm: ModuleType | None = None


def _quiet_litellm_logging() -> None:
    # litellm installs its own handlers (every line twice) and logs each call at INFO.
    level = logging.DEBUG if logging.getLogger().isEnabledFor(logging.DEBUG) else logging.WARNING
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
        named = logging.getLogger(name)
        named.handlers.clear()
        named.propagate = True
        named.setLevel(level)


def load_litellm() -> ModuleType:
    """Import litellm once (offline price map, no telemetry) and register the offline model."""
    global _litellm
    with _lock:
        if _litellm is None:
            os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
            module: Any = importlib.import_module("litellm")
            module.telemetry = False
            module.suppress_debug_info = True
            _quiet_litellm_logging()
            from agentwake.agent.offline import OfflineModel

            module.custom_provider_map = [
                *[p for p in module.custom_provider_map if p.get("provider") != OFFLINE_PROVIDER],
                {"provider": OFFLINE_PROVIDER, "custom_handler": OfflineModel()},
            ]
            _litellm = module
        return _litellm


async def load_litellm_async() -> ModuleType:
    """The import runs in a worker thread, so the service keeps polling meanwhile."""
    if _litellm is not None:
        return _litellm
    return await anyio.to_thread.run_sync(load_litellm)


def litellm_loaded() -> bool:
    return _litellm is not None


class LLMError(Exception):
    """An LLM call failed; ``transient`` says whether another attempt may succeed."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


def is_transient(exc: BaseException) -> bool:
    litellm = _litellm
    if litellm is None:
        return False
    transient = tuple(getattr(litellm, name) for name in _TRANSIENT_NAMES if hasattr(litellm, name))
    if isinstance(exc, transient):
        return True
    status = getattr(exc, "status_code", None)
    return (
        isinstance(exc, litellm.APIError)
        and isinstance(status, int)
        and (status >= 500 or status in _TRANSIENT_STATUS)
    )


def describe(exc: BaseException) -> str:
    """A short reason for the action log: the exception class and its first line, no request dump."""
    name = type(exc).__name__
    lines = str(exc).strip().splitlines()
    message = lines[0] if lines else ""
    # litellm prefixes its messages with the class name, sometimes more than once.
    while True:
        trimmed = message.removeprefix("litellm.").removeprefix(f"{name}:").strip()
        if trimmed == message:
            break
        message = trimmed
    return f"{name}: {message[:300]}" if message else name


@dataclass(frozen=True, slots=True)
class LLMSettings:
    model: str
    api_base: str | None
    api_key: str | None = field(repr=False)  # never in a log line or traceback
    max_tokens: int
    temperature: float | None
    request_timeout_s: float
    retries: int
    retry_initial_s: float
    retry_max_s: float


@dataclass(frozen=True, slots=True)
class Completion:
    message: dict[str, Any]  # the assistant message, OpenAI-shaped
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None
    attempts: int


def _cost(litellm: ModuleType, response: Any) -> float | None:
    try:
        return float(litellm.completion_cost(completion_response=response))
    except Exception:  # unknown model or provider: the offline price map has no entry
        return None


async def complete(
    settings: LLMSettings, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> Completion:
    """One chat completion. Transient failures are retried with backoff; the last one raises LLMError."""
    litellm = await load_litellm_async()
    kwargs: dict[str, Any] = {
        "model": settings.model,
        "messages": messages,
        "max_tokens": settings.max_tokens,
        "timeout": settings.request_timeout_s,
        "max_retries": 0,  # tenacity owns retries, so they are counted and logged once
        "num_retries": 0,
    }
    if tools:
        kwargs["tools"] = tools
    if settings.api_base:
        kwargs["api_base"] = settings.api_base
    if settings.api_key:
        kwargs["api_key"] = settings.api_key
    if settings.temperature is not None:
        kwargs["temperature"] = settings.temperature

    def note(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        delay = state.next_action.sleep if state.next_action else 0.0
        logger.warning("LLM %s: %s; retrying in %.1fs", settings.model, describe(exc) if exc else "?", delay)

    retrying = AsyncRetrying(
        retry=retry_if_exception(is_transient),
        wait=tenacity_wait(initial_s=settings.retry_initial_s, max_s=settings.retry_max_s),
        stop=stop_after_attempt(settings.retries + 1),
        before_sleep=note,
        reraise=True,
    )
    try:
        async for attempt in retrying:
            with attempt:
                response = await litellm.acompletion(**kwargs)
    except Exception as exc:
        raise LLMError(describe(exc), transient=is_transient(exc)) from exc
    choice = response.choices[0]
    message = choice.message.model_dump(exclude_none=True)
    message.setdefault("role", "assistant")
    message.setdefault("content", None)
    message = {k: v for k, v in message.items() if k in ("role", "content", "tool_calls")}
    usage = getattr(response, "usage", None)
    return Completion(
        message=message,
        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        cost_usd=_cost(litellm, response),
        attempts=attempt.retry_state.attempt_number,
    )
