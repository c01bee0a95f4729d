"""The operator's HTTP endpoint inside ``agentwake run`` (aiohttp): probes, metrics and the approvals page.

    GET  /healthz      200 {"status": "ok"}; 503 with the reason while stopping, or when the store
                       cannot be written (agentwake.web.health)
    GET  /readyz       200 when every configured server is connected or deliberately ended and the
                       model's circuit breaker is closed; 503 listing what is not
                       (both open to probes; with a token configured, the errors' details are
                       for its holders only)
    GET  /metrics      Prometheus text (agentwake.metrics)
    GET  /             the approvals page: held events, newest first (sanitized data, rule, the
                       tools approving allows; tick several to answer them at once), what is
                       paused (pause and resume), the limits with their use, recent answers, runs
                       and events; its lists refresh in place (never over a half-written note)
    GET  /events, /events/{row}, /runs, /runs/{id}   lists (filtered, paged) and detail pages
                       (agentwake.web.browse)
    POST /approvals/bulk, GET/POST /pauses, POST /pauses/resume, DELETE /pauses, GET /limits
                       (agentwake.web.control)
    GET  /approvals    the page too; with ``Accept: application/json`` the held events as JSON
                       (the page's sanitized view): {"held": [...], "total": N}
    POST /approvals/{row}/approve   form: note       the event goes back to the inbox; the worker
    POST /approvals/{row}/deny      form: reason     is woken at once and runs the agent on it
                       (form: on_behalf_of, e.g. slack:U0123ABCD: who a bearer token with the
                       approve scope relays the answer for; recorded as who answered)
    GET, POST /login, POST /logout

Scopes: read (the pages, GET /approvals, /events, /runs, /limits, /pauses), approve (the answers,
pausing and resuming), metrics (/metrics). Every answer
is recorded in the store's audit trail with who gave it (the token's name, or the identity it
relays), from where (the client address) and when: from the authenticated caller, never from
the request's body. Who may do what is agentwake.web.access. The service starts it when
``[service] listen`` is set.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

import anyio
import anyio.abc
from aiohttp import web

from agentwake.delivery.receiver import listen_url
from agentwake.errors import ConfigError, StoreError
from agentwake.redaction import redact
from agentwake.store.browse import EventFilter, RunFilter
from agentwake.store.pauses import as_dict
from agentwake.store.records import Answerer
from agentwake.web import browse, control
from agentwake.web.access import (
    HSTS,
    SESSION_COOKIE,
    EndpointSettings,
    LoginThrottle,
    OpenFormTokens,
    Session,
    loopback_host_header,
    same_origin,
)
from agentwake.web.pages import (
    CONTENT_SECURITY_POLICY,
    TEMPLATES,
    answer_shown,
    granted_tools,
    held_event,
    recent_event,
    recent_run,
    shown,
)
from agentwake.web.sessions import StoredSessions

if TYPE_CHECKING:
    from agentwake.store import Store
    from agentwake.supervisor import Supervisor
    from agentwake.web.health import Health

logger = logging.getLogger(__name__)

PROBES: Final = frozenset({"/healthz", "/readyz"})
# Server states /readyz counts as ready (Supervisor.readiness).
READY_STATES: Final = frozenset({"connected", "ended"})
RECENT_RUNS: Final = 20
# Held events shown at once, newest first; /events?state=held and `agentwake approvals` list them all.
HELD_SHOWN: Final = 100
RECENT_EVENTS: Final = 30
# How often the page refreshes its lists in place.
LIVE_MS: Final = 10_000
# The one-line sanitized data of a held event in the JSON listing.
SUMMARY_CHARS: Final = 500
# A note or reason typed on the page is kept to this many characters.
NOTE_CHARS: Final = 1000
# Forms are small; anything bigger is refused before it is read.
MAX_REQUEST_BYTES: Final = 64 * 1024
# The recent answers (the audit trail) on the page and in the JSON listing.
RECENT_ANSWERS: Final = 20
# Who a bearer token relays an answer for: "<system>:<id>", e.g. slack:U0123ABCD.
ON_BEHALF_OF: Final = re.compile(r"[a-z][a-z0-9-]{0,15}:[A-Za-z0-9._@-]{1,64}")
# At a stop, requests in progress get this long to finish.
SHUTDOWN_TIMEOUT_S: Final = 1.0


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request comes from: a token (as bearer, or the session a login with it made), or anyone
    at an open endpoint; ``name`` is the token's (who acts), ``scopes`` what it may do."""

    via: Literal["bearer", "session", "open"]
    name: str
    scopes: frozenset[str]
    session: Session | None = None


