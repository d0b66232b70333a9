"""The dashboard's HTTP server: loopback only, a token to get in, read-only routes.

Anyone on the machine can reach a loopback port, so the address alone grants
nothing: the URL printed at start carries a random token, checked in constant
time; the first visit trades it for an HttpOnly, SameSite=Strict cookie and is
redirected to the same page without it (so it stays out of the history).  Every
other request without the cookie is refused with 403.  Every answer carries a
Content-Security-Policy that lets the page load only the package's own style sheet
and script, and no CORS header: another site's page can neither read an answer nor
frame one.  Only GET and HEAD are served; nothing is ever written to the daemon.

The standard library's threading server is enough here: one thread per request.  A
page's script asks ``/live.json`` once a second, answered from the shared `Poller`:
however many pages are open, the daemon answers one ``status`` request a second.
"""

from __future__ import annotations

import hmac
import json
import secrets
import socket
from http import HTTPStatus
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from jobwarden.control.client import DaemonBusy, DaemonUnreachable
from jobwarden.dashboard.drills import Drills
from jobwarden.dashboard.pages import Pages, age, row_fields
from jobwarden.dashboard.poller import Poller, PollFailed
from jobwarden.dashboard.source import Source, Table, now
from jobwarden.protocol import ControlError
from jobwarden.states import JobState

