"""The webhook sender's pure rules, without a network or an event loop: the watermark, TTL grants,
backoff, the suspension window, the verification rate limit and callback URL checks."""

from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path

import pytest
from mcp.shared.exceptions import MCPError

from agentwake.server import SqliteWebhookStore, WebhookSettings
from agentwake.server._webhook import TokenBuckets
from agentwake.server._webhook_delivery import HealthWindow, Watermark
from agentwake.server._webhook_settings import check_url, grant_ttl, retry_delay_s

SETTINGS = WebhookSettings(max_ttl=timedelta(minutes=30), min_ttl=timedelta(minutes=1))


# ---- the watermark ---------------------------------------------------------------------------------


def test_the_watermark_waits_for_the_oldest_pending_delivery() -> None:
    mark = Watermark("0")
    one, two, three = mark.add("1"), mark.add("2"), mark.add("3")
    mark.done(two)
    mark.done(three)
    assert mark.value == "0"  # 1 is still pending
    assert mark.value_with(two) == "0" and mark.value_with(one) == "3"
    mark.done(one)
    assert mark.value == "3" and mark.pending == 0


def test_a_delivery_may_count_itself_but_nothing_pending_before_it() -> None:
    mark = Watermark("0")
    one, two, three = mark.add("1"), mark.add("2"), mark.add("3")
    assert [mark.value_with(s) for s in (one, two, three)] == ["1", "0", "0"]
    mark.done(one)
    assert [mark.value_with(s) for s in (two, three)] == ["2", "1"]


def test_positions_reached_with_nothing_to_deliver_advance_it_only_in_order() -> None:
    mark = Watermark("0")
    mark.mark("5")  # a quiet read: nothing pending, so straight to it
    assert mark.value == "5"
    six = mark.add("6")
    mark.mark("9")  # the batch's end, after 6
    assert mark.value == "5"
    mark.done(six)
    assert mark.value == "9"
    mark.done(six)  # twice is harmless
    assert mark.value == "9"


def test_the_front_is_the_oldest_delivery_not_done() -> None:
    mark = Watermark(None)
    one, gap = mark.add("1"), mark.add("7")
    assert mark.is_front(one) and not mark.is_front(gap)
    mark.done(one)
    assert mark.is_front(gap)


# ---- TTL grants -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ttl_ms", "given", "granted"),
    [
        (None, False, timedelta(minutes=30)),
        (600_000, True, timedelta(minutes=10)),
        (3_600_000, True, timedelta(minutes=30)),
        (10**30, True, timedelta(minutes=30)),  # no overflow
        (1, True, timedelta(minutes=1)),
        (-5, True, timedelta(minutes=1)),
        (None, True, timedelta(minutes=30)),  # no expiry needs a store
    ],
)
def test_grants_are_clamped_into_the_floor_and_cap(
    ttl_ms: int | None, given: bool, granted: timedelta
) -> None:
    assert grant_ttl(SETTINGS, ttl_ms, given=given) == granted


def test_no_expiry_is_granted_only_when_asked_and_a_store_is_configured(tmp_path: Path) -> None:
    store = SqliteWebhookStore(tmp_path / "hooks.db")
    try:
        durable = WebhookSettings(max_ttl=timedelta(minutes=30), store=store)
        assert grant_ttl(durable, None, given=True) is None
        assert grant_ttl(durable, None, given=False) == timedelta(minutes=30)
    finally:
        store.close()


# ---- retries, suspension, rate limits -----------------------------------------------------------------


class _Uniform(random.Random):
    """A random source whose ``uniform`` always lands at one fraction of its range."""

    def __init__(self, fraction: float) -> None:
        super().__init__()
        self.fraction = fraction

    def uniform(self, low: float, high: float) -> float:
        return low + (high - low) * self.fraction


def test_backoff_doubles_up_to_the_cap_plus_up_to_one_initial_interval_of_jitter() -> None:
    settings = WebhookSettings(
        max_ttl=timedelta(minutes=1), retry_initial=timedelta(seconds=1), retry_max=timedelta(seconds=10)
    )
    low, high = _Uniform(0.0), _Uniform(1.0)
    assert [retry_delay_s(settings, n, rng=low) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert [retry_delay_s(settings, n, rng=high) for n in range(1, 7)] == [2, 3, 5, 9, 11, 11]
    assert retry_delay_s(settings, 500, rng=low) == 10  # no overflow for huge attempt numbers
    rng = random.Random(7)
    for attempt in range(1, 7):
        floor = min(10.0, 2.0 ** (attempt - 1))
        assert floor <= retry_delay_s(settings, attempt, rng=rng) <= floor + 1.0


def test_suspension_needs_both_the_sample_size_and_the_failure_rate() -> None:
    window = HealthWindow(window_s=60, min_attempts=4, failure_rate=0.5)
    assert [window.record(False, t) for t in (0, 1, 2)] == [False, False, False]  # too few attempts
    assert window.record(False, 3) is True
    window.clear()
    assert [window.record(ok, t) for ok, t in ((True, 0), (False, 1), (True, 2), (False, 3))] == [False] * 4
    # Old attempts leave the window: at t=70 only the last ones count.
    window.clear()
    for t in range(4):
        window.record(True, t)
    assert window.record(False, 70) is False  # one attempt in the window
    assert [window.record(False, 70 + t) for t in (1, 2, 3)] == [False, False, True]


def test_verification_buckets_refill_over_the_window() -> None:
    buckets = TokenBuckets(capacity=2, window_s=60)
    assert [buckets.take("a.test", 0), buckets.take("a.test", 0), buckets.take("a.test", 0)] == [
        True,
        True,
        False,
    ]
    assert buckets.take("b.test", 0)  # per host
    assert buckets.take("a.test", 30)  # one token back after half the window
    assert not buckets.take("a.test", 30)
    buckets.forget_full(10_000)
    assert buckets.take("a.test", 10_000)


# ---- callback URLs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/a?b=c",
        "https://[2001:db8::1]:8443/x",
        "https://127.0.0.1:9/",
        "HTTPS://Example.COM",
    ],
)
def test_https_urls_are_accepted_as_given(url: str) -> None:
    assert check_url(url) == url


def test_an_overlong_url_is_refused() -> None:
    with pytest.raises(MCPError) as caught:
        check_url("https://a.test/" + "x" * 5000)
    assert caught.value.error.code == -32602
