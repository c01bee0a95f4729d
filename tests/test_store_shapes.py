"""The row shapes and values both store backends share (agentwake.store.shapes, agentwake.store.rows).

Both backends run through these in tests/test_store_contract.py; here each piece is pinned on its own:
the keys in their order, what a row becomes, the values a statement is given, the errors raised.
"""

from __future__ import annotations

import json
import logging

import pytest

from agentwake.errors import StoreError
from agentwake.store import rows, shapes
from agentwake.store.records import (
    DUPLICATE,
    INSERTED,
    NEITHER,
    EventVerdict,
    InboxEvent,
    IncomingEvent,
    RejectedEvent,
    RetiredWebhook,
    RunProgress,
    Settlement,
    SubscriptionKey,
    ToolCallRecord,
    WebhookDelivery,
    WebhookRecord,
)

KEY = SubscriptionKey("tickets", "demo", "ticket.created", {"queue": "support"})


def test_the_views_keys_stay_in_the_order_callers_have_always_had_them() -> None:
    received = ("id", "server", "subscription", "event", "event_id", "timestamp", "received_at")
    assert (*received, "state", "attempts", "data", "last_error") == shapes.INBOX_KEYS
    assert (*received, "decision", "data", "injection_score") == shapes.HELD_KEYS
    assert (
        *received,
        *("state", "attempts", "data", "meta", "last_error", "injection_score", "sanitize_report"),
        *("decision", "approved_at", "approval_note"),
    ) == shapes.EVENT_KEYS
    assert (
        *("run_id", "event_id", "server", "subscription", "event", "kind", "attempt", "model", "status"),
        *("reason", "steps", "prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd"),
        *("started_at", "duration_ms", "tool_calls", "refused", "tools", "summary"),
    ) == shapes.ACTION_KEYS
    assert (
        *("run_id", "event_row", "event_id", "server", "subscription", "event", "kind", "attempt"),
        *("model", "status", "reason", "cost_usd", "started_at", "duration_ms", "messages"),
    ) == shapes.PAGE_RUN_KEYS
    assert (
        *("run_id", "kind", "attempt", "model", "status", "reason", "decision", "system_prompt"),
        *("user_prompt", "messages", "steps", "prompt_tokens", "completion_tokens", "cached_tokens"),
        *("cost_usd", "started_at", "finished_at", "duration_ms"),
    ) == shapes.RUN_KEYS


def test_a_view_row_becomes_its_dict_with_its_json_columns_read() -> None:
    received = (7, "demo", "tickets", "ticket.created", "e1", "2024-01-01T00:00:00Z", "2024-01-01T00:00:01Z")
    assert shapes.inbox_view((*received, "done", 1, '{"a": 1}', None)) == {
        **dict(zip(shapes.INBOX_KEYS, received, strict=False)),
        "state": "done",
        "attempts": 1,
        "data": {"a": 1},
        "last_error": None,
    }
    held = shapes.held_view((*received, "", '{"a": 1}', 0.5))
    assert (held["decision"], held["data"], held["injection_score"]) == (None, {"a": 1}, 0.5)
    page = shapes.page_event_view((*received, "held", 0, "{}", None, '{"rule": "r"}'))
    assert list(page) == [*shapes.INBOX_KEYS, "decision"]
    assert page["decision"] == {"rule": "r"}

    event = shapes.event_view((*received, "done", 1, "{}", "", None, 0.1, '{"s": 1}', None, None, None))
    assert (event["meta"], event["sanitize_report"], event["decision"]) == (None, {"s": 1}, None)
    assert list(event) == list(shapes.EVENT_KEYS)


def test_a_run_is_summed_up_by_its_final_answer() -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "all  done\nhere"}]
    columns = (3, "agent", 1, "m", "completed", None, '{"rule": "r"}', "s", "u", json.dumps(messages))
    run = shapes.run_view((*columns, 2, 10, 5, 1, 0.01, "t0", "t1", 40))
    assert run["decision"] == {"rule": "r"}
    assert run["messages"] == messages
    assert run["summary"] == "all done here"
    assert list(run) == [*shapes.RUN_KEYS, "summary"]

    listed = (3, 7, "e1", "demo", "tickets", "ticket.created", "agent", 1, "m", "completed", None)
    page_run = shapes.page_run_view((*listed, 0.01, "t0", 40, None))
    assert "messages" not in page_run
    assert page_run["summary"] is None

    call = shapes.call_view((1, "c1", "demo.tool", "demo", "tool", "", "ok", "r", 5))
    assert call["arguments"] is None


def test_an_action_takes_the_tools_and_summary_its_backend_read() -> None:
    listed = (1, "e1", "demo", "tickets", "ticket.created", "agent", 1, "m", "completed", None)
    row = (*listed, 2, 10, 5, 1, 0.01, "t0", 40, 2, 0, "raw tools", "raw summary")
    action = shapes.action_view(row, None, "one line")
    assert (action["tools"], action["summary"]) == ([], "one line")
    assert shapes.action_view(row, ["a", "b"], None)["tools"] == ["a", "b"]


