"""The control socket under abuse: every request answered in strict JSON, no client held forever.

Unit tests of the protocol run in milliseconds; the rest drive one real
wardend over its real socket, on a root prepared with 300 settled jobs (so
status answers are large and nothing runs), and wardenctl against sockets
that are full, silent or busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from jobwarden.control import client
from jobwarden.daemon.api.server import BACKLOG, MAX_CLIENTS
from jobwarden.daemon.api.status import TABLE_FIELDS
from jobwarden.daemon.store.jobs import new_record, state_text
from jobwarden.daemon.store.layout import Root
from jobwarden.jobfile import job_from_mapping
from jobwarden.protocol import PROTOCOL_VERSION, ControlError, Encoded, encode_ok, parse_request
from jobwarden.states import JobState
from tests.daemon import Daemon
from tests.helpers import wait_until

WARDENCTL = [sys.executable, "-m", "jobwarden.control.cli"]
JOBS = 300
DEEP = b"[" * 100_000 + b"]" * 100_000


def strict(line: bytes) -> Any:
    """Parse an answer line as strict JSON: NaN and Infinity are errors."""

    def refuse(name: str) -> None:
        raise ValueError(f"{name} in an answer")

    return json.loads(line, parse_constant=refuse)


class TestProtocol:
    """parse_request and the encoders, without a daemon."""

    @pytest.mark.parametrize(
        ("line", "code"),
        [
            (b'{"v": 1, "id": ' + DEEP + b', "cmd": "status"}', "control.bad_json"),
            (b'{"v": 1, "id": NaN, "cmd": "status"}', "control.bad_json"),
            (b'{"v": 1, "id": -Infinity, "cmd": "status"}', "control.bad_json"),
            (b'{"v": 1, "id": 1e999, "cmd": "status"}', "control.bad_json"),
            (b'{"v": 1, "id": 1, "cmd": "status", "args": {"job": "\\ud800"}}', "control.bad_json"),
            (b'{"v": true, "id": 1, "cmd": "status"}', "control.version"),
            (b'{"v": 1.0, "id": 1, "cmd": "status"}', "control.version"),
            (b'{"v": 1, "id": [1], "cmd": "status"}', "control.bad_request"),
            (b'{"v": 1, "id": 1180591620717411303424, "cmd": "status"}', "control.bad_request"),
            (b'{"v": 1, "id": 1, "cmd": "status", "args": []}', "control.bad_request"),
        ],
    )
    def test_a_bad_request_is_refused_with_its_code(self, line: bytes, code: str) -> None:
        """Each refusal is a ControlError with a stable code, never another exception."""
        with pytest.raises(ControlError) as refused:
            parse_request(line + b"\n")
        assert refused.value.code == code

    def test_a_version_refusal_echoes_the_request_id(self) -> None:
        """The id of a request of another version is still sent back."""
        with pytest.raises(ControlError) as refused:
            parse_request(b'{"v": 3, "id": "mine", "cmd": "status"}\n')
        assert refused.value.evidence["request_id"] == "mine"

    def test_answers_are_strict_json(self) -> None:
        """A NaN result cannot be encoded; an encoded result is spliced in as it is."""
        with pytest.raises(ValueError, match="Out of range float"):
            encode_ok(1, {"x": float("nan")})
        line = encode_ok(7, Encoded(b'{"jobs": []}'))
        assert strict(line) == {"v": PROTOCOL_VERSION, "id": 7, "ok": True, "result": {"jobs": []}}


def test_a_failing_handler_is_an_internal_error_answer(tmp_path: Path) -> None:
    """A handler that raises: the client gets control.internal, the next request an answer."""
    from jobwarden.daemon.api.server import ControlServer

    def boom(args: dict[str, Any]) -> Any:
        raise RecursionError("maximum recursion depth exceeded")

    async def run() -> list[Any]:
        server = ControlServer(tmp_path / "c.sock", {"boom": boom, "ok": lambda args: 1})
        await server.start()
        try:
            reader, writer = await asyncio.open_unix_connection(str(tmp_path / "c.sock"))
            writer.write(b'{"v": 1, "id": 1, "cmd": "boom"}\n{"v": 1, "id": 2, "cmd": "ok"}\n')
            answers = [strict(await reader.readline()) for _ in range(2)]
            writer.close()
            await writer.wait_closed()
            return answers
        finally:
            await server.close()

    first, second = asyncio.run(run())
    assert first["error"] == {
        "code": "control.internal",
        "message": "the daemon could not answer: RecursionError: maximum recursion depth exceeded",
    }
    assert second == {"v": 1, "id": 2, "ok": True, "result": 1}


def settled_jobs(root: Root, count: int) -> None:
    """Job folders of completed jobs, written directly (the daemon only loads them)."""
    for index in range(count):
        job = job_from_mapping({"id": f"j{index:03d}", "task": "linreg"})
        folder = root.job(job.id)
        folder.mkdir(parents=True)
        (folder / "job.json").write_text(json.dumps(job.to_record()))
        record = new_record(job)
        record.state, record.attempt = JobState.COMPLETED, 1
        (folder / "state.json").write_text(state_text(record))
    events = root.job("j000") / "attempts" / "1" / "events.jsonl"
    events.parent.mkdir(parents=True)
    events.write_bytes(
        b'{"v": 1, "event": "preempted", "step": 1, "reason": "x", "time": 1}\n'
        b'{"v": 1, "event": "progress", "loss": NaN}\n' + DEEP + b"\n"
    )


@pytest.fixture(scope="module")
def wardend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon with 300 settled jobs and a one-second control timeout."""
    root = Root(tmp_path_factory.mktemp("abuse") / "root")
    root.create()
    settled_jobs(root, JOBS)
    with Daemon(root.path, None, "--control-timeout", "1", "--max-concurrent", "1") as daemon:
        yield daemon


