"""The GitHub poller reads a changed feed back to the last item it saw, page after page, and records a gap
when the feed's history does not reach that far (issue 31, "Nothing lost, nothing twice").

The bridge runs in process (tests/test_github_bridge.py's ``in_process``) against agentwake/fakes/github.py,
which paginates as GitHub does (``per_page``, ``page``, a ``Link`` header with absolute URLs, the events
feed cut at its newest 300 events). Each test drives the poll rounds itself (``poll_repo``), so a round
happens exactly when the test says, with no sleep.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from test_github_bridge import TOKEN, InProcess, in_process

from agentwake.bridges.github import GitHubBridge, ReadBack, read_back
from agentwake.bridges.github_api import GitHubAPI, Page
from agentwake.fakes._http import serve
from agentwake.fakes.github import FakeGitHub

pytestmark = pytest.mark.anyio

REPO = "acme/x"


@pytest.fixture
async def github() -> AsyncIterator[FakeGitHub]:
    async with FakeGitHub(token=TOKEN) as fake:
        fake.add_repo(REPO)
        yield fake


async def read_all(bridge: InProcess, name: str, cursor: str) -> tuple[list[str], list[bool], str]:
    """Every event of ``name`` after ``cursor`` (as many polls as it takes), each poll's truncated, the cursor."""
    ids: list[str] = []
    truncated: list[bool] = []
    while True:
        result = await bridge.wire.poll(name, cursor)
        ids += [event["eventId"] for event in result["events"]]
        truncated.append(result["truncated"])
        cursor = result["cursor"]
        if not result["hasMore"]:
            return ids, truncated, cursor


def comment_ids(github: FakeGitHub, number: int) -> list[str]:
    return [f"issue_comment.created:{c['id']}" for c in github.comments(REPO, number)]


def gap_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "recorded as a gap" in r.getMessage()]


async def test_250_comments_and_120_failed_runs_between_two_polls_are_stored_once_each(
    tmp_path: Path, github: FakeGitHub, caplog: pytest.LogCaptureFixture
) -> None:
    issue = github.open_issue(REPO, title="A busy thread")
    github.fail_workflow_run(REPO, name="CI before the bridge")
    async with in_process(tmp_path, github, repos=(REPO,)) as bridge:
        bridge_: GitHubBridge = bridge.bridge
        await bridge_.poll_repo(REPO)  # the baseline
        start = bridge.head()
        for n in range(250):
            github.add_comment(REPO, issue["number"], body=f"comment {n}", user="hubot")
        runs = [github.fail_workflow_run(REPO, name=f"CI {n}") for n in range(120)]
        events_pages = len(github.calls("GET", f"/repos/{REPO}/events"))

        await bridge_.poll_repo(REPO)
        # 250 events at 100 a page, back to the IssuesEvent seen in round 1; 120 runs at 50 a page.
        assert len(github.calls("GET", f"/repos/{REPO}/events")) - events_pages == 3
        await bridge_.poll_repo(REPO)  # unchanged: one 304 per feed, nothing stored again

        comments, truncated, _ = await read_all(bridge, "issue_comment.created", str(start))
        assert comments == comment_ids(github, issue["number"])  # all 250, oldest first, once each
        assert not any(truncated)
        failed, truncated, _ = await read_all(bridge, "workflow_run.completed", str(start))
        assert failed == [f"workflow_run.completed:{run['id']}:1" for run in runs]
        assert not any(truncated)
        assert bridge.head() == start + 370
    assert gap_warnings(caplog) == []


async def test_a_feed_whose_history_does_not_reach_the_last_item_seen_records_one_gap(
    tmp_path: Path, github: FakeGitHub, caplog: pytest.LogCaptureFixture
) -> None:
    issue = github.open_issue(REPO, title="A busier thread")
    async with in_process(tmp_path, github, repos=(REPO,)) as bridge:
        await bridge.bridge.poll_repo(REPO)
        start = str(bridge.head())
        for n in range(350):
            github.add_comment(REPO, issue["number"], body=f"comment {n}", user="hubot")

        # GitHub's events feed stops at its newest 300: the 50 before them are lost.
        await bridge.bridge.poll_repo(REPO)
        comments, truncated, cursor = await read_all(bridge, "issue_comment.created", start)
        assert comments == comment_ids(github, issue["number"])[50:]
        assert truncated[0] is True and not any(truncated[1:])
        assert len(gap_warnings(caplog)) == 1
        # Only the types that feed carries: failed runs were not missed.
        runs, truncated, _ = await read_all(bridge, "workflow_run.completed", start)
        assert (runs, truncated) == ([], [False])

        # The reader was told once; the next change is news without a gap.
        later = github.add_comment(REPO, issue["number"], body="after the gap", user="hubot")
        await bridge.bridge.poll_repo(REPO)
        comments, truncated, _ = await read_all(bridge, "issue_comment.created", cursor)
        assert (comments, truncated) == ([f"issue_comment.created:{later['id']}"], [False])
        assert len(gap_warnings(caplog)) == 1


