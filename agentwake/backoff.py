"""The one backoff formula every retry loop uses, client and server side.

After ``failures`` failures in a row (1 for the first) a loop waits::

    min(max_s, initial_s * 2 ** (failures - 1)) + uniform(0, jitter_s)

``jitter_s`` defaults to ``initial_s``; 0 turns jitter off (a deterministic schedule).
``failures = 0`` gives the jitter alone: a loop that reconnects after a clean end
still spreads its reconnects out. The formula is tenacity's ``wait_exponential_jitter``;
``tenacity_wait`` hands it to tenacity so that loops retried by tenacity and loops that
count their own failures back off alike.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from tenacity import RetryCallState

# 2 ** 62 seconds is already beyond any cap; larger exponents would only overflow.
_MAX_EXPONENT: Final = 62


def backoff_s(
    failures: int,
    *,
    initial_s: float,
    max_s: float,
    jitter_s: float | None = None,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait after ``failures`` consecutive failures; see the module docstring."""
    jitter = initial_s if jitter_s is None else jitter_s
    spread = (rng or random).uniform(0.0, jitter) if jitter > 0 else 0.0
    if failures <= 0:
        return spread
    base = min(max_s, initial_s * float(2 ** min(failures - 1, _MAX_EXPONENT)))
    return base + spread


def tenacity_wait(
    *, initial_s: float, max_s: float, jitter_s: float | None = None
) -> Callable[[RetryCallState], float]:
    """``backoff_s`` as a tenacity wait: the attempt that just failed is the failure count."""

    def wait(state: RetryCallState) -> float:
        return backoff_s(state.attempt_number, initial_s=initial_s, max_s=max_s, jitter_s=jitter_s)

    return wait
