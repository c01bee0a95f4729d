"""The fault suite: SIGKILL of `agentwake run` at five points in each delivery mode, and an MCP
server killed mid-stream. Ground truth comes from outside agentwake: the demo server's own ticket
store (which events exist; a ticket's sequence is its cursor), the sender's log of the deliveries
it saw answered 2xx (webhook), and the tools server's record of every call it received
(tests/journal_tools_server.py, which writes each call down before it answers).

The matrix; each row a parametrized case ``MODE-POINT``:

==================  ====  ====  =======  ===============================================================
point               poll  push  webhook  how the kill lands there
==================  ====  ====  =======  ===============================================================
after_inbox_commit  yes   yes   yes      ``AGENTWAKE_CRASH_AT`` (agentwake/faults.py) fires right after
                                         the ingest that stored the event committed: before the agent
                                         saw it and (webhook) before the 2xx
mid_cursor_write    yes   yes   yes      the same, inside that transaction: the event inserted, the
                                         cursor not written, the transaction open
webhook_accept      --    --    yes      the same, in the receiver: body read and verified, neither
                                         committed nor answered (poll and push accept nothing)
mid_llm             yes   yes   yes      the fake LLM holds the event's second call (its tool call
                                         made, its result back) and never answers
tool_send           yes   yes   yes      the tools server writes the event's call down and never
                                         answers
==================  ====  ====  =======  ===============================================================

Plus ``poll-mcp_server_killed`` and ``push-mcp_server_killed``: the demo server (a stdio child of
agentwake) SIGKILLed while tickets arrive; agentwake starts it again and resumes from the stored
cursor, with no gap (tickets are a durable type) and none missing or stored twice.

Checked after each kill, on the store as the kill left it: every ticket at or before the stored
cursor is in the inbox, and (webhook) every delivery the sender saw answered 2xx; and that the
point was hit (the event stored but not run; not stored and the cursor not moved; the run open with
its call settled; the call journaled 'sent'). After the restart drained: every ticket is in the
inbox once and finished; no event has two completed runs, or two runs that each sent a tool call;
the tools server received at most one call per event, as many as the journal says went out (one
idempotency key each: a rerun's journal lists a predecessor's unanswered call again, under that
run's key). The call of unknown outcome is not sent again: its event is 'dead' for a person.

Budget. litellm takes ~5 s of CPU to import, and each `agentwake run` imports it, so the kills
share processes. Per mode, one chain of processes; each first drains what the previous kill left
(the restart of that case), then opens tickets one at a time and is killed:

- poll, push: [mid_llm + tool_send + after_inbox_commit] [mid_cursor_write] [drain, server killed, drain, SIGTERM]
- webhook:    [mid_llm + tool_send + webhook_accept] [after_inbox_commit] [mid_cursor_write] [drain, SIGTERM]

A bracket is one process and one SIGKILL: with two runs at a time, one event is held mid-LLM,
another's call is blocked at the tools server, then a third ticket arrives and the store (or
receiver) kills the process on it. Tickets arrive one at a time, so the N of
``AGENTWAKE_CRASH_AT=POINT:N`` is known (the hook counts ingests that store new events, and every
delivery for webhook_accept); webhook_accept is first in its chain because it counts duplicate
deliveries too, and a fresh chain has none in flight. The three chains run concurrently in one
module-scoped fixture; the cases read its outcome.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import anyio
import anyio.abc
import pytest
import trustme
from _faults import (
    TERMINAL,
    TOOLS_READY,
    GatedProxy,
    Script,
    Snapshot,
    Tickets,
    WebhookDemo,
    children,
    cmdline,
    command_lines,
    reap,
    run_invariants,
    sent_calls,
    seq_of,
    snapshot,
    start_webhook_demo,
    ticket_id,
    until,
)
from _support import RunningService, agentwake_run, demo_server_toml
from conftest import REPO, free_port
from fake_llm import FakeLLM

from agentwake.config import load_config
from agentwake.delivery.common import subscription_key
from agentwake.store.sqlite import SqliteCore

# The cases wait for one fixture that runs every chain (about a minute on an idle 2-core machine);
# the default 120 s per test is too tight only on a much busier one.
pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(300)]

MODES: Final = ("poll", "push", "webhook")
AGENT_POINTS: Final = ("mid_llm", "tool_send")
# One process per entry, killed at its point (with the agent points too in the first one).
CHAINS: Final = {
    "poll": ("after_inbox_commit", "mid_cursor_write"),
    "push": ("after_inbox_commit", "mid_cursor_write"),
    "webhook": ("webhook_accept", "after_inbox_commit", "mid_cursor_write"),
}
CASES: Final = [(mode, point) for mode in MODES for point in (*AGENT_POINTS, *CHAINS[mode])]
SUBSCRIPTION: Final = "tickets"
TOKEN: Final = "fault-suite-token"
KEY: Final = {"FAKE_LLM_KEY": "sk-test"}
# Runs the script in argv[2] once the FIFO in argv[1] has a writer.
GATED_SERVER: Final = (
    "import runpy, sys; open(sys.argv[1]).close(); sys.argv = sys.argv[2:];"
    " runpy.run_path(sys.argv[0], run_name='__main__')"
)
# A restart imports litellm (seconds of CPU) while the other chains may do the same.
DRAIN_TIMEOUT_S: Final = 90.0


@dataclass
class Kill:
    """One point of one SIGKILL, and what the kill and the restart after it left behind."""

    point: str
    target: str  # the ticket the point was aimed at
    started_at: float  # when the killed process started (time.time())
    returncode: int | None = None
    after: Snapshot | None = None  # the store as the kill left it
    calls_after: dict[str, int] = field(default_factory=dict)
    head: int = 0  # the demo's last ticket at the kill
    restarted_at: float = 0.0
    drained: Snapshot | None = None  # the store once the next process had drained it
    calls_drained: dict[str, int] = field(default_factory=dict)
    restart_log: list[str] = field(default_factory=list)


@dataclass
class ServerKill:
    """The demo server killed under the last process of a poll or push chain."""

    pids: tuple[int, int] = (0, 0)  # the killed server, the one started again
    cursor_at_kill: str | None = None
    opened: list[str] = field(default_factory=list)  # tickets opened around the kill
    lines_after_kill: list[str] = field(default_factory=list)
    drained: Snapshot | None = None


@dataclass
class Chain:
    mode: str
    kills: dict[str, Kill] = field(default_factory=dict)
    server_kill: ServerKill | None = None
    final: Snapshot | None = None
    calls: dict[str, int] = field(default_factory=dict)
    tickets: list[str] = field(default_factory=list)
    acks: list[tuple[float, str]] = field(default_factory=list)  # webhook: (time, eventId) per 2xx
    stopped: int | None = None  # the last process's exit code after SIGTERM
    without_tool: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)  # stdio servers that outlived their agentwake
    error: str | None = None
    seconds: float = 0.0

    def acked_by(self, kill: Kill) -> set[str]:
        """Deliveries the sender saw answered 2xx by the killed process (before the next one started)."""
        end = kill.restarted_at or float("inf")
        return {event for at, event in self.acks if kill.started_at <= at < end}

    def broken(self, what: str) -> str:
        return f"the {self.mode} chain broke before {what}:\n{self.error}"


@dataclass
class Rig:
    """One chain's files: the config, the store, the tools server's calls and block files, the demo's tickets."""

    tmp: Path
    mode: str
    tickets: Tickets
    # Webhook: agentwake reaches the demo server through this, once its tools server is listed.
    proxy: GatedProxy | None = None
    config: Path = field(init=False)
    store: Path = field(init=False)
    calls: Path = field(init=False)
    block: Path = field(init=False)

    def __post_init__(self) -> None:
        self.config = self.tmp / "agentwake.toml"
        self.store = self.tmp / "aw.db"
        self.calls = self.tmp / "calls.jsonl"
        self.block = self.tmp / "block"

    def write(self, llm_url: str, servers: str, *, gate: Path | None = None) -> None:
        """The config, and cursor "0" in the store. With ``gate`` (a FIFO) the tools server starts only
        once the test opens it for writing."""
        server = str(REPO / "tests" / "journal_tools_server.py")
        notes = [server] if gate is None else ["-c", GATED_SERVER, str(gate), server]
        # Two runs at a time: one held mid-LLM, one blocked at the tools server.
        self.config.write_text(
            f"""
[store]
path = "aw.db"

[log]
level = "INFO"

[policy]
dir = "no-policies"

[agent]
model = "openai/fake"
api_base = "{llm_url}"
api_key_env = "FAKE_LLM_KEY"
attempt_backoff_s = 0
llm_retries = 0
concurrency = 2
timeout_s = 120
prompts = "{REPO / "prompts"}"

{servers}
[servers.notes]
command = "{sys.executable}"
args = {json.dumps(notes)}
env = {{ CALLS_FILE = "{self.calls}", BLOCK_FILE = "{self.block}" }}

[[subscriptions]]
name = "{SUBSCRIPTION}"
server = "demo"
event = "ticket.created"
delivery = "{self.mode}"
poll_floor_ms = 100
tools = ["notes__post_note"]
"""
        )
        # Cursor "0", as an earlier run would have left it: every ticket is delivered (a null
        # cursor would start at the head).
        config = load_config(self.config)
        store = SqliteCore.open(config.store.path)
        try:
            key = subscription_key(config.subscriptions[0])
            store.register(key)
            store.ingest(key, [], "0")
        finally:
            store.close()

    def snapshot(self) -> Snapshot:
        return snapshot(self.store)

    def sent(self) -> dict[str, int]:
        return sent_calls(self.calls)

    def stored(self, ticket: str) -> bool:
        return ticket in self.snapshot().events


