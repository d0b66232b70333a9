"""Prometheus scraping: /metrics over real HTTP on loopback, and node_exporter's textfile."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobwarden.daemon.observe.exporter import MetricsListenError, parse_address
from jobwarden.daemon.stats import SinceStart
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


class TestSinceStart:
    """Whole-life totals turned into counters from the daemon's start."""

    def test_a_job_found_at_the_start_counts_only_its_growth(self) -> None:
        """Its totals at the first reading are the baseline; what they add later is counted."""
        since = SinceStart()
        since.begin("records", ["old"])
        assert since.read("records", "old", {("restarts",): 3}) == {("restarts",): 0.0}
        assert since.read("records", "old", {("restarts",): 5}) == {("restarts",): 2.0}

    def test_a_job_submitted_since_counts_from_zero(self) -> None:
        """A job not found at the start has all of its totals counted."""
        since = SinceStart()
        since.begin("records", ["old"])
        assert since.read("records", "new", {("restarts",): 2}) == {("restarts",): 2.0}

    def test_a_falling_total_never_makes_the_counter_fall(self) -> None:
        """A resume starts a job's restarts at 0 again: the counter keeps its count, then grows."""
        since = SinceStart()
        since.read("records", "job", {("restarts",): 3})
        assert since.read("records", "job", {("restarts",): 0}) == {("restarts",): 3.0}
        assert since.read("records", "job", {("restarts",): 1}) == {("restarts",): 4.0}

    def test_a_removed_job_stays_in_the_sums_and_its_name_counts_anew(self) -> None:
        """Removing a job keeps its counts in `summed`; a new job of that name starts at 0."""
        since = SinceStart()
        since.read("records", "job", {("restarts",): 3})
        since.keep(set())
        assert since.summed("records") == {("restarts",): 3.0}
        since.read("records", "job", {("restarts",): 1})
        assert since.summed("records") == {("restarts",): 4.0}

    def test_a_series_first_seen_after_the_baseline_counts_whole(self) -> None:
        """A job found at the start that then meets a new cause counts all of that cause."""
        since = SinceStart()
        since.begin("goodput", ["job"])
        since.read("goodput", "job", {("badput", "replay"): 4})
        counted = since.read("goodput", "job", {("badput", "replay"): 4, ("badput", "stall"): 2})
        assert counted == {("badput", "replay"): 0.0, ("badput", "stall"): 2.0}


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


Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def series(text: str) -> Series:
    """Every sample of an exposition by name and labels, read by prometheus_client's parser."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    """One sample's value (KeyError when the exposition has no such series)."""
    return series(text)[name, frozenset(labels.items())]


@dataclass(frozen=True)
class Outputs:
    """What a daemon that recovered a crashed job published, read once it had settled."""

    root: Path
    textfile: Path
    textfile_text: str
    textfile_mode: int
    http_text: str
    ctl_text: str


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory, compile_cache: Path) -> Outputs:
    """A daemon with the listener and the textfile runs a job that crashes once (an incident)."""
    base = tmp_path_factory.mktemp("outputs")
    root, folder = base / "root", base / "textfile"
    folder.mkdir()
    target = folder / "jobwarden.prom"
    options = ["--metrics-listen", ":0", "--metrics-textfile", str(target)]
    with Daemon(root, compile_cache, *options, "--sample-interval", "0.2") as daemon:
        port = wait_until(lambda: listening(root), timeout=10, what="metrics.listening")["port"]
        daemon.drop("crash.toml", linreg_job("crash", faults={"fail_after": 3}))
        assert daemon.wait("crash")["state"] == "completed"

        def settled(text: str) -> bool:
            return jobs_gauge(text)["completed"] == 1 and value(text, "jobwarden_restarts_total")

        textfile = wait_until(target.read_text, settled, timeout=30, what="the textfile settled")
        http = wait_until(
            lambda: scrape(f"http://127.0.0.1:{port}/metrics")[2],
            settled,
            timeout=30,
            what="a scrape settled",
        )
        ctl_text = str(daemon.ask("metrics")["text"])
    return Outputs(root, target, textfile, target.stat().st_mode & 0o777, http, ctl_text)


