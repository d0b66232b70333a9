"""The control socket and wardenctl against a live daemon running real jobs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobwarden.control import client
from jobwarden.protocol import MAX_REQUEST_BYTES, PROTOCOL_VERSION
from tests.daemon import WARDENCTL, Daemon, ctl, linreg_job
from tests.helpers import wait_until


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, compile_cache: Path) -> Iterator[Daemon]:
    """One daemon for this module, with a crashed-and-recovered job already done."""
    root = tmp_path_factory.mktemp("control") / "root"
    with Daemon(root, compile_cache, "--control-timeout", "1") as daemon:
        daemon.drop("crash.toml", linreg_job("crash", faults={"fail_after": 3}))
        assert daemon.wait("crash")["state"] == "completed"
        yield daemon


def raw_exchange(path: Path, payload: bytes, wait: float = 5) -> bytes:
    """Send raw bytes on a fresh connection and read until the daemon closes or replies."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(wait)
        conn.connect(str(path))
        conn.sendall(payload)
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


@pytest.mark.slow
def test_status_lists_jobs_and_details_one(live: Daemon) -> None:
    """status prints one row per job; status JOB --json has the state and the history."""
    table = ctl(live, "status")
    assert table.returncode == 0
    header, row = table.stdout.splitlines()[:2]
    assert header.split() == [
        "JOB",
        "STATE",
        "ATTEMPT",
        "STEP",
        "LAST",
        "CKPT",
        "PID",
        "RSS",
        "UPTIME",
    ]
    assert row.split()[:4] == ["crash", "completed", "2", "8/8"]
    detail = json.loads(ctl(live, "status", "crash", "--json").stdout)
    assert detail["state"] == "completed"
    assert [h["to"] for h in detail["history"]] == [
        "queued",
        "starting",
        "running",
        "recovering",
        "running",
        "completed",
    ]
    missing = ctl(live, "status", "nope")
    assert missing.returncode == 4
    assert "no job 'nope'" in missing.stderr


@pytest.mark.slow
def test_incidents_runbook_and_tail(live: Daemon) -> None:
    """incidents, runbook and tail show the recovered crash."""
    incidents = json.loads(ctl(live, "incidents", "crash", "--json").stdout)
    assert [(i["id"], i["kind"], i["status"]) for i in incidents] == [
        ("crash-1", "crash", "verified")
    ]
    book = ctl(live, "runbook", "crash-1")
    assert book.returncode == 0
    assert "## Verification" in book.stdout
    assert "runbook file:" in book.stdout
    # Every line from the first (tail shows the end: -n), the worker's only (--no-daemon).
    tail = ctl(live, "tail", "crash", "-n", "1000", "--no-daemon").stdout.splitlines()
    assert tail[0].startswith("#1 ")
    assert "started" in tail[0]
    assert any("failed" in line and "worker.injected_failure" in line for line in tail)
    assert tail[-1].startswith("#2 ")
    assert "completed" in tail[-1]
    shown = ctl(live, "tail", "crash", "-n", "1000", "--json").stdout.splitlines()
    events = [json.loads(line) for line in shown]
    assert [e["step"] for e in events if e["event"] == "progress" and e["attempt"] == 2] == [
        3,
        4,
        5,
        6,
        7,
        8,
    ]


@pytest.mark.slow
def test_checkpoints_show_each_file_with_its_verdict(live: Daemon) -> None:
    """checkpoints lists committed files as accepted and a damaged one as refused."""
    ck = live.root / "checkpoints" / "crash"
    damaged = ck / "ckpt-0000000099.safetensors"
    shutil.copy(ck / "ckpt-0000000008.safetensors", damaged)
    damaged.write_bytes(damaged.read_bytes()[:-3])
    try:
        rows = json.loads(ctl(live, "checkpoints", "crash", "--json").stdout)
    finally:
        damaged.unlink()
    verdicts = {Path(r["file"]).name: r["verdict"] for r in rows}
    assert verdicts["ckpt-0000000008.safetensors"]["ok"] is True
    assert verdicts["ckpt-0000000099.safetensors"]["code"] == "checkpoint.truncated"


