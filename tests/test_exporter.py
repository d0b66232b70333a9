"""Prometheus scraping: /metrics over real HTTP on loopback, and node_exporter's textfile."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobwarden.daemon.observe.exporter import MetricsListenError, parse_address
from tests.daemon import Daemon, linreg_job
from tests.helpers import wait_until


class TestParseAddress:
    """``--metrics-listen`` values."""

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("9100", ("127.0.0.1", 9100)),
            (":9100", ("127.0.0.1", 9100)),
            ("0.0.0.0:9100", ("0.0.0.0", 9100)),
            ("[::1]:9100", ("::1", 9100)),
        ],
    )
    def test_a_bare_port_binds_loopback(self, text: str, expected: tuple[str, int]) -> None:
        """Only an explicit host leaves loopback."""
        assert parse_address(text) == expected

    @pytest.mark.parametrize("text", ["", "host:", "host:port", "127.0.0.1:70000"])
    def test_a_bad_address_is_refused(self, text: str) -> None:
        """A missing, non-numeric or out-of-range port is a MetricsListenError naming the value."""
        with pytest.raises(MetricsListenError, match="expected HOST:PORT"):
            parse_address(text)


def listening(root: Path) -> dict[str, Any]:
    """The daemon's ``metrics.listening`` log record (the port it bound)."""
    log = root / "wardend.log"
    for line in log.read_text().splitlines() if log.exists() else []:
        record = json.loads(line)
        if record.get("event") == "metrics.listening":
            return dict(record)
    return {}


def jobs_gauge(text: str) -> dict[str, float]:
    """jobwarden_jobs by state, parsed with prometheus_client's own parser."""
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "jobwarden_jobs"]
    return {s.labels["state"]: s.value for s in family.samples}


def scrape(url: str) -> tuple[int, str, str]:
    """GET ``url``: status, content type, body."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.status, reply.headers["Content-Type"], reply.read().decode()


def test_metrics_are_scraped_over_http_while_a_job_runs(
    tmp_path: Path, compile_cache: Path
) -> None:
    """A port of 0 on the default host binds loopback; a running job shows in jobwarden_jobs."""
    root = tmp_path / "root"
    with Daemon(
        root, compile_cache, "--metrics-listen", ":0", "--sample-interval", "0.2"
    ) as daemon:
        bound = wait_until(lambda: listening(root), timeout=10, what="metrics.listening")
        assert bound["host"] == "127.0.0.1"
        url = f"http://127.0.0.1:{bound['port']}"
        daemon.drop("slow.toml", linreg_job("slow", faults={"step_delay_s": 0.5}))
        status, kind, _ = wait_until(
            lambda: scrape(f"{url}/metrics"),
            lambda got: jobs_gauge(got[2])["running"] == 1,
            timeout=60,
            what="a scrape showing the job running",
        )
        assert status == 200
        assert kind.startswith("text/plain; version=0.0.4")
        assert daemon.state("slow")["state"] == "running"
        wait_until(
            lambda: jobs_gauge(scrape(f"{url}/metrics")[2]),
            lambda gauge: gauge["completed"] == 1 and gauge["running"] == 0,
            timeout=60,
            what="a scrape showing the job completed",
        )
        with pytest.raises(urllib.error.HTTPError) as missing:
            scrape(f"{url}/other")
        missing.value.close()
        assert missing.value.code == 404
    with pytest.raises(urllib.error.URLError):  # the listener stops with the daemon
        scrape(f"{url}/metrics")


def test_a_listen_address_in_use_is_refused_at_start(tmp_path: Path) -> None:
    """wardend exits 2 naming the address and the errno when it cannot bind."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        listen = ["--metrics-listen", address]
        done = subprocess.run(
            [sys.executable, "-m", "jobwarden.daemon", "--root", str(tmp_path / "root"), *listen],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 2
    assert f"wardend: --metrics-listen {address!r}: EADDRINUSE" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_textfile_is_rewritten_atomically(tmp_path: Path, compile_cache: Path) -> None:
    """Each turn replaces the file by rename: a reader never sees half of it, nor a leftover."""
    root = tmp_path / "root"
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    target = textfiles / "jobwarden.prom"
    torn: list[str] = []
    inodes: set[int] = set()
    stop = threading.Event()

    def read_while_written() -> None:
        while not stop.wait(0.002):
            try:
                with target.open() as file:
                    inodes.add(os.fstat(file.fileno()).st_ino)
                    text = file.read()
            except FileNotFoundError:
                continue
            if not text.endswith("\n") or "jobwarden_notifications_total" not in text:
                torn.append(text)

    reader = threading.Thread(target=read_while_written)
    reader.start()
    try:
        with Daemon(
            root, compile_cache, "--metrics-textfile", str(target), "--sample-interval", "0.1"
        ) as daemon:
            daemon.drop("short.toml", linreg_job("short", run={"steps": 2}))
            assert daemon.wait("short")["state"] == "completed"
            wait_until(
                lambda: jobs_gauge(target.read_text()),
                lambda gauge: gauge["completed"] == 1,
                timeout=30,
                what="the textfile showing the completion",
            )
            wait_until(lambda: len(inodes) >= 5, timeout=30, what="five renderings seen")
    finally:
        stop.set()
        reader.join()
    assert torn == []
    assert sorted(p.name for p in textfiles.iterdir()) == ["jobwarden.prom"]
    assert target.stat().st_mode & 0o777 == 0o644  # readable by node_exporter's own user