POLICY = (
    "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
STATIC = {"dashboard.css": "text/css", "live.js": "text/javascript"}
STATES = tuple(state.value for state in JobState)


class Dashboard(ThreadingHTTPServer):
    """The server, its token, the shared poller and the pages."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        source: Source,
        drills: Drills | None = None,
        token: str | None = None,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, Handler)
        self.host = address[0]
        self.source = source
        self.token = token or secrets.token_urlsafe(32)
        self.poller = Poller(source.table)
        self.drills = drills or Drills(())
        self.pages = Pages(drills=bool(self.drills.folders))

    @property
    def cookie(self) -> str:
        """The cookie's name: one per port, as browsers keep cookies per host."""
        return f"jobwarden_dashboard_{self.server_address[1]}"

    @property
    def url(self) -> str:
        """The address to open, token included."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.server_address[1]}/?token={self.token}"

    def serve(self) -> None:
        """Serve until `shutdown`."""
        self.poller.start()
        try:
            self.serve_forever(poll_interval=0.2)
        finally:
            self.poller.stop()

    def allows(self, given: str | None) -> bool:
        """Whether ``given`` is the token, compared in constant time."""
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())


class NotFound(Exception):
    """Raised by a route for a page that does not exist; its message says which."""


class Handler(BaseHTTPRequestHandler):
    """One request."""

    server: Dashboard
    protocol_version = "HTTP/1.1"
    server_version = "jobwarden-dashboard"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the dashboard's requests are not the daemon's evidence."""

    def log_error(self, format: str, *args: Any) -> None:
        """Failures go to stderr, as the base class writes them."""
        super().log_message(format, *args)

    def do_HEAD(self) -> None:
        """As GET, without the body."""
        self.do_GET()

    def do_GET(self) -> None:
        """Check the token, then route."""
        parts = urlsplit(self.path)
        query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        if "token" in query:
            if not self.server.allows(query.pop("token")):
                self.refuse()
                return
            rest = "&".join(f"{quote(k)}={quote(v)}" for k, v in query.items())
            cookie = f"{self.server.cookie}={self.server.token}; HttpOnly; SameSite=Strict; Path=/"
            self.answer(
                HTTPStatus.SEE_OTHER,
                b"",
                "text/plain",
                {"Location": parts.path + (f"?{rest}" if rest else ""), "Set-Cookie": cookie},
            )
            return
        jar = SimpleCookie(self.headers.get("Cookie", ""))
        morsel = jar.get(self.server.cookie)
        if not self.server.allows(morsel.value if morsel else None):
            self.refuse()
            return
        try:
            self.route(parts.path, query)
        except NotFound as missing:
            self.page(HTTPStatus.NOT_FOUND, "error.html", status="not found", message=str(missing))
        except ControlError as error:
            status = HTTPStatus.NOT_FOUND if "no_such" in error.code else HTTPStatus.BAD_GATEWAY
            self.page(status, "error.html", status=error.code, message=error.message)
        except (DaemonUnreachable, DaemonBusy, PollFailed) as error:
            message = getattr(error, "message", str(error))
            self.page(
                HTTPStatus.SERVICE_UNAVAILABLE, "error.html", status="wardend", message=message
            )
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as error:  # noqa: BLE001 - a page that fails says why, the server lives
            self.log_error("%s failed: %r", self.path, error)
            self.page(
                HTTPStatus.INTERNAL_SERVER_ERROR,
                "error.html",
                status="internal error",
                message=f"{type(error).__name__}: {error}",
            )

    def do_POST(self) -> None:
        """Refused: the dashboard is read-only."""
        self.answer(HTTPStatus.METHOD_NOT_ALLOWED, b"read-only\n", "text/plain", {"Allow": "GET"})

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_POST

    def refuse(self) -> None:
        """403, and nothing said about what is behind."""
        self.answer(
            HTTPStatus.FORBIDDEN, b"open the URL wardenctl dashboard printed\n", "text/plain"
        )

    def route(self, path: str, query: dict[str, str]) -> None:
        """The page at ``path``."""
        parts = [part for part in path.split("/") if part]
        source = self.server.source
        if not parts:
            chosen = query.get("state", "")
            table = self.server.poller.latest()
            rows = [row for row in table.rows if not chosen or row.state == chosen]
            self.page(
                HTTPStatus.OK,
                "jobs.html",
                rows=rows,
                health=table.health,
                states=STATES,
                chosen=chosen,
            )
        elif parts == ["live.json"]:
            body = live_message(self.server.poller.latest(), query.get("state", ""))
            self.answer(HTTPStatus.OK, body, "application/json")
        elif parts[0] == "static" and len(parts) == 2 and parts[1] in STATIC:
            body = resources.files("jobwarden.dashboard").joinpath("static", parts[1]).read_bytes()
            self.answer(HTTPStatus.OK, body, STATIC[parts[1]])
        elif parts[0] == "job" and len(parts) == 2:
            job = source.job(parts[1])
            self.page(
                HTTPStatus.OK,
                "job.html",
                job=job,
                now=now(),
                curves=source.curves(parts[1]),
                incidents=source.incidents(parts[1]),
                checkpoints=source.checkpoints(parts[1]),
            )
        elif parts[0] == "job" and len(parts) == 3 and parts[2] == "tail":
            stream = query.get("stream", "events")
            if stream not in ("events", "stderr") or not query.get("attempt", "").isdigit():
                raise NotFound("a tail is of events or stderr, of one attempt")
            attempt = int(query["attempt"])
            lines = source.tail(parts[1], attempt, stream)
            self.page(
                HTTPStatus.OK,
                "tail.html",
                job=parts[1],
                attempt=attempt,
                stream=stream,
                lines=lines,
            )
        elif parts == ["incidents"]:
            self.page(HTTPStatus.OK, "incidents.html", incidents=source.incidents())
        elif parts[0] == "incident" and len(parts) == 2:
            found = [i for i in source.incidents() if i.id == parts[1]]
            if not found:
                raise NotFound(f"no incident {parts[1]!r:.80}")
            self.page(
                HTTPStatus.OK, "incident.html", incident=found[0], runbook=source.runbook(parts[1])
            )
        elif parts == ["drills"]:
            self.page(HTTPStatus.OK, "drills.html", drills=self.server.drills.listing())
        elif parts[0] == "drill" and len(parts) == 2:
            try:
                drill = self.server.drills.read(parts[1])
            except KeyError:
                raise NotFound(f"no drill {parts[1]!r:.80} in the folders given") from None
            self.page(HTTPStatus.OK, "drill.html", drill=drill)
        else:
            raise NotFound(f"no page {path!r:.80}")

    def page(self, code: HTTPStatus, template: str, **values: Any) -> None:
        """A rendered template."""
        body = self.server.pages.render(template, **values).encode()
        self.answer(code, body, "text/html; charset=utf-8")

    def answer(
        self, status: HTTPStatus, body: bytes, kind: str, extra: dict[str, str] | None = None
    ) -> None:
        """One whole answer with the dashboard's headers."""
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for name, value in {**HEADERS, **(extra or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def live_message(table: Table, chosen: str) -> bytes:
    """One live update: the rows of the chosen state (every row without one) and health."""
    health = table.health
    rows = [row_fields(row) for row in table.rows if not chosen or row.state == chosen]
    return json.dumps(
        {
            "rows": rows,
            "health": {
                "uptime": age(health.uptime_s),
                "jobs": health.jobs,
                "backlog": health.backlog,
                "needs_attention": health.needs_attention,
                "rejected": health.rejected,
            },
        },
        separators=(",", ":"),
    ).encode()