@pytest.mark.slow
def test_metrics_are_prometheus_text(live: Daemon) -> None:
    """metrics parses as Prometheus exposition and counts what happened."""
    text = ctl(live, "metrics").stdout
    families = {f.name: f for f in text_string_to_metric_families(text)}
    jobs = {s.labels["state"]: s.value for s in families["jobwarden_jobs"].samples}
    assert jobs["completed"] >= 1
    incidents = {
        s.labels["kind"]: s.value
        for s in families["jobwarden_incidents"].samples
        if s.name.endswith("_total")
    }
    assert incidents["crash"] >= 1
    assert families["jobwarden_replayed_updates"].samples[0].value >= 1
    assert families["jobwarden_checkpoint_bytes"].samples[0].value > 0
    assert "jobwarden_stall_detections" in families
    assert "jobwarden_restarts" in families


@pytest.mark.slow
def test_submit_stop_resume(live: Daemon, tmp_path: Path) -> None:
    """submit prints the id; stop preempts at a committed step; resume completes the job."""
    spec = tmp_path / "slow.toml"
    spec.write_text(
        linreg_job(
            "slow",
            run={"steps": 400, "checkpoint_every": 100},
            # The first attempt's only: slow enough to be stopped mid-run; the resume is not.
            faults={"step_delay_s": 0.01},
        )
    )
    submitted = ctl(live, "submit", str(spec))
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout.strip() == "slow"
    live.wait("slow", ("running",))
    wait_until(
        lambda: live.state("slow"),
        lambda status: status["step"] >= 20,
        timeout=60,
        what="job slow past step 20",
    )
    assert ctl(live, "stop", "slow").returncode == 0
    stopped = live.wait("slow", ("preempted",), timeout=60)
    assert stopped["reason"].startswith("stopped by operator")
    assert stopped["newest_checkpoint_step"] == stopped["step"]
    assert ctl(live, "stop", "slow").returncode == 1
    assert ctl(live, "resume", "slow").returncode == 0
    done = live.wait("slow", timeout=120)
    assert done["state"] == "completed"
    second = live.events("slow", 2)
    assert next(e for e in second if e["event"] == "restored")["step"] == stopped["step"]
    again = ctl(live, "submit", str(spec))
    assert again.returncode == 1
    assert "duplicate job id 'slow'" in again.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text('id = "bad"\ntask = "linreg"\n[train]\nmomentum = 2\n')
    refused = ctl(live, "submit", str(bad))
    assert refused.returncode == 2
    assert "train.momentum" in refused.stderr


@pytest.mark.slow
def test_malformed_oversized_and_half_sent_requests(live: Daemon) -> None:
    """Each bad request gets an error or is cut off, and the daemon goes on answering."""
    sock = live.root / "control.sock"
    assert json.loads(raw_exchange(sock, b"not json\n"))["error"]["code"] == "control.bad_json"
    wrong = raw_exchange(sock, b'{"v": 9, "id": 1, "cmd": "status"}\n')
    assert json.loads(wrong)["error"]["code"] == "control.version"
    unknown = json.loads(raw_exchange(sock, b'{"v": 1, "id": 7, "cmd": "explode"}\n'))
    assert (unknown["id"], unknown["error"]["code"]) == (7, "control.unknown_command")
    big = raw_exchange(sock, b"x" * (MAX_REQUEST_BYTES + 10) + b"\n")
    assert json.loads(big)["error"]["code"] == "control.too_large"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as slow:
        slow.connect(str(sock))
        slow.sendall(b'{"v": 1, "id": 1, "cmd": "sta')
        began = time.monotonic()
        assert live.ask("version")["protocol"] == PROTOCOL_VERSION
        assert time.monotonic() - began < 0.5
        slow.settimeout(5)
        reply = slow.recv(65536)
    assert json.loads(reply)["error"]["code"] == "control.timeout"
    assert live.ask("status")["jobs"]