async def drained(service: RunningService, rig: Rig, cursor_at_head: bool) -> Snapshot:
    """Wait until every ticket the demo has is in the inbox and finished (and, for poll and push,
    the cursor is at the demo's head); the store then."""
    found: list[Snapshot] = []

    def done() -> bool:
        if service.process.returncode is not None:
            raise AssertionError(f"agentwake exited ({service.process.returncode}):\n{service.log()}")
        snap = rig.snapshot()
        ids = rig.tickets.ids()
        if any(snap.state(t) not in TERMINAL for t in ids):
            return False
        if cursor_at_head and snap.cursors.get(SUBSCRIPTION) != str(rig.tickets.head()):
            return False
        found.append(snap)
        return True

    try:
        await until(done, "every ticket stored and finished", DRAIN_TIMEOUT_S)
    except AssertionError as exc:
        snap = rig.snapshot()
        states = {t: snap.state(t) for t in rig.tickets.ids()}
        raise AssertionError(f"{exc}; states {states}, cursors {snap.cursors}\n{service.log()}") from None
    return found[-1]


# ---- the chains ---------------------------------------------------------------------------------


async def webhook_demo(tg: anyio.abc.TaskGroup, rig: Rig) -> tuple[WebhookDemo, str]:
    """The demo server over HTTP delivering by webhook; and agentwake's [servers.demo] and [webhook].

    agentwake reaches it through a gated proxy, opened once the tools server is listed, so that the
    events a restart finds are claimed with every server up (the worker waits for the servers of a
    run's tools, tested below; the gate keeps these cases about their own kill point).
    """
    ca = trustme.CA()
    cert, ca_file = rig.tmp / "receiver.pem", rig.tmp / "ca.pem"
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(cert))
    ca.cert_pem.write_to_path(str(ca_file))
    demo = await start_webhook_demo(
        tg,
        rig.tickets.db,
        DEMO_TOKEN=TOKEN,
        DEMO_WEBHOOK_TTL_MS="60000",
        DEMO_WEBHOOK_MIN_TTL_MS="500",
        DEMO_WEBHOOK_ALLOW="127.0.0.0/8",
        DEMO_WEBHOOK_CA=str(ca_file),
        DEMO_WEBHOOK_RETRY_S="0.1",
        DEMO_NEXT_POLL_MS="100",
    )
    rig.proxy = GatedProxy(demo.port)
    await tg.start(rig.proxy.serve)
    port = free_port()  # the same across restarts: the sender keeps the callback URL
    toml = f"""
[servers.demo]
url = "{rig.proxy.url}"
headers = {{ Authorization = "Bearer {TOKEN}" }}
connect_timeout_s = 10

[webhook]
listen = "127.0.0.1:{port}"
public_url = "https://127.0.0.1:{port}/hooks"
tls_cert = "{cert}"
tls_key = "{cert}"
ttl_ms = 60000
"""
    return demo, toml


