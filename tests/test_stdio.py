"""agentwake.stdio against real server processes: hostile output, stderr floods, exits and shutdown.

The MCP-level tests drive the real ``mcp.Client`` over the transport to tests/stdio_server.py, a
real MCPServer whose tools write garbage on the wire; the others run small scripts written to
tmp_path. Nothing sleeps to wait: every wait is on an event or a condition, under fail_after.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import random
import resource
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import demo_stdio
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import Client, StdioServerParameters
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCNotification, JSONRPCResponse

from agentwake.mcp import ServerConnection
from agentwake.stdio import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_STDERR_LINE_CHARS,
    DEFAULT_STDERR_LINES,
    BoundedStdioClient,
    Line,
    LineSplitter,
    Overflow,
    OverflowEnd,
    OversizedMessage,
    RateWindow,
    ServerExit,
    StdioLimits,
    UnparsableMessage,
    bounded_stdio_client,
    clean_line,
)

SERVER = Path(__file__).with_name("stdio_server.py")
MIB = 1024 * 1024
LOGGER = "agentwake.stdio"


def hostile_server() -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[str(SERVER)])


def script(tmp_path: Path, body: str) -> StdioServerParameters:
    path = tmp_path / "server.py"
    path.write_text(textwrap.dedent(body))
    return StdioServerParameters(command=sys.executable, args=["-u", str(path)])


class Faults:
    """The transport exceptions the session hands to message_handler."""

    def __init__(self) -> None:
        self.items: list[Exception] = []

    async def __call__(self, message: Any) -> None:
        if isinstance(message, Exception):
            self.items.append(message)


def text_of(result: Any) -> str:
    return str(result.content[0].text)


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise LookupError(field)


def reset_peak_rss() -> int | None:
    """Resets this process's peak RSS (Linux) and returns the current RSS in KiB; None if not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _status_kib("VmRSS")
    except (OSError, LookupError):
        return None


def peak_rss_kib(reset: bool) -> int:
    if reset:
        return _status_kib("VmHWM")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak


