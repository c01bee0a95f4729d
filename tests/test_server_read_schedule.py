"""When a push stream or a webhook subscription reads again: after a batch, the type's poll interval
(emit-only types wait for an emit); after failed reads, the poll interval doubling up to 30 s (or
the interval itself when that is longer), the same every time."""

from __future__ import annotations

from agentwake.server import EventContext, EventResult, EventsExtension, EventType
from agentwake.server._shared import idle_delay, retry_delay


def check(ctx: EventContext, arguments: dict[str, object], cursor: str | None) -> EventResult:
    return EventResult(events=[], cursor=cursor)


def extension(
    default_next_poll_ms: int, type_next_poll_ms: int | None = None
) -> tuple[EventsExtension, EventType]:
    events = EventsExtension(default_next_poll_ms=default_next_poll_ms)
    events.event(name="ticket.created", next_poll_ms=type_next_poll_ms)(check)
    events.event(name="incident.created", emit_only=True)(type("IncidentCreated", (), {}))
    return events, events.event_types()[0]


def test_failed_reads_back_off_from_the_poll_interval_doubling_up_to_thirty_seconds() -> None:
    events, ticket = extension(5_000)
    assert [retry_delay(events, ticket, n) for n in range(1, 7)] == [5, 10, 20, 30, 30, 30]
    assert retry_delay(events, ticket, 10_000) == 30  # no overflow for a long outage


def test_the_retry_schedule_has_no_jitter() -> None:
    events, ticket = extension(1_500)
    assert {retry_delay(events, ticket, 2) for _ in range(50)} == {3.0}


def test_the_type_s_own_interval_is_the_start_and_a_longer_one_is_its_own_cap() -> None:
    events, ticket = extension(5_000, type_next_poll_ms=250)
    assert [retry_delay(events, ticket, n) for n in range(1, 4)] == [0.25, 0.5, 1.0]
    events, ticket = extension(45_000)
    assert [retry_delay(events, ticket, n) for n in (1, 2, 5)] == [45, 45, 45]


def test_after_a_batch_a_check_type_waits_its_interval_and_an_emit_only_type_waits_for_an_emit() -> None:
    events, ticket = extension(5_000, type_next_poll_ms=2_000)
    incident = events.event_types()[1]
    assert idle_delay(events, ticket, EventResult(events=[], cursor="c")) == 2.0
    assert idle_delay(events, ticket, EventResult(events=[], cursor="c", next_poll_ms=700)) == 0.7
    assert idle_delay(events, incident, EventResult(events=[], cursor="c")) is None
