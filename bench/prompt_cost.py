"""What prompt caching saves: the bundled GitHub triage rule, run after run, against fake providers.

    .venv/bin/python bench/prompt_cost.py              # 200 runs per series
    .venv/bin/python bench/prompt_cost.py --runs 20 --json

Each series runs ``--runs`` new-issue events through agentwake's real path: the bundled policy
(``policies/``) decides them (rule github-triage-issues), ``AgentRunner`` renders the prompts and
offers the rule's tools (from ``agentwake bridge github --fake`` over stdio, its tools called for
real), and litellm calls a fake provider over loopback HTTP. Each run is two LLM calls: the model
labels the issue, then answers. The providers are the fakes of ``tests/fake_anthropic.py``, which
cache as the real APIs document (a cache write on the first request, reads after; Anthropic only at
``cache_control`` breakpoints of 1024 tokens or more, OpenAI on any shared prefix of 1024 tokens or
more in 128-token steps) and report usage as those APIs do. Four series, each with a fresh cache:

- anthropic/claude-sonnet-4-5 with ``[agent] prompt_cache = "off"`` (no markers: nothing cached)
  and ``"auto"`` (the system prompt marked);
- openai/gpt-4.1 without caching (the fake's cache disabled: what the same requests cost where
  nothing is cached) and with OpenAI's automatic prefix caching (agentwake sends no markers).

The input cost of a run is priced from the usage the provider reported, at litellm's prices of the
model (full, cache-write and cache-read rates); the recorded cost is what agentwake stored for the
run (litellm's ``completion_cost``, output included). Tokens are the fakes' (a block's JSON
characters / 4), not a real tokenizer's.

The second table is the tokens of one request of each bundled rule that wakes the agent, split into
system prompt, tools (the rule's allowed tools as the servers describe them), rule prompt (the user
message without the event data) and event (the fenced event data), counted with litellm's
tokenizer for gpt-4.1 on a sample event: what a user looks at to trim a policy.

Target: with caching on, the input cost per run from the second run on is at least 50 % lower than
with it off, for both providers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import anyio
from _harness import BenchFailure, finish

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
# The fake providers live with the tests, not in the package.
sys.path.insert(0, str(REPO_ROOT / "tests"))

from fake_anthropic import FakeAnthropic, OpenAIPrefixCache  # noqa: E402
from fake_llm import FakeLLM, Reply, text, tool_calls  # noqa: E402

from agentwake.agent.fence import Fence  # noqa: E402
from agentwake.agent.llm import load_litellm  # noqa: E402
from agentwake.agent.prompts import PromptRenderer  # noqa: E402
from agentwake.agent.runner import AgentRunner  # noqa: E402
from agentwake.agent.tools import Allowlist, ConnectionPool  # noqa: E402
from agentwake.cli.common import NO_INGRESS_ENV  # noqa: E402
from agentwake.clock import utc_now  # noqa: E402
from agentwake.config import AgentwakeConfig, ServerConfig, parse_config  # noqa: E402
from agentwake.decide import decide  # noqa: E402
from agentwake.delivery.common import subscription_key  # noqa: E402
from agentwake.mcp import ServerConnection  # noqa: E402
from agentwake.policy import Policy  # noqa: E402
from agentwake.service import load_service_policy  # noqa: E402
from agentwake.store import IncomingEvent  # noqa: E402
from agentwake.store.sqlite import SqliteStore  # noqa: E402

DEFAULT_RUNS: Final = 200
TARGET_SAVING: Final = 0.5
RULE: Final = "github-triage-issues"
REPOSITORY: Final = "acme/demo"
ANTHROPIC_MODEL: Final = "anthropic/claude-sonnet-4-5"
OPENAI_MODEL: Final = "openai/gpt-4.1"
KEY_ENV: Final = "AGENTWAKE_BENCH_KEY"
AGENTWAKE_BIN: Final = str(Path(sys.executable).parent / "agentwake")


@dataclass
class Series:
    provider: str
    model: str
    caching: bool
    runs: int = 0
    input_tokens: list[int] = field(default_factory=list)  # per run, all of them
    cached_tokens: list[int] = field(default_factory=list)  # per run, read from the cache
    written_tokens: list[int] = field(default_factory=list)  # per run, written to the cache
    input_cost: list[float] = field(default_factory=list)  # per run, USD
    recorded_cost: list[float] = field(default_factory=list)  # per run, USD, as agentwake stored it

    def after_first(self, values: list[Any]) -> float:
        rest = values[1:] or values
        return sum(rest) / len(rest)


@dataclass
class Split:
    rule: str
    template: str
    system: int
    tools: int
    rule_prompt: int
    event: int

    @property
    def total(self) -> int:
        return self.system + self.tools + self.rule_prompt + self.event


@dataclass
class Figures:
    runs: int
    series: list[dict[str, Any]]
    saving_anthropic: float
    saving_openai: float
    within_target: bool
    per_event_tools: list[str]
    split: list[dict[str, Any]]


# ---- the servers ---------------------------------------------------------------------------------


def servers(state: Path) -> dict[str, ServerConfig]:
    quiet = {NO_INGRESS_ENV: "1"}
    bridge = [AGENTWAKE_BIN, "bridge"]
    return {
        "github": ServerConfig(
            command=bridge[0],
            args=[
                *bridge[1:],
                *("github", "--fake", "--state-dir", str(state / "github")),
                *("--allow-tool", "close_issue", "--allow-tool", "create_issue"),
            ],
            env=quiet,
        ),
        "slack": ServerConfig(
            command=bridge[0],
            args=[*bridge[1:], "slack", "--fake", "--state-dir", str(state / "slack")],
            env=quiet,
        ),
        "pagerduty": ServerConfig(
            command=bridge[0],
            args=[*bridge[1:], "pagerduty", "--fake", "--state-dir", str(state / "pagerduty")],
            env=quiet,
        ),
        "demo": ServerConfig(
            command=sys.executable,
            args=["-m", "examples.demo_server"],
            env={
                "DEMO_RATE": "0",
                "DEMO_ALERT_INTERVAL": "0",
                "DEMO_LOAD_INTERVAL": "0",
                "DEMO_DB": str(state / "demo.db"),
            },
            cwd=REPO_ROOT,
        ),
    }


def config(state: Path, model: str, api_base: str, prompt_cache: str) -> AgentwakeConfig:
    return parse_config(
        {
            "store": {"path": str(state / "aw.db")},
            "agent": {
                "model": model,
                "api_base": api_base,
                "api_key_env": KEY_ENV,
                "prompts": str(REPO_ROOT / "prompts"),
                "prompt_cache": prompt_cache,
                "max_tokens": 512,
            },
            "policy": {"dir": str(REPO_ROOT / "policies"), "default": "log"},
            "servers": {"github": servers(state)["github"].model_dump(exclude_defaults=True, mode="json")},
            "subscriptions": [
                {
                    "name": "github-issues",
                    "server": "github",
                    "event": "issues.opened",
                    "arguments": {"repository": REPOSITORY},
                }
            ],
        },
        env={},
    )


WORDS: Final = [
    "crash",
    "saving",
    "file",
    "export",
    "pdf",
    "timeout",
    "login",
    "redirect",
    "loop",
    "cache",
    "stale",
    "upload",
    "large",
    "memory",
    "leak",
    "dark",
    "mode",
    "settings",
    "sync",
    "offline",
    "search",
    "index",
    "slow",
    "startup",
]


def issue(number: int) -> dict[str, Any]:
    """A new issue as the GitHub bridge gives it, by a member: the rule github-triage-issues."""
    words = [WORDS[(number * 7 + i * 3) % len(WORDS)] for i in range(6)]
    return {
        "repository": REPOSITORY,
        "number": number,
        "title": f"{words[0].capitalize()} {words[1]} fails with {words[2]} after {words[3]}",
        "author": f"member{number % 13}",
        "authorAssociation": "MEMBER",
        "authorType": "User",
        "bodyExcerpt": (
            f"Steps: open the app, go to {words[4]}, press {words[5]}. Expected it to work; it failed with"
            f" error E{number:04d}. Version 2.{number % 9}.1 on Linux."
        ),
        "bodyTruncated": False,
        "labels": [],
        "url": f"https://github.com/{REPOSITORY}/issues/{number}",
    }


def replies(number: int) -> tuple[Reply, Reply]:
    """The model labels the issue, then answers."""
    return (
        tool_calls(("github__add_labels", {"repository": REPOSITORY, "number": number, "labels": ["bug"]})),
        text(
            f"Issue #{number}: a bug report with steps; labelled bug, no duplicate found, no comment needed."
        ),
    )


# ---- the runs ------------------------------------------------------------------------------------


def prices(model: str) -> tuple[float, float, float]:
    """litellm's (input, cache write, cache read) USD per token of the model."""
    info = load_litellm().get_model_info(model)
    full = float(info["input_cost_per_token"])
    write = float(info.get("cache_creation_input_token_cost") or full)
    read = float(info.get("cache_read_input_token_cost") or full)
    return full, write, read


