"""litellm, loaded on first use, and one LLM call with retries on transient errors.

litellm takes seconds to import and would fetch its model price map from the
internet on import unless ``LITELLM_LOCAL_MODEL_COST_MAP`` is set, so it is only
imported here, the first time an agent runs, with the local map forced on.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

import anyio
import anyio.from_thread
import anyio.lowlevel

from agentwake.agent.caching import cache_points, marked_messages
from agentwake.backoff import backoff_s
from agentwake.config import OFFLINE_MODEL
from agentwake.errors import ConfigError

if TYPE_CHECKING:
    from agentwake.config import AgentConfig, AgentwakeConfig

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
# A provider's Retry-After is honoured up to this long (and never past the run's deadline).
RETRY_AFTER_CAP_S: Final = 120.0
# What the client library is given as the key of an endpoint that wants none (api_key_env = "").
NO_KEY_PLACEHOLDER: Final = "no-key"
# What provider clients say when no key reached them; litellm wraps some of these in a 500.
_NO_KEY: Final = re.compile(
    r"missing credentials|api_key client option must be set|no api key|"
    r"api[ _]key (?:is )?(?:missing|not set|not provided|not found|required)",
    re.IGNORECASE,
)
# validate_environment also lists settings such as AZURE_API_BASE; only these are keys.
_SECRET_WORDS: Final = ("KEY", "TOKEN", "SECRET", "PASSWORD")

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
            # A call cut off by its deadline during litellm's set-up leaves litellm's coroutine
            # unawaited; Python's warning about it would be noise in the service's log.
            warnings.filterwarnings(
                "ignore", message="coroutine '.*acompletion' was never awaited", category=RuntimeWarning
            )
            _quiet_litellm_logging()
            from agentwake.agent.offline import OfflineModel

            module.custom_provider_map = [
                *[p for p in module.custom_provider_map if p.get("provider") != OFFLINE_PROVIDER],
                {"provider": OFFLINE_PROVIDER, "custom_handler": OfflineModel()},
            ]
            _litellm = module
        return _litellm


async def load_litellm_async() -> ModuleType:
    """The import runs in a thread of its own, so the service keeps polling meanwhile.

    A daemon thread, not one of anyio's workers: a stop (SIGTERM during the first start's import)
    lets the caller go at once, and the process can exit without joining a thread that is still
    importing.
    """
    if _litellm is not None:
        return _litellm
    token = anyio.lowlevel.current_token()
    done = anyio.Event()
    outcome: list[ModuleType | BaseException] = []

    def load_and_tell() -> None:
        try:
            outcome.append(load_litellm())
        except BaseException as exc:  # handed to the waiting task
            outcome.append(exc)
        with contextlib.suppress(RuntimeError):  # the event loop is gone: nobody waits any more
            anyio.from_thread.run_sync(done.set, token=token)

    threading.Thread(target=load_and_tell, name="litellm-import", daemon=True).start()
    await done.wait()
    [result] = outcome
    if isinstance(result, BaseException):
        raise result
    return result


def litellm_loaded() -> bool:
    return _litellm is not None


class LLMError(Exception):
    """An LLM call failed; ``transient`` says whether another attempt may succeed.

    ``prompt_tokens``, ``completion_tokens``, ``cached_tokens`` and ``cost_usd``: what the provider
    reported for the call's failed attempts (an answer without choices still used tokens).
    """

    def __init__(self, message: str, *, transient: bool, usage: _Usage | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.prompt_tokens = usage.prompt_tokens if usage else 0
        self.completion_tokens = usage.completion_tokens if usage else 0
        self.cached_tokens = usage.cached_tokens if usage else 0
        self.cost_usd = usage.cost_usd if usage else None


class CallTimedOut(Exception):
    """One LLM call passed request_timeout_s (a provider that answers too slowly): transient."""


class NoChoices(Exception):
    """The provider answered 200 with no choices: transient (another attempt usually has one)."""


def is_auth_error(exc: BaseException) -> bool:
    """The provider refused the request for its credentials (401), or no key reached the client."""
    litellm = _litellm
    auth = getattr(litellm, "AuthenticationError", None) if litellm is not None else None
    if isinstance(auth, type) and isinstance(exc, auth):
        return True
    if getattr(exc, "status_code", None) == 401:
        return True
    return bool(_NO_KEY.search(str(exc)))


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, CallTimedOut | NoChoices):
        return True
    litellm = _litellm
    if litellm is None or is_auth_error(exc):
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
    api_key_env: str | None = None  # where api_key came from, named in an authentication error
    prompt_cache: str = "off"  # [agent] prompt_cache: "auto" marks the shared prefix where it pays


@dataclass(frozen=True, slots=True)
class Completion:
    message: dict[str, Any]  # the assistant message, OpenAI-shaped
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None
    attempts: int
    cached_tokens: int = 0  # of prompt_tokens, read from the provider's prompt cache


def _cost(litellm: ModuleType, response: Any) -> float | None:
    """litellm's price of the answer from its usage: cache reads at the model's cached rate, cache
    writes at its cache-write rate (Anthropic's cache_creation_input_tokens), the rest at full rate."""
    try:
        return float(litellm.completion_cost(completion_response=response))
    except Exception:  # unknown model or provider: the offline price map has no entry
        return None


# Told of each LLM call's end (the model, and the LLMError or None): the worker's circuit breaker.
CallObserver = Callable[[str, "LLMError | None"], None]
_observer: ContextVar[CallObserver | None] = ContextVar("agentwake_llm_observer", default=None)


@contextmanager
def observed_by(observer: CallObserver) -> Iterator[None]:
    """Tell ``observer`` how every LLM call made in this context (a run) ends."""
    token = _observer.set(observer)
    try:
        yield
    finally:
        _observer.reset(token)


def settings_for(agent: AgentConfig, model: str) -> LLMSettings:
    """The settings of a call to ``model`` under [agent] (the key read from the environment now)."""
    return LLMSettings(
        model=model,
        api_base=agent.api_base,
        api_key=os.environ.get(agent.api_key_env) if agent.api_key_env else None,
        max_tokens=agent.max_tokens,
        temperature=agent.temperature,
        request_timeout_s=agent.request_timeout_s,
        retries=agent.llm_retries,
        retry_initial_s=agent.retry_initial_s,
        retry_max_s=agent.retry_max_s,
        api_key_env=agent.api_key_env,
        prompt_cache=agent.prompt_cache,
    )


async def probe(settings: LLMSettings) -> LLMError | None:
    """One small call (a word in, one token out, no retry): does the model answer? None when it does."""
    try:
        await _complete(replace(settings, retries=0, max_tokens=1), [{"role": "user", "content": "ping"}], [])
    except LLMError as exc:
        return exc
    return None


async def complete(
    settings: LLMSettings, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *, shared: str = ""
) -> Completion:
    """One chat completion; see ``_complete``. An observer (``observed_by``) is told how it ended.
    ``shared``: the start of the first user message that every run of the rule sends alike."""
    observer = _observer.get()
    try:
        done = await _complete(settings, messages, tools, shared=shared)
    except LLMError as exc:
        if observer is not None and settings.model != OFFLINE_MODEL:
            observer(settings.model, exc)
        raise
    if observer is not None and settings.model != OFFLINE_MODEL:
        observer(settings.model, None)
    return done


async def _complete(
    settings: LLMSettings, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *, shared: str = ""
) -> Completion:
    """One chat completion. Transient failures are retried with backoff; the last one raises LLMError.

    Each attempt is bounded by ``request_timeout_s`` as a whole (not per read); a 429's
    ``Retry-After`` is waited (up to RETRY_AFTER_CAP_S), and no wait goes past the caller's
    deadline (the run's ``timeout_s``): the error is raised instead, transient.

    ``agentwake/offline`` is answered here, by the stand-in, without loading litellm: it is no LLM.
    """
    if settings.model == OFFLINE_MODEL:
        from agentwake.agent.standin import answer

        said = answer(messages, tools)
        return Completion(said.message, said.prompt_tokens, said.completion_tokens, cost_usd=0.0, attempts=1)
    litellm = await load_litellm_async()
    kwargs: dict[str, Any] = {
        "model": settings.model,
        "messages": messages,
        "max_tokens": settings.max_tokens,
        "timeout": settings.request_timeout_s,
        "max_retries": 0,  # the loop below owns retries, so they are counted and logged once
        "num_retries": 0,
    }
    if tools:
        kwargs["tools"] = tools
    points = cache_points(settings.model, settings.prompt_cache)
    if points:
        kwargs["cache_control_injection_points"] = points
        kwargs["messages"] = marked_messages(messages, shared, tools_offered=bool(tools))
    if settings.api_base:
        kwargs["api_base"] = settings.api_base
    if settings.api_key:
        kwargs["api_key"] = settings.api_key
    elif settings.api_key_env == "" and settings.api_base:
        # A local endpoint without auth; the provider's client still wants some key.
        kwargs["api_key"] = NO_KEY_PLACEHOLDER
    if settings.temperature is not None:
        kwargs["temperature"] = settings.temperature

    if settings.api_key_env and not settings.api_key and settings.model != OFFLINE_MODEL:
        # Not worth a request: the provider would refuse it, and the client's message names its
        # own default variable, not the one the config names.
        raise LLMError(_no_key_reason(settings), transient=False)

    usage = _Usage()
    attempt = 0
    while True:
        attempt += 1
        failure: BaseException
        try:
            # The call's own deadline: litellm's timeout bounds each read, so a provider that
            # trickles its answer would otherwise hold the call until the run's timeout_s.
            with anyio.fail_after(settings.request_timeout_s):
                response = await litellm.acompletion(**kwargs)
            usage.add(litellm, response)
            return _completion(response, usage, attempt)
        except TimeoutError:
            failure = CallTimedOut(
                f"no complete answer within request_timeout_s={settings.request_timeout_s:g}s"
            )
        except NoChoices as exc:
            failure = exc
        except Exception as exc:
            if is_auth_error(exc):
                raise LLMError(_auth_reason(litellm, settings, exc), transient=False, usage=usage) from exc
            failure = exc
        transient = is_transient(failure)
        if not transient or attempt > settings.retries:
            raise LLMError(describe(failure), transient=transient, usage=usage) from failure
        wait_s = backoff_s(attempt, initial_s=settings.retry_initial_s, max_s=settings.retry_max_s)
        asked = retry_after_s(failure)
        if asked is not None:
            wait_s = max(wait_s, min(asked, RETRY_AFTER_CAP_S))
        left_s = anyio.current_effective_deadline() - anyio.current_time()
        if wait_s >= left_s:
            # The run's deadline (timeout_s) comes first: the event is retried later instead.
            raise LLMError(
                f"{describe(failure)} (not retried: the wait of {wait_s:.1f}s is past the run's"
                f" deadline, {max(left_s, 0.0):.1f}s away)",
                transient=True,
                usage=usage,
            ) from failure
        logger.warning(
            "LLM %s: %s; retrying in %.1fs%s",
            settings.model,
            describe(failure),
            wait_s,
            "" if asked is None else f" (the provider's Retry-After: {asked:g}s)",
        )
        await anyio.sleep(wait_s)


@dataclass(slots=True)
class _Usage:
    """What the provider reported for every attempt of one call, answers without choices included."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float | None = None

    def add(self, litellm: ModuleType, response: Any) -> None:
        reported = getattr(response, "usage", None)
        self.prompt_tokens += int(getattr(reported, "prompt_tokens", 0) or 0)
        self.completion_tokens += int(getattr(reported, "completion_tokens", 0) or 0)
        self.cached_tokens += cached_tokens(reported)
        cost = _cost(litellm, response)
        if cost is not None:
            self.cost_usd = (self.cost_usd or 0.0) + cost


def cached_tokens(usage: Any) -> int:
    """The prompt tokens a provider read from its cache, as litellm reports them: OpenAI's
    ``prompt_tokens_details.cached_tokens`` (litellm fills it from Anthropic's and Bedrock's cache
    reads too), else Anthropic's ``cache_read_input_tokens``. Cache writes are not reads: not counted."""
    details = getattr(usage, "prompt_tokens_details", None)
    found = getattr(details, "cached_tokens", None)
    if found is None and isinstance(details, dict):
        found = details.get("cached_tokens")
    if not found:
        found = getattr(usage, "cache_read_input_tokens", None)
    try:
        return max(int(found or 0), 0)
    except (TypeError, ValueError):
        return 0


def _completion(response: Any, usage: _Usage, attempts: int) -> Completion:
    choices = getattr(response, "choices", None) or []
    if not choices or getattr(choices[0], "message", None) is None:
        raise NoChoices("the provider's answer has no choices (no message to read)")
    message = choices[0].message.model_dump(exclude_none=True)
    message.setdefault("role", "assistant")
    message.setdefault("content", None)
    message = {k: v for k, v in message.items() if k in ("role", "content", "tool_calls")}
    return Completion(
        message=message,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        cost_usd=usage.cost_usd,
        attempts=attempts,
        cached_tokens=usage.cached_tokens,
    )


def retry_after_s(exc: BaseException) -> float | None:
    """The seconds a provider's ``Retry-After`` (or ``retry-after-ms``) header asks for, if any."""
    headers = getattr(exc, "litellm_response_headers", None)
    if headers is None:
        headers = getattr(getattr(exc, "response", None), "headers", None)
    if headers is None:
        return None
    try:
        millis = headers.get("retry-after-ms")
        if millis is not None:
            return max(float(millis) / 1000, 0.0)
        value = headers.get("retry-after")
    except (AttributeError, TypeError, ValueError):
        return None
    if value is None:
        return None
    value = str(value).strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - datetime.now(UTC)).total_seconds(), 0.0)


