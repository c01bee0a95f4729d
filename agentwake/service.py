"""agentwake as a service: the store, the worker and the supervisor in one task group, with signals.

``agentwake run`` is ``serve(config)``. A program that embeds agentwake calls
``run_service(config)`` inside its own anyio event loop instead, and stops it by
cancelling its scope; ``handle_signals=False`` leaves SIGINT, SIGTERM and SIGHUP to it. To stop
as gracefully as the signals do, it first awaits ``supervisor.stop_delivery()`` under a timeout
(the supervisor is what ``run_service`` reports when started).

While it runs, the service records itself in the store (pid, host, version, start time), writes a
heartbeat there every HEARTBEAT_S and, on a clean stop, the time it stopped: ``agentwake status``
tells a running service from a stopped one, or one that vanished without stopping, by that record.

    SIGINT, SIGTERM   stop: in-flight writes finish, cursors stay, runs cut short go again.
                      First the delivery loops end while their connections are open (open push
                      streams are cancelled on their servers) and the connections close, for
                      at most STOP_GRACE_S; then everything else is cancelled. A second signal
                      skips what is left of the grace.
    SIGHUP            load the policy files again (also when one changes on disk), and the config
                      file: its servers and subscriptions (also when it changes; agentwake.reload)
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Final

import anyio
import anyio.abc

from agentwake.config import AgentwakeConfig
from agentwake.errors import AgentwakeError, StoreError
from agentwake.policy import Policy, PolicyReloader, load_policy
from agentwake.store import Store, open_store
from agentwake.systemd import Notifier
from agentwake.web import Health, endpoint_settings

if TYPE_CHECKING:
    from agentwake.agent.prompts import PromptRenderer
    from agentwake.agent.runner import AgentRunner
    from agentwake.agent.tools import ConnectionPool
    from agentwake.reload import ConfigReloader
    from agentwake.supervisor import Supervisor
    from agentwake.worker import Worker

logger = logging.getLogger("agentwake")

# How often the policy folder is looked at for changed files.
POLICY_POLL_S: Final = 2.0
# After a stop signal, how long the delivery loops get to end cleanly (push streams cancelled on
# their servers, connections closed) before everything is cancelled.
STOP_GRACE_S: Final = 2.0
# After this long the subscriptions are up and their objects are frozen for the garbage collector.
SETTLE_S: Final = 20.0
# Container objects allocated between two collections of the young generation (CPython's default
# is 700). A backlog allocates a few a notification and keeps thousands queued for the store, which
# every young pass rescans: at 10,000 a push drain costs 8 % less CPU (bench/push_latency.py). What
# the young generation then holds is garbage in cycles only, a few MB at most.
COLLECTOR_YOUNG_THRESHOLD: Final = 10_000
# How often the running service writes its heartbeat into the store; `status` counts a service
# whose last heartbeat is older than three of these as not running.
HEARTBEAT_S: Final = 5.0
# A PostgreSQL store that is not accepting connections yet (starting up, restarting) is waited for this long.
SERVICE_START_WAIT_S: Final = 60.0


def config_dir(config: AgentwakeConfig) -> Path:
    """The folder relative paths in the config (hooks among them) resolve against."""
    return config.source.parent.resolve() if config.source else Path.cwd()


def load_service_policy(config: AgentwakeConfig, renderer: PromptRenderer | None = None) -> Policy:
    """The policy files, every error at once; with a renderer, the rules' prompt templates are checked too."""
    policy = load_policy(config.policy.dir, config.policy.default, base=config_dir(config))
    if renderer is not None:
        renderer.check([r.rule.prompt for r in policy.rules if r.rule.prompt])
    return policy


def build_agent(config: AgentwakeConfig, store: Store) -> tuple[AgentRunner | None, ConnectionPool | None]:
    """The agent runner and its connection pool, or Nones without an [agent] section.

    Every prompt template the subscriptions use is checked here, before anything starts.
    The agent modules are imported here, not at module level: litellm itself is only
    imported by the agent stage, in a worker thread, when the worker starts.
    """
    if config.agent is None:
        return None, None
    from agentwake.agent.prompts import PromptRenderer
    from agentwake.agent.runner import AgentRunner
    from agentwake.agent.tools import ConnectionPool

    renderer = PromptRenderer(config.agent, config.sanitize)
    renderer.check([renderer.template_for(s, s.event) for s in config.subscriptions if s.agent])
    from agentwake.agent.llm import require_api_keys

    require_api_keys(config)  # a ConfigError naming the unset variable; agentwake/offline needs none
    pool = ConnectionPool(call_timeout_s=config.agent.request_timeout_s)
    return AgentRunner(config, config.agent, store, pool, renderer), pool