async def run_chain(mode: str, tmp: Path) -> Chain:
    """Every kill of one mode, then a last process that drains and stops; never raises."""
    chain = Chain(mode)
    began = time.monotonic()
    rig = Rig(tmp, mode, Tickets(tmp / "demo.db"))
    rig.tickets.open()  # T-000001, there before the first start
    demo: WebhookDemo | None = None
    try:
        async with FakeLLM() as fake, anyio.create_task_group() as tg:
            try:
                if mode == "webhook":
                    demo, servers = await webhook_demo(tg, rig)
                else:
                    servers = demo_server_toml(rig.tickets.db, DEMO_NEXT_POLL_MS="100")
                rig.write(fake.url, servers)
                script = Script(rig.block)
                fake.responder = script
                previous: list[Kill] = []
                for index, point in enumerate(CHAINS[mode]):
                    agent_points = AGENT_POINTS if index == 0 else ()
                    previous = await kill_at(point, agent_points, rig, script, previous, chain)
                await last_process(rig, previous, chain)
                chain.without_tool = script.without_tool
            finally:
                if demo is not None:
                    demo.process.kill()
                    with anyio.CancelScope(shield=True):
                        await demo.process.wait()
                        await demo.process.aclose()
                    chain.acks = list(demo.acks)
                tg.cancel_scope.cancel()
    except Exception:
        chain.error = traceback.format_exc()
    chain.seconds = time.monotonic() - began
    return chain