# ---- API keys ------------------------------------------------------------------------------------


def _no_key_reason(settings: LLMSettings, variables: Iterable[str] = ()) -> str:
    if settings.api_key_env:
        return (
            f"AuthenticationError: no API key for {settings.model}: {settings.api_key_env} is not set"
            " ([agent] api_key_env); export it and restart agentwake"
        )
    named = ", ".join(variables) or "the provider's API key variable"
    return (
        f"AuthenticationError: no API key for {settings.model}: {named} is not set; export it,"
        " or name the variable that holds the key with api_key_env in [agent]"
    )


def _auth_reason(litellm: ModuleType, settings: LLMSettings, exc: BaseException) -> str:
    """An authentication failure in words that name the variable the key comes from."""
    if not settings.api_key:
        missing = _missing_variables(litellm, settings.model, settings.api_base)
        if settings.api_key_env or missing:
            return _no_key_reason(settings, missing)
    reason = describe(exc)
    if not reason.startswith("AuthenticationError"):
        reason = f"AuthenticationError: {reason}"
    source = (
        f"the API key in {settings.api_key_env} ([agent] api_key_env)"
        if settings.api_key_env
        else "the provider's API key from the environment (set api_key_env in [agent] to choose the variable)"
    )
    return f"{reason} ({source} was refused)"