# Who a route is for: probes (open), the login form (anyone), members (a token, or open loopback).
Access = Literal["probe", "login", "member"]
Handler = Callable[[web.Request, Caller | None], Awaitable[web.Response]]
RouteHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Form = Any  # what request.post() gives: a MultiDictProxy of str (or file) values


def _wants_html(request: web.Request) -> bool:
    return "text/html" in request.headers.get("Accept", "")


def _wants_json(request: web.Request) -> bool:
    return "application/json" in request.headers.get("Accept", "")


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=lambda v: json.dumps(v, ensure_ascii=False))


def _see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


async def _form(request: web.Request) -> Form | None:
    """The request's form; None when it cannot be read as text (not UTF-8, malformed)."""
    try:
        return await request.post()
    except ValueError:  # UnicodeDecodeError included
        return None


def _security_headers(secure: Callable[[web.Request], bool]) -> Callable[..., Awaitable[None]]:
    """The headers every answer carries; HSTS on those given over https."""

    async def add(request: web.Request, response: web.StreamResponse) -> None:
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("X-Frame-Options", "DENY")
        # Not no-referrer: under it browsers send "Origin: null" with our own forms, which same_origin refuses.
        response.headers.setdefault("Referrer-Policy", "same-origin")
        response.headers.setdefault("Cache-Control", "no-store")
        if secure(request):
            response.headers.setdefault("Strict-Transport-Security", HSTS)

    return add