async def restarted(service: RunningService, rig: Rig, previous: list[Kill], started_at: float) -> None:
    """The restart after ``previous``: wait for the tools server, drain, record what it left."""
    for kill in previous:
        kill.restarted_at = started_at
    await service.wait_for(TOOLS_READY)
    if rig.proxy is not None:
        rig.proxy.open_gate()
    # Webhook cursors are the sender's watermark, which a duplicate retry may bring after the rest.
    snap = await drained(service, rig, cursor_at_head=rig.mode != "webhook")
    for kill in previous:
        kill.drained = snap
        kill.calls_drained = rig.sent()
        kill.restart_log = list(service.lines)


async def kill_at(
    point: str, agent_points: tuple[str, ...], rig: Rig, script: Script, previous: list[Kill], chain: Chain
) -> list[Kill]:
    """One process: drain what the previous kill left; then hold one event mid-LLM and block
    another's tool call (``agent_points``); then open the ticket that ``point`` kills the process on."""
    missing = [t for t in rig.tickets.ids() if not rig.stored(t)]
    # Each ticket still to store is one ingest (the hook counts ingests with new events) only if at
    # most one is missing: the chain is built so.
    assert len(missing) <= 1, f"{point}: {missing} not stored yet; the hit count would be a guess"
    hits = len(missing) + len(agent_points) + 1
    if rig.proxy is not None:
        rig.proxy.close_gate()
    started_at = time.time()
    async with agentwake_run(rig.config, AGENTWAKE_CRASH_AT=f"{point}:{hits}", **KEY) as service:
        await restarted(service, rig, previous, started_at)
        servers = command_lines(children(service.process.pid))
        kills: list[Kill] = []

        def aim(at: str) -> Kill:
            kill = Kill(at, ticket_id(rig.tickets.head() + 1), started_at)
            chain.kills[at] = kill  # from here on, a broken chain shows as this point's
            kills.append(kill)
            return kill

        if "mid_llm" in agent_points:
            held = aim("mid_llm")
            script.hold_second_step = held.target
            assert rig.tickets.open() == [held.target]
            await until(lambda: script.held == held.target, f"{held.target}'s second LLM call")
        if "tool_send" in agent_points:
            blocked = aim("tool_send")
            script.block_tool_call = blocked.target
            assert rig.tickets.open() == [blocked.target]
            await until(lambda: rig.sent().get(blocked.target), f"{blocked.target}'s tool call at the server")
        kill = aim(point)
        assert rig.tickets.open() == [kill.target]
        try:
            with anyio.fail_after(60):
                await service.process.wait()  # it kills itself at the point
        except TimeoutError:
            raise AssertionError(f"{point} never fired for {kill.target}:\n{service.log()}") from None
    # The tools server blocks every call while this file exists: the blocked one died with the process.
    rig.block.unlink(missing_ok=True)
    after, calls, head = rig.snapshot(), rig.sent(), rig.tickets.head()
    for kill in kills:
        kill.returncode, kill.after, kill.calls_after, kill.head = (
            service.process.returncode,
            after,
            calls,
            head,
        )
    chain.stuck += await reap(servers)
    return kills


