"""The operator's HTTP endpoint inside ``agentwake run`` (aiohttp): probes, metrics and the approvals page.

    GET  /healthz      200 {"status": "ok"}; 503 with the reason while stopping, or when the store
                       cannot be written (agentwake.web.health)
    GET  /readyz       200 when every configured server is connected or deliberately ended; 503
                       listing the others and their state
                       (both open to probes; with a token configured, the errors' details are
                       for its holders only)
    GET  /metrics      Prometheus text (agentwake.metrics)
    GET  /             the approvals page: held events (sanitized data, rule, the tools approving
                       allows), recent runs and events
    GET  /approvals    the page too; with ``Accept: application/json`` the held events as JSON
                       (the page's sanitized view): {"held": [...], "total": N}
    POST /approvals/{row}/approve   form: note       the event goes back to the inbox; the worker
    POST /approvals/{row}/deny      form: reason     is woken at once and runs the agent on it
    GET, POST /login, POST /logout

Who may do what is agentwake.web.access. The service starts it when ``[service] listen`` is set.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

import anyio
import anyio.abc
from aiohttp import web

from agentwake.delivery.receiver import listen_url
from agentwake.errors import ConfigError, StoreError
from agentwake.redaction import redact
from agentwake.web.access import (
    SESSION_COOKIE,
    EndpointSettings,
    LoginThrottle,
    Session,
    Sessions,
    loopback_host_header,
    same_origin,
)
from agentwake.web.pages import (
    CONTENT_SECURITY_POLICY,
    TEMPLATES,
    held_event,
    recent_event,
    recent_run,
    shown,
)

if TYPE_CHECKING:
    from agentwake.store import Store
    from agentwake.supervisor import Supervisor
    from agentwake.web.health import Health

logger = logging.getLogger(__name__)

PROBES: Final = frozenset({"/healthz", "/readyz"})
# Server states /readyz counts as ready (Supervisor.readiness).
READY_STATES: Final = frozenset({"connected", "ended"})
RECENT_RUNS: Final = 20
# Held events shown at once, oldest first; `agentwake approvals` lists them all.
HELD_SHOWN: Final = 100
RECENT_EVENTS: Final = 30
# The one-line sanitized data of a held event in the JSON listing.
SUMMARY_CHARS: Final = 500
# A note or reason typed on the page is kept to this many characters.
NOTE_CHARS: Final = 1000
# Forms are small; anything bigger is refused before it is read.
MAX_REQUEST_BYTES: Final = 64 * 1024
# At a stop, requests in progress get this long to finish.
SHUTDOWN_TIMEOUT_S: Final = 1.0


@dataclass(frozen=True, slots=True)
class Caller:
    """How a request was let in: a bearer token, a browser session (the cookie), or an open endpoint."""

    via: Literal["bearer", "session", "open"]
    session: Session | None = None


# Who a route is for: probes (open), the login form (anyone), members (the token, or open loopback).
Access = Literal["probe", "login", "member"]
Handler = Callable[[web.Request, Caller | None], Awaitable[web.Response]]
RouteHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _wants_html(request: web.Request) -> bool:
    return "text/html" in request.headers.get("Accept", "")


def _wants_json(request: web.Request) -> bool:
    return "application/json" in request.headers.get("Accept", "")


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=lambda v: json.dumps(v, ensure_ascii=False))


def _see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("X-Frame-Options", "DENY")
    # Not no-referrer: under it browsers send "Origin: null" with our own forms, which same_origin refuses.
    response.headers.setdefault("Referrer-Policy", "same-origin")
    response.headers.setdefault("Cache-Control", "no-store")


class Endpoint:
    """The endpoint of one running service: its store, its supervisor (readiness, the worker) and health."""

    def __init__(
        self, settings: EndpointSettings, store: Store, supervisor: Supervisor, health: Health
    ) -> None:
        self.settings = settings
        self.store = store
        self.supervisor = supervisor
        self.health = health
        self.sessions = Sessions()
        self.throttle = LoginThrottle()
        self.url: str | None = None  # once listening

    # ---- serving ---------------------------------------------------------------------------------

    def application(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.on_response_prepare.append(_security_headers)
        routes = app.router
        routes.add_get("/healthz", self._admitted(self.healthz, "probe"))
        routes.add_get("/readyz", self._admitted(self.readyz, "probe"))
        routes.add_get("/metrics", self._admitted(self.metrics))
        routes.add_get("/", self._admitted(self.index))
        routes.add_get("/approvals", self._admitted(self.approvals))
        routes.add_post(r"/approvals/{row:\d+}/approve", self._admitted(self.approve))
        routes.add_post(r"/approvals/{row:\d+}/deny", self._admitted(self.deny))
        routes.add_get("/login", self._admitted(self.login_page, "login"))
        routes.add_post("/login", self._admitted(self.login, "login"))
        routes.add_post("/logout", self._admitted(self.logout))
        return app

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; reports started once listening (``url`` has the bound port)."""
        runner = web.AppRunner(
            self.application(), handle_signals=False, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.settings.host, self.settings.port)
            try:
                await site.start()
            except OSError as exc:
                where = listen_url("http", self.settings.host, self.settings.port)
                raise ConfigError(
                    f"the service endpoint cannot listen on {where}: {exc.strerror or exc};"
                    " check [service] listen"
                ) from None
            port = int(runner.addresses[0][1])
            self.url = listen_url("http", self.settings.host, port)
            logger.info("service endpoint listening on %s (%s)", self.url, self._access_note())
            task_status.started()
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await runner.cleanup()

    def _access_note(self) -> str:
        if self.settings.token is None:
            return "open: no access token, loopback only; set [service] token_env to require one"
        return f"the token in ${self.settings.token_env} is required, except for /healthz and /readyz"

    # ---- who gets in -----------------------------------------------------------------------------

    def _admitted(self, handler: Handler, access: Access = "member") -> RouteHandler:
        """``handler`` behind the access rules (agentwake.web.access), told who was let in."""

        async def admitted(request: web.Request) -> web.StreamResponse:
            found = await self._admit(request, access)
            if isinstance(found, web.StreamResponse):
                return found
            return await handler(request, found)

        return admitted

    async def _admit(self, request: web.Request, access: Access) -> Caller | web.Response | None:
        """Who the request comes from, or the refusal to answer it with; None: a caller without the
        token where ``access`` lets one in (a probe, the login form)."""
        if access == "probe":
            # Open to probes; with a token configured, only its holders see why (errors name hosts, paths).
            return self._authenticate(request) if self.settings.token is not None else Caller("open")
        caller: Caller | None
        if self.settings.token is None:
            if not loopback_host_header(request.host):
                # An open endpoint answers loopback names only: a DNS-rebound page cannot reach it.
                return _json({"error": "this endpoint answers loopback host names only"}, 403)
            caller = Caller("open", self.sessions.get(request.cookies.get(SESSION_COOKIE)))
        else:
            found = self._authenticate(request)
            if isinstance(found, web.Response):
                return found
            caller = found
            if caller is None and access != "login":
                return self._unauthorized(request)
        if request.method == "POST":
            if not same_origin(
                request.headers.get("Origin"), request.headers.get("Sec-Fetch-Site"), request.host
            ):
                return _json({"error": "cross-site request refused"}, 403)
            if caller is not None and caller.via != "bearer" and access != "login":
                # The cookie is sent by the browser on its own: the form must prove it came from our page.
                form = await request.post()
                presented = form.get("csrf")
                if (
                    caller.session is None
                    or not isinstance(presented, str)
                    or not caller.session.csrf_matches(presented)
                ):
                    return _json({"error": "missing or stale form token (CSRF): reload the page"}, 403)
        return caller

    def _authenticate(self, request: web.Request) -> Caller | web.Response | None:
        """A bearer token (a wrong one is a 401 at once) or a session cookie; None: neither."""
        header = request.headers.get("Authorization")
        if header is not None:
            scheme, _, presented = header.partition(" ")
            if scheme.lower() == "bearer" and presented.strip():
                if self.throttle.blocked():
                    return _json({"error": "too many wrong tokens; try again in a minute"}, 429)
                if self.settings.accepts(presented.strip()):
                    return Caller("bearer")
                self._wrong_token(request)
                return self._unauthorized(request, "wrong token")
        session = self.sessions.get(request.cookies.get(SESSION_COOKIE))
        return Caller("session", session) if session is not None else None

    def _wrong_token(self, request: web.Request) -> None:
        self.throttle.failed()
        logger.warning("service endpoint: a wrong access token was presented (from %s)", request.remote)

    def _unauthorized(self, request: web.Request, error: str | None = None) -> web.Response:
        if request.method == "GET" and _wants_html(request):
            return self._login_form(error, status=401)
        return web.json_response(
            {"error": error or "this endpoint needs its access token (Authorization: Bearer ...)"},
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="agentwake"'},
        )

    def _set_session(self, request: web.Request, response: web.StreamResponse, session: Session) -> None:
        response.set_cookie(
            SESSION_COOKIE,
            session.id,
            max_age=int(self.sessions.ttl_s),
            path="/",
            httponly=True,
            samesite="Strict",
            secure=request.secure,
        )

    # ---- probes and metrics ----------------------------------------------------------------------

    async def healthz(self, request: web.Request, caller: Caller | None) -> web.Response:
        problem = self.health.problem()
        if problem is None:
            return _json({"status": "ok"})
        status = "stopping" if self.health.stopping else "unhealthy"
        if caller is None:
            problem = problem.partition(":")[0]
        return _json({"status": status, "reason": redact(problem)[0]}, 503)

    async def readyz(self, request: web.Request, caller: Caller | None) -> web.Response:
        detailed = caller is not None
        servers = {
            name: redact(state)[0] if detailed else state.partition(":")[0]
            for name, state in self.supervisor.readiness().items()
        }
        if self.health.stopping:
            return _json({"status": "stopping", "servers": servers}, 503)
        waiting = {name: state for name, state in servers.items() if state not in READY_STATES}
        if waiting:
            return _json({"status": "not ready", "waiting": waiting, "servers": servers}, 503)
        return _json({"status": "ready", "servers": servers})

    async def metrics(self, request: web.Request, caller: Caller | None) -> web.Response:
        from agentwake.metrics import CONTENT_TYPE, exposition

        owners = self.supervisor.owners
        body = await exposition(self.store, process=owners.owner if owners.shared else None)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    # ---- the page --------------------------------------------------------------------------------

    async def index(self, request: web.Request, caller: Caller | None) -> web.Response:
        assert caller is not None  # _admit lets no one else in
        session, new = caller.session, False
        if session is None and caller.via == "open":
            session, new = self.sessions.create(), True
        config = self.supervisor.config
        worker = self.supervisor.worker
        policy = worker.policy if worker is not None else None
        all_held = await self.store.approvals()
        held = [held_event(h, config, policy) for h in all_held[:HELD_SHOWN]]
        runs = [recent_run(a) for a in await self.store.actions(RECENT_RUNS)]
        events = [recent_event(e, config) for e in await self.store.inbox(RECENT_EVENTS)]
        flash, problem = [], self.health.problem()
        if session is not None:
            flash, session.flash = session.flash, []
        html = TEMPLATES.get_template("index.html").render(
            held=held,
            held_total=len(all_held),
            runs=runs,
            events=events,
            flash=flash,
            csrf=session.csrf if session is not None else "",
            logout=caller.via == "session",
            health="running" if problem is None else shown(redact(problem)[0]),
            servers={name: shown(redact(state)[0]) for name, state in self.supervisor.readiness().items()},
            note_chars=NOTE_CHARS,
        )
        response = web.Response(text=html, content_type="text/html")
        if new and session is not None:
            self._set_session(request, response, session)
        return response

    async def approvals(self, request: web.Request, caller: Caller | None) -> web.Response:
        if not _wants_json(request):
            return await self.index(request, caller)
        config = self.supervisor.config
        worker = self.supervisor.worker
        policy = worker.policy if worker is not None else None
        all_held = await self.store.approvals()
        held = []
        for raw in all_held[:HELD_SHOWN]:
            event = held_event(raw, config, policy)
            held.append(
                {
                    "row": event.row,
                    "event_id": event.event_id,
                    "server": event.server,
                    "subscription": event.subscription,
                    "name": event.event,
                    "timestamp": shown(raw.get("timestamp")),
                    "rule": event.rule,
                    "tools": event.tools,
                    "summary": shown(event.data, SUMMARY_CHARS),
                }
            )
        return _json({"held": held, "total": len(all_held)})

    async def approve(self, request: web.Request, caller: Caller | None) -> web.Response:
        return await self._answer(request, caller, approve=True)

    async def deny(self, request: web.Request, caller: Caller | None) -> web.Response:
        return await self._answer(request, caller, approve=False)

    async def _answer(self, request: web.Request, caller: Caller | None, *, approve: bool) -> web.Response:
        assert caller is not None  # _admit lets no one else in
        row = int(request.match_info["row"])
        form = await request.post()
        typed = form.get("note" if approve else "reason")
        note = (typed.strip()[:NOTE_CHARS] or None) if isinstance(typed, str) else None
        shown_id = f"row {row}"
        try:
            event = await self.store.event(row)
            shown_id = shown(event.event_id)
            await self.store.answer(row, approve=approve, note=note)
        except StoreError as exc:
            message, status = f"event {shown_id}: {exc}", 409
        else:
            status = 200
            if approve:
                if self.supervisor.worker is not None:
                    self.supervisor.worker.wake()
                message = f"approved {shown_id}: the agent runs on it now"
            else:
                message = f"denied {shown_id}" + (f": {shown(note)}" if note else "")
            logger.info(
                "event %s (%s) %s on the service endpoint (%s)",
                event.event_id,
                event.subscription,
                "approved" if approve else "denied",
                caller.via,
            )
        if _wants_json(request) or caller.via == "bearer":
            return _json({"ok": status == 200, "message": message}, status)
        if caller.session is not None:
            caller.session.flash.append(message)
        return _see_other("/")

    # ---- logging in and out ----------------------------------------------------------------------

    def _login_form(self, error: str | None = None, *, status: int = 200) -> web.Response:
        html = TEMPLATES.get_template("login.html").render(token_env=self.settings.token_env, error=error)
        return web.Response(text=html, content_type="text/html", status=status)

    async def login_page(self, request: web.Request, caller: Caller | None) -> web.Response:
        if self.settings.token is None or caller is not None:
            return _see_other("/")
        return self._login_form()

    async def login(self, request: web.Request, caller: Caller | None) -> web.Response:
        if self.settings.token is None:
            return _see_other("/")
        if self.throttle.blocked():
            return self._login_form("Too many wrong tokens; try again in a minute.", status=429)
        form = await request.post()
        presented = form.get("token")
        if not isinstance(presented, str) or not self.settings.accepts(presented.strip()):
            self._wrong_token(request)
            return self._login_form("That is not the access token.", status=401)
        session = self.sessions.create()
        response = _see_other("/")
        self._set_session(request, response, session)
        return response

    async def logout(self, request: web.Request, caller: Caller | None) -> web.Response:
        if caller is not None and caller.session is not None:
            self.sessions.end(caller.session.id)
        response = _see_other("/login" if self.settings.token is not None else "/")
        response.del_cookie(SESSION_COOKIE, path="/")
        return response


__all__ = ["PROBES", "READY_STATES", "Caller", "Endpoint"]