async def test_the_page_bound_stops_the_read_back_and_records_a_gap(
    tmp_path: Path, github: FakeGitHub, caplog: pytest.LogCaptureFixture
) -> None:
    issue = github.open_issue(REPO, title="A thread")
    async with in_process(tmp_path, github, repos=(REPO,), poll_max_pages=2) as bridge:
        await bridge.bridge.poll_repo(REPO)
        start = str(bridge.head())
        for n in range(250):
            github.add_comment(REPO, issue["number"], body=f"comment {n}", user="hubot")
        before = len(github.calls("GET", f"/repos/{REPO}/events"))
        await bridge.bridge.poll_repo(REPO)
        assert len(github.calls("GET", f"/repos/{REPO}/events")) - before == 2
        comments, truncated, _ = await read_all(bridge, "issue_comment.created", start)
        assert comments == comment_ids(github, issue["number"])[50:]
        assert truncated[0] is True
        assert len(gap_warnings(caplog)) == 1


async def test_the_read_back_keeps_the_rate_limits_reserve_and_finishes_on_a_later_poll(
    tmp_path: Path, github: FakeGitHub
) -> None:
    issue = github.open_issue(REPO, title="A thread")
    async with in_process(tmp_path, github, repos=(REPO,)) as bridge:
        await bridge.bridge.poll_repo(REPO)
        start = str(bridge.head())
        for n in range(150):
            github.add_comment(REPO, issue["number"], body=f"comment {n}", user="hubot")
        github.rate_limit_remaining = 20  # below the poller's reserve: no second page
        before = len(github.calls("GET", f"/repos/{REPO}/events"))
        await bridge.bridge.poll_repo(REPO)
        assert len(github.calls("GET", f"/repos/{REPO}/events")) - before == 1
        comments, truncated, cursor = await read_all(bridge, "issue_comment.created", start)
        assert len(comments) == 100 and not any(truncated)

        github.rate_limit_remaining = 5000  # the quota reset: the same feed is read again, to the end
        await bridge.bridge.poll_repo(REPO)
        rest, truncated, _ = await read_all(bridge, "issue_comment.created", cursor)
        assert sorted(comments + rest) == sorted(comment_ids(github, issue["number"]))
        assert not any(truncated)


def page(ids: list[int], *, more: bool = False, per_page: int = 3) -> Page:
    items: list[dict[str, Any]] = [{"id": str(i)} for i in ids]
    return Page(True, items, None, None, next_url="http://gh/next" if more else None, per_page=per_page)


def test_read_back_reaches_the_last_item_seen_or_says_why_not() -> None:
    assert read_back([page([9, 8, 7], more=True)], 7, 10) is ReadBack.REACHED
    assert read_back([page([9, 8, 7], more=True)], 5, 10) is ReadBack.MORE
    assert read_back([page([9, 8, 7], more=True), page([6, 5, 4])], 5, 10) is ReadBack.REACHED
    # The last item seen was deleted: an older one reaches past it.
    assert read_back([page([9, 8, 4], more=True)], 5, 10) is ReadBack.REACHED
    # The feed ends on a short page: it holds everything there is.
    assert read_back([page([9, 8, 7], more=True), page([6])], 5, 10) is ReadBack.REACHED
    # It ends on a full page (the events API's 300th event) or at the page bound: a gap.
    assert read_back([page([9, 8, 7], more=True), page([6, 5, 4])], 1, 10) is ReadBack.GAP
    assert read_back([page([9, 8, 7], more=True), page([6, 5, 4], more=True)], 1, 2) is ReadBack.GAP
    # The feed was empty when last seen (0): everything in it is new.
    assert read_back([page([2, 1])], 0, 10) is ReadBack.REACHED


async def test_next_page_follows_the_link_header_to_the_end_of_the_feed(github: FakeGitHub) -> None:
    for n in range(3):
        github.open_issue(REPO, title=f"issue {n}")
    async with GitHubAPI(base_url=github.url, token=TOKEN) as api:
        first = await api.repo_events(REPO, per_page=2)
        assert first.next_url is not None and first.next_url.startswith(github.url + "/repos/")
        second = await api.next_page(first)
        assert second is not None and second.next_url is None
        assert [e["id"] for e in first.items + second.items] == [e["id"] for e in github.events(REPO)]
        assert await api.next_page(second) is None


@pytest.mark.parametrize(
    "link",
    [
        "http://127.0.0.2:{port}/api/v3/repos/octo/x/events?page=2",  # another host
        "https://127.0.0.1:{port}/api/v3/repos/octo/x/events?page=2",  # another scheme
        "http://127.0.0.1:{port}/repos/octo/x/events?page=2",  # outside the base path
        "http://127.0.0.1:{port}/api/v30/repos/octo/x/events?page=2",  # a prefix of it is not it
    ],
)
async def test_a_next_link_off_the_base_url_is_not_followed(link: str) -> None:
    async def events(request: web.Request) -> web.Response:
        port = request.url.port
        return web.json_response([], headers={"Link": f'<{link.format(port=port)}>; rel="next"'})

    app = web.Application()
    app.router.add_get("/api/v3/repos/octo/x/events", events)
    runner = await serve(app, 0)
    try:
        port = runner.addresses[0][1]
        async with GitHubAPI(base_url=f"http://127.0.0.1:{port}/api/v3", token=TOKEN) as api:
            first = await api.repo_events("octo/x")
            assert first.next_url is None
            assert await api.next_page(first) is None
    finally:
        await runner.cleanup()
