"""Notifications: an exec hook and webhooks told of job state changes and incidents."""

from __future__ import annotations

import datetime
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from jobwarden.daemon.observe.hooks import Channel
from jobwarden.daemon.observe.sinks import DeliveryError, environment_of
from tests import schemas
from tests.daemon import Daemon, linreg_job
from tests.helpers import wait_until


def lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a file, none if it does not exist yet."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def log_records(root: Path, event: str) -> list[dict[str, Any]]:
    """The daemon's log records named ``event``."""
    return [r for r in lines(root / "wardend.log") if r.get("event") == event]


class Flaky:
    """A sink failing its first ``failures`` tries, then recording what it is given."""

    name = "flaky"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.tries = 0
        self.got: list[dict[str, Any]] = []

    def deliver(self, body: bytes, event: Mapping[str, Any]) -> None:
        self.tries += 1
        if self.tries <= self.failures:
            raise DeliveryError(f"try {self.tries} refused")
        self.got.append(json.loads(body))


class Gate:
    """A sink that holds its first delivery until released, recording every event."""

    name = "gate"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.got: list[str] = []

    def deliver(self, body: bytes, event: Mapping[str, Any]) -> None:
        self.entered.set()
        self.release.wait(10)
        self.got.append(event["job"])


def started(channel: Channel) -> Channel:
    channel.thread.start()
    return channel


class TestChannel:
    """One sink's queue and thread, with a real thread and no sleeping (backoff 0)."""

    def test_a_failed_try_is_retried_and_the_event_delivered(self) -> None:
        """Two refusals, then success: delivered once, on the third try, none dropped."""
        sink = Flaky(failures=2)
        channel = started(Channel(sink, backoff_s=0))
        channel.put({"event": "job.state", "job": "a"})
        channel.close()
        assert sink.got == [{"event": "job.state", "job": "a"}]
        assert (sink.tries, channel.sent, channel.dropped) == (3, 1, 0)

    def test_an_event_failing_every_try_is_dropped_and_the_next_sent(self) -> None:
        """Three refusals drop the first event; the second still goes out."""
        sink = Flaky(failures=3)
        waits: list[float] = []
        channel = started(Channel(sink, backoff_s=0.5, sleep=waits.append))
        channel.put({"event": "job.state", "job": "lost"})
        channel.put({"event": "job.state", "job": "kept"})
        channel.close()
        assert [e["job"] for e in sink.got] == ["kept"]
        assert (channel.sent, channel.dropped) == (1, 1)
        assert waits == [0.5, 1.0]  # backoff between the three tries of the first event

    def test_a_full_queue_drops_its_oldest_event(self) -> None:
        """With two slots and a delivery stuck, a third put loses the oldest queued."""
        sink = Gate()
        channel = started(Channel(sink, size=2))
        channel.put({"event": "job.state", "job": "first"})
        assert sink.entered.wait(10)
        for job in ("second", "third", "fourth"):
            channel.put({"event": "job.state", "job": job})
        sink.release.set()
        channel.close()
        assert sink.got == ["first", "third", "fourth"]
        assert channel.overflowed == 1


def test_the_environment_names_the_event() -> None:
    """Only the fields an event has become JOBWARDEN_EVENT* variables; the time as ISO 8601."""
    event = {
        "event": "job.state",
        "time": 1.0,
        "time_iso": "t",
        "job": "a",
        "from": None,
        "to": "queued",
    }
    assert environment_of(event) == {
        "JOBWARDEN_EVENT": "job.state",
        "JOBWARDEN_EVENT_TIME": "t",
        "JOBWARDEN_EVENT_JOB": "a",
        "JOBWARDEN_EVENT_TO": "queued",
    }


HOOK = """\
import json, os, sys
event = json.loads(sys.stdin.read())
env = {k: v for k, v in os.environ.items() if k.startswith(("JOBWARDEN", "HOOK_TEST"))}
with open(OUT, "a") as out:
    out.write(json.dumps({"event": event, "env": env, "cwd": os.getcwd()}) + "\\n")
"""


@pytest.fixture
def hook(tmp_path: Path) -> tuple[Path, Path]:
    """An executable hook program (argv[0] only) and the file it appends each event to."""
    out = tmp_path / "hook.jsonl"
    program = tmp_path / "hook.py"
    program.write_text(f"#!{sys.executable}\n" + HOOK.replace("OUT", repr(str(out))))
    program.chmod(0o700)
    return program, out