async def last_process(rig: Rig, previous: list[Kill], chain: Chain) -> None:
    """Drain what the last kill left; for poll and push, kill the demo server mid-stream and drain
    again; stop with SIGTERM."""
    if rig.proxy is not None:
        rig.proxy.close_gate()
    async with agentwake_run(rig.config, **KEY) as service:
        await restarted(service, rig, previous, time.time())
        if chain.mode != "webhook":
            chain.server_kill = await kill_the_server(service, rig)
        chain.stopped = await service.stop(signal.SIGTERM)
    chain.final = rig.snapshot()
    chain.calls = rig.sent()
    chain.tickets = rig.tickets.ids()


def demo_servers(service: RunningService) -> list[int]:
    return [pid for pid in children(service.process.pid) if "examples.demo_server" in cmdline(pid)]


async def kill_the_server(service: RunningService, rig: Rig) -> ServerKill:
    outcome = ServerKill()
    [demo] = demo_servers(service)
    outcome.opened = rig.tickets.open(3)
    await until(lambda: rig.stored(outcome.opened[0]), "a new ticket stored")
    outcome.cursor_at_kill = rig.snapshot().cursors[SUBSCRIPTION]
    mark = len(service.lines)
    os.kill(demo, signal.SIGKILL)  # mid-stream: the other two may or may not be stored yet
    outcome.opened += rig.tickets.open(2)  # while it is down
    restarted: list[int] = []

    def started_again() -> bool:
        # The pid seen here is the one kept: a second look may fall between two of its restarts.
        restarted[:] = [pid for pid in demo_servers(service) if pid != demo]
        return bool(restarted)

    await until(started_again, "the demo server started again")
    outcome.pids = (demo, restarted[0])
    outcome.drained = await drained(service, rig, cursor_at_head=True)
    outcome.lines_after_kill = service.lines[mark:]
    return outcome


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    # Module scope, so the one fixture below runs every chain once for all the cases.
    return "asyncio"


@pytest.fixture(scope="module")
async def chains(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Chain]:
    found: dict[str, Chain] = {}

    async def one(mode: str) -> None:
        found[mode] = await run_chain(mode, tmp_path_factory.mktemp(f"chain-{mode}"))

    async with anyio.create_task_group() as tg:
        for mode in MODES:
            tg.start_soon(one, mode)
    for mode, chain in found.items():
        # Shown with -s: the time, and the events whose run began before the tools server was listed.
        seen = f"the {mode} chain took {chain.seconds:.1f}s; without the tool: {chain.without_tool}"
        print(f"fault suite: {seen}")  # noqa: T201
    return found


# ---- the cases ----------------------------------------------------------------------------------


def calls_expected(chain: Chain, ticket: str) -> int:
    """A finished event's calls at the tools server: one, unless its run began before that server was
    listed (then its call was refused, and none went out; see the report on the start-up race)."""
    return 0 if ticket in chain.without_tool else 1