def exchange(path: Path, payload: bytes, timeout: float = 5) -> bytes:
    """Send raw bytes and return the first answer line (b"" if the daemon hung up)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(str(path))
        conn.sendall(payload)
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(1 << 20)
            if not chunk:
                break
            data += chunk
        return data


def request_line(cmd: str, args: dict[str, Any] | str) -> bytes:
    """A request line; ``args`` given as text is sent as it is (escapes and all)."""
    text = args if isinstance(args, str) else json.dumps(args)
    return b'{"v": 2, "id": 5, "cmd": "' + cmd.encode() + b'", "args": ' + text.encode() + b"}\n"


class TestEveryRequestIsAnswered:
    """Requests that used to get no answer, or an answer that is not JSON."""

    @pytest.mark.parametrize(
        ("payload", "code"),
        [
            (b'{"v": 1, "id": 5, "cmd": "status", "args": {"x": ' + DEEP + b"}}\n", "bad_json"),
            (b'{"v": 1, "id": NaN, "cmd": "version"}\n', "bad_json"),
            (b'{"v": 1, "id": 1e999, "cmd": "version"}\n', "bad_json"),
            (b'{"v": true, "id": 5, "cmd": "version"}\n', "version"),
            (request_line("events", {"job": "j000", "offset": 10**30}), "bad_request"),
            (request_line("events", {"job": "j000", "attempt": True}), "bad_request"),
            (request_line("events", {"job": "j000", "offset": -1}), "bad_request"),
            (request_line("submit", {"name": "a\x00b.toml", "content": "x"}), "bad_request"),
            (request_line("submit", {"name": "é" * 120 + ".toml", "content": "x"}), "bad_request"),
            (request_line("submit", {"name": "x" * 240 + ".toml", "content": "x"}), "bad_request"),
            (request_line("submit", '{"name": "s.toml", "content": "\\ud800"}'), "bad_json"),
            (request_line("submit", {"name": "\ud800.toml", "content": "x"}), "bad_json"),
            (request_line("runbook", {"incident": "j000-1/../../../x"}), "no_such_incident"),
            (request_line("status", {"job": "a\x00b"}), "no_such_job"),
        ],
    )
    def test_a_hostile_request_gets_one_strict_error_answer(
        self, wardend: Daemon, payload: bytes, code: str
    ) -> None:
        """An error answer in strict JSON; nothing left in spool/tmp; the daemon goes on."""
        answer = strict(exchange(wardend.socket, payload))
        assert (answer["ok"], answer["error"]["code"]) == (False, f"control.{code}"), answer
        assert os.listdir(wardend.root / "spool" / "tmp") == []
        assert wardend.ask("version")["pid"] == wardend.proc.pid

    def test_event_lines_with_nan_or_deep_nesting_are_shown_as_malformed(
        self, wardend: Daemon
    ) -> None:
        """The events of a job whose log holds NaN and 100 KB of nesting: strict JSON."""
        answer = strict(exchange(wardend.socket, request_line("events", {"job": "j000"})))
        kinds = [(e["event"], e.get("reason", "")[:24]) for e in answer["result"]["events"]]
        assert kinds == [
            ("preempted", "x"),
            ("malformed", "NaN is not a JSON number"),
            ("malformed", "nested deeper than 32 le"),
        ]

    def test_a_valid_submit_over_the_socket_leaves_nothing_in_tmp(self, wardend: Daemon) -> None:
        """submit of a bad job file: rejected with the file kept, spool/tmp empty."""
        result = wardend.ask("submit", name="bad.toml", content='id = "b"\ntask = "nope"\n')
        assert result["accepted"] is False
        assert "unknown task 'nope'" in result["problems"][0]
        assert Path(result["kept_at"]).is_file()
        assert os.listdir(wardend.root / "spool" / "tmp") == []


def daemon_process(daemon: Daemon) -> psutil.Process:
    """The daemon as psutil sees it."""
    assert daemon.proc is not None
    return psutil.Process(daemon.proc.pid)


class TestClientsThatNeverRead:
    """Connections are capped, silent clients dropped, and the backlog is large."""

    def test_silent_clients_are_dropped_and_their_memory_released(self, wardend: Daemon) -> None:
        """300 clients each ask for five status tables and never read: all let go within
        the timeout, the daemon's memory bounded meanwhile, others still answered."""
        process = daemon_process(wardend)
        fds, rss = process.num_fds(), process.memory_info().rss
        line = request_line("status", {}) * 5
        flood = []
        try:
            for _ in range(300):
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                conn.connect(str(wardend.socket))
                conn.setblocking(False)
                with contextlib.suppress(BlockingIOError, BrokenPipeError, ConnectionResetError):
                    conn.send(line)
                flood.append(conn)
            peak = rss
            answered = 0
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                peak = max(peak, process.memory_info().rss)
                answered += len(client.request(wardend.socket, "status", timeout=5)["jobs"]) > 0
            wait_until(
                process.num_fds,
                lambda now: now <= fds + 2,
                timeout=10,
                what="the daemon letting the silent clients go",
            )
        finally:
            for conn in flood:
                conn.close()
        assert answered > 0
        assert peak - rss < 60 << 20, f"grew by {(peak - rss) >> 20} MB"

    def test_a_client_past_the_cap_takes_the_slot_of_the_oldest_silent_one(
        self, wardend: Daemon
    ) -> None:
        """MAX_CLIENTS silent connections held: the next client is answered within the
        grace a silent one has, and only the oldest silent one is told control.busy (retry)
        and closed."""
        idle = []
        try:
            for _ in range(MAX_CLIENTS):
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                conn.connect(str(wardend.socket))
                idle.append(conn)
            began = time.monotonic()
            answer = strict(exchange(wardend.socket, request_line("version", {})))
            waited = time.monotonic() - began
            assert answer["ok"], answer
            idle[0].settimeout(0.5)
            evicted = strict(idle[0].recv(65536))
            assert evicted["error"]["code"] == "control.busy"
            assert "closed to serve a waiting client" in evicted["error"]["message"]
            assert evicted["error"]["message"].endswith(": retry")
            assert idle[0].recv(65536) == b""
            for conn in idle[1:]:
                conn.setblocking(False)
                with pytest.raises(BlockingIOError):
                    conn.recv(65536)
            assert waited < 0.5
        finally:
            for conn in idle:
                conn.close()

    def test_status_stays_prompt_while_silent_and_slow_clients_flood_the_cap(
        self, wardend: Daemon
    ) -> None:
        """600 clients that connect and say nothing, or half a line, and stay connected:
        every status in between answered within 0.3 s, the daemon's descriptors capped by
        its slots and its waiting room."""
        process = daemon_process(wardend)
        fds = process.num_fds()
        flood: list[socket.socket] = []
        waits: list[float] = []
        peak = fds
        try:
            for index in range(600):
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                conn.connect(str(wardend.socket))
                if index % 2:  # evicted or told busy at once, it may find the pipe broken
                    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                        conn.sendall(b'{"v": 1, "id": 1, "cmd": "sta')
                flood.append(conn)
                if index % 20 == 19:
                    began = time.monotonic()
                    answer = client.request(wardend.socket, "status", timeout=5)
                    waits.append(time.monotonic() - began)
                    assert answer["totals"]["jobs"] == JOBS
                    peak = max(peak, process.num_fds())
        finally:
            for conn in flood:
                conn.close()
        assert max(waits) < 0.3, f"status waited {max(waits):.3f} s, all: {waits}"
        assert peak <= fds + MAX_CLIENTS + BACKLOG + 4, (fds, peak)

    def test_the_listen_backlog_is_large(self, wardend: Daemon) -> None:
        """ss shows the socket listening with BACKLOG, not asyncio's default of 100."""
        listing = subprocess.run(
            ["ss", "-xln"], capture_output=True, text=True, check=True, timeout=10
        ).stdout
        (row,) = [r for r in listing.splitlines() if str(wardend.socket) in r]
        assert int(row.split()[3]) == BACKLOG >= 1024