def gone(pid: int) -> bool:
    """The process is dead: no such pid, or a zombie awaiting its (re)parent's reaping."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


# ---- line splitting, rate windows, cleaning ---------------------------------------------------


def test_lines_are_split_across_chunks() -> None:
    splitter = LineSplitter(10)
    assert splitter.feed(b"ab") == []
    assert splitter.feed(b"c\nde\n\nf") == [Line(b"abc"), Line(b"de"), Line(b"")]
    assert splitter.finish() == Line(b"f")
    assert splitter.finish() is None


def test_a_line_at_the_limit_passes_and_one_byte_more_overflows() -> None:
    splitter = LineSplitter(3)
    assert splitter.feed(b"abc\nabcd\nok\n") == [
        Line(b"abc"),
        Overflow(b"abc", 4),
        OverflowEnd(4),
        Line(b"ok"),
    ]


def test_splitting_gives_the_same_events_however_the_stream_is_cut_into_chunks() -> None:
    """The chunk's whole lines are split at once (a fast path): the events must not depend on
    where the reads cut the stream, overlong lines, empty lines and a line cut mid-way included."""
    rng = random.Random(7)
    limit = 8
    lines = [b"x" * rng.choice([0, 1, 7, 8, 9, 20]) for _ in range(400)]
    stream = b"".join(line + b"\n" for line in lines) + b"tail"
    expected: list[Line | Overflow | OverflowEnd] = []
    for line in lines:
        if len(line) <= limit:
            expected.append(Line(line))
        else:
            expected += [Overflow(line[:limit], len(line)), OverflowEnd(len(line))]
    for _ in range(50):
        splitter = LineSplitter(limit)
        got: list[Line | Overflow | OverflowEnd] = []
        start = 0
        while start < len(stream):
            size = rng.choice([1, 2, 9, 10, 33, 200, 5000])
            got += splitter.feed(stream[start : start + size])
            start += size
        # An Overflow's size is what was seen of the line when it went over: that one depends on the reads.
        assert [e.head if isinstance(e, Overflow) else e for e in got] == [
            e.head if isinstance(e, Overflow) else e for e in expected
        ]
        assert splitter.finish() == Line(b"tail")


def test_an_overlong_line_is_reported_once_then_skipped_to_its_newline() -> None:
    splitter = LineSplitter(3)
    assert splitter.feed(b"ab") == []
    assert splitter.feed(b"cd") == [Overflow(b"abc", 4)]
    assert splitter.feed(b"e" * 1000) == []
    assert splitter.feed(b"f\nok\n") == [OverflowEnd(1005), Line(b"ok")]
    splitter.feed(b"toolong")
    assert splitter.finish() == OverflowEnd(7)


def test_restart_drops_the_line_in_progress_and_begins_the_next() -> None:
    splitter = LineSplitter(3)
    splitter.feed(b"abcdef")  # overlong, being skipped
    assert splitter.restart(b"xy") == []
    assert splitter.feed(b"z\n") == [Line(b"xyz")]
    assert splitter.restart(b"long") == [Overflow(b"lon", 4)]
    assert splitter.feed(b"\n") == [OverflowEnd(4)]


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=120), max_size=10),
    limit=st.integers(min_value=1, max_value=8),
)
def test_splitting_matches_a_plain_split_whatever_the_chunking(
    lines: list[bytes], cuts: list[int], limit: int
) -> None:
    data = b"".join(line + b"\n" for line in lines)
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    splitter = LineSplitter(limit)
    events = [e for a, b in itertools.pairwise(bounds) for e in splitter.feed(data[a:b])]
    expected: list[Line | Overflow | OverflowEnd] = []
    for line in lines:
        if len(line) <= limit:
            expected.append(Line(line))
        else:
            # Reported as soon as the limit is passed: the size so far depends on the chunking.
            expected.append(Overflow(line[:limit], -1))
            expected.append(OverflowEnd(len(line)))
    assert [Overflow(e.head, -1) if isinstance(e, Overflow) else e for e in events] == expected
    assert all(limit < e.size <= len(data) for e in events if isinstance(e, Overflow))
    assert splitter.finish() is None


def test_rate_window_admits_its_limit_then_counts_and_reports_the_drops_once() -> None:
    window = RateWindow(2, 10.0)
    assert [window.admit(t) for t in (0.0, 1.0, 2.0, 3.0)] == [(True, 0), (True, 0), (False, 0), (False, 0)]
    assert window.admit(10.0) == (True, 2)  # a new window: the last one's drops, to report
    assert window.admit(11.0) == (True, 0)
    assert window.admit(12.0) == (False, 0)
    assert window.take_dropped() == 1
    assert window.take_dropped() == 0
    assert window.full(12.5) and not window.full(20.0)
    window.drop(5)
    assert window.admit(20.0) == (True, 5)


def test_clean_line_removes_control_characters_but_tab() -> None:
    assert clean_line("a\tb\x1b[31mc\rd\x00e\x7ff\x85g\u2028h\u202ei") == "a\tb[31mcdefghi"


def test_exit_descriptions() -> None:
    assert str(ServerExit("demo", 3)) == "server 'demo' exited with code 3"
    assert str(ServerExit("demo", -signal.SIGKILL)) == "server 'demo' was killed by SIGKILL"
    assert ServerExit("demo", 0).signal is None


def test_limits_are_validated() -> None:
    assert StdioLimits().max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES == 4 * MIB
    assert StdioLimits().stderr_line_chars == DEFAULT_STDERR_LINE_CHARS
    assert StdioLimits().stderr_lines == DEFAULT_STDERR_LINES
    with pytest.raises(ValueError, match="max_message_bytes"):
        StdioLimits(max_message_bytes=0)
    with pytest.raises(ValueError, match="terminate_wait_s"):
        StdioLimits(terminate_wait_s=-1)


# ---- a real MCP server writing garbage on the wire --------------------------------------------


@pytest.mark.anyio
async def test_a_50mb_line_is_dropped_in_bounded_memory_and_the_next_request_is_answered() -> None:
    faults = Faults()
    transport = bounded_stdio_client(
        hostile_server(), name="hostile", limits=StdioLimits(max_message_bytes=MIB), errlog=io.StringIO()
    )
    with anyio.fail_after(60):
        async with Client(transport, message_handler=faults) as client:
            assert text_of(await client.call_tool("echo", {"text": "warm-up"})) == "warm-up"
            reset = reset_peak_rss()
            before = reset if reset is not None else peak_rss_kib(False)
            assert text_of(await client.call_tool("flood", {"size": 50_000_000})) == "flooded"
            growth_kib = peak_rss_kib(reset is not None) - before
            assert text_of(await client.call_tool("echo", {"text": "still here"})) == "still here"
    # The line was never held: far below its 50 MB (the SDK's transport grows by ~590 MB).
    assert growth_kib < 16 * 1024, f"RSS grew by {growth_kib} KiB"
    [oversized] = [f for f in faults.items if isinstance(f, OversizedMessage)]
    assert oversized.limit == MIB
    assert MIB < oversized.size_so_far <= 50_000_000


@pytest.mark.anyio
async def test_invalid_utf8_costs_one_line_not_the_connection() -> None:
    faults = Faults()
    transport = bounded_stdio_client(hostile_server(), name="hostile", errlog=io.StringIO())
    with anyio.fail_after(30):
        async with Client(transport, message_handler=faults) as client:
            assert text_of(await client.call_tool("bad_bytes", {})) == "bad bytes sent"
            assert text_of(await client.call_tool("echo", {"text": "after"})) == "after"
            assert text_of(await client.call_tool("bad_bytes", {})) == "bad bytes sent"
            assert text_of(await client.call_tool("echo", {"text": "again"})) == "again"
    # Only the line that was not JSON at all was lost, once per call.
    assert len(faults.items) == 2
    assert all(isinstance(f, UnparsableMessage) for f in faults.items)


@pytest.mark.anyio
async def test_invalid_utf8_in_a_message_becomes_a_replacement_character(tmp_path: Path) -> None:
    params = script(
        tmp_path,
        r"""
        import sys
        out = sys.stdout.buffer
        out.write(b"\xff\xfe\n")
        out.write(b'{"jsonrpc":"2.0","method":"notifications/note","params":{"text":"bad \xff byte"}}\n')
        out.write(b'{"jsonrpc":"2.0","id":1,"result":{}}\n')
        out.flush()
        sys.stdin.read()
        """,
    )
    async with bounded_stdio_client(params, name="bytes", errlog=io.StringIO()) as (read, _write):
        with anyio.fail_after(20):
            first, second, third = [await read.receive() for _ in range(3)]
    assert isinstance(first, UnparsableMessage)
    assert first.reason.startswith("Invalid JSON") and first.preview == "\ufffd\ufffd"
    assert isinstance(second, SessionMessage) and isinstance(second.message, JSONRPCNotification)
    assert second.message.params == {"text": "bad \ufffd byte"}
    assert isinstance(third, SessionMessage) and isinstance(third.message, JSONRPCResponse)


@pytest.mark.anyio
async def test_claim_is_shown_exactly_the_plain_notifications_and_the_rest_reach_the_session(
    tmp_path: Path,
) -> None:
    # A plain notification: jsonrpc "2.0", a string method, params an object, null or absent, no
    # other member. The SDK reads the others as something else, or refuses them: never the claim.
    lines = [
        '{"jsonrpc":"2.0","method":"notifications/ok-1","params":{"k":1}}',
        '{"jsonrpc":"2.0","method":"notifications/ok-2"}',
        '{"jsonrpc":"2.0","method":"notifications/ok-3","params":null}',
        '{"jsonrpc":"2.0","method":"notifications/not-extra","params":{},"extra":1}',
        '{"jsonrpc":"2.0","method":"notifications/not-extra-no-params","extra":1}',
        '{"jsonrpc":"2.0","method":"notifications/not-list","params":[1]}',
        '{"jsonrpc":"1.0","method":"notifications/not-version","params":{}}',
        '{"method":"notifications/not-no-version","params":{},"other":1}',
        '{"jsonrpc":"2.0","params":{},"other":"notifications/not-no-method"}',
        '{"jsonrpc":"2.0","method":7,"params":{}}',
        '{"jsonrpc":"2.0","method":"notifications/ok-4","params":{"last":true}}',
        '{"jsonrpc":"2.0","id":"end","result":{}}',  # read in order: all before it was seen
    ]
    body = "import sys\nsys.stdout.write(" + repr("".join(f"{line}\n" for line in lines)) + ")\n"
    params = script(tmp_path, body + "sys.stdout.flush()\nsys.stdin.read()\n")
    claimed: list[tuple[str, Any]] = []

    def claim(method: str, params: Any) -> bool:
        claimed.append((method, params))
        return True

    transport = bounded_stdio_client(params, name="claims", errlog=io.StringIO(), claim=claim)
    async with transport as (read, _write):
        with anyio.fail_after(20):
            while True:
                item = await read.receive()
                if isinstance(item, SessionMessage) and isinstance(item.message, JSONRPCResponse):
                    break
                assert not isinstance(item, SessionMessage) or "notifications/ok" not in repr(item.message)
    assert claimed == [
        ("notifications/ok-1", {"k": 1}),
        ("notifications/ok-2", None),
        ("notifications/ok-3", None),
        ("notifications/ok-4", {"last": True}),
    ]


@pytest.mark.anyio
async def test_on_lost_hears_of_each_lost_line_before_any_later_line_is_delivered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    params = script(
        tmp_path,
        r"""
        import sys
        out = sys.stdout.buffer
        out.write(b"z" * 5000 + b"\n" + b"junk\n" + b'{"jsonrpc":"2.0","method":"notifications/after"}\n')
        out.flush()
        sys.stdin.read()
        """,
    )
    lost: list[Exception] = []

    def on_lost(exc: Exception) -> None:
        lost.append(exc)
        if len(lost) == 2:
            raise RuntimeError("a buggy callback")

    limits = StdioLimits(max_message_bytes=1024)
    transport = bounded_stdio_client(
        params, name="lossy", limits=limits, errlog=io.StringIO(), on_lost=on_lost
    )
    async with transport as (read, _write):
        with anyio.fail_after(20):
            oversized = await read.receive()
            assert lost[0] is oversized
            unparsable = await read.receive()
            assert lost[1] is unparsable
            after = await read.receive()
            # The guarantee: both were heard of before the next message was delivered.
            assert lost == [oversized, unparsable]
    assert isinstance(oversized, OversizedMessage) and oversized.limit == 1024
    assert 1024 < oversized.size_so_far <= 5000  # how far the reader had got when it passed the limit
    assert isinstance(unparsable, UnparsableMessage) and unparsable.preview == "junk"
    # The callback's failure is logged and costs nothing else.
    assert isinstance(after, SessionMessage) and isinstance(after.message, JSONRPCNotification)
    assert "a transport callback failed" in caplog.text


@pytest.mark.anyio
async def test_10000_junk_lines_log_two_lines_without_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    faults = Faults()
    transport = bounded_stdio_client(hostile_server(), name="hostile", errlog=io.StringIO())
    with anyio.fail_after(60):
        async with Client(transport, message_handler=faults) as client:
            assert text_of(await client.call_tool("junk", {"count": 10_000})) == "junked"
            assert text_of(await client.call_tool("echo", {"text": "fine"})) == "fine"
    # Each lost line still reaches the session, as in the SDK.
    assert len(faults.items) == 10_000
    assert all(isinstance(f, UnparsableMessage) for f in faults.items)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.name for r in warnings] == [LOGGER, LOGGER]
    first, summary = (r.getMessage() for r in warnings)
    assert "not a JSON-RPC message" in first and "junk line 0" in first
    assert len(first) < 400
    assert "9999 more bad stdout lines" in summary
    assert not any(r.exc_info for r in caplog.records)
    assert not any("Failed to parse" in r.getMessage() for r in caplog.records)


@pytest.mark.anyio
async def test_bad_lines_are_summarised_once_per_window(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    limits = StdioLimits(bad_line_logs=3, bad_line_window_s=3600)
    transport = bounded_stdio_client(hostile_server(), name="hostile", limits=limits, errlog=io.StringIO())
    with anyio.fail_after(60):
        async with Client(transport) as client:
            await client.call_tool("junk", {"count": 50})
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(messages) == 4
    assert all(f"junk line {n}:" in m for n, m in enumerate(messages[:3]))
    assert "47 more bad stdout lines" in messages[3]


# ---- stderr -------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_stderr_lines_are_prefixed_cleaned_truncated_and_rate_limited(tmp_path: Path) -> None:
    params = script(
        tmp_path,
        r"""
        import sys
        w = sys.stderr.write
        w("hello from the server\n")
        w("\x1b[31mred\x1b[0m, a\rcarriage return and a\ttab\n")
        w("2026-01-01 12:00:00 ERROR agentwake fake\x0bline\x85that\u2028does not break\n")
        w("y" * 10000 + "\n")
        for n in range(500):
            w(f"line {n}\n")
        w("no newline at the end")
        sys.stderr.flush()
        """,
    )
    errlog = io.StringIO()
    limits = StdioLimits(stderr_window_s=3600, stderr_drain_wait_s=20)
    transport = bounded_stdio_client(params, name="demo", limits=limits, errlog=errlog)
    with anyio.fail_after(20):
        async with transport:
            await transport.wait_exit()
    lines = errlog.getvalue().split("\n")
    assert lines.pop() == ""
    assert all(line.startswith("[demo] ") for line in lines)
    assert lines[:3] == [
        "[demo] hello from the server",
        "[demo] [31mred[0m, acarriage return and a\ttab",
        "[demo] 2026-01-01 12:00:00 ERROR agentwake fakelinethatdoes not break",
    ]
    marker = "… [truncated: the line had 10000 bytes]"
    assert lines[3] == "[demo] " + "y" * DEFAULT_STDERR_LINE_CHARS + marker
    assert lines[4:100] == [f"[demo] line {n}" for n in range(96)]
    # 505 lines in all: the first 100 are copied, the other 405 counted in one line.
    assert lines[100:] == ["[demo] … [405 stderr lines dropped: at most 100 per 3600s]"]


@pytest.mark.anyio
async def test_a_stderr_flood_from_a_live_server_is_bounded_and_the_session_goes_on() -> None:
    errlog = io.StringIO()
    limits = StdioLimits(stderr_lines=10, stderr_window_s=3600)
    transport = bounded_stdio_client(hostile_server(), name="hostile", limits=limits, errlog=errlog)
    with anyio.fail_after(60):
        async with Client(transport) as client:
            assert text_of(await client.call_tool("shout", {"count": 20_000})) == "shouted"
            assert text_of(await client.call_tool("echo", {"text": "heard"})) == "heard"
    copied = errlog.getvalue().splitlines()
    assert len(copied) <= 11
    assert all(line.startswith("[hostile] ") for line in copied)
    assert copied[-1].startswith("[hostile] … [") and "stderr lines dropped" in copied[-1]


# ---- how the server ended -------------------------------------------------------------------------


@pytest.mark.anyio
async def test_an_exit_code_is_reported_by_the_time_the_read_stream_ends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    params = script(tmp_path, "import sys\nsys.stderr.write('giving up\\n')\nsys.exit(3)\n")
    errlog = io.StringIO()
    exits: list[ServerExit] = []
    limits = StdioLimits(exit_report_wait_s=20)
    transport = bounded_stdio_client(params, name="demo", limits=limits, errlog=errlog, on_exit=exits.append)
    with anyio.fail_after(20):
        async with transport as (read, _write):
            assert [item async for item in read] == []
            assert transport.exit is not None
            assert str(transport.exit) == "server 'demo' exited with code 3"
            assert not transport.exit.during_shutdown
    assert exits == [transport.exit]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
        "server 'demo' exited with code 3"
    ]
    assert errlog.getvalue() == "[demo] giving up\n"


@pytest.mark.anyio
async def test_a_signal_is_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    params = script(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    transport = bounded_stdio_client(params, name="demo", errlog=io.StringIO())
    with anyio.fail_after(20):
        async with transport:
            ended = await transport.wait_exit()
    assert ended.signal == "SIGKILL"
    assert not ended.stopped_by_agentwake
    assert "server 'demo' was killed by SIGKILL" in caplog.text


@pytest.mark.anyio
async def test_a_server_dying_mid_session_fails_the_request_with_its_exit_known() -> None:
    limits = StdioLimits(exit_report_wait_s=20)
    transport = bounded_stdio_client(hostile_server(), name="hostile", limits=limits, errlog=io.StringIO())
    with anyio.fail_after(30):
        async with Client(transport) as client:
            with pytest.raises(Exception) as failure:
                await client.call_tool("die", {"code": 7})
            assert transport.exit is not None
    assert "closed" in str(failure.value).lower()
    assert transport.exit.describe() == "exited with code 7"


@pytest.mark.anyio
async def test_a_clean_shutdown_is_reported_at_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    transport = bounded_stdio_client(hostile_server(), name="hostile", errlog=io.StringIO())
    with anyio.fail_after(30):
        async with Client(transport) as client:
            await client.call_tool("echo", {"text": "bye"})
    assert transport.exit == ServerExit("hostile", 0, during_shutdown=True)
    [record] = [r for r in caplog.records if r.name == LOGGER]
    assert (record.levelno, record.getMessage()) == (logging.INFO, "server 'hostile' exited with code 0")


@pytest.mark.anyio
async def test_cancelling_while_the_server_ignores_stdin_and_sigterm_kills_its_process_group(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    # The server and its child ignore SIGTERM and never read stdin; the child holds the pipes too.
    (tmp_path / "child.py").write_text(
        textwrap.dedent(
            """
            import os, signal, sys, time
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            note = '{"jsonrpc":"2.0","method":"notifications/ready","params":{"child":%d}}'
            sys.stdout.write(note % os.getpid() + "\\n")
            sys.stdout.flush()
            time.sleep(600)
            """
        )
    )
    params = script(
        tmp_path,
        f"""
        import signal, subprocess, sys
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        subprocess.Popen([sys.executable, {str(tmp_path / "child.py")!r}])
        signal.pause()
        """,
    )
    limits = StdioLimits(stdin_close_wait_s=0.3, terminate_wait_s=0.3)
    transport = bounded_stdio_client(params, name="stubborn", limits=limits, errlog=io.StringIO())
    started = ended = 0.0
    with anyio.fail_after(30):
        with anyio.CancelScope() as scope:
            async with transport as (read, _write):
                ready = await read.receive()
                assert isinstance(ready, SessionMessage) and isinstance(ready.message, JSONRPCNotification)
                assert ready.message.params is not None
                child = int(ready.message.params["child"])
                scope.cancel()
                started = anyio.current_time()
                await anyio.sleep_forever()
        ended = anyio.current_time()
        # Within the bounded shutdown: stdin grace + SIGTERM grace, the kill wait as slack.
        assert ended - started < limits.stdin_close_wait_s + limits.terminate_wait_s + limits.kill_wait_s
        assert scope.cancelled_caught
        assert transport.exit is not None and transport.exit.signal == "SIGKILL"
        assert transport.exit.stopped_by_agentwake and transport.exit.during_shutdown
        assert transport.pid is not None and gone(transport.pid)
        # SIGKILL reached the child through the group; it dies as soon as the kernel runs it.
        while not gone(child):  # noqa: ASYNC110 - nothing signals a non-child's death
            await anyio.sleep(0.01)
    assert "server 'stubborn' was killed by SIGKILL: it did not exit when its stdin closed" in caplog.text


@pytest.mark.anyio
async def test_a_command_that_does_not_exist_raises_on_entering(tmp_path: Path) -> None:
    params = StdioServerParameters(command=str(tmp_path / "no-such-server"))
    with pytest.raises(FileNotFoundError):
        async with bounded_stdio_client(params, name="ghost"):
            pass


@pytest.mark.anyio
async def test_the_transport_is_entered_once() -> None:
    transport = BoundedStdioClient(hostile_server(), name="hostile", errlog=io.StringIO())
    with anyio.fail_after(30):
        async with transport:
            with pytest.raises(RuntimeError, match="only once"):
                await transport.__aenter__()


# ---- as agentwake's transport -------------------------------------------------------------------


@pytest.mark.anyio
async def test_server_connection_speaks_to_a_stdio_server_through_this_transport(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with ServerConnection("demo", demo_stdio(tmp_path / "demo.db"), errlog=io.StringIO()) as conn:
            names = [event.name for event in await conn.list_events()]
            transport = conn.stdio
    assert "ticket.created" in names
    assert isinstance(transport, BoundedStdioClient)
    assert transport.exit is not None and transport.exit.returncode == 0


@pytest.mark.anyio
async def test_a_token_in_the_servers_stderr_is_redacted_on_its_way_to_ours(tmp_path: Path) -> None:
    script = tmp_path / "leaky.py"
    script.write_text("import sys\nsys.stderr.write('auth with Bearer abcdefghijklmnopqrstuvwxyz0123\\n')\n")
    errlog = io.StringIO()
    params = StdioServerParameters(command=sys.executable, args=[str(script)])
    with anyio.fail_after(20):
        async with bounded_stdio_client(params, name="leaky", errlog=errlog) as (read, _write):
            async for _item in read:
                pass
    assert "abcdefghijklmnopqrstuvwxyz0123" not in errlog.getvalue()
    assert "[leaky] auth with Bearer [REDACTED]" in errlog.getvalue()


@pytest.mark.anyio
async def test_lines_for_a_server_that_reads_nothing_yet_queue_without_holding_their_senders(
    tmp_path: Path,
) -> None:
    """Thousands of quiet polls go out at once to a server slower to read them: each sender hands its
    line over and goes on (up to WRITE_QUEUE queued) instead of waiting for the pipe; the lines then
    reach the server whole and in order."""
    go = tmp_path / "go"
    os.mkfifo(go)
    lines = 3000  # about 600 kB: far more than a pipe holds
    params = script(
        tmp_path,
        rf"""
        import json, sys
        open({str(go)!r}, "rb").read(1)  # reads nothing from stdin until the test says so
        seen = [json.loads(sys.stdin.buffer.readline())["params"]["i"] for _ in range({lines})]
        done = {{"count": len(seen), "ordered": seen == list(range({lines}))}}
        sys.stdout.write(json.dumps({{"jsonrpc": "2.0", "method": "notifications/done", "params": done}}) + "\n")
        sys.stdout.flush()
        sys.stdin.read()
        """,
    )
    async with bounded_stdio_client(params, name="slow", errlog=io.StringIO()) as (read, write):
        with anyio.fail_after(60):  # a guard: with senders held by the full pipe, this never ends
            for i in range(lines):
                note = JSONRPCNotification(
                    jsonrpc="2.0", method="notifications/n", params={"i": i, "pad": "x" * 150}
                )
                await write.send(SessionMessage(note))

        def release() -> None:
            with open(go, "wb") as fifo:
                fifo.write(b"1")

        await anyio.to_thread.run_sync(release)
        with anyio.fail_after(60):
            reply = await read.receive()
    assert isinstance(reply, SessionMessage) and isinstance(reply.message, JSONRPCNotification)
    assert reply.message.params == {"count": lines, "ordered": True}