def check_point(kill: Kill, mode: str, chain: Chain) -> None:
    """That the kill landed where it was aimed, and what the restart made of it."""
    after, rerun_snapshot, target = kill.after, kill.drained, kill.target
    assert after is not None and rerun_snapshot is not None
    event = after.events.get(target)
    cursor = after.cursors[SUBSCRIPTION]
    if kill.point == "after_inbox_commit":
        # Stored with its cursor, before the agent saw it (and, webhook, before the 2xx).
        assert event is not None and event.state == "pending" and event.runs == (), event
        if mode == "webhook":
            assert target not in chain.acked_by(kill)
        else:
            assert cursor == str(seq_of(target))
    elif kill.point in ("mid_cursor_write", "webhook_accept"):
        # The transaction died with the process (or never began): neither the event nor its cursor.
        assert event is None, event
        if mode == "webhook":
            assert target not in chain.acked_by(kill)
        else:
            assert cursor is not None and int(cursor) == seq_of(target) - 1
    elif kill.point == "mid_llm":
        # The run is open, its one tool call made and settled; its next LLM call was in flight.
        assert event is not None and event.state == "processing", event
        assert [(r.status, r.statuses()) for r in event.runs] == [("running", ("ok",))]
        assert kill.calls_after.get(target) == 1
    elif kill.point == "tool_send":
        # The call is journaled as sent, and the server has it; its answer never came.
        assert event is not None and event.state == "processing", event
        assert [(r.status, r.statuses()) for r in event.runs] == [("running", ("sent",))]
        assert kill.calls_after.get(target) == 1

    rerun = rerun_snapshot.events[target]
    statuses = [r.status for r in rerun.runs]
    if kill.point == "tool_send":
        # Not sent again: its outcome is unknown, so the event waits for a person.
        assert rerun.state == "dead", rerun
        assert "outcome is unknown" in (rerun.last_error or "")
        assert "--resend-unknown" in (rerun.last_error or "")
        assert statuses == ["interrupted", "failed"], rerun.runs
        assert not rerun.runs[1].sent_itself(), rerun.runs
        assert kill.calls_drained.get(target) == 1
    elif kill.point == "mid_llm":
        # Goes on from the stored transcript: the call is not made again.
        assert rerun.state == "done", rerun
        assert statuses == ["interrupted", "completed"], rerun.runs
        assert not rerun.runs[1].sent_itself(), rerun.runs
        assert kill.calls_drained.get(target) == 1
        assert any(f"event {target} run" in line and "goes on from run" in line for line in kill.restart_log)
    else:
        assert rerun.state == "done" and statuses == ["completed"], rerun
        assert kill.calls_drained.get(target, 0) == calls_expected(chain, target)


@pytest.mark.parametrize(("mode", "point"), CASES, ids=[f"{mode}-{point}" for mode, point in CASES])
async def test_a_sigkill_at_the_point_loses_no_accepted_event_and_repeats_no_run_or_tool_call(
    chains: dict[str, Chain], mode: str, point: str
) -> None:
    chain = chains[mode]
    kill = chain.kills.get(point)
    assert kill is not None and kill.after is not None, chain.broken(point)
    assert kill.returncode == -signal.SIGKILL

    # No accepted event lost: everything at or before the stored cursor, and every delivery the
    # sender saw answered 2xx, is in the inbox as the kill left it.
    after = kill.after
    cursor = after.cursors[SUBSCRIPTION]
    acknowledged = {ticket_id(seq) for seq in range(1, int(cursor or 0) + 1)}
    assert acknowledged <= set(after.events), sorted(acknowledged - set(after.events))
    if mode == "webhook":
        answered = chain.acked_by(kill)
        assert answered, "the sender saw no 2xx at all from the killed process"
        assert answered <= set(after.events), sorted(answered - set(after.events))

    assert kill.drained is not None, chain.broken(f"the restart after {point} drained")
    check_point(kill, mode, chain)

    # The restart finished every ticket there was; nothing ran twice, no call went out twice.
    there = [ticket_id(seq) for seq in range(1, kill.head + 1)]
    assert all(kill.drained.state(t) in TERMINAL for t in there)
    involved = {kill.target} | {t for t in after.events if after.state(t) not in TERMINAL}
    assert run_invariants(kill.drained, kill.calls_drained, sorted(involved)) == []


