"""What the delivery loops share: the subscription key, their retry pacing and progress cadence."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from agentwake.config import SubscriptionConfig
from agentwake.store import SubscriptionKey

# A failed request or a dropped stream is tried again after backoff_s(failures, RETRY_INITIAL_S, RETRY_MAX_S).
RETRY_INITIAL_S: Final = 0.5
RETRY_MAX_S: Final = 30.0
# A long backlog is reported every this many events.
PROGRESS_EVERY: Final = 10_000

Sleep = Callable[[float], Awaitable[None]]


def subscription_key(sub: SubscriptionConfig) -> SubscriptionKey:
    return SubscriptionKey(sub.name, sub.server, sub.event, dict(sub.arguments))
