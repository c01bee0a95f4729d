"""The kill switch at work: what this process does about the store's pauses (agentwake.store.pauses).

The store keeps a paused server's or subscription's events out of every claim. This process also
reads the pauses every ``PAUSE_POLL_S``: an event decided to run under a paused rule is given back
(it waits in 'pending', and is looked at again every ``RULE_PAUSE_RECHECK_S``), a pause that asks
for it (``--now``) cuts short the runs it covers, and a resume wakes the claim loop at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

import anyio

from agentwake import metrics
from agentwake.errors import StoreError
from agentwake.logs import event_fields
from agentwake.store import InboxEvent, Store
from agentwake.store.pauses import Pause

logger = logging.getLogger(__name__)

PAUSE_POLL_S: Final = 1.0
# How soon an event given back under a paused rule is decided again (a resume takes effect by then).
RULE_PAUSE_RECHECK_S: Final = 15.0


class Handling(Protocol):
    """An event being handled by the worker, as far as a pause is concerned."""

    event: InboxEvent | None
    rule: str | None
    lost: bool
    stopped_because: list[str]

    def stop(self) -> None: ...


@dataclass
class PauseWatch:
    """The store's pauses as this process last read them, and what changed at each read."""

    store: Store
    current: tuple[Pause, ...] = ()
    _failing: bool = field(default=False, init=False)

    async def refresh(self) -> tuple[list[Pause], list[Pause]]:
        """Read the pauses again: those added (or changed) and those lifted since the last read.
        A store that fails for now keeps the last pauses known, said once."""
        try:
            now = tuple(await self.store.pauses())
        except StoreError as exc:
            if not self._failing:
                logger.warning("could not read the pauses (the last ones read still hold): %s", exc)
            self._failing = True
            return [], []
        self._failing = False
        before = {(p.scope, p.name): p for p in self.current}
        after = {(p.scope, p.name): p for p in now}
        added = [p for key, p in after.items() if before.get(key) != p]
        lifted = [p for key, p in before.items() if key not in after]
        self.current = now
        for pause in added:
            if (pause.scope, pause.name) not in before:
                logger.warning("paused: %s; no run starts for it until it is resumed", pause.describe())
            metrics.observe_paused(pause.scope, pause.name, True)
        for pause in lifted:
            logger.info(
                "resumed: %s", "everything" if pause.scope == "all" else f"{pause.scope} {pause.name}"
            )
            metrics.observe_paused(pause.scope, pause.name, False)
        return added, lifted

    async def follow(self, handlings: Callable[[], Sequence[Handling]], wake: Callable[[], None]) -> None:
        """Read the pauses every PAUSE_POLL_S: a resume ``wake``s the claim loop; a pause with ``--now``
        cuts short each handling it covers (its run is recorded interrupted, its event waits in pending)."""
        while True:
            await anyio.sleep(PAUSE_POLL_S)
            added, lifted = await self.refresh()
            if lifted:
                wake()
            for pause in (p for p in added if p.cut_short):
                for handling in handlings():
                    event = handling.event
                    if event is None or handling.lost:
                        continue
                    if pause.covers(server=event.server, subscription=event.subscription, rule=handling.rule):
                        logger.warning(
                            "event %s: its run is cut short: %s",
                            event.event_id,
                            pause.describe(),
                            extra=event_fields(
                                subscription=event.subscription, server=event.server, event_id=event.event_id
                            ),
                        )
                        handling.stopped_because.append(f"paused: {pause.describe()}")
                        handling.stop()

    def covering(self, *, server: str, subscription: str, rule: str | None) -> Pause | None:
        return next(
            (p for p in self.current if p.covers(server=server, subscription=subscription, rule=rule)), None
        )