def test_exec_hook_hears_every_transition_and_the_incident(
    tmp_path: Path,
    compile_cache: Path,
    hook: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A crash and its recovery: each state change and the incident reach the hook, as JSON."""
    program, out = hook
    monkeypatch.setenv("HOOK_TEST_SECRET", "not for hooks")
    root = tmp_path / "root"
    with Daemon(root, compile_cache, "--notify-exec", str(program)) as daemon:
        daemon.drop("crash.toml", linreg_job("crash", faults={"fail_after": 3}))
        assert daemon.wait("crash")["state"] == "completed"
        got = wait_until(
            lambda: lines(out),
            lambda got: any(g["event"].get("to") == "completed" for g in got),
            timeout=30,
            what="the hook told of the completion",
        )
    events = [g["event"] for g in got]
    for number, event in enumerate(events):
        schemas.check("notify.schema.json", event, f"the hook's event {number}")
    states = [(e["from"], e["to"]) for e in events if e["event"] == "job.state"]
    assert states[0] == (None, "queued")
    assert states[1] == ("queued", "starting")
    assert "recovering" in [to for _, to in states]
    assert states[-1][1] == "completed"
    incidents = [e for e in events if e["event"].startswith("incident.")]
    assert [(e["event"], e["kind"], e["status"]) for e in incidents] == [
        ("incident.opened", "crash", "open"),
        ("incident.concluded", "crash", "verified"),
    ]
    assert incidents[0]["symptom"]
    assert incidents[1]["incident"] == "crash-1"
    moment = datetime.datetime.fromisoformat(events[0]["time_iso"])
    assert moment.utcoffset() is not None
    assert abs(moment.timestamp() - events[0]["time"]) < 0.001
    last = got[-1]
    assert last["env"]["JOBWARDEN_EVENT"] == "job.state"
    assert last["env"]["JOBWARDEN_EVENT_JOB"] == "crash"
    assert last["env"]["JOBWARDEN_EVENT_TO"] == "completed"
    assert "HOOK_TEST_SECRET" not in last["env"]  # the workers' environment, not the daemon's
    assert str(root) == last["cwd"]


class Collector(BaseHTTPRequestHandler):
    """A webhook receiver: keeps each POST's headers and JSON body on its server."""

    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with self.server.lock:
            self.server.got.append((dict(self.headers), json.loads(body)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Receiver(ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 standing for a chat or paging webhook."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Collector)
        self.got: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"

    def events(self) -> list[dict[str, Any]]:
        with self.lock:
            return [body for _, body in self.got]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A running webhook receiver, shut down after the test."""
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def test_webhook_receives_each_state_change_as_json(
    tmp_path: Path, compile_cache: Path, receiver: Receiver
) -> None:
    """A job's life reaches a real HTTP server as POSTs of application/json."""
    with Daemon(tmp_path / "root", compile_cache, "--notify-webhook", receiver.url) as daemon:
        daemon.drop("hooked.toml", linreg_job("hooked", run={"steps": 2}))
        assert daemon.wait("hooked")["state"] == "completed"
        wait_until(
            receiver.events,
            lambda got: any(e.get("to") == "completed" for e in got),
            timeout=30,
            what="the webhook told of the completion",
        )
    headers, first = receiver.got[0]
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Jobwarden-Event"] == "job.state"
    assert [e["to"] for e in receiver.events() if e["job"] == "hooked"] == [
        "queued",
        "starting",
        "running",
        "completed",
    ]
    for number, event in enumerate(receiver.events()):
        schemas.check("notify.schema.json", event, f"the webhook's event {number}")
    assert {"event", "schema", "time", "time_iso", "job", "from", "to", "reason", "attempt"} == set(
        first
    )


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_dead_webhook_is_logged_and_dropped_while_jobs_complete(
    tmp_path: Path, compile_cache: Path
) -> None:
    """Connection refused: each event is dropped after its tries, logged, counted; jobs go on."""
    url = f"http://127.0.0.1:{closed_port()}/hook"
    root = tmp_path / "root"
    options = ("--notify-timeout", "2", "--notify-tries", "2", "--notify-backoff", "0")
    with Daemon(root, compile_cache, "--notify-webhook", url, *options) as daemon:
        daemon.drop("first.toml", linreg_job("first", run={"steps": 2}))
        daemon.drop("second.toml", linreg_job("second", run={"steps": 2}))
        assert daemon.wait("first")["state"] == "completed"
        assert daemon.wait("second")["state"] == "completed"
        dropped = wait_until(
            lambda: log_records(root, "notify.dropped"),
            timeout=30,
            what="a notify.dropped record",
        )
        metrics = daemon.ask("metrics")["text"]
    assert dropped[0]["sink"] == "webhook"
    assert dropped[0]["tries"] == 2  # --notify-tries
    assert dropped[0]["error"].startswith("ECONNREFUSED")
    assert 'jobwarden_notifications_total{outcome="dropped"}' in metrics
    assert 'jobwarden_notifications_total{outcome="sent"} 0.0' in metrics


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        ("--notify-webhook", "ftp://example.org/x", "expected an http:// or https:// URL"),
        ("--notify-exec", "/no/such/hook", "not an executable file"),
        ("--notify-timeout", "0", "expected seconds above 0"),
        ("--notify-timeout", "nan", "expected seconds above 0"),
        ("--notify-tries", "0", "expected 1 to 10"),
        ("--notify-backoff", "-1", "expected seconds from 0 to 60"),
    ],
)
def test_an_unusable_setting_is_refused_at_start(
    tmp_path: Path, option: str, value: str, problem: str
) -> None:
    """wardend exits 2 naming the option, the value and the problem, before it starts."""
    done = subprocess.run(
        [sys.executable, "-m", "jobwarden.daemon", "--root", str(tmp_path / "root"), option, value],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert f"wardend: {option} {value!r}: {problem}\n" == done.stderr
