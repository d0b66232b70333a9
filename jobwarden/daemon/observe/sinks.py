"""Where notifications go: an exec hook or a webhook, one try per call.

A try is judged by what the sink itself answers: a hook by its exit, a
webhook by its status (a redirect is never followed, since urllib would
re-send the POST as a GET without its body).
"""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from jobwarden import __version__
from jobwarden.daemon.observe.notify import child_environment
from jobwarden.daemon.store.evidence import describe

ERROR_CHARS = 300
"""Of a hook's stderr, this much is kept in the log."""


class DeliveryError(Exception):
    """Raised by a sink when one try failed; the message is what the log keeps."""


class Sink(Protocol):
    """Where events go: one try per call, `DeliveryError` when it failed."""

    name: str

    def deliver(self, body: bytes, event: Mapping[str, Any]) -> None:
        """Deliver one event, or raise `DeliveryError`."""


def environment_of(event: Mapping[str, Any]) -> dict[str, str]:
    """The ``JOBWARDEN_EVENT*`` variables an exec hook gets beside the JSON on stdin."""
    names = {"event": "JOBWARDEN_EVENT", "time": "JOBWARDEN_EVENT_TIME"}
    env = {}
    for key in ("event", "time", "job", "from", "to", "incident", "kind", "status"):
        value = event.get(key)
        if value is not None:
            env[names.get(key, f"JOBWARDEN_EVENT_{key.upper()}")] = str(value)
    return env


class ExecHook:
    """Runs a program per event: argv[0] only, no shell, the event on stdin."""

    name = "exec"

    def __init__(
        self, program: str, environ: Mapping[str, str], cwd: Path, timeout_s: float
    ) -> None:
        self.program = program
        self.environment = child_environment(environ)
        self.cwd = cwd
        self.timeout_s = timeout_s

    def deliver(self, body: bytes, event: Mapping[str, Any]) -> None:
        """Run the hook once; a non-zero exit, a timeout or a failed start is a failed try."""
        try:
            done = subprocess.run(  # the operator's own program, no shell
                [self.program],
                input=body,
                env={**self.environment, **environment_of(event)},
                cwd=self.cwd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as error:
            raise DeliveryError(f"no exit within {self.timeout_s} s (killed)") from error
        except OSError as error:
            raise DeliveryError(f"could not start: {error}") from error
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip()[-ERROR_CHARS:]
            raise DeliveryError(f"exit status {done.returncode}" + (f": {tail}" if tail else ""))


class Unredirected(urllib.request.HTTPRedirectHandler):
    """Follows no redirect: urllib would re-send a POST as a GET without its body."""

    def redirect_request(self, *args: Any) -> None:
        return None


class Webhook:
    """POSTs each event as application/json to an http or https URL."""

    name = "webhook"

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s

    def deliver(self, body: bytes, event: Mapping[str, Any]) -> None:
        """POST once; anything but a 2xx status within the timeout is a failed try."""
        request = urllib.request.Request(  # noqa: S310 - the scheme is checked at start
            self.url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": f"jobwarden/{__version__}",
                "X-Jobwarden-Event": str(event["event"]),
            },
        )
        opener = urllib.request.build_opener(Unredirected)
        try:
            with opener.open(request, timeout=self.timeout_s) as reply:
                reply.read(ERROR_CHARS)
        except urllib.error.HTTPError as error:
            error.close()
            text = f"HTTP {error.code} {error.reason}"
            if 300 <= error.code < 400:
                where = error.headers.get("Location")
                text += f": a redirect (to {where!r}) is not followed for a POST"
                text += "; give the URL it leads to"
            raise DeliveryError(text) from error
        except (OSError, ValueError) as error:  # URLError, timeouts, resets, a bad reply
            reason = getattr(error, "reason", error)
            text = describe(reason) if isinstance(reason, OSError) else str(reason)
            raise DeliveryError(text) from error
