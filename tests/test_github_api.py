"""The GitHub bridge's REST client against the fake GitHub on loopback: requests, errors, polling, secrecy."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from aiohttp import web
from conftest import free_port

from agentwake.bridges.github_api import API_VERSION, GitHubAPI, GitHubError, RateLimited
from agentwake.fakes.github import FakeGitHub

pytestmark = pytest.mark.anyio

REPO = "octo/hello-world"
TOKEN = "ghp_s3cretT0kenThatMustNeverLeak"


@pytest.fixture
async def gh() -> AsyncIterator[FakeGitHub]:
    async with FakeGitHub(token=TOKEN) as fake:
        fake.add_repo(REPO)
        yield fake


@pytest.fixture
async def api(gh: FakeGitHub) -> AsyncIterator[GitHubAPI]:
    async with GitHubAPI(base_url=gh.url, token=TOKEN, timeout_s=5) as client:
        yield client


def only_request(gh: FakeGitHub) -> Any:
    [request] = gh.requests
    return request


@pytest.fixture
async def plain_server() -> AsyncIterator[tuple[str, anyio.Event]]:
    """An HTTP server that is not GitHub: text bodies, and a path that never answers until released."""
    release = anyio.Event()

    async def html(request: web.Request) -> web.Response:
        return web.Response(text="<html>" + "hello " * 500 + "</html>", content_type="text/html")

    async def bad_gateway(request: web.Request) -> web.Response:
        return web.Response(status=502, text="<html>Bad Gateway</html>", content_type="text/html")

    async def stall(request: web.Request) -> web.Response:
        await release.wait()
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/repos/octo/html/issues/1", html)
    app.router.add_get("/repos/octo/gateway/issues/1", bad_gateway)
    app.router.add_get("/repos/octo/stall/issues/1", stall)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", release
    finally:
        release.set()
        await runner.cleanup()


# -- what goes out -----------------------------------------------------------------------------


async def test_every_request_carries_the_versioned_media_type_the_agent_and_the_token(
    gh: FakeGitHub, api: GitHubAPI
) -> None:
    issue = gh.open_issue(REPO, title="Crash on start", body="Traceback ...", labels=["bug"])

    fetched = await api.get_issue(REPO, issue["number"])

    assert fetched["title"] == "Crash on start"
    assert [label["name"] for label in fetched["labels"]] == ["bug"]
    request = only_request(gh)
    assert (request.method, request.path, request.json) == ("GET", f"/repos/{REPO}/issues/1", None)
    assert request.headers["Accept"] == "application/vnd.github+json"
    assert request.headers["X-GitHub-Api-Version"] == API_VERSION == "2022-11-28"
    assert request.headers["User-Agent"] == "agentwake-bridge"
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"


async def test_without_a_token_no_authorization_is_sent_and_the_user_agent_is_ours() -> None:
    async with FakeGitHub(token=None) as gh:
        gh.open_issue(REPO, title="t")
        async with GitHubAPI(base_url=gh.url, user_agent="my-bridge/1.0") as api:
            await api.get_issue(REPO, 1)
    request = only_request(gh)
    assert "Authorization" not in request.headers
    assert request.headers["User-Agent"] == "my-bridge/1.0"


async def test_the_tool_calls_send_githubs_methods_paths_and_bodies(gh: FakeGitHub, api: GitHubAPI) -> None:
    gh.open_issue(REPO, title="Crash on start")
    gh.open_issue(REPO, title="Fix the crash", user="alice", pull_request=True)

    labels = await api.add_labels(REPO, 1, ["bug", "p1"])
    remaining = await api.remove_label(REPO, 1, "p1")
    comment = await api.comment(REPO, 1, "Looking into it.")
    assigned = await api.assign(REPO, 1, ["bob"])
    requested = await api.request_reviewers(REPO, 2, ["bob"])
    with_teams = await api.request_reviewers(REPO, 2, ["carol"], ["core"])
    found = await api.search_issues("crash repo:octo/hello-world is:issue", per_page=5)
    closed = await api.close_issue(REPO, 1, reason="not_planned")

    sent = [(r.method, r.path, r.json) for r in gh.requests]
    assert sent == [
        ("POST", f"/repos/{REPO}/issues/1/labels", {"labels": ["bug", "p1"]}),
        ("DELETE", f"/repos/{REPO}/issues/1/labels/p1", None),
        ("POST", f"/repos/{REPO}/issues/1/comments", {"body": "Looking into it."}),
        ("POST", f"/repos/{REPO}/issues/1/assignees", {"assignees": ["bob"]}),
        ("POST", f"/repos/{REPO}/pulls/2/requested_reviewers", {"reviewers": ["bob"]}),
        (
            "POST",
            f"/repos/{REPO}/pulls/2/requested_reviewers",
            {"reviewers": ["carol"], "team_reviewers": ["core"]},
        ),
        ("GET", "/search/issues", None),
        ("PATCH", f"/repos/{REPO}/issues/1", {"state": "closed", "state_reason": "not_planned"}),
    ]
    assert gh.calls("GET", "/search/")[0].query == {
        "q": "crash repo:octo/hello-world is:issue",
        "per_page": "5",
    }
    assert [label["name"] for label in labels] == ["bug", "p1"]
    assert [label["name"] for label in remaining] == ["bug"]
    assert comment["body"] == "Looking into it." and gh.comments(REPO, 1)[0]["id"] == comment["id"]
    assert [a["login"] for a in assigned["assignees"]] == ["bob"]
    assert [r["login"] for r in requested["requested_reviewers"]] == ["bob"]
    assert [t["slug"] for t in with_teams["requested_teams"]] == ["core"]
    assert found["total_count"] == 1 and found["items"][0]["number"] == 1
    assert (closed["state"], closed["state_reason"]) == ("closed", "not_planned")
    assert gh.issue(REPO, 1)["state"] == "closed"


@pytest.mark.parametrize(
    ("label", "segment"),
    [
        ("needs triage", "needs%20triage"),
        ("area/api", "area%2Fapi"),
        ("#1?x=y&z", "%231%3Fx%3Dy%26z"),
        ("..", "%2E%2E"),
        ("ünïcode", "%C3%BCn%C3%AFcode"),
    ],
)
async def test_a_label_name_goes_out_as_one_quoted_path_segment(
    gh: FakeGitHub, api: GitHubAPI, label: str, segment: str
) -> None:
    gh.open_issue(REPO, title="t", labels=[label, "keep"])

    remaining = await api.remove_label(REPO, 1, label)

    assert only_request(gh).path == f"/repos/{REPO}/issues/1/labels/{segment}"
    assert [x["name"] for x in remaining] == ["keep"]


async def test_a_base_url_with_a_path_prefix_is_kept() -> None:
    async with FakeGitHub(token=TOKEN, path_prefix="/api/v3") as enterprise:
        enterprise.open_issue(REPO, title="On GHE")
        for base in (enterprise.url, enterprise.url + "/"):
            async with GitHubAPI(base_url=base, token=TOKEN) as api:
                assert (await api.get_issue(REPO, 1))["title"] == "On GHE"
        assert [r.path for r in enterprise.requests] == [f"/api/v3/repos/{REPO}/issues/1"] * 2


# -- input validation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "repo",
    [
        "octo",
        "octo/",
        "/repo",
        "octo/repo/extra",
        "octo//repo",
        "octo/..",
        "../repo",
        "octo/.",
        "oc to/repo",
        "octo/re?po",
        "octo/re#po",
        "octo/re%2Fpo",
        "",
        "a" * 40 + "/repo",
    ],
)
async def test_a_repository_that_is_not_owner_slash_name_is_refused_before_sending(
    gh: FakeGitHub, api: GitHubAPI, repo: str
) -> None:
    with pytest.raises(ValueError, match="owner/name"):
        await api.get_issue(repo, 1)
    with pytest.raises(ValueError, match="owner/name"):
        await api.repo_events(repo)
    assert gh.requests == []


async def test_other_bad_inputs_are_refused_before_sending(gh: FakeGitHub, api: GitHubAPI) -> None:
    for number in (0, -1, True, "1", 1.0):
        with pytest.raises(ValueError, match="positive integer"):
            await api.get_issue(REPO, number)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="list of non-empty strings"):
        await api.add_labels(REPO, 1, "bug")
    with pytest.raises(ValueError, match="list of non-empty strings"):
        await api.assign(REPO, 1, [""])
    with pytest.raises(ValueError, match="non-empty string"):
        await api.remove_label(REPO, 1, "")
    with pytest.raises(ValueError, match="close reason"):
        await api.close_issue(REPO, 1, reason="wontfix")
    with pytest.raises(ValueError, match="per_page"):
        await api.search_issues("x", per_page=101)
    with pytest.raises(ValueError, match="query"):
        await api.search_issues("  ")
    assert gh.requests == []
    with pytest.raises(ValueError, match="http"):
        GitHubAPI(base_url="ftp://example.com")
    with pytest.raises(ValueError, match="credentials"):
        GitHubAPI(base_url="https://user:pw@example.com")


# -- errors ------------------------------------------------------------------------------------


async def test_not_found_and_validation_failures_carry_githubs_message(
    gh: FakeGitHub, api: GitHubAPI
) -> None:
    gh.open_issue(REPO, title="t")

    with pytest.raises(GitHubError) as missing:
        await api.add_labels(REPO, 99, ["bug"])
    assert (missing.value.status, missing.value.method) == (404, "POST")
    assert missing.value.path == f"/repos/{REPO}/issues/99/labels"
    assert missing.value.message == "Not Found"
    assert str(missing.value) == f"GitHub API: POST /repos/{REPO}/issues/99/labels: 404 Not Found: Not Found"
    assert not isinstance(missing.value, RateLimited)

    with pytest.raises(GitHubError) as unknown_repo:
        await api.get_issue("octo/nowhere", 1)
    assert unknown_repo.value.status == 404

    with pytest.raises(GitHubError) as invalid:
        await api.add_labels(REPO, 1, [])
    assert invalid.value.status == 422
    assert "No subschema" in invalid.value.message
    assert "422 Unprocessable" in str(invalid.value)

    with pytest.raises(GitHubError) as absent:
        await api.remove_label(REPO, 1, "never added")
    assert (absent.value.status, absent.value.message) == (404, "Label does not exist")

    with pytest.raises(GitHubError) as empty_comment:
        await api.comment(REPO, 1, "")
    assert empty_comment.value.status == 422 and "missing_field" in empty_comment.value.message


async def test_a_long_upstream_message_is_bounded(gh: FakeGitHub, api: GitHubAPI) -> None:
    gh.fail_next(500, message="boom\n" + "x" * 10_000)

    with pytest.raises(GitHubError) as failed:
        await api.search_issues("x")

    assert failed.value.status == 500
    assert len(failed.value.message) < 400 and "\n" not in failed.value.message
    assert len(str(failed.value)) < 500


async def test_a_redirect_is_not_followed(gh: FakeGitHub, api: GitHubAPI) -> None:
    gh.fail_next(301, message="Moved Permanently", headers={"Location": f"{gh.url}/repositories/1/issues/1"})

    with pytest.raises(GitHubError) as moved:
        await api.get_issue(REPO, 1)

    assert moved.value.status == 301
    assert len(gh.requests) == 1


async def test_the_primary_rate_limit_retries_at_its_reset(gh: FakeGitHub, api: GitHubAPI) -> None:
    gh.open_issue(REPO, title="t")
    await api.get_issue(REPO, 1)
    assert api.rate_limit.limit == 5000 and api.rate_limit.remaining == 4999
    assert api.rate_limit.reset_at == gh.rate_limit_reset and api.rate_limit.resource == "core"

    gh.rate_limit_remaining = 0
    with pytest.raises(RateLimited) as limited:
        await api.get_issue(REPO, 1)

    assert limited.value.status == 403
    assert limited.value.retry_at == gh.rate_limit_reset
    assert "rate limit exceeded" in limited.value.message
    assert api.rate_limit.remaining == 0


async def test_retry_after_sets_when_to_retry(gh: FakeGitHub, api: GitHubAPI) -> None:
    before = time.time()
    gh.fail_next(429, message="Too many requests", headers={"Retry-After": "30"})
    gh.fail_next(403, message="You have exceeded a secondary rate limit.", headers={"Retry-After": "120"})
    gh.fail_next(403, message="You have exceeded a secondary rate limit.")
    gh.fail_next(403, message="Resource not accessible by integration")

    with pytest.raises(RateLimited) as too_many:
        await api.search_issues("x")
    with pytest.raises(RateLimited) as secondary:
        await api.search_issues("x")
    with pytest.raises(RateLimited) as unspecified:
        await api.search_issues("x")
    with pytest.raises(GitHubError) as forbidden:
        await api.search_issues("x")

    after = time.time()
    assert before + 30 <= too_many.value.retry_at <= after + 30
    assert too_many.value.status == 429
    assert before + 120 <= secondary.value.retry_at <= after + 120
    assert before + 60 <= unspecified.value.retry_at <= after + 60
    assert not isinstance(forbidden.value, RateLimited) and forbidden.value.status == 403


async def test_bad_credentials_are_a_401(gh: FakeGitHub) -> None:
    async with GitHubAPI(base_url=gh.url, token="wrong-token") as api:
        with pytest.raises(GitHubError) as refused:
            await api.get_issue(REPO, 1)
    assert (refused.value.status, refused.value.message) == (401, "Bad credentials")


async def test_a_refused_connection_is_status_zero() -> None:
    async with GitHubAPI(base_url=f"http://127.0.0.1:{free_port()}", token=TOKEN) as api:
        with pytest.raises(GitHubError) as refused:
            await api.get_issue(REPO, 1)
    assert refused.value.status == 0
    assert refused.value.method == "GET" and refused.value.path == f"/repos/{REPO}/issues/1"
    assert "ConnectError" in str(refused.value) and "no response" in str(refused.value)
    assert refused.value.__cause__ is None and refused.value.__suppress_context__


async def test_a_timeout_is_status_zero(plain_server: tuple[str, anyio.Event]) -> None:
    url, _ = plain_server
    async with GitHubAPI(base_url=url, token=TOKEN, timeout_s=0.2) as api:
        with pytest.raises(GitHubError) as slow:
            await api.get_issue("octo/stall", 1)
    assert slow.value.status == 0 and "timed out" in str(slow.value)


async def test_a_body_that_is_not_json_is_an_error(plain_server: tuple[str, anyio.Event]) -> None:
    url, _ = plain_server
    async with GitHubAPI(base_url=url) as api:
        with pytest.raises(GitHubError) as html:
            await api.get_issue("octo/html", 1)
        with pytest.raises(GitHubError) as gateway:
            await api.get_issue("octo/gateway", 1)
    assert html.value.status == 200 and "not JSON" in html.value.message
    assert len(str(html.value)) < 400
    assert gateway.value.status == 502 and "Bad Gateway" in gateway.value.message


async def test_the_token_appears_in_no_error_and_no_repr(gh: FakeGitHub, api: GitHubAPI) -> None:
    gh.open_issue(REPO, title="t")
    errors: list[BaseException] = []
    with pytest.raises(GitHubError) as missing:
        await api.get_issue(REPO, 404)
    errors.append(missing.value)
    with pytest.raises(GitHubError) as invalid:
        await api.add_labels(REPO, 1, [])
    errors.append(invalid.value)
    gh.fail_next(500, message="boom")
    with pytest.raises(GitHubError) as failed:
        await api.search_issues("x")
    errors.append(failed.value)
    gh.rate_limit_remaining = 0
    with pytest.raises(RateLimited) as limited:
        await api.repo_events(REPO)
    errors.append(limited.value)
    async with GitHubAPI(base_url=f"http://127.0.0.1:{free_port()}", token=TOKEN) as unreachable:
        with pytest.raises(GitHubError) as refused:
            await unreachable.get_issue(REPO, 1)
        errors.append(refused.value)
        assert TOKEN not in repr(unreachable) and TOKEN not in str(unreachable)

    for error in errors:
        assert TOKEN not in str(error) and TOKEN not in repr(error)
        assert TOKEN not in repr(vars(error))
    assert TOKEN not in repr(api) and "with a token" in repr(api)
    with pytest.raises(ValueError, match="printable") as bad:
        GitHubAPI(token="tok\nen " + TOKEN)
    assert TOKEN not in str(bad.value)


# -- polling -----------------------------------------------------------------------------------


async def test_the_events_feed_is_a_conditional_get(gh: FakeGitHub, api: GitHubAPI) -> None:
    gh.poll_interval_s = 90
    gh.open_issue(REPO, title="Crash on start")
    gh.add_comment(REPO, 1, body="Me too")

    first = await api.repo_events(REPO)
    assert first.changed and first.etag and first.etag.startswith('"')
    assert [e["type"] for e in first.items] == ["IssueCommentEvent", "IssuesEvent"]
    assert first.items[1]["payload"]["issue"]["title"] == "Crash on start"
    assert first.poll_interval_s == 90
    assert gh.requests[0].query == {"per_page": "100"}
    assert "If-None-Match" not in gh.requests[0].headers

    remaining = api.rate_limit.remaining
    again = await api.repo_events(REPO, etag=first.etag)
    assert (again.changed, again.items, again.etag, again.poll_interval_s) == (False, [], first.etag, 90)
    assert gh.requests[1].headers["If-None-Match"] == first.etag
    assert api.rate_limit.remaining == remaining  # a 304 costs nothing

    gh.add_comment(REPO, 1, body="And me")
    changed = await api.repo_events(REPO, etag=first.etag)
    assert changed.changed and changed.etag != first.etag
    assert changed.items[0]["payload"]["comment"]["body"] == "And me"


async def test_the_issues_list_is_a_conditional_get_with_since(gh: FakeGitHub, api: GitHubAPI) -> None:
    gh.open_issue(REPO, title="An issue")
    gh.open_issue(REPO, title="A pull request", pull_request=True)

    page = await api.repo_issues(REPO, since="2020-01-01T00:00:00Z", per_page=20)

    assert gh.requests[0].query == {
        "state": "all",
        "sort": "created",
        "direction": "desc",
        "per_page": "20",
        "since": "2020-01-01T00:00:00Z",
    }
    assert [i["number"] for i in page.items] == [2, 1]
    assert "pull_request" in page.items[0] and "pull_request" not in page.items[1]
    assert page.poll_interval_s is None
    assert not (await api.repo_issues(REPO, etag=page.etag, since="2020-01-01T00:00:00Z")).changed
    assert (await api.repo_issues(REPO, since="2999-01-01T00:00:00Z")).items == []


async def test_workflow_runs_are_the_completed_runs(gh: FakeGitHub, api: GitHubAPI) -> None:
    gh.add_workflow_run(REPO, status="in_progress")
    failed = gh.fail_workflow_run(REPO, name="CI", head_branch="main")

    page = await api.workflow_runs(REPO)

    assert gh.requests[0].path == f"/repos/{REPO}/actions/runs"
    assert gh.requests[0].query == {"status": "completed", "per_page": "50"}
    assert [(r["id"], r["conclusion"]) for r in page.items] == [(failed["id"], "failure")]
    assert not (await api.workflow_runs(REPO, etag=page.etag)).changed
    assert gh.requests[1].headers["If-None-Match"] == page.etag


# -- the fake itself ---------------------------------------------------------------------------


async def test_wait_for_returns_a_request_that_came_or_the_next_one(gh: FakeGitHub, api: GitHubAPI) -> None:
    gh.open_issue(REPO, title="t")
    await api.comment(REPO, 1, "first")
    assert (await gh.wait_for("POST", f"/repos/{REPO}/issues/1/comments")).json == {"body": "first"}

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(api.comment, REPO, 1, "second")
        second = await gh.wait_for("POST", f"/repos/{REPO}/issues/1/comments", count=2)
    assert second.json == {"body": "second"}

    with pytest.raises(TimeoutError, match="no POST"):
        await gh.wait_for("POST", f"/repos/{REPO}/issues/1/labels", timeout=0.05)