async def run_service(
    config: AgentwakeConfig,
    *,
    handle_signals: bool = True,
    notifier: Notifier | None = None,
    task_status: anyio.abc.TaskStatus[Supervisor] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run until cancelled (or, with ``handle_signals``, until SIGINT or SIGTERM). Reports the supervisor.

    With a ``notifier`` (``serve`` passes systemd's, agentwake.systemd): READY=1 once started,
    STOPPING=1 at a stop signal, WATCHDOG=1 while the loops run if ``[service] watchdog``.
    """
    from agentwake.supervisor import Supervisor
    from agentwake.worker import Worker

    # [service] listen: refused before anything starts if it would be reachable without a token.
    endpoint = endpoint_settings(config.service) if config.service.listen is not None else None
    health = Health(HEARTBEAT_S)
    store = await open_store(config.store, start_wait_s=SERVICE_START_WAIT_S)
    try:
        runner, pool = build_agent(config, store)
        policy = load_service_policy(config, runner.renderer if runner else None)
    except AgentwakeError:
        await store.close()
        raise
    # The SDK's import leaves a large heap of long-lived objects; keep the collector from rescanning it.
    settle_collector()
    _log_start(config, runner)
    service_id: int | None = None
    try:
        service_id = await store.service_started(
            pid=os.getpid(), host=socket.gethostname(), version=_version(), heartbeat_s=HEARTBEAT_S
        )
        health.store_written()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_heartbeat, store, service_id, HEARTBEAT_S, health, name="service-heartbeat")
            if config.store.retention.enabled:  # [store.retention]: old events, runs and transcripts go
                from agentwake.store.retention import keep_pruned

                tg.start_soon(keep_pruned, config.store, store, name="store-pruner")
            worker = Worker(config, store, policy=policy, agent=runner, pool=pool)
            supervisor = Supervisor(config, store, worker=worker, pool=pool)
            if handle_signals:
                await tg.start(
                    _stop_on_signal,
                    tg.cancel_scope,
                    supervisor,
                    notifier,
                    health,
                    config.service.stop_timeout_s,
                )
            await tg.start(
                partial(watch_policy, supervisor=supervisor, runner=runner),
                config,
                worker,
                runner.renderer if runner else None,
                handle_signals,
            )
            # Only now, with SIGHUP handled: a reader of this line may send one.
            logger.info(
                "policy: %d rule(s) from %s in %s; %s",
                len(policy.rules),
                policy.files_summary(),
                config.policy.dir,
                policy.who_decides_the_rest(),
            )
            await tg.start(supervisor.run)
            tg.start_soon(_freeze_when_settled, name="gc-freeze")
            if endpoint is not None:  # /healthz, /readyz, /metrics and the approvals page
                from agentwake.web.app import Endpoint

                await tg.start(Endpoint(endpoint, store, supervisor, health).serve, name="service-endpoint")
            task_status.started(supervisor)
            if notifier is not None:  # systemd (agentwake.systemd): up, and alive while the loops run
                notifier.ready(
                    f"running: {len(config.subscriptions)} subscription(s) on {len(config.servers)} server(s)"
                )
                if config.service.watchdog:
                    tg.start_soon(notifier.keep_alive, name="systemd-watchdog")
    finally:
        with anyio.CancelScope(shield=True):
            if service_id is not None:
                try:
                    await store.service_stopped(service_id)
                except StoreError as exc:
                    logger.warning("could not record the stop in the store: %s", exc)
            await store.close()
        logger.info("agentwake stopped; cursors are saved in %s", store_name(config))


def store_name(config: AgentwakeConfig) -> str:
    """The store as log lines name it: the SQLite file, or the PostgreSQL database (never a password)."""
    if config.store.url is None:
        return str(config.store.path)
    from agentwake.store.postgres.base import describe_target

    return describe_target(config.store.url)


async def _freeze_when_settled(after_s: float = SETTLE_S) -> None:
    """Once the subscriptions are up, their long-lived objects (loops, streams, scopes: some
    20 KB each) are frozen, so that the collector's full passes stop scanning them."""
    await anyio.sleep(after_s)
    settle_collector()


def settle_collector() -> None:
    """Collect, freeze what is left (the collector's full passes stop scanning it), and let the young
    generation grow to COLLECTOR_YOUNG_THRESHOLD. The benches that stand for ``agentwake run`` call it
    where it does."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(COLLECTOR_YOUNG_THRESHOLD, middle, old)


async def _heartbeat(store: Store, service_id: int, interval_s: float, health: Health | None = None) -> None:
    """Tell the store this service is alive, every ``interval_s``, until cancelled; ``health`` hears how it went."""
    failing = False
    while True:
        await anyio.sleep(interval_s)
        try:
            await store.service_heartbeat(service_id)
        except StoreError as exc:
            if not failing:  # a locked store: said once, tried again at the next beat
                logger.warning("could not write the service heartbeat: %s", exc)
            failing = True
            if health is not None:
                health.store_failed(str(exc))
        else:
            failing = False
            if health is not None:
                health.store_written()


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agentwake")
    except PackageNotFoundError:
        return None


def serve(config: AgentwakeConfig) -> None:
    """``run_service`` in a new event loop, until SIGINT or SIGTERM; an AgentwakeError comes out unwrapped."""
    try:
        anyio.run(lambda: run_service(config, notifier=Notifier.from_environment()))
    except BaseExceptionGroup as group:
        # A start-up failure inside a task group (say the webhook port is taken) comes out wrapped.
        leaf: BaseException = group
        while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
            leaf = leaf.exceptions[0]
        if isinstance(leaf, AgentwakeError):
            raise leaf from None
        raise


def _log_start(config: AgentwakeConfig, runner: AgentRunner | None) -> None:
    logger.info(
        "agentwake starting: %d server(s), %d subscription(s), store %s",
        len(config.servers),
        len(config.subscriptions),
        store_name(config),
    )
    if not config.subscriptions:
        logger.warning("no [[subscriptions]] configured: nothing to do until you add one")
    if runner is None:
        logger.warning("no [agent] section: events are sanitized, decided and logged; no agent runs")
    else:
        logger.info(
            "agent: model %s, up to %d run(s) at a time", runner.agent.model, runner.agent.concurrency
        )


async def _stop_on_signal(
    scope: anyio.CancelScope,
    supervisor: Supervisor,
    notifier: Notifier | None = None,
    health: Health | None = None,
    stop_timeout_s: float = 30.0,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """On SIGINT or SIGTERM: claim no more events, let running agent runs finish (at most
    ``stop_timeout_s``), stop the supervisor's delivery gracefully, then cancel ``scope``."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        signum = await anext(signals)
        logger.info("received %s: stopping", signal.Signals(signum).name)
        if notifier is not None:
            notifier.stopping()
        if health is not None:  # /healthz and /readyz answer 503 from now on
            health.stopping = True
        async with anyio.create_task_group() as grace:

            async def on_second_signal() -> None:
                signum = await anext(signals)
                logger.info(
                    "received %s during the graceful stop: stopping at once", signal.Signals(signum).name
                )
                grace.cancel_scope.cancel()

            grace.start_soon(on_second_signal)
            await _drain_runs(supervisor, stop_timeout_s)
            with anyio.move_on_after(STOP_GRACE_S) as waited:
                await supervisor.stop_delivery()
            if waited.cancelled_caught:
                logger.warning(
                    "delivery did not stop within %gs; stopping the rest without waiting", STOP_GRACE_S
                )
            grace.cancel_scope.cancel()
        scope.cancel()


async def _drain_runs(supervisor: Supervisor, stop_timeout_s: float) -> None:
    """The worker claims nothing more; the events it is handling get ``stop_timeout_s`` to finish.

    Their servers stay connected meanwhile, so their tool calls still go out. A run still going
    at the deadline is cancelled: it is recorded as interrupted and its event runs again at the
    next start, from where it stopped, without counting the attempt.
    """
    worker = supervisor.worker
    if worker is None:
        return
    worker.stop_claiming()
    if not worker.held:
        return
    logger.info(
        "waiting up to %gs for %d event(s) being handled to finish (a second signal stops at once)",
        stop_timeout_s,
        len(worker.held),
    )
    with anyio.move_on_after(stop_timeout_s) as waited:
        await worker.drained()
    if waited.cancelled_caught:
        logger.warning(
            "%d event(s) still being handled after %gs: their runs are cut short and go again at the next start",
            len(worker.held),
            stop_timeout_s,
        )


async def watch_policy(
    config: AgentwakeConfig,
    worker: Worker,
    renderer: PromptRenderer | None,
    handle_signals: bool = True,
    *,
    supervisor: Supervisor | None = None,
    runner: AgentRunner | None = None,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Reload the policy on SIGHUP, and when a policy file changes (checked every POLICY_POLL_S).

    With a ``supervisor`` and a config read from a file, the config too: its servers and
    subscriptions (``agentwake.reload``), on SIGHUP and when the file changes.
    """

    def apply(policy: Policy) -> None:
        worker.policy = policy

    reloader = PolicyReloader(
        config.policy.dir,
        lambda: load_service_policy(config, renderer),
        apply,
        worker.policy,
        base=config_dir(config),
    )
    from agentwake.reload import ConfigReloader

    watcher = (
        ConfigReloader(config.source, supervisor, runner)
        if supervisor is not None and config.source is not None
        else None
    )
    async with anyio.create_task_group() as tg:
        if handle_signals:
            await tg.start(_reload_on_sighup, reloader, watcher)
        task_status.started()
        while True:
            await anyio.sleep(POLICY_POLL_S)
            if watcher is not None and watcher.changed():
                await watcher.reload("the config file changed")
            if reloader.changed():
                reloader.reload(reason="a policy file changed")


async def _reload_on_sighup(
    reloader: PolicyReloader,
    watcher: ConfigReloader | None = None,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    with anyio.open_signal_receiver(signal.SIGHUP) as signals:
        task_status.started()
        async for _ in signals:
            if watcher is not None:
                await watcher.reload("SIGHUP")
            reloader.reload(reason="SIGHUP")


__all__ = ["build_agent", "config_dir", "load_service_policy", "run_service", "serve", "watch_policy"]