def test_counts_are_folded_per_subscription_and_every_state_is_counted() -> None:
    counts = shapes.run_counts_of(
        [("tickets", "completed", 2)],
        [("tickets", "done", 2), ("alerts", "pending", 1)],
        [("alerts", "boom")],
    )
    assert counts == {
        "tickets": {"runs_completed": 2, "events_done": 2},
        "alerts": {"events_pending": 1, "last_failure": "boom"},
    }
    states = shapes.state_counts_of([("done", 3)])
    assert states["done"] == 3
    assert set(states.values()) == {0, 3}


def test_recent_errors_count_a_repeat_and_keep_the_newest_few() -> None:
    once = rows.with_recent_error(None, "boom", "t1")
    assert json.loads(once) == [{"at": "t1", "error": "boom"}]
    assert json.loads(rows.with_recent_error(once, "boom", "t2")) == [
        {"at": "t2", "error": "boom", "count": 2}
    ]
    stored = None
    for n in range(rows.RECENT_ERRORS + 2):
        stored = rows.with_recent_error(stored, f"e{n}", f"t{n}")
    kept = json.loads(stored or "[]")
    assert [e["error"] for e in kept] == [f"e{n}" for n in range(2, rows.RECENT_ERRORS + 2)]


def test_a_group_commit_tallies_each_subscription_as_the_backends_did() -> None:
    event = IncomingEvent("e1", "ticket.created", "t", {"a": 1})
    seen: set[tuple[str, str, str]] = set()
    first = WebhookDelivery(KEY, event, "c1")
    assert rows.first_sight(first, seen) is INSERTED
    assert rows.first_sight(first, seen) is DUPLICATE
    assert rows.first_sight(WebhookDelivery(KEY, None, "c2"), seen) is NEITHER

    tally = rows.DeliveryTally(KEY)
    truncated = WebhookDelivery(KEY, None, "c3", truncated=True, control_id="g1")
    assert not tally.wants_stored_cursor(first)
    tally.add(first, INSERTED)
    assert not tally.wants_stored_cursor(truncated)  # the batch's own cursor is known now
    tally.add(truncated, NEITHER)
    refused = RejectedEvent("e9", "ticket.created", "t", "too big", "{...")
    tally.add(WebhookDelivery(KEY, None, None, rejected=refused), NEITHER)
    assert (tally.inserted, tally.duplicates, tally.last_cursor) == (1, 0, "c3")
    assert tally.rejected == [refused]
    assert tally.has_gap("g1") and not tally.has_gap("g2")
    assert tally.gap_rows("now") == [
        ("tickets", "demo", "ticket.created", "now", "c1", "c3", "g1"),
        ("tickets", "demo", "ticket.created", "now", "c3", None, None),
    ]

    fresh = rows.DeliveryTally(KEY)
    assert fresh.wants_stored_cursor(truncated)
    fresh.know_cursor("stored")
    fresh.add(truncated, NEITHER)
    assert fresh.gaps == [("stored", "c3", "g1")]


def test_incoming_and_refused_events_are_stored_as_json() -> None:
    event = IncomingEvent("e1", "ticket.created", "t", {"a": 1})
    assert rows.event_values(KEY, event) == ("demo", "tickets", "ticket.created", "e1", "t", '{"a":1}', None)
    assert rows.event_values(KEY, event._replace(meta={"m": 1}))[-1] == '{"m":1}'
    refused = RejectedEvent("e9", "ticket.created", "t", "too big", "{...")
    assert json.loads(rows.rejected_data(refused)) == {"rejected": "too big", "preview": "{..."}


def test_webhook_rows_become_records_and_records_rows() -> None:
    keyed = ("tickets", "demo", "ticket.created", '{"queue":"support"}', "https://x", "s1", None, None, None)
    row = (*keyed, "w1", None, 1, '{"ok": true}', 2, "t")
    record = rows.webhook_record(row)
    assert record == WebhookRecord(
        "tickets",
        "demo",
        "ticket.created",
        {"queue": "support"},
        "https://x",
        "s1",
        webhook_id="w1",
        no_expiry=True,
        delivery_status={"ok": True},
        refreshes=2,
        last_refresh_at="t",
    )
    assert rows.retired_values(record, "gone", "now", unsubscribed=False) == [
        *("tickets", "demo", "ticket.created", '{"queue":"support"}', "https://x", "w1", "gone", "now", None)
    ]
    assert rows.retired_values(record, "gone", "now", unsubscribed=True)[-1] == "now"
    assert rows.retired_webhook((1, "tickets", "demo", "ticket.created", "{}", "https://x", None)) == (
        RetiredWebhook(1, "tickets", "demo", "ticket.created", {}, "https://x", None)
    )
    params = rows.subscribed_params("tickets", "w1", "s2", None, {"ok": True}, "until", "now")
    assert params == {
        "sent": "s2",
        "until": "until",
        "id": "w1",
        "refresh": None,
        "no_expiry": True,
        "status": '{"ok":true}',
        "now": "now",
        "name": "tickets",
    }
    assert rows.subscribed_params("tickets", "w1", "s2", "later", None, "until", "now")["status"] is None