async def run_series(series: Series, runs: int, state: Path, pool: ConnectionPool, policy: Policy) -> None:
    """``runs`` events through the rule, each run's usage added to ``series``."""
    full, write, read = prices(series.model)
    await anyio.Path(state).mkdir(parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        usages: list[dict[str, Any]]
        if series.provider == "anthropic":
            anthropic = await stack.enter_async_context(FakeAnthropic())
            api_base, script, usages = anthropic.url, anthropic.script, anthropic.usages
        else:
            openai = await stack.enter_async_context(FakeLLM())
            cache = OpenAIPrefixCache(enabled=series.caching)
            usages = []

            def usage_for(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
                usage = cache.usage(body, reply)
                usages.append(usage)
                return usage

            openai.usage_for = usage_for
            api_base, script = openai.url, openai.script
        cfg = config(state, series.model, api_base, "auto" if series.caching else "off")
        store = await SqliteStore.open(state / "aw.db")
        stack.push_async_callback(store.close)
        runner = AgentRunner.build(cfg, store, pool)
        key = subscription_key(cfg.subscriptions[0])
        await store.register(key)
        await store.ingest(
            key,
            [
                IncomingEvent(
                    f"issue-{n}", "issues.opened", f"2026-03-01T10:{n // 60 % 60:02d}:{n % 60:02d}Z", issue(n)
                )
                for n in range(1, runs + 1)
            ],
            "1",
        )
        for _ in range(runs):
            [event] = await store.claim(1)
            outcome = await decide(event, config=cfg, policy=policy, now=utc_now(), flow=None)
            if outcome.verdict != "run" or outcome.decision.rule != RULE:
                raise BenchFailure(
                    f"event {event.event_id} went to {outcome.decision.rule!r} ({outcome.verdict})"
                )
            script(*replies(int(event.data["number"])))
            seen = len(usages)
            result = await runner.run(outcome)
            if result.status != "completed":
                raise BenchFailure(f"run of {event.event_id} ended {result.status}: {result.reason}")
            mine = usages[seen:]
            if series.provider == "anthropic":
                total = sum(
                    u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
                    for u in mine
                )
                cached = sum(u["cache_read_input_tokens"] for u in mine)
                written = sum(u["cache_creation_input_tokens"] for u in mine)
            else:
                total = sum(u["prompt_tokens"] for u in mine)
                cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in mine)
                written = 0
            series.input_tokens.append(total)
            series.cached_tokens.append(cached)
            series.written_tokens.append(written)
            series.input_cost.append((total - cached - written) * full + written * write + cached * read)
            [stored] = store.core.find_events(event.event_id)[0]["runs"]
            if stored["cached_tokens"] != cached:
                raise BenchFailure(
                    f"run {result.run_id} recorded {stored['cached_tokens']} cached tokens, not {cached}"
                )
            series.recorded_cost.append(float(stored["cost_usd"] or 0.0))
            series.runs += 1


# ---- the split of one request, per rule ----------------------------------------------------------

SAMPLES: Final[dict[tuple[str, str], dict[str, Any]]] = {
    ("github", "issues.opened"): issue(42),
    ("github", "issue_comment.created"): {
        "repository": REPOSITORY,
        "number": 42,
        "commentId": 9001,
        "author": "member1",
        "authorAssociation": "MEMBER",
        "bodyExcerpt": "Does this also happen on 2.3? I see the same error after the upgrade.",
        "url": f"https://github.com/{REPOSITORY}/issues/42#issuecomment-9001",
    },
    ("github", "pull_request.opened"): {
        "repository": REPOSITORY,
        "number": 43,
        "title": "Fix export timeout on large files",
        "author": "member2",
        "authorAssociation": "MEMBER",
        "files": ["src/export.py", "tests/test_export.py"],
        "url": f"https://github.com/{REPOSITORY}/pull/43",
    },
    ("github", "check_run.completed"): {
        "repository": REPOSITORY,
        "name": "tests",
        "conclusion": "failure",
        "pullRequests": [43],
        "url": f"https://github.com/{REPOSITORY}/runs/1",
    },
    ("github", "dependabot_alert.created"): {
        "repository": REPOSITORY,
        "number": 5,
        "package": "requests",
        "severity": "high",
        "summary": "Proxy-Authorization header leaked on redirect",
    },
    ("pagerduty", "incident.triggered"): {
        "id": "Q1P1",
        "title": "API 5xx rate above 5%",
        "urgency": "high",
        "service": "api",
        "priority": "P1",
    },
    ("slack", "app_mention"): {
        "channel": "C123",
        "user": "U1",
        "text": "@agentwake is the export bug tracked anywhere?",
        "ts": "1760000000.000100",
    },
    ("demo", "ticket.created"): {
        "ticketId": "T-000042",
        "queue": "support",
        "priority": "P2",
        "title": "Printer on fire",
    },
    ("demo", "alert.fired"): {"alertId": "A-7", "severity": "P1", "title": "Disk full on db-1"},
}
FALLBACK_EVENT: Final = {
    "github": "issues.opened",
    "pagerduty": "incident.triggered",
    "slack": "app_mention",
    "demo": "ticket.created",
}
FENCED: Final = re.compile(
    r'<event-data boundary="[0-9a-f]+">\n.*?\n</event-data boundary="[0-9a-f]+">', re.DOTALL
)


def sample_for(server: str, event: str | None) -> tuple[str, dict[str, Any]]:
    name = event if event and "*" not in event else None
    if name is None or (server, name) not in SAMPLES:
        wanted = (event or "").replace("*", "")
        name = next((e for (s, e) in SAMPLES if s == server and wanted and e.startswith(wanted)), None)
        name = name or FALLBACK_EVENT.get(server, "issues.opened")
    return name, SAMPLES.get((server, name), issue(42))


def split_table(policy: Policy, pool: ConnectionPool, state: Path) -> list[Split]:
    litellm = load_litellm()
    model = OPENAI_MODEL.split("/", 1)[1]

    def tokens(text_: str) -> int:
        return int(litellm.token_counter(model=model, text=text_)) if text_ else 0

    agent = parse_config(
        {"agent": {"model": "agentwake/offline", "prompts": str(REPO_ROOT / "prompts")}}, env={}
    ).agent
    assert agent is not None
    renderer = PromptRenderer(agent)
    catalog = pool.catalog()
    found: list[Split] = []
    for loaded in policy.rules:
        rule = loaded.rule
        if rule.action not in ("agent", "approve"):
            continue
        server = rule.match.server or "demo"
        name, data = sample_for(server, rule.match.event)
        allowed = sorted(Allowlist(tuple(rule.tools or ())).select(catalog), key=lambda s: s.exposed)
        prompt = renderer.render(
            fence=Fence(),
            event={
                "event_id": "sample-1",
                "name": name,
                "timestamp": "2026-03-01T10:00:00Z",
                "subscription": f"{server}-sample",
                "data": renderer.clean(data).value,
            },
            subscription=None,
            server=server,
            tools=[s.exposed for s in allowed],
            template=rule.prompt,
        )
        fenced = "".join(FENCED.findall(prompt.user))
        found.append(
            Split(
                rule=rule.name,
                template=prompt.template,
                system=tokens(prompt.system),
                tools=tokens(json.dumps([s.to_llm() for s in allowed])),
                rule_prompt=tokens(FENCED.sub("", prompt.user)),
                event=tokens(fenced),
            )
        )
    return found


# ---- the bench -----------------------------------------------------------------------------------


async def measure_async(runs: int) -> Figures:
    os.environ[KEY_ENV] = "sk-bench"
    with tempfile.TemporaryDirectory(prefix="agentwake-prompt-cost-") as tmp:
        state = Path(tmp)
        async with contextlib.AsyncExitStack() as stack:
            pool = ConnectionPool()
            for name, server in servers(state).items():
                conn = await stack.enter_async_context(ServerConnection(name, server))
                await pool.attach(conn)
            policy = load_service_policy(config(state, OPENAI_MODEL, "http://127.0.0.1:9", "auto"))
            all_series = [
                Series("anthropic", ANTHROPIC_MODEL, caching=False),
                Series("anthropic", ANTHROPIC_MODEL, caching=True),
                Series("openai", OPENAI_MODEL, caching=False),
                Series("openai", OPENAI_MODEL, caching=True),
            ]
            for index, series in enumerate(all_series):
                await run_series(series, runs, state / f"series-{index}", pool, policy)
            plan_store = await SqliteStore.open(state / "plan.db")
            stack.push_async_callback(plan_store.close)
            varying = await tools_varying(plan_store, pool, policy, state)
            split = split_table(policy, pool, state)
    saving = {}
    for provider in ("anthropic", "openai"):
        off, on = (
            next(s for s in all_series if s.provider == provider and s.caching is c) for c in (False, True)
        )
        saving[provider] = 1 - on.after_first(on.input_cost) / off.after_first(off.input_cost)
    return Figures(
        runs=runs,
        series=[
            {
                "provider": s.provider,
                "model": s.model,
                "caching": s.caching,
                "runs": s.runs,
                "input_tokens_per_run": s.after_first(s.input_tokens),
                "cached_tokens_per_run": s.after_first(s.cached_tokens),
                "written_tokens_per_run": s.after_first(s.written_tokens),
                "first_run_input_usd": s.input_cost[0],
                "input_usd_per_run": s.after_first(s.input_cost),
                "recorded_usd_per_run": s.after_first(s.recorded_cost),
            }
            for s in all_series
        ],
        saving_anthropic=saving["anthropic"],
        saving_openai=saving["openai"],
        within_target=min(saving.values()) >= TARGET_SAVING,
        per_event_tools=sorted(varying),
        split=[{**vars(s), "total": s.total} for s in split],
    )


async def tools_varying(store: SqliteStore, pool: ConnectionPool, policy: Policy, state: Path) -> list[str]:
    """The rule's tools whose declaration (as offered to the model) differs between two events."""
    cfg = config(state, OPENAI_MODEL, "http://127.0.0.1:9", "off")
    runner = AgentRunner.build(cfg, store, pool)
    key = subscription_key(cfg.subscriptions[0])
    await store.register(key)
    await store.ingest(
        key,
        [IncomingEvent(f"plan-{n}", "issues.opened", "2026-03-01T10:00:00Z", issue(n)) for n in (1, 2)],
        "1",
    )
    declared: list[dict[str, str]] = []
    for _ in range(2):
        [event] = await store.claim(1)
        outcome = await decide(event, config=cfg, policy=policy, now=utc_now(), flow=None)
        plan = runner.prepare(outcome)
        declared.append({s.exposed: json.dumps(s.to_llm(), sort_keys=True) for s in plan.offered()})
    return sorted(name for name in declared[0] if declared[0][name] != declared[1].get(name))


def measure(runs: int) -> Figures:
    return anyio.run(measure_async, runs)


def report(figures: Figures) -> None:
    print(f"Prompt cost of rule {RULE}: {figures.runs} runs per series, 2 LLM calls per run (fake providers)")
    print(
        "(per run: the first run, then the mean of runs 2..N; tokens are the fakes', USD at litellm's prices)"
    )
    print()
    header = f"{'provider':<10} {'caching':<8} {'input tok':>10} {'cached':>8} {'written':>8} {'input $ run 1':>14} {'input $/run':>12} {'recorded $/run':>15}"
    print(header)
    print("-" * len(header))
    for s in figures.series:
        print(
            f"{s['provider']:<10} {'on' if s['caching'] else 'off':<8} {s['input_tokens_per_run']:>10.0f}"
            f" {s['cached_tokens_per_run']:>8.0f} {s['written_tokens_per_run']:>8.0f}"
            f" {s['first_run_input_usd']:>14.6f} {s['input_usd_per_run']:>12.6f} {s['recorded_usd_per_run']:>15.6f}"
        )
    print()
    verdict = "met" if figures.within_target else "NOT met"
    print(
        f"input cost per run from run 2 on, caching on vs off: anthropic -{figures.saving_anthropic:.0%},"
        f" openai -{figures.saving_openai:.0%} (target: -{TARGET_SAVING:.0%} for both: {verdict})"
    )
    if figures.per_event_tools:
        print(
            "tools whose declaration differs from event to event (the rule's args pin them to the event's"
            f" values, so the tools, the first part of the prefix, change every run): {', '.join(figures.per_event_tools)}"
        )
    print()
    print("Tokens of one request per bundled rule (gpt-4.1 tokenizer, sample event):")
    header = f"{'rule':<38} {'template':<34} {'system':>7} {'tools':>7} {'rule':>7} {'event':>7} {'total':>7}"
    print(header)
    print("-" * len(header))
    for row in figures.split:
        print(
            f"{row['rule']:<38} {row['template']:<34} {row['system']:>7} {row['tools']:>7}"
            f" {row['rule_prompt']:>7} {row['event']:>7} {row['total']:>7}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="runs per series (default 200)")
    parser.add_argument("--quick", action="store_true", help="3 runs per series: does it work")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()
    runs = 3 if args.quick else args.runs
    if runs < 2:
        parser.error("--runs must be at least 2 (the first run writes the cache)")
    return finish(lambda: measure(runs), as_json=args.json, report=report)


if __name__ == "__main__":
    sys.exit(main())
