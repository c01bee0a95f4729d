"""tests/feed_server.py made stubborn: when its stdin closes it does not exit, and keeps emitting.

As soon as it starts it writes its pid to $STUBBORN_PIDFILE, and from then on appends a line to
$STUBBORN_BEAT every 50 ms for as long as it lives (what a server left running would go on
doing). When its stdin ends, the MCP session ends but the process stays. With
STUBBORN_SIGTERM=ignore it ignores SIGTERM too (only SIGKILL ends it); otherwise SIGTERM ends it.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import anyio
import feed_server


def beat(path: str) -> None:
    while True:
        with open(path, "a") as out:
            out.write(f"{time.time()}\n")
        time.sleep(0.05)


def main() -> None:
    if os.environ.get("STUBBORN_SIGTERM") == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(os.environ["STUBBORN_PIDFILE"], "w") as out:
        out.write(str(os.getpid()))
    threading.Thread(target=beat, args=(os.environ["STUBBORN_BEAT"],), daemon=True).start()
    anyio.run(feed_server.main)
    # stdin ended: a well-behaved server would exit here.
    threading.Event().wait()


if __name__ == "__main__":
    main()