def test_the_work_queue_refuses_with_the_same_words() -> None:
    with pytest.raises(StoreError, match=r"^no stored event with row id 4$"):
        raise rows.no_event(4)
    rows.check_held("held")
    with pytest.raises(StoreError, match=r"^the event is 'done', not held for approval$"):
        rows.check_held("done")
    rows.check_retryable("dead")
    with pytest.raises(StoreError, match=r"^the event is 'held'; only failed or dead events are retried$"):
        rows.check_retryable("held")
    unknown = [(1, "demo.close", "k1")]
    rows.check_no_unknown_calls(unknown, resend_unknown=True)
    rows.check_no_unknown_calls([], resend_unknown=False)
    with pytest.raises(StoreError, match=r"sent 1 tool call\(s\) whose outcome is unknown: demo.close"):
        rows.check_no_unknown_calls(unknown, resend_unknown=False)


def test_work_queue_values() -> None:
    assert rows.injection_score({"injection_score": 1}) == 1.0
    assert rows.injection_score({"injection_score": True}) is None
    assert rows.injection_score({}) is None
    settled = Settlement(4, {"injection_score": 0.5}, "held")
    assert rows.settle_values(settled, "now") == ('{"injection_score":0.5}', "held", "now", 0.5, "held", 4)
    assert rows.answered_state(True, "ok", "now") == ["pending", "now", "ok", "now"]
    assert rows.answered_state(False, None, "now") == ["denied", None, None, "now"]
    claimed = [(5, "x", "b"), (3, "x", "a"), (4, "x", "b")]
    assert rows.served_in_order(claimed, [4, 3, 5]) == ["b", "a"]
    assert rows.batch_member((1, "demo", "tickets", "n", "e1", "t", '{"a": 1}', 2)) == InboxEvent(
        1, "demo", "tickets", "n", "e1", "t", {"a": 1}, 2
    )


def test_action_log_values() -> None:
    progress = RunProgress([{"role": "user", "content": "hi"}], 1, 10, 5, 0.01, cached_tokens=2)
    assert rows.progress_values(progress) == ['[{"role":"user","content":"hi"}]', 1, 10, 5, 0.01, 2]
    call = ToolCallRecord(1, "c1", "demo.close", "demo", "close", {"id": 1}, "ok", "done", 7)
    assert rows.tool_call_values(9, call, "now") == (
        *(9, 1, "c1", "demo.close", "demo", "close", '{"id":1}', "ok", "done", 7, "now"),
    )
    assert rows.journal_values(9, call, "k", "now") == [
        9,
        1,
        "c1",
        "demo.close",
        "demo",
        "close",
        '{"id":1}',
        "k",
        "now",
    ]
    verdict = EventVerdict("pending", "later", "t", refund_attempt=True)
    assert rows.verdict_values(verdict, "now") == ["pending", "later", "t", "now", 1]


def test_a_rerun_goes_on_from_the_newest_run_that_got_an_answer() -> None:
    unanswered = (3, json.dumps([{"role": "user", "content": "hi"}]), 0, 0, 0, None, 0)
    answered = (2, json.dumps([{"role": "assistant", "content": "ok"}]), 1, 10, 5, 0.01, 3)
    assert rows.answered_run([unanswered]) is None
    found = rows.answered_run([unanswered, answered])
    assert found == (answered, [{"role": "assistant", "content": "ok"}])
    journal = [
        ("c1", "demo.close", "sent", '{"id": 1}', None, None, "k1"),
        ("c1", "demo.close", "ok", "", "r", "y", "k1"),
    ]
    assert found is not None
    point = rows.resume_point_of(*found, journal)
    assert (point.run_id, point.steps, point.cost_usd, point.cached_tokens) == (2, 1, 0.01, 3)
    assert point.calls["c1"].status == "ok"
    assert point.calls["c1"].arguments is None


def test_a_dropped_cursor_is_told_on_the_backends_logger(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("agentwake.store.sqlite.subscriptions")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        rows.warn_cursor_dropped(logger, KEY)
    [record] = caplog.records
    assert record.name == logger.name
    assert record.funcName == "test_a_dropped_cursor_is_told_on_the_backends_logger"
    assert record.getMessage() == (
        "subscription tickets changed (server, event or arguments): its stored cursor is dropped"
    )
