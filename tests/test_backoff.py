"""The one backoff formula: min(max_s, initial_s * 2 ** (failures - 1)) + uniform(0, jitter_s)."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any, cast

import pytest

from agentwake.backoff import backoff_s, tenacity_wait


@pytest.mark.parametrize(
    ("failures", "base"), [(1, 0.5), (2, 1.0), (3, 2.0), (6, 16.0), (7, 30.0), (500, 30.0)]
)
def test_the_wait_doubles_per_failure_up_to_the_cap_plus_at_most_one_initial_of_jitter(
    failures: int, base: float
) -> None:
    rng = random.Random(7)
    waits = [backoff_s(failures, initial_s=0.5, max_s=30.0, rng=rng) for _ in range(200)]
    assert all(base <= wait <= base + 0.5 for wait in waits)
    assert len(set(waits)) > 1  # jittered


def test_without_jitter_the_schedule_is_exact() -> None:
    assert [backoff_s(n, initial_s=1.0, max_s=5.0, jitter_s=0) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 5.0]


def test_no_failure_yet_waits_only_the_jitter() -> None:
    assert backoff_s(0, initial_s=1.0, max_s=60.0, jitter_s=0) == 0.0
    assert 0.0 <= backoff_s(0, initial_s=1.0, max_s=60.0) <= 1.0


def test_tenacity_counts_the_attempt_that_just_failed_as_the_failures() -> None:
    wait = tenacity_wait(initial_s=1.0, max_s=60.0, jitter_s=0)
    states = [cast(Any, SimpleNamespace(attempt_number=n)) for n in (1, 2, 3)]
    assert [wait(state) for state in states] == [1.0, 2.0, 4.0]