@contextlib.contextmanager
def fake_daemon(tmp_path: Path, behaviour: str) -> Iterator[Path]:
    """A socket that is full (never accepts), silent (accepts, never answers) or busy."""
    path = tmp_path / f"{behaviour}.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(0)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.05)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                conn, _ = server.accept()
                if behaviour == "busy":
                    conn.sendall(
                        b'{"v": 1, "id": null, "ok": false, "error": '
                        b'{"code": "control.busy", "message": "full"}}\n'
                    )
                    conn.close()
                else:
                    held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    if behaviour == "full":
        filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        filler.connect(str(path))
        held.append(filler)
    else:
        thread.start()
    try:
        yield path
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
        for conn in held:
            conn.close()
        server.close()


@pytest.mark.parametrize("behaviour", ["full", "silent", "busy"])
def test_wardenctl_says_daemon_busy_instead_of_a_traceback(tmp_path: Path, behaviour: str) -> None:
    """A full backlog, a daemon that never answers, a control.busy answer: exit 5, one line."""
    with fake_daemon(tmp_path, behaviour) as path:
        began = time.monotonic()
        done = subprocess.run(
            [*WARDENCTL, "--socket", str(path), "--timeout", "0.5", "status"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert (done.returncode, done.stdout) == (5, ""), done.stderr
    assert done.stderr.startswith("wardenctl: daemon busy: wardend is busy on ")
    if behaviour == "busy":  # the daemon's own reason
        assert f"{path}: full, for 0.5 s" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert time.monotonic() - began < 10


def test_a_submit_that_kept_nothing_is_sent_again(tmp_path: Path) -> None:
    """A daemon short of descriptors answers a submit whose drop failed control.busy,
    "nothing was kept": the client sends the same request again, and returns the answer
    to it."""
    path = tmp_path / "short.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)
    lines: list[bytes] = []

    def serve() -> None:
        for answer in (
            b'{"code": "control.busy", "message": "submit: the daemon is short of resources '
            b'(EMFILE); nothing was kept: send it again"}',
            None,
        ):
            conn, _ = server.accept()
            with conn:
                lines.append(conn.makefile("rb").readline())
                body = b'"ok": true, "result": {"accepted": true, "job": "sent"}'
                if answer is not None:
                    body = b'"ok": false, "error": ' + answer
                conn.sendall(b'{"v": 1, "id": 1, ' + body + b"}\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        answer = client.request(path, "submit", timeout=10, name="sent.toml", content="x")
    finally:
        thread.join(10)
        server.close()
    assert answer == {"accepted": True, "job": "sent"}
    assert len(lines) == 2, lines
    assert lines[0] == lines[1], lines
    assert json.loads(lines[0])["cmd"] == "submit"


def test_wardenctl_doc_lists_every_exit_status() -> None:
    """docs/wardenctl.md has a row for each EXIT_* status wardenctl can return."""
    from jobwarden.control.commands import output

    text = (Path(__file__).parent.parent / "docs" / "wardenctl.md").read_text()
    statuses = {v for k, v in vars(output).items() if k.startswith("EXIT_")}
    assert statuses == {0, 1, 2, 3, 4, 5}
    for status in statuses:
        assert f"\n| {status} | " in text, status


class TestStatusRows:
    """The kept rows of settled jobs: made once, refreshed when their record is saved."""

    def test_a_row_is_reused_until_its_record_is_saved(self, tmp_path: Path) -> None:
        """The same row while nothing changes but the age; a new one after JobTable.save."""
        from jobwarden.daemon.api.status import StatusRows
        from jobwarden.daemon.store.jobs import JobTable

        root = Root(tmp_path / "root")
        root.create()
        table = JobTable(root)
        job = job_from_mapping({"id": "a", "task": "linreg"})
        root.job("a").mkdir()
        record = table.add(job)
        record.last_progress = 1000.0

        rows, daemon = StatusRows(), SimpleNamespace(supervisors={}, is_live=lambda job: False)
        first = rows.row(daemon, record, 1010.0)
        assert (first["state"], first["last_progress_age_s"], first["uptime_s"]) == (
            "queued",
            10.0,
            None,
        )
        assert rows.row(daemon, record, 1012.5)["last_progress_age_s"] == 12.5
        table.transition(record, JobState.STARTING, "test")
        assert rows.row(daemon, record, 1013.0)["state"] == "starting"

    def test_table_values_are_reused_until_the_record_is_saved(self, tmp_path: Path) -> None:
        """The columns' values: the age fresh at each request, the rest new after a save."""
        from jobwarden.daemon.api.status import StatusRows
        from jobwarden.daemon.store.jobs import JobTable

        root = Root(tmp_path / "root")
        root.create()
        table = JobTable(root)
        root.job("a").mkdir()
        record = table.add(job_from_mapping({"id": "a", "task": "linreg"}))
        record.last_progress = 1000.0
        rows = StatusRows()
        daemon = SimpleNamespace(supervisors={}, is_live=lambda job: False, table=table)

        def shown(now: float) -> dict[str, Any]:
            return rows.values(daemon, record, now)

        assert (shown(1010.0)["state"], shown(1012.5)["last_progress_age_s"]) == ("queued", 12.5)
        record.step = 5  # not saved: the kept values stand
        assert shown(1013.0)["step"] == 0
        table.transition(record, JobState.STARTING, "test")
        assert (shown(1014.0)["state"], shown(1014.0)["step"]) == ("starting", 5)

    def test_the_columns_are_reused_until_the_table_changes(self, tmp_path: Path) -> None:
        """Ages fresh at each request; a save, an added job or a held job's row seen at once."""
        from jobwarden.daemon.api.status import StatusRows
        from jobwarden.daemon.store.jobs import JobTable

        root = Root(tmp_path / "root")
        root.create()
        table = JobTable(root)
        for job_id in ("a", "b"):
            root.job(job_id).mkdir()
            table.add(job_from_mapping({"id": job_id, "task": "linreg"}))
        a, b = table.get("a"), table.get("b")
        assert a is not None
        assert b is not None
        a.last_progress = 1000.0
        held: dict[str, object] = {}
        daemon = SimpleNamespace(supervisors=held, is_live=lambda job: False, table=table)
        rows = StatusRows()

        def shown(now: float) -> dict[str, list[Any]]:
            return rows.columns(daemon, now)

        first = shown(1010.0)
        assert (first["id"], first["last_progress_age_s"]) == (["a", "b"], [10.0, None])
        assert shown(1011.5)["last_progress_age_s"] == [11.5, None]
        b.last_progress = 1011.0  # not saved: unseen
        assert shown(1011.5)["last_progress_age_s"] == [11.5, None]
        table.save(b)
        assert shown(1011.5)["last_progress_age_s"] == [11.5, 0.5]
        b.step = 7  # not saved, not held: the kept columns stand
        assert shown(1012.0)["step"] == [0, 0]
        held["b"] = object()  # a supervisor takes b: its row is made at each request
        assert shown(1012.0)["step"] == [0, 7]
        b.step = 8
        assert shown(1012.0)["step"] == [0, 8]
        del held["b"]
        root.job("c").mkdir()
        table.add(job_from_mapping({"id": "c", "task": "linreg"}))
        assert shown(1013.0)["id"] == ["a", "b", "c"]
        table.drop("a")
        assert shown(1013.0)["id"] == ["b", "c"]


class TestStatusAnswer:
    """status sends its table column by column; rows=true sends the full rows."""

    def test_the_table_comes_as_columns_with_totals(self, wardend: Daemon) -> None:
        """300 jobs: one list per table field, totals per state, and a third of the bytes."""
        columns = strict(exchange(wardend.socket, request_line("status", {})))["result"]
        full = strict(exchange(wardend.socket, request_line("status", {"rows": True})))["result"]
        assert sorted(columns["columns"]) == sorted(TABLE_FIELDS)
        assert {len(values) for values in columns["columns"].values()} == {JOBS}
        assert columns["totals"] == full["totals"]
        assert columns["totals"] == {
            "jobs": JOBS,
            "states": {"completed": JOBS},
            "needs_attention": 0,
            "rejected": columns["totals"]["rejected"],
        }
        assert [row["id"] for row in full["jobs"]] == columns["columns"]["id"]
        assert {"reason", "task", "incidents"} <= set(full["jobs"][0])
        small = len(json.dumps(columns))
        assert small * 3 < len(json.dumps(full)), small

    def test_rows_must_be_a_boolean(self, wardend: Daemon) -> None:
        """rows: 1 is a bad request naming the argument."""
        answer = strict(exchange(wardend.socket, request_line("status", {"rows": 1})))
        assert answer["error"]["code"] == "control.bad_request"
        assert "rows must be a boolean" in answer["error"]["message"]