def _missing_variables(litellm: ModuleType, model: str, api_base: str | None) -> list[str]:
    """The key variables litellm wants for ``model`` and does not find (never fetches anything)."""
    try:
        found = litellm.validate_environment(model=model, api_base=api_base)
    except Exception:  # an unknown provider: litellm cannot say
        return []
    return [str(name) for name in found.get("missing_keys") or [] if _is_secret(str(name))]


def _is_secret(name: str) -> bool:
    return any(word in name.upper() for word in _SECRET_WORDS)


@dataclass(frozen=True, slots=True)
class MissingKey:
    """A model that cannot run: the variables its API key should come from are not set."""

    model: str
    variables: tuple[str, ...]
    named: bool  # the variable is the one [agent] api_key_env names

    def __str__(self) -> str:
        if self.named:
            name = self.variables[0]
            return (
                f"[agent] api_key_env names {name}, but {name} is not set: the agent could not call"
                f" {self.model}; export {name} (or use model = {OFFLINE_MODEL!r} to run without a key)"
            )
        names = " and ".join(self.variables)
        return (
            f"model {self.model!r} needs {names}, which is not set; export it, or name the variable"
            " that holds the key with api_key_env in [agent]"
        )


def models_in_use(config: AgentwakeConfig, extra: Iterable[str | None] = ()) -> list[str]:
    """Every model the agent may call: [agent] model, the subscriptions' and ``extra`` (the rules')."""
    if config.agent is None:
        return []
    models = [config.agent.model]
    models += [s.model for s in config.subscriptions if s.agent and s.model]
    models += [m for m in extra if m]
    return list(dict.fromkeys(models))


