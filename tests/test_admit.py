"""What a server sends is admitted or refused before the store (agentwake/delivery/admit.py). Pure."""

from __future__ import annotations

from typing import Any

import pytest

from agentwake.config import LimitsConfig
from agentwake.delivery.admit import MalformedPage, admit, admit_all, clamp_next_poll_ms, read_page
from agentwake.delivery.poll import next_delay_ms
from agentwake.store import IncomingEvent, RejectedEvent

LIMITS = LimitsConfig(max_event_bytes=2048, max_event_id_chars=64)


def event(**fields: Any) -> dict[str, Any]:
    return {
        "eventId": "h-1",
        "name": "h.tick",
        "timestamp": "2026-12-02T10:00:00Z",
        "data": {"n": 1},
        **fields,
    }


def test_a_well_formed_event_of_the_subscribed_type_is_admitted() -> None:
    admitted = admit(event(_meta={"trace": "x"}), "h.tick", LIMITS)
    assert admitted == IncomingEvent(
        "h-1", "h.tick", "2026-12-02T10:00:00Z", {"n": 1}, {"trace": "x"}, data_json='{"n":1}'
    )


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"name": "alert.fired"}, "an event named 'alert.fired' on a subscription to 'h.tick'"),
        ({"eventId": "x" * 1_000_000}, "eventId is 1000000 characters, over max_event_id_chars"),
        ({"eventId": ""}, "eventId must be a non-empty string"),
        ({"eventId": 7}, "eventId must be a non-empty string"),
        ({"timestamp": "2" * 10_000}, "timestamp must be a string of at most 64 characters"),
        ({"data": ["not", "an", "object"]}, "data must be a JSON object"),
        ({"data": {"blob": "x" * 5000}}, "over max_event_bytes (2048)"),
        ({"_meta": "str"}, "_meta must be a JSON object"),
    ],
)
def test_an_event_a_server_should_not_send_is_refused_with_a_bounded_summary(
    fields: dict[str, Any], reason: str
) -> None:
    refused = admit(event(**fields), "h.tick", LIMITS)
    assert isinstance(refused, RejectedEvent)
    assert reason in refused.reason
    assert len(refused.event_id) <= 100 and len(refused.name) <= 100
    assert len(refused.preview) <= 400
    assert len(refused.timestamp) <= 100


def test_two_refused_events_with_long_ids_stay_distinct() -> None:
    first = admit(event(eventId="x" * 100 + "a"), "h.tick", LIMITS)
    second = admit(event(eventId="x" * 100 + "b"), "h.tick", LIMITS)
    assert isinstance(first, RejectedEvent) and isinstance(second, RejectedEvent)
    assert first.event_id != second.event_id


def test_a_page_keeps_its_good_events_when_one_is_bad() -> None:
    admitted = admit_all([event(), "junk", event(eventId="h-2", name="other")], "h.tick", LIMITS)
    assert [e.event_id for e in admitted.events] == ["h-1"]
    assert len(admitted.rejected) == 2


@pytest.mark.parametrize(
    ("value", "waited"),
    [
        (float("inf"), 3_600_000),  # what `1e400` parses to
        (-5, 200),
        (12.5, 200),
        (250.7, 250),
        ("soon", None),
        (True, None),
        (float("nan"), None),
        (None, None),
        (10**30, 3_600_000),
    ],
)
def test_next_poll_ms_is_clamped_whatever_the_server_wrote(value: Any, waited: int | None) -> None:
    assert clamp_next_poll_ms(value, floor_ms=200, ceiling_ms=3_600_000) == waited


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"events": {"a": 1}}, "events: must be a list"),
        ({"cursor": 5}, "cursor: must be a string or null"),
        ({"hasMore": "yes"}, "hasMore: must be true or false"),
        ([], "(result): must be an object"),
    ],
)
def test_a_page_whose_own_shape_is_wrong_names_the_field(raw: Any, field: str) -> None:
    with pytest.raises(MalformedPage, match=field.replace("(", r"\(").replace(")", r"\)")):
        read_page(raw, floor_ms=200, ceiling_ms=60_000)


def test_has_more_with_nothing_new_waits_the_floor_instead_of_spinning() -> None:
    page = read_page({"events": [], "hasMore": True, "nextPollMs": 0}, floor_ms=200, ceiling_ms=60_000)
    assert next_delay_ms(page, 200, progressed=False) == 200
    assert next_delay_ms(page, 200, progressed=True) == 0