class Endpoint:
    """The endpoint of one running service: its store, its supervisor (readiness, the worker) and health."""

    def __init__(
        self, settings: EndpointSettings, store: Store, supervisor: Supervisor, health: Health
    ) -> None:
        self.settings = settings
        self.store = store
        self.supervisor = supervisor
        self.health = health
        self.sessions = StoredSessions(
            store,
            {token.name: token for token in settings.tokens},
            ttl_s=settings.session_ttl_s,
            idle_s=settings.session_idle_s,
        )
        self.live_ms = LIVE_MS
        self.open_forms = OpenFormTokens()
        self.throttle = LoginThrottle()
        self.url: str | None = None  # once listening

    # ---- serving ---------------------------------------------------------------------------------

    def application(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.on_response_prepare.append(_security_headers(self.secure))
        routes = app.router
        routes.add_get("/healthz", self._admitted(self.healthz, "probe"))
        routes.add_get("/readyz", self._admitted(self.readyz, "probe"))
        routes.add_get("/metrics", self._admitted(self.metrics, scope="metrics"))
        routes.add_get("/", self._admitted(self.index, scope="read"))
        routes.add_get("/approvals", self._admitted(self.approvals, scope="read"))
        routes.add_post(r"/approvals/{row:\d+}/approve", self._admitted(self.approve, scope="approve"))
        routes.add_post(r"/approvals/{row:\d+}/deny", self._admitted(self.deny, scope="approve"))
        routes.add_post("/approvals/bulk", self._admitted(self._bound(control.bulk_answer), scope="approve"))
        routes.add_get("/events", self._admitted(self._bound(browse.events_list), scope="read"))
        routes.add_get(
            r"/events/{row:\d{1,19}}", self._admitted(self._bound(browse.event_page), scope="read")
        )
        routes.add_get("/runs", self._admitted(self._bound(browse.runs_list), scope="read"))
        routes.add_get(r"/runs/{run:\d{1,19}}", self._admitted(self._bound(browse.run_page), scope="read"))
        routes.add_get("/pauses", self._admitted(self._bound(control.pauses), scope="read"))
        routes.add_post("/pauses", self._admitted(self._bound(control.pause), scope="approve"))
        routes.add_post("/pauses/resume", self._admitted(self._bound(control.resume), scope="approve"))
        routes.add_delete("/pauses", self._admitted(self._bound(control.resume), scope="approve"))
        routes.add_get("/limits", self._admitted(self._bound(control.limits), scope="read"))
        routes.add_get("/login", self._admitted(self.login_page, "login"))
        routes.add_post("/login", self._admitted(self.login, "login"))
        routes.add_post("/logout", self._admitted(self.logout))
        return app

    def _bound(
        self, handler: Callable[[Endpoint, web.Request, Caller | None], Awaitable[web.Response]]
    ) -> Handler:
        async def bound(request: web.Request, caller: Caller | None) -> web.Response:
            return await handler(self, request, caller)

        return bound

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; reports started once listening (``url`` has the bound port)."""
        context = self.settings.tls_context()
        scheme = "https" if context is not None else "http"
        runner = web.AppRunner(
            self.application(), handle_signals=False, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.settings.host, self.settings.port, ssl_context=context)
            try:
                await site.start()
            except OSError as exc:
                where = listen_url(scheme, self.settings.host, self.settings.port)
                raise ConfigError(
                    f"the service endpoint cannot listen on {where}: {exc.strerror or exc};"
                    " check [service] listen"
                ) from None
            port = int(runner.addresses[0][1])
            self.url = listen_url(scheme, self.settings.host, port)
            logger.info("service endpoint listening on %s (%s)", self.url, self._access_note())
            task_status.started()
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await runner.cleanup()

    def _access_note(self) -> str:
        if self.settings.open:
            return "open: no access token, loopback only; set [service] token_env to require one"
        named = ", ".join(f"{t.name} (${t.env}: {' '.join(sorted(t.scopes))})" for t in self.settings.tokens)
        if [t.name for t in self.settings.tokens] == ["operator"]:
            named = f"the token in ${self.settings.token_env}"
        return f"{named} is required, except for /healthz and /readyz"

    # ---- where a request comes from --------------------------------------------------------------

    def client(self, request: web.Request) -> str:
        """The client's address: the TCP peer, or what a trusted proxy says in X-Forwarded-For."""
        peer = request.remote or "unknown"
        if not self.settings.trusted(peer):
            return peer
        forwarded = ",".join(request.headers.getall("X-Forwarded-For", []))
        # From the right: the first address the trusted proxies did not add themselves.
        for hop in reversed([h.strip() for h in forwarded.split(",") if h.strip()]):
            try:
                address = str(ipaddress.ip_address(hop))
            except ValueError:
                return peer  # a garbled header: the proxy is all we know
            if not self.settings.trusted(address):
                return address
        return peer

    def secure(self, request: web.Request) -> bool:
        """Whether the request came over https: TLS here, or a trusted proxy's X-Forwarded-Proto."""
        if self.settings.tls:
            return True
        if self.settings.trusted(request.remote):
            proto = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
            return proto == "https"
        return False

    # ---- who gets in -----------------------------------------------------------------------------

    def _admitted(
        self, handler: Handler, access: Access = "member", scope: str | None = None
    ) -> RouteHandler:
        """``handler`` behind the access rules (agentwake.web.access), told who was let in."""

        async def admitted(request: web.Request) -> web.StreamResponse:
            found = await self._admit(request, access, scope)
            if isinstance(found, web.StreamResponse):
                return found
            return await handler(request, found)

        return admitted

    async def _admit(
        self, request: web.Request, access: Access, scope: str | None = None
    ) -> Caller | web.Response | None:
        """Who the request comes from, or the refusal to answer it with; None: a caller without a
        token where ``access`` lets one in (a probe, the login form)."""
        if access == "probe":
            # Open to probes; with tokens configured, only their holders see why (errors name hosts, paths).
            if self.settings.open:
                return Caller("open", "open", frozenset())
            return await self._authenticate(request)  # a wrong token is a 401 here too
        caller: Caller | None
        if self.settings.open:
            if not loopback_host_header(request.host):
                # An open endpoint answers loopback names only: a DNS-rebound page cannot reach it.
                return _json({"error": "this endpoint answers loopback host names only"}, 403)
            session = await self.sessions.get(request.cookies.get(SESSION_COOKIE))
            caller = Caller("open", "open", frozenset({"read", "approve", "metrics"}), session)
        else:
            found = await self._authenticate(request)
            if isinstance(found, web.Response):
                return found
            caller = found
            if caller is None and access != "login":
                return self._unauthorized(request)
        if caller is not None and scope is not None and scope not in caller.scopes:
            return _json(
                {
                    "error": f"the token {caller.name!r} does not have the {scope!r} scope this needs"
                    f" (its scopes: {', '.join(sorted(caller.scopes)) or 'none'})"
                },
                403,
            )
        if request.method == "DELETE" and caller is not None and caller.via != "bearer":
            # No form carries a CSRF token with a DELETE: it is for tools with a bearer token.
            return _json({"error": "DELETE is for a bearer token; the page posts its forms"}, 403)
        if request.method == "POST":
            if not same_origin(
                request.headers.get("Origin"), request.headers.get("Sec-Fetch-Site"), request.host
            ):
                return _json({"error": "cross-site request refused"}, 403)
            if caller is not None and caller.via != "bearer" and access != "login":
                # The cookie is sent by the browser on its own: the form must prove it came from our page.
                form = await _form(request)
                if form is None:
                    return _json({"error": "the form is not readable UTF-8 text"}, 401)
                presented = form.get("csrf")
                if not isinstance(presented, str) or not self._csrf_valid(caller, presented):
                    return _json({"error": "missing or stale form token (CSRF): reload the page"}, 403)
        return caller

    def _csrf_valid(self, caller: Caller, presented: str) -> bool:
        if caller.session is not None and caller.session.csrf_matches(presented):
            return True
        # Open: the page's form token is signed, not stored (a visit makes no session).
        return caller.via == "open" and self.open_forms.valid(presented)

    async def _authenticate(self, request: web.Request) -> Caller | web.Response | None:
        """A bearer token (a wrong or malformed one is a 401 at once) or a session cookie; None: neither."""
        header = request.headers.get("Authorization")
        if header is not None:
            scheme, _, presented = header.partition(" ")
            if scheme.lower() == "bearer" and presented.strip():
                token = self.settings.accepts(presented.strip())
                if token is not None:  # a right token is never refused for others' mistakes
                    return Caller("bearer", token.name, token.scopes)
                return self._wrong_token(request)
        cookie = request.cookies.get(SESSION_COOKIE)
        session = await self.sessions.get(cookie) if cookie else None
        if session is None or session.token is None:
            return None
        return Caller("session", session.token, session.scopes, session)

    def _wrong_token(self, request: web.Request, *, form: bool = False) -> web.Response:
        """A wrong (or malformed) token: counted against its client; 429 once the client is over its limit."""
        client = self.client(request)
        if self.throttle.blocked(client):
            message = "too many wrong tokens from this address; try again in a minute"
            if form:
                return self._login_form(message[0].upper() + message[1:] + ".", status=429)
            return _json({"error": message}, 429)
        if self.throttle.failed(client):  # once per address and window: a flood is no log flood
            logger.warning("service endpoint: a wrong access token was presented (from %s)", client)
        if form:
            return self._login_form("That is not the access token.", status=401)
        return self._unauthorized(request, "wrong token")

    def _unauthorized(self, request: web.Request, error: str | None = None) -> web.Response:
        if request.method == "GET" and _wants_html(request):
            return self._login_form(error, status=401)
        return web.json_response(
            {"error": error or "this endpoint needs an access token (Authorization: Bearer ...)"},
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
            secure=self.secure(request),
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
        worker = self.supervisor.worker
        if worker is not None and worker.breaker.is_open:
            # Events arrive but nothing acts on them: not ready, for as long as the model fails.
            model = worker.breaker.reason() if detailed else "failing"
            return _json({"status": "not ready", "model": model, "servers": servers}, 503)
        # A paused service is ready (it takes events in, on purpose runs nothing for them): say what.
        pauses = worker.pauses.current if worker is not None else ()
        paused = [as_dict(p) if detailed else {"scope": p.scope, "name": p.name} for p in pauses]
        return _json({"status": "ready", "servers": servers, "paused": paused})

    async def metrics(self, request: web.Request, caller: Caller | None) -> web.Response:
        from agentwake.metrics import CONTENT_TYPE, exposition

        owners = self.supervisor.owners
        body = await exposition(self.store, process=owners.owner if owners.shared else None)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    # ---- the page --------------------------------------------------------------------------------

    def chrome(self, caller: Caller) -> dict[str, Any]:
        """What every page's frame needs: the forms' CSRF token, who is in, whether they may act."""
        session = caller.session
        # Forms need a CSRF token: the session's, or (open, no session) one signed by this process.
        csrf = (
            session.csrf if session is not None else self.open_forms.issue() if caller.via == "open" else ""
        )
        return {
            "csrf": csrf,
            "who": caller.name,
            "logout": caller.via == "session",
            "can_approve": "approve" in caller.scopes,
            "can_operate": "approve" in caller.scopes,
            "live_ms": 0,
        }

    async def _held(self) -> tuple[list[Any], int]:
        """The held events the page shows, newest first, and how many are held."""
        config = self.supervisor.config
        worker = self.supervisor.worker
        policy = worker.policy if worker is not None else None
        all_held = await self.store.approvals()
        newest = sorted(all_held, key=lambda h: int(h["id"]), reverse=True)[:HELD_SHOWN]
        return [(h, held_event(h, config, policy)) for h in newest], len(all_held)

    async def index(self, request: web.Request, caller: Caller | None) -> web.Response:
        assert caller is not None  # _admit lets no one else in
        session = caller.session
        config = self.supervisor.config
        held, held_total = await self._held()
        actions = await self.store.actions(RECENT_RUNS)
        rows_of = {
            r["run_id"]: r["event_row"] for r in (await self.store.run_page(RunFilter(), 0, RECENT_RUNS))[0]
        }
        runs = [recent_run({**a, "event_row": rows_of.get(a["run_id"])}) for a in actions]
        events = [
            recent_event(e, config) for e in (await self.store.event_page(EventFilter(), 0, RECENT_EVENTS))[0]
        ]
        answers = [answer_shown(a) for a in await self.store.answers(RECENT_ANSWERS)]
        pauses = [
            {**as_dict(p), "what": "everything" if p.scope == "all" else f"{p.scope} {shown(p.name)}"}
            for p in await self.store.pauses()
        ]
        flash, problem = [], self.health.problem()
        if session is not None:
            flash = list(session.flash)
            session.flash.clear()
        html = TEMPLATES.get_template("index.html").render(
            held=[event for _, event in held],
            held_total=held_total,
            runs=runs,
            events=events,
            answers=answers,
            pauses=[{k: shown(v) if isinstance(v, str) else v for k, v in p.items()} for p in pauses],
            pause_names=await control.pause_names(self),
            limits=await control.limit_rows(self),
            flash=flash,
            health="running" if problem is None else shown(redact(problem)[0]),
            servers={name: shown(redact(state)[0]) for name, state in self.supervisor.readiness().items()},
            note_chars=NOTE_CHARS,
            **{**self.chrome(caller), "live_ms": self.live_ms},
        )
        return web.Response(text=html, content_type="text/html")

    async def approvals(self, request: web.Request, caller: Caller | None) -> web.Response:
        if not _wants_json(request):
            return await self.index(request, caller)
        held, total = await self._held()
        listed = []
        for raw, event in held:
            entry: dict[str, Any] = {
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
            if event.authority is not None:
                entry["authority"] = event.authority
            listed.append(entry)
        answers = [answer_shown(a) for a in await self.store.answers(RECENT_ANSWERS)]
        return _json({"held": listed, "total": total, "answered": answers})

    async def approve(self, request: web.Request, caller: Caller | None) -> web.Response:
        return await self._answer(request, caller, approve=True)

    async def deny(self, request: web.Request, caller: Caller | None) -> web.Response:
        return await self._answer(request, caller, approve=False)

    def answerer(self, request: web.Request, caller: Caller, relayed: object) -> Answerer | str:
        """Who answers (or pauses), from the authenticated caller (never from the form, but for a
        relayed identity from a token with the approve scope); a str: why the request is refused."""
        client = self.client(request)
        if relayed is None or relayed == "":
            if caller.via == "open":
                return Answerer("open", "open endpoint (no token)", client)
            how = "bearer token" if caller.via == "bearer" else "browser session"
            return Answerer(caller.name, f"{how} {caller.name}", client)
        if not isinstance(relayed, str) or not ON_BEHALF_OF.fullmatch(relayed):
            return "on_behalf_of must be SYSTEM:ID (e.g. slack:U0123ABCD): lower-case system, then letters, digits, . _ @ -"
        if caller.via == "bearer":  # the approve scope was checked by _admit
            return Answerer(relayed, f"relayed by token {caller.name}", client)
        if caller.via == "open":
            return Answerer(relayed, "relayed through the open endpoint (no token: unverified)", client)
        return "on_behalf_of is for a relaying token (Authorization: Bearer), not a browser session"

    def log_action(self, what: str, by: Answerer) -> None:
        logger.info("%s on the service endpoint by %s (%s, from %s)", what, by.who, by.via, by.address)

    async def answer_one(
        self, row: int, *, approve: bool, typed: object, answerer: Answerer
    ) -> tuple[int, str]:
        """Answer one held event and record who did; the HTTP status and the message to show."""
        note = (typed.strip()[:NOTE_CHARS] or None) if isinstance(typed, str) else None
        shown_id = f"row {row}"
        try:
            event = await self.store.event(row)
            shown_id = shown(event.event_id)
            tools = granted_tools(event.decision, event.subscription, self.supervisor.config)
            await self.store.answer(row, approve=approve, note=note, by=answerer, tools=tools)
        except StoreError as exc:
            return 409, f"event {shown_id}: {exc}"
        if approve:
            if self.supervisor.worker is not None:
                self.supervisor.worker.wake()
            message = f"approved {shown_id}: the agent runs on it now"
        else:
            message = f"denied {shown_id}" + (f": {shown(note)}" if note else "")
        logger.info(
            "event %s (%s) %s on the service endpoint by %s (%s, from %s)",
            event.event_id,
            event.subscription,
            "approved" if approve else "denied",
            answerer.who,
            answerer.via,
            answerer.address,
        )
        return 200, message

    async def _answer(self, request: web.Request, caller: Caller | None, *, approve: bool) -> web.Response:
        assert caller is not None  # _admit lets no one else in
        row = int(request.match_info["row"])
        form = await _form(request)
        if form is None:
            return _json({"ok": False, "message": "the form is not readable UTF-8 text"}, 400)
        answerer = self.answerer(request, caller, form.get("on_behalf_of"))
        if isinstance(answerer, str):
            return _json({"ok": False, "message": answerer}, 400)
        status, message = await self.answer_one(
            row, approve=approve, typed=form.get("note" if approve else "reason"), answerer=answerer
        )
        if _wants_json(request) or caller.via == "bearer":
            return _json({"ok": status == 200, "message": message}, status)
        return await self.back_to_page(request, caller, message, "/")

    async def back_to_page(
        self, request: web.Request, caller: Caller, message: str, where: str
    ) -> web.Response:
        """A browser's form was handled: back to the page, ``message`` shown there once."""
        response = _see_other(where)
        session = caller.session
        if session is None and caller.via == "open":
            # Open: the first answer of a browser makes its session, to carry the message to the page.
            session = await self.sessions.create()
            self._set_session(request, response, session)
        if session is not None:
            session.flash.append(message)
        return response

    # ---- logging in and out ----------------------------------------------------------------------

    def _login_form(self, error: str | None = None, *, status: int = 200) -> web.Response:
        html = TEMPLATES.get_template("login.html").render(token_env=self.settings.token_env, error=error)
        return web.Response(text=html, content_type="text/html", status=status)

    async def login_page(self, request: web.Request, caller: Caller | None) -> web.Response:
        if self.settings.open or caller is not None:
            return _see_other("/")
        return self._login_form()

    async def login(self, request: web.Request, caller: Caller | None) -> web.Response:
        if self.settings.open:
            return _see_other("/")
        form = await _form(request)
        presented = form.get("token") if form is not None else None
        token = self.settings.accepts(presented.strip()) if isinstance(presented, str) else None
        if token is None:
            return self._wrong_token(request, form=True)
        if "read" not in token.scopes:
            return self._login_form(
                f"The token {token.name!r} cannot read this page (its scopes: {', '.join(sorted(token.scopes))}).",
                status=403,
            )
        session = await self.sessions.create(token)
        response = _see_other("/")
        self._set_session(request, response, session)
        return response

    async def logout(self, request: web.Request, caller: Caller | None) -> web.Response:
        if caller is not None and caller.session is not None:
            await self.sessions.end(caller.session.id)
        response = _see_other("/" if self.settings.open else "/login")
        response.del_cookie(SESSION_COOKIE, path="/")
        return response


__all__ = ["PROBES", "READY_STATES", "Caller", "Endpoint"]