@pytest.mark.parametrize("mode", MODES)
async def test_after_the_last_restart_every_event_is_stored_once_and_no_run_or_call_was_repeated(
    chains: dict[str, Chain], mode: str
) -> None:
    chain = chains[mode]
    assert chain.final is not None, chain.broken("the end")
    assert chain.stopped == 0
    final = chain.final
    assert final.ids() == chain.tickets  # every ticket the demo has, none else
    assert (final.gap_counts[SUBSCRIPTION], final.gap_rows) == (0, 0)
    if mode != "webhook":
        assert final.duplicates[SUBSCRIPTION] == 0  # the cursor commits with its batch: nothing fetched twice
    assert run_invariants(final, chain.calls, chain.tickets) == []
    dead = sorted(t for t, e in final.events.items() if e.state == "dead")
    assert dead == [chain.kills["tool_send"].target]  # the call of unknown outcome, and only it
    assert all(e.state == "done" for t, e in final.events.items() if t not in dead)
    assert {t: chain.calls.get(t, 0) for t in chain.tickets} == {
        t: calls_expected(chain, t) for t in chain.tickets
    }
    assert chain.stuck == []  # a killed agentwake's stdio servers went with it


@pytest.mark.parametrize("mode", ["poll", "push"], ids=["poll-mcp_server_killed", "push-mcp_server_killed"])
async def test_an_mcp_server_killed_mid_stream_is_started_again_and_resumed_from_the_cursor_without_a_gap(
    chains: dict[str, Chain], mode: str
) -> None:
    chain = chains[mode]
    outcome = chain.server_kill
    assert outcome is not None and outcome.drained is not None, chain.broken("the server kill drained")
    killed, again = outcome.pids
    assert killed != again
    # Reconnected, and resumed from the stored cursor (not from "now").
    verb = "polling" if mode == "poll" else "streaming"
    resumed = [
        line.rpartition("from cursor ")[2].split()[0]
        for line in outcome.lines_after_kill
        if f"subscription {SUBSCRIPTION}: {verb} ticket.created on demo from cursor" in line
    ]
    assert resumed, "\n".join(outcome.lines_after_kill)
    assert all(int(cursor) >= int(outcome.cursor_at_kill or 0) for cursor in resumed)
    # No gap (tickets are durable), none missing, none fetched twice; each ran once.
    drained = outcome.drained
    assert set(outcome.opened) <= set(drained.events)
    assert (drained.gap_counts[SUBSCRIPTION], drained.gap_rows, drained.duplicates[SUBSCRIPTION]) == (0, 0, 0)
    assert drained.cursors[SUBSCRIPTION] == str(seq_of(outcome.opened[-1]))
    assert all(drained.state(t) == "done" for t in outcome.opened)
    assert chain.final is not None, chain.broken("the end")
    assert run_invariants(chain.final, chain.calls, outcome.opened) == []


def test_the_matrix_is_every_meaningful_combination() -> None:
    points = {"after_inbox_commit", "mid_llm", "tool_send", "mid_cursor_write", "webhook_accept"}
    for mode in MODES:
        expected = points if mode == "webhook" else points - {"webhook_accept"}
        assert {point for m, point in CASES if m == mode} == expected
    assert len(CASES) == 13


async def open_gate(fifo: Path) -> None:
    """Let the gated tools server start: open its FIFO for writing (once it waits on it) and close it."""

    def opened() -> bool:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no reader yet
                return False
            raise
        os.close(fd)
        return True

    await until(opened, "the tools server waiting at its gate")


async def test_a_run_that_begins_before_the_server_of_its_allowed_tools_is_connected_still_gets_them(
    tmp_path: Path,
) -> None:
    """Seen in the webhook chain when the restart's first run came before the tools server was listed
    ("run 2 started: ... 0 tool(s) allowed", then "notes__post_note refused"). The tools server starts
    only once the claimed event waits for it: the run then has its tools, and the call goes out."""
    rig = Rig(tmp_path, "poll", Tickets(tmp_path / "demo.db"))
    [ticket] = rig.tickets.open()
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    async with FakeLLM() as fake:
        fake.responder = Script(rig.block)
        rig.write(fake.url, demo_server_toml(rig.tickets.db, DEMO_NEXT_POLL_MS="100"), gate=gate)
        async with agentwake_run(rig.config, **KEY) as service:
            await until(lambda: rig.snapshot().state(ticket) == "processing", f"{ticket} claimed")
            await service.wait_for(f"event {ticket}: waiting up to", "for server notes to connect")
            await open_gate(gate)
            await service.wait_for(TOOLS_READY)
            await drained(service, rig, cursor_at_head=True)
            assert await service.stop(signal.SIGTERM) == 0
    assert rig.sent() == {ticket: 1}
