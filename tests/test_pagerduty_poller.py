"""The PagerDuty bridge's poller when more changed between two polls than one page holds: it follows
PagerDuty's ``offset``/``limit`` pagination (while ``more``) back to its cursor, stores each change once,
records a gap its readers see as ``truncated`` when the window holds more than it reads, and stops
paging when the rate limit's quota is spent.

In process against agentwake/fakes/pagerduty.py, with the harness of test_pagerduty_bridge.py.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from test_pagerduty_bridge import KEY, RESULT, InProcess, in_process

from agentwake.bridges import pagerduty
from agentwake.fakes.pagerduty import FakePagerDuty
from agentwake.mcp import _EventsRequest, _Params

pytestmark = pytest.mark.anyio


@pytest.fixture
async def pd() -> AsyncIterator[FakePagerDuty]:
    async with FakePagerDuty(api_key=KEY) as fake:
        yield fake


async def read_all(bridge: InProcess, name: str) -> tuple[list[dict[str, Any]], bool]:
    """Every logged event of ``name`` by events/poll from the start, and whether any read was truncated."""
    cursor, events, truncated = "0", [], False
    while True:
        params = _Params.model_validate({"name": name, "cursor": cursor})
        request = _EventsRequest(method="events/poll", params=params)
        result = await bridge.client.session.send_request(request, RESULT)  # type: ignore[type-var]
        events += result["events"]
        truncated |= bool(result.get("truncated"))
        cursor = result["cursor"]
        if not result.get("hasMore"):
            return events, truncated


def log_entry_offsets(pd: FakePagerDuty, since: int) -> list[int]:
    return [int(r.param("offset") or 0) for r in pd.requests[since:] if r.path == "/log_entries"]


async def test_250_changes_between_two_polls_are_all_stored_once_and_beyond_the_bound_a_gap_is_recorded(
    tmp_path: Path, pd: FakePagerDuty, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    grace = pd.add_user("Grace Hopper", "grace@example.com")
    earlier = datetime.now(UTC) - timedelta(minutes=10)
    incidents = [pd.trigger(f"Disk full on db-{n}", at=earlier) for n in range(500)]
    async with in_process(tmp_path, pd) as bridge:
        await bridge.bridge.poll_once()  # the baseline
        for incident in incidents[:250]:
            pd.acknowledge(incident["id"], grace)

        # 250 acknowledgements: three pages of log entries, read while PagerDuty says "more".
        asked = len(pd.requests)
        await bridge.bridge.poll_once()
        assert log_entry_offsets(pd, asked) == [0, 100, 200]
        events, truncated = await read_all(bridge, "incident.acknowledged")
        assert sorted(e["data"]["incidentId"] for e in events) == sorted(i["id"] for i in incidents[:250])
        assert len({e["eventId"] for e in events}) == 250 and not truncated
        # Read again (the next window overlaps this one): still once each.
        await bridge.bridge.poll_once()
        assert len((await read_all(bridge, "incident.acknowledged"))[0]) == 250
        head = bridge.head()

        # Beyond the bound (here 2 pages): what was read is stored, and the rest is a gap.
        monkeypatch.setattr(pagerduty, "MAX_PAGES", 2)
        for incident in incidents[250:]:
            pd.acknowledge(incident["id"], grace)
        asked = len(pd.requests)
        with caplog.at_level(logging.WARNING, logger="agentwake.bridge.pagerduty"):
            await bridge.bridge.poll_once()
        assert log_entry_offsets(pd, asked) == [0, 100]
        assert "recorded as a gap" in caplog.text
        assert bridge.head() == head + 200  # the 200 newest; the 50 oldest are lost
        log = bridge.server.log
        after = log.read("incident.acknowledged", head, 1000)
        assert after.truncated and len(after.events) == 200
        # A reader of the feed's other types is told too: what was lost may have been any of them.
        assert all(log.read(kind, head, 1000).truncated for kind in pagerduty.FEED_TYPES["log_entries"])
        # The cursor moved on: the next round asks from the new window, and finds no new gap.
        await bridge.bridge.poll_once()
        assert not log.read("incident.acknowledged", bridge.head(), 1000).truncated


async def test_a_spent_quota_stops_paging_and_holds_the_cursors(tmp_path: Path, pd: FakePagerDuty) -> None:
    grace = pd.add_user("Grace Hopper", "grace@example.com")
    earlier = datetime.now(UTC) - timedelta(minutes=10)
    incidents = [pd.trigger(f"Queue backlog {n}", at=earlier) for n in range(150)]
    async with in_process(tmp_path, pd) as bridge:
        await bridge.bridge.poll_once()
        log = bridge.server.log
        cursors = (log.get_state("log_entries:since"), log.get_state("incidents:since"))
        for incident in incidents:
            pd.acknowledge(incident["id"], grace)
        # The first page's answer says no request is left for 40 s: no second page is asked for.
        pd.rate_limit_remaining = 1
        asked = len(pd.requests)
        wait = await bridge.bridge.poll_once()
        assert log_entry_offsets(pd, asked) == [0]
        assert wait >= 1
        assert (log.get_state("log_entries:since"), log.get_state("incidents:since")) == cursors
        assert bridge.head() == 0
        # With the quota back, the next round reads the whole window: nothing lost, no gap.
        pd.rate_limit_remaining = 960
        await bridge.bridge.poll_once()
        events, truncated = await read_all(bridge, "incident.acknowledged")
        assert len(events) == 150 and not truncated
