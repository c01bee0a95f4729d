"""agentwake: wake an LLM agent when something happens upstream, through MCP Events.

The names a program embedding agentwake needs are importable from here; each is loaded
on first use, so ``import agentwake`` loads no heavy dependency and changes nothing in
the process (no environment variable, no logging set-up).

    config = agentwake.load_config("agentwake.toml")
    await agentwake.run_service(config)            # inside your own anyio event loop
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentwake.config import AgentwakeConfig, load_config
    from agentwake.decide import Outcome
    from agentwake.errors import (
        AgentwakeError,
        ConfigError,
        DeliveryError,
        PolicyError,
        StoreError,
    )
    from agentwake.policy import Policy, load_policy
    from agentwake.service import run_service, serve
    from agentwake.store import InboxEvent, Store, open_store

# name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "AgentwakeConfig": "agentwake.config",
    "AgentwakeError": "agentwake.errors",
    "ConfigError": "agentwake.errors",
    "DeliveryError": "agentwake.errors",
    "InboxEvent": "agentwake.store",
    "Outcome": "agentwake.decide",
    "Policy": "agentwake.policy",
    "PolicyError": "agentwake.errors",
    "Store": "agentwake.store",
    "StoreError": "agentwake.errors",
    "load_config": "agentwake.config",
    "load_policy": "agentwake.policy",
    "open_store": "agentwake.store",
    "run_service": "agentwake.service",
    "serve": "agentwake.service",
}

__all__ = [
    "AgentwakeConfig",
    "AgentwakeError",
    "ConfigError",
    "DeliveryError",
    "InboxEvent",
    "Outcome",
    "Policy",
    "PolicyError",
    "Store",
    "StoreError",
    "load_config",
    "load_policy",
    "open_store",
    "run_service",
    "serve",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentwake' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