@pytest.mark.slow
def test_each_supported_protocol_version_gets_its_own_shapes(live: Daemon) -> None:
    """A version-1 client gets status rows, version 2 the columns; 3 is refused with 1, 2."""
    sock = live.root / "control.sock"
    old = json.loads(raw_exchange(sock, b'{"v": 1, "id": 1, "cmd": "status"}\n'))
    new = json.loads(raw_exchange(sock, b'{"v": 2, "id": 2, "cmd": "status"}\n'))
    assert (old["v"], new["v"]) == (1, 2)
    assert "columns" not in old["result"]
    assert [job["id"] for job in old["result"]["jobs"]] == new["result"]["columns"]["id"]
    assert all("reason" in job for job in old["result"]["jobs"])
    future = json.loads(raw_exchange(sock, b'{"v": 3, "id": 3, "cmd": "status"}\n'))
    assert (future["id"], future["error"]["code"]) == (3, "control.version")
    assert "speaks 1, 2" in future["error"]["message"]


@pytest.mark.slow
def test_fifty_concurrent_clients_are_all_answered(live: Daemon) -> None:
    """50 clients at once each get their status answer."""
    answers: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(50)

    def one() -> None:
        try:
            barrier.wait()
            answers.append(len(client.request(live.root / "control.sock", "status")["jobs"]))
        except BaseException as error:  # noqa: BLE001 - collected and asserted below
            errors.append(error)

    threads = [threading.Thread(target=one) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors
    assert len(answers) == 50
    assert min(answers) >= 1


NOBODY = 65534


def probe_as_nobody(sock: Path) -> str:
    """Fork a child that drops to uid/gid 65534 and asks for status; returns what it got."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no Python-level cleanup, just syscalls and _exit
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(10)
            try:
                conn.connect(str(sock))
            except PermissionError:
                os.write(write_end, b"EACCES")
                os._exit(0)
            # the daemon may refuse and close before the request is even sent
            with contextlib.suppress(OSError):
                conn.sendall(b'{"v": 1, "id": 1, "cmd": "status"}\n')
            os.write(write_end, conn.recv(65536))
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as stream:
        data = stream.read()
    os.waitpid(pid, 0)
    return data.decode().strip()


def test_socket_is_private_and_other_users_are_refused(tmp_path: Path) -> None:
    """Mode 0600; another uid cannot connect, and even with the mode opened SO_PEERCRED refuses."""
    public = Path(tempfile.mkdtemp(prefix="jobwarden-sock-"))
    try:
        public.chmod(0o755)
        sock = public / "control.sock"
        with Daemon(tmp_path / "root", None, "--socket", str(sock)):
            assert stat.S_IMODE(sock.stat().st_mode) == 0o600
            assert probe_as_nobody(sock) == "EACCES"
            sock.chmod(0o666)
            reply = json.loads(probe_as_nobody(sock))
            assert reply["error"]["code"] == "control.forbidden"
            assert client.request(sock, "version")["protocol"] == PROTOCOL_VERSION
        log = [
            json.loads(line)
            for line in (tmp_path / "root" / "wardend.log").read_text().splitlines()
        ]
        refusals = [entry for entry in log if entry["event"] == "control.refused"]
        assert len(refusals) == 1
        assert refusals[0]["peer_uid"] == NOBODY
    finally:
        shutil.rmtree(public)


def test_group_socket_is_0660_and_group_owned(tmp_path: Path) -> None:
    """With --group, the socket is mode 0660 and owned by that group."""
    import grp

    with Daemon(tmp_path / "root", None, "--group", "nogroup") as daemon:
        info = (daemon.root / "control.sock").stat()
        assert stat.S_IMODE(info.st_mode) == 0o660
        assert info.st_gid == grp.getgrnam("nogroup").gr_gid


def test_no_daemon_names_the_socket_tried(tmp_path: Path) -> None:
    """Without a daemon, wardenctl says so, names the socket, and exits 1."""
    done = subprocess.run(
        [*WARDENCTL, "--root", str(tmp_path), "status"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    assert f"nothing answers on {tmp_path / 'control.sock'}" in done.stderr
    env = {**os.environ, "JOBWARDEN_ROOT": str(tmp_path / "elsewhere")}
    via_env = subprocess.run(
        [*WARDENCTL, "status"], capture_output=True, text=True, timeout=30, check=False, env=env
    )
    assert str(tmp_path / "elsewhere" / "control.sock") in via_env.stderr


class TestStatusTable:
    """The status table as wardenctl prints it, from the columns the daemon sends."""

    def answer(self, **totals: Any) -> dict[str, Any]:
        """Two jobs, one running for two days, with the totals given."""
        return {
            "columns": {
                "id": ["a-long-job-name", "b"],
                "state": ["running", "queued"],
                "attempt": [3, 0],
                "step": [120, 0],
                "steps": [3000, 8],
                "last_progress_age_s": [83.4, None],
                "newest_checkpoint_step": [100, None],
                "pid": [4242, None],
                "rss_mb": [1229.0, None],
                "uptime_s": [2 * 86400 + 3 * 3600 + 4 * 60 + 5, None],
            },
            "totals": {"jobs": 2, "states": {"queued": 1, "running": 1}, **totals},
        }

    def test_columns_are_padded_absent_values_are_dashes_and_durations_read_as_clocks(
        self,
    ) -> None:
        """Header, padded columns, '-' never None, 0:01:23 and '2 days, 3:04:05'."""
        from jobwarden.control.tables import render_status

        lines = render_status(self.answer(rejected=0)).splitlines()
        assert lines == [
            "JOB              STATE    ATTEMPT  STEP      LAST     CKPT  PID   RSS     UPTIME",
            "a-long-job-name  running  3        120/3000  0:01:23  100   4242  1.2 GB  "
            "2 days, 3:04:05",
            "b                queued   0        0/8       -        -     -     -       -",
            "2 jobs: 1 queued, 1 running",
        ]

    def test_rejected_requests_are_counted_under_the_table(self) -> None:
        """A non-zero rejected count is one line naming the command that lists them."""
        from jobwarden.control.tables import render_status

        assert render_status(self.answer(rejected=3)).splitlines()[-1] == (
            "3 rejected requests: wardenctl rejected"
        )
        assert render_status(self.answer(rejected=1)).splitlines()[-1] == (
            "1 rejected request: wardenctl rejected"
        )

    def test_the_rows_a_client_reads_are_built_from_the_columns(self) -> None:
        """answer["jobs"] gives one dict per job, with the columns' values."""
        answer = client.StatusAnswer(self.answer())
        assert [(r["id"], r["state"], r["pid"]) for r in answer["jobs"]] == [
            ("a-long-job-name", "running", 4242),
            ("b", "queued", None),
        ]


def test_status_counts_rejected_requests_kept_before_and_since_the_start(tmp_path: Path) -> None:
    """Two error files already in spool/rejected, one more request rejected: 3 counted."""
    root = tmp_path / "root"
    (root / "spool" / "rejected").mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    for name in ("old-1.toml", "old-2.toml"):
        (root / "spool" / "rejected" / name).write_text("x")
        (root / "spool" / "rejected" / f"{name}.error.json").write_text("{}")
    with Daemon(root, None) as daemon:
        assert daemon.ask("status")["totals"]["rejected"] == 2
        daemon.drop("bad.toml", 'id = "bad"\ntask = "no-such-task"\n')
        wait_until(
            lambda: daemon.ask("status")["totals"],
            lambda totals: totals["rejected"] == 3,
            timeout=30,
            what="the rejection counted",
        )
        shown = ctl(daemon, "status")
        listed = json.loads(ctl(daemon, "status", "--json").stdout)
    assert (shown.returncode, shown.stdout) == (
        0,
        "no jobs\n3 rejected requests: wardenctl rejected\n",
    )
    assert (listed["jobs"], listed["totals"]["rejected"]) == ([], 3)