def model_warnings(models: Iterable[str]) -> list[tuple[str, str]]:
    """(model, why) for each model litellm cannot price (a cost limit cannot hold, runs record no cost)
    or cannot drive with native tool calling; for `agentwake check`. Imports litellm."""
    litellm = load_litellm()
    found: list[tuple[str, str]] = []
    for model in models:
        if model == OFFLINE_MODEL:
            continue
        provider = model.split("/", 1)[0] if "/" in model else ""
        if provider == "ollama":
            found.append(
                (
                    model,
                    "litellm sends ollama/ models to Ollama's /api/generate, with the tools pasted into the"
                    " prompt and JSON output forced; ollama_chat/ uses Ollama's native tool calling",
                )
            )
        try:
            info = litellm.get_model_info(model)
        except Exception:  # litellm raises its own error types for a model it does not map
            found.append(
                (
                    model,
                    "litellm has no price for it: runs record no cost, so [agent] max_cost_per_day_usd"
                    " cannot hold (max_runs_per_hour still does)",
                )
            )
            continue
        if info.get("supports_function_calling") is False:
            found.append(
                (model, "litellm says it has no native tool calling: the agent could not call tools")
            )
    return found


def missing_api_keys(agent: AgentConfig, models: Iterable[str]) -> list[MissingKey]:
    """The models whose API key is not in the environment. ``agentwake/offline`` needs none.

    With ``api_key_env`` the key is that variable, for every model. Without it, litellm's
    ``validate_environment`` says which variable the provider reads (OPENAI_API_KEY for
    ``openai/...``); litellm is imported for that (offline price map), and only then.
    """
    online = [m for m in dict.fromkeys(models) if m != OFFLINE_MODEL]
    if not online or (agent.api_key_env == "" and agent.api_base):
        return []  # api_key_env = "": the endpoint at api_base wants no key
    if agent.api_key_env:
        if os.environ.get(agent.api_key_env):
            return []
        return [MissingKey(", ".join(online), (agent.api_key_env,), named=True)]
    litellm = load_litellm()
    problems = []
    for model in online:
        missing = _missing_variables(litellm, model, agent.api_base)
        if missing:
            problems.append(MissingKey(model, tuple(missing), named=False))
    return problems


def require_api_keys(config: AgentwakeConfig, extra_models: Iterable[str | None] = ()) -> None:
    """Refuse to start the agent stage without its API key: a ConfigError naming the variable."""
    if config.agent is None:
        return
    problems = missing_api_keys(config.agent, models_in_use(config, extra_models))
    if problems:
        raise ConfigError("; ".join(map(str, problems)))
