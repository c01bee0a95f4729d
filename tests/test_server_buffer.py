"""Unit tests of the emit-only ring buffer (``RingBuffer`` and ``EmitBuffer``).

No MCP session here: these pin down positions, cursors, eviction and paging,
which the poll handler builds on. Time is a fake ``now`` the tests move by hand.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agentwake.server import EmitBuffer, Event
from agentwake.server._buffer import RingBuffer

T0 = datetime(2026, 2, 19, 15, 30, tzinfo=UTC)


class FakeNow:
    """A wall clock that only moves when the test says so."""

    def __init__(self, start: datetime = T0) -> None:
        self.value = start

    def __call__(self) -> datetime:
        return self.value

    def advance(self, **delta: float) -> None:
        self.value += timedelta(**delta)


def make_event(n: int, *, at: datetime = T0) -> Event:
    return Event(name="alert.fired", data={"n": n}, event_id=f"evt_{n}", timestamp=at)


def make_buffer(
    max_events: int = 100, max_age: timedelta = timedelta(minutes=10), *, now: FakeNow | None = None
) -> RingBuffer:
    return RingBuffer(EmitBuffer(max_events=max_events, max_age=max_age), epoch="e1", now=now or FakeNow())


def ids(events: list[Event]) -> list[str]:
    return [event.event_id for event in events]


# ---- positions and cursors ------------------------------------------------------


def test_an_empty_buffer_is_at_position_zero_and_names_it_with_a_cursor() -> None:
    buffer = make_buffer()

    assert buffer.head == 0
    assert buffer.cursor_for(0) == "e1-0"
    assert buffer.parse_cursor("e1-0") == 0


def test_reading_an_empty_buffer_from_position_zero_is_empty_and_not_truncated() -> None:
    read = make_buffer().read(0, 10)

    assert read.events == []
    assert read.position == 0
    assert read.truncated is False
    assert read.has_more is False


def test_sequence_numbers_start_at_one_and_each_append_advances_the_head() -> None:
    buffer = make_buffer()

    assert [buffer.append(make_event(n)) for n in range(3)] == [1, 2, 3]
    assert buffer.head == 3


def test_a_cursor_for_the_head_parses_back_to_the_head() -> None:
    buffer = make_buffer()
    for n in range(4):
        buffer.append(make_event(n))

    assert buffer.parse_cursor(buffer.cursor_for(buffer.head)) == 4
    assert buffer.parse_cursor(buffer.cursor_for(2)) == 2


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "garbage",
        "e1",
        "e1-",
        "e1-x",
        "e1--1",
        "e1-1.5",
        "e1- 1",
        "e1-\N{SUPERSCRIPT TWO}",
        "e1-\N{ARABIC-INDIC DIGIT ONE}",
        "deadbeef-3",
        "e2-1",
    ],
)
def test_parse_cursor_rejects_anything_that_is_not_one_of_its_own_cursors(cursor: str) -> None:
    buffer = make_buffer()
    for n in range(5):
        buffer.append(make_event(n))

    assert buffer.parse_cursor(cursor) is None


def test_parse_cursor_rejects_a_position_beyond_the_head() -> None:
    buffer = make_buffer()
    buffer.append(make_event(1))

    assert buffer.parse_cursor("e1-1") == 1
    assert buffer.parse_cursor("e1-2") is None
    assert buffer.parse_cursor("e1-999999999999") is None


def test_a_cursor_from_another_buffer_is_not_accepted_even_at_a_valid_position() -> None:
    first = RingBuffer(EmitBuffer())
    second = RingBuffer(EmitBuffer())
    for buffer in (first, second):
        buffer.append(make_event(1))

    assert first.epoch != second.epoch
    assert second.parse_cursor(first.cursor_for(1)) is None


# ---- reading --------------------------------------------------------------------


def test_read_from_position_zero_returns_every_event_in_order_with_per_event_cursors() -> None:
    buffer = make_buffer()
    for n in range(1, 4):
        buffer.append(make_event(n))

    read = buffer.read(0, 10)

    assert ids(read.events) == ["evt_1", "evt_2", "evt_3"]
    assert [event.cursor for event in read.events] == ["e1-1", "e1-2", "e1-3"]
    assert read.position == 3
    assert read.truncated is False
    assert read.has_more is False


def test_read_returns_only_the_events_after_the_given_position() -> None:
    buffer = make_buffer()
    for n in range(1, 6):
        buffer.append(make_event(n))

    read = buffer.read(3, 10)

    assert ids(read.events) == ["evt_4", "evt_5"]
    assert read.position == 5


def test_read_from_the_head_returns_nothing_and_stays_at_the_head() -> None:
    buffer = make_buffer()
    for n in range(3):
        buffer.append(make_event(n))

    read = buffer.read(3, 10)

    assert read.events == []
    assert read.position == 3
    assert read.truncated is False


def test_max_events_cuts_the_read_and_reports_has_more_at_the_last_returned_position() -> None:
    buffer = make_buffer()
    for n in range(1, 6):
        buffer.append(make_event(n))

    first = buffer.read(0, 2)
    second = buffer.read(first.position, 2)
    third = buffer.read(second.position, 2)

    assert (ids(first.events), first.position, first.has_more) == (["evt_1", "evt_2"], 2, True)
    assert (ids(second.events), second.position, second.has_more) == (["evt_3", "evt_4"], 4, True)
    assert (ids(third.events), third.position, third.has_more) == (["evt_5"], 5, False)


def test_a_read_that_exactly_drains_the_buffer_does_not_report_has_more() -> None:
    buffer = make_buffer()
    for n in range(1, 4):
        buffer.append(make_event(n))

    read = buffer.read(0, 3)

    assert len(read.events) == 3
    assert read.has_more is False
    assert read.position == 3


def test_events_the_accept_hook_skips_still_advance_the_position() -> None:
    buffer = make_buffer()
    for n in range(1, 6):
        buffer.append(make_event(n))

    read = buffer.read(0, 10, accept=lambda event: event if event.data["n"] % 2 else None)

    assert ids(read.events) == ["evt_1", "evt_3", "evt_5"]
    assert read.position == 5
    assert buffer.read(read.position, 10).events == []


def test_a_narrow_filter_at_the_end_of_the_buffer_still_advances_to_the_head() -> None:
    buffer = make_buffer()
    for n in range(1, 4):
        buffer.append(make_event(n))

    read = buffer.read(0, 10, accept=lambda event: None)

    assert read.events == []
    assert read.position == 3


def test_the_accept_hook_can_reshape_events_and_the_buffer_keeps_the_original() -> None:
    buffer = make_buffer()
    buffer.append(make_event(1))

    read = buffer.read(0, 10, accept=lambda event: event.replace(data={"shaped": True}))

    assert read.events[0].data == {"shaped": True}
    assert read.events[0].cursor == "e1-1"
    assert buffer.read(0, 10).events[0].data == {"n": 1}


def test_a_not_before_floor_skips_older_events_marks_truncated_and_moves_past_them() -> None:
    buffer = make_buffer()
    buffer.append(make_event(1, at=T0))
    buffer.append(make_event(2, at=T0 + timedelta(minutes=1)))
    buffer.append(make_event(3, at=T0 + timedelta(minutes=2)))

    read = buffer.read(0, 10, not_before=T0 + timedelta(seconds=90))

    assert ids(read.events) == ["evt_3"]
    assert read.truncated is True
    assert read.position == 3


def test_a_not_before_floor_older_than_every_event_is_not_truncated() -> None:
    buffer = make_buffer()
    buffer.append(make_event(1, at=T0))

    read = buffer.read(0, 10, not_before=T0 - timedelta(minutes=1))

    assert ids(read.events) == ["evt_1"]
    assert read.truncated is False


# ---- eviction -------------------------------------------------------------------


def test_eviction_by_count_keeps_the_newest_events_and_marks_an_old_position_truncated() -> None:
    buffer = make_buffer(max_events=3)
    for n in range(1, 6):
        buffer.append(make_event(n))

    read = buffer.read(0, 10)

    assert ids(read.events) == ["evt_3", "evt_4", "evt_5"]
    assert read.truncated is True
    assert read.position == 5


def test_a_position_just_before_the_oldest_retained_event_is_not_truncated() -> None:
    buffer = make_buffer(max_events=3)
    for n in range(1, 6):
        buffer.append(make_event(n))

    read = buffer.read(2, 10)

    assert ids(read.events) == ["evt_3", "evt_4", "evt_5"]
    assert read.truncated is False


def test_eviction_by_age_drops_events_older_than_max_age_on_read() -> None:
    now = FakeNow()
    buffer = make_buffer(max_age=timedelta(minutes=10), now=now)
    buffer.append(make_event(1))
    now.advance(minutes=6)
    buffer.append(make_event(2))
    now.advance(minutes=5)

    read = buffer.read(0, 10)

    assert ids(read.events) == ["evt_2"]
    assert read.truncated is True
    assert read.position == 2


def test_an_event_exactly_max_age_old_is_still_retained() -> None:
    now = FakeNow()
    buffer = make_buffer(max_age=timedelta(minutes=10), now=now)
    buffer.append(make_event(1))
    now.advance(minutes=10)

    read = buffer.read(0, 10)

    assert ids(read.events) == ["evt_1"]
    assert read.truncated is False


def test_eviction_by_age_uses_the_time_the_event_was_stored_not_its_timestamp() -> None:
    now = FakeNow()
    buffer = make_buffer(max_age=timedelta(minutes=10), now=now)
    buffer.append(make_event(1, at=T0 - timedelta(days=1)))

    read = buffer.read(0, 10)

    assert ids(read.events) == ["evt_1"]


def test_reading_after_everything_aged_out_from_an_old_position_is_truncated_and_empty() -> None:
    now = FakeNow()
    buffer = make_buffer(max_age=timedelta(minutes=10), now=now)
    for n in range(1, 4):
        buffer.append(make_event(n))
    now.advance(minutes=11)

    read = buffer.read(1, 10)

    assert read.events == []
    assert read.truncated is True
    assert read.position == 3


def test_reading_from_the_head_after_everything_aged_out_is_not_truncated() -> None:
    now = FakeNow()
    buffer = make_buffer(max_age=timedelta(minutes=10), now=now)
    for n in range(1, 4):
        buffer.append(make_event(n))
    now.advance(hours=1)

    read = buffer.read(3, 10)

    assert read.events == []
    assert read.truncated is False
    assert read.position == 3


def test_appending_evicts_aged_out_events_before_they_are_read() -> None:
    now = FakeNow()
    buffer = make_buffer(max_age=timedelta(minutes=10), now=now)
    buffer.append(make_event(1))
    now.advance(minutes=11)
    buffer.append(make_event(2))
    now.value = T0  # even if the clock were wound back, the old event is already gone

    read = buffer.read(0, 10)

    assert ids(read.events) == ["evt_2"]
    assert read.truncated is True


# ---- limits -----------------------------------------------------------------------


@pytest.mark.parametrize("max_events", [0, -1])
def test_emit_buffer_refuses_a_count_limit_below_one(max_events: int) -> None:
    with pytest.raises(ValueError, match="max_events"):
        EmitBuffer(max_events=max_events)


@pytest.mark.parametrize("max_age", [timedelta(0), timedelta(seconds=-1)])
def test_emit_buffer_refuses_a_non_positive_age_limit(max_age: timedelta) -> None:
    with pytest.raises(ValueError, match="max_age"):
        EmitBuffer(max_age=max_age)


def test_a_buffer_of_one_keeps_only_the_latest_event() -> None:
    buffer = make_buffer(max_events=1)
    for n in range(1, 4):
        buffer.append(make_event(n))

    assert ids(buffer.read(2, 10).events) == ["evt_3"]
    assert buffer.read(1, 10).truncated is True