class TestWhatEachOutputHolds:
    """The listener and the textfile, which any local user can read, name no job."""

    def test_the_public_outputs_hold_counts_and_no_job_name(self, outputs: Outputs) -> None:
        """The crash and its recovery are counted; no series has a job label; the file is 0644."""
        for text in (outputs.textfile_text, outputs.http_text):
            assert value(text, "jobwarden_incidents_total", kind="crash") == 1
            assert value(text, "jobwarden_restarts_total") == 1
            assert value(text, "jobwarden_checkpoints_total") > 0
            assert [labels for _, labels in series(text) if "job" in dict(labels)] == []
            assert 'job="' not in text
        assert outputs.textfile_mode == 0o644

    def test_wardenctl_metrics_adds_the_series_by_job(self, outputs: Outputs) -> None:
        """The control socket's metrics hold the same counts and the job's goodput series."""
        text = outputs.ctl_text
        assert value(text, "jobwarden_restarts_total") == 1
        assert 0 < value(text, "jobwarden_goodput_ratio", job="crash") <= 1
        assert value(text, "jobwarden_productive_seconds_total", job="crash") > 0

    def test_promtool_reports_nothing_on_either_output(self, outputs: Outputs) -> None:
        """``promtool check metrics`` finds no problem in the textfile nor in a scrape."""
        promtool = shutil.which("promtool")
        if promtool is None:
            pytest.skip(
                "promtool is not installed (Debian's prometheus package, which CI does not"
                " install: docs/daemon.md, Metrics), so `promtool check metrics` was not run;"
                " prometheus_client's parser still read both outputs"
            )
        for text in (outputs.textfile_text, outputs.http_text, outputs.ctl_text):
            done = subprocess.run(
                [promtool, "check", "metrics"],
                input=text,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_counters_count_from_the_daemon_start(outputs: Outputs, compile_cache: Path) -> None:
    """A new daemon on the same root starts every counter at 0, then counts only its own work."""
    target = outputs.textfile
    target.unlink()
    options = ["--metrics-textfile", str(target), "--sample-interval", "0.2"]
    with Daemon(outputs.root, compile_cache, *options) as daemon:
        started = wait_until(
            lambda: target.read_text() if target.exists() else "",
            lambda text: text and jobs_gauge(text)["completed"] == 1,
            timeout=30,
            what="the new daemon's textfile",
        )
        zeros = {
            name: value(started, name)
            for name in (
                "jobwarden_restarts_total",
                "jobwarden_replayed_updates_total",
                "jobwarden_time_lost_seconds_total",
                "jobwarden_checkpoints_total",
                "jobwarden_checkpoint_bytes_total",
            )
        }
        assert dict.fromkeys(zeros, 0.0) == zeros
        assert value(started, "jobwarden_incidents_total", kind="crash") == 0
        before = str(daemon.ask("metrics")["text"])
        assert value(before, "jobwarden_productive_seconds_total", job="crash") == 0
        daemon.drop("again.toml", linreg_job("again", faults={"fail_after": 3}))
        assert daemon.wait("again")["state"] == "completed"
        after = wait_until(
            target.read_text,
            lambda text: jobs_gauge(text)["completed"] == 2,
            timeout=30,
            what="the second job's completion in the textfile",
        )
        assert value(after, "jobwarden_restarts_total") == 1
        assert value(after, "jobwarden_incidents_total", kind="crash") == 1
        assert value(after, "jobwarden_checkpoints_total") > 0
        assert value(outputs.textfile_text, "jobwarden_checkpoints_total") == value(
            after, "jobwarden_checkpoints_total"
        )  # the same job again: only the second daemon's own checkpoints
        text = str(daemon.ask("metrics")["text"])
        assert value(text, "jobwarden_productive_seconds_total", job="crash") == 0
        assert value(text, "jobwarden_productive_seconds_total", job="again") > 0
