"""wardenctl dashboard in a real headless Chromium, against a real daemon with a job that
crashed and recovered and one whose own text is markup; the token, the pages, the live
update, and one shared status poll however many pages are open."""

from __future__ import annotations

import http.client
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobwarden.dashboard.drills import Drills
from jobwarden.dashboard.server import Dashboard
from jobwarden.dashboard.source import Source
from tests.browser import SHOTS, chrome
from tests.daemon import WARDENCTL, Daemon, ctl, linreg_job
from tests.helpers import wait_until

__all__ = ["chrome"]

PAYLOAD = "<script>window.pwned=1</script><b>bold</b>"
MARKUP_JOB = f"""id = "markup"
command = [{sys.executable!r}, "-c", "import sys; sys.exit(3)", {PAYLOAD!r}]
sdk = false
[supervision]
max_restarts = 0
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, compile_cache: Path) -> Iterator[Daemon]:
    """A daemon with a crashed-and-recovered job and a failed one whose command is markup."""
    root = tmp_path_factory.mktemp("dashboard") / "root"
    with Daemon(root, compile_cache) as running:
        running.drop("crash.toml", linreg_job("crash", faults={"fail_after": 3}))
        running.drop("markup.toml", MARKUP_JOB)
        assert running.wait("crash")["state"] == "completed"
        assert running.wait("markup")["state"] == "failed"
        yield running


@pytest.fixture(scope="module")
def url(daemon: Daemon) -> Iterator[str]:
    """``wardenctl dashboard`` on a free loopback port: the URL it printed, token and all."""
    argv = [*WARDENCTL, "--root", str(daemon.root), "dashboard", "--listen", "127.0.0.1:0"]
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert "http://127.0.0.1:" in line, process.stderr.read() if process.stderr else line
            yield line.split()[-1]
        finally:
            process.terminate()
            assert process.wait(timeout=10) == 0


def base(url: str) -> str:
    """The URL without its path and token."""
    return url.split("/?", 1)[0]


def visit(chrome: Any, url: str, path: str, shot: str) -> Any:
    """Open ``path`` (the token URL first, for the cookie) and keep a screenshot."""
    if not getattr(chrome, "has_cookie", False):
        chrome.get(url)
        chrome.has_cookie = True
    chrome.get(base(url) + path)
    chrome.save_screenshot(str(SHOTS / f"{shot}.png"))
    return chrome


def text_of(chrome: Any, selector: str) -> str:
    """The text of the element the CSS selector finds ("" while the live update is replacing
    the table, the element gone or stale for a moment: the next poll reads the new one)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return str(chrome.find_element("css selector", selector).text)
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def fetch(url: str, cookie: str | None = None) -> tuple[int, Any]:
    """GET ``url`` without following a redirect: the status and the headers."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.netloc, timeout=10)
    try:
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", path or "/", headers={"Cookie": cookie} if cookie else {})
        answer = conn.getresponse()
        answer.read()
        return answer.status, answer.headers
    finally:
        conn.close()


class TestToken:
    """A URL without the token grants nothing."""

    def test_no_token_is_refused(self, url: str) -> None:
        """/ and a job page without the token (or with a wrong one) answer 403."""
        for path in ("/", "/job/crash", "/?token=wrong", "/static/live.js"):
            assert fetch(base(url) + path)[0] == 403, path
        assert fetch(base(url) + "/", cookie="jobwarden_dashboard_1=wrong")[0] == 403

    def test_token_becomes_a_strict_cookie(self, url: str) -> None:
        """The token URL sets an HttpOnly SameSite=Strict cookie and a restrictive policy."""
        status, headers = fetch(url)
        assert status == 303
        assert headers["Location"] == "/"
        assert "HttpOnly" in headers["Set-Cookie"]
        assert "SameSite=Strict" in headers["Set-Cookie"]
        assert "default-src 'none'" in headers["Content-Security-Policy"]
        assert headers["Access-Control-Allow-Origin"] is None
        cookie = headers["Set-Cookie"].split(";")[0]
        assert fetch(base(url) + "/job/crash", cookie=cookie)[0] == 200


class TestPages:
    """Each page in the browser, a screenshot kept of each."""

    def test_jobs_page(self, chrome: Any, url: str) -> None:
        """The jobs page lists the recovered job as completed, and the daemon's health."""
        visit(chrome, url, "/", "jobs")
        assert text_of(chrome, 'tr[data-job="crash"] td.state') == "completed"
        assert text_of(chrome, "#jobs-count") == "2"
        assert text_of(chrome, "#attention") == "1"

    def test_state_filter(self, chrome: Any, url: str) -> None:
        """Filtered by state, the jobs page shows only the jobs in that state."""
        visit(chrome, url, "/?state=failed", "jobs-failed")
        rows = chrome.find_elements("css selector", "#jobs tbody tr")
        assert [row.get_attribute("data-job") for row in rows] == ["markup"]

    def test_job_page(self, chrome: Any, url: str) -> None:
        """The job page shows two attempts, the incident, and loss points of both attempts."""
        visit(chrome, url, "/job/crash", "job")
        assert text_of(chrome, "#attempts") == "2"
        marks = chrome.find_elements("css selector", 'svg.timeline a[href="/incident/crash-1"]')
        assert len(marks) == 1
        first = chrome.find_elements("css selector", 'svg.loss g[data-attempt="1"] circle')
        second = chrome.find_elements("css selector", 'svg.loss g[data-attempt="2"] circle')
        assert (len(first), len(second)) == (3, 6)  # updates 1-3, then 3-8 replayed from 2
        assert chrome.find_elements("css selector", "svg.goodput rect.cause")

    def test_incident_page(self, chrome: Any, url: str) -> None:
        """The incident page renders the runbook's markdown and the verified replay checks."""
        visit(chrome, url, "/incident/crash-1", "incident")
        assert text_of(chrome, "#runbook h1").startswith("Incident crash-1")
        assert chrome.find_elements("css selector", "#runbook h2")
        checks = chrome.find_elements("css selector", "table.checks tbody tr.ok")
        assert len(checks) == 2

    def test_evidence_tail(self, chrome: Any, url: str) -> None:
        """The evidence links serve an attempt's events through the socket."""
        visit(chrome, url, "/job/crash/tail?attempt=1&stream=events", "tail")
        assert "event=failed" in text_of(chrome, "#tail")


class TestMarkup:
    """A job's own text is shown as text: no element is made of it, no script runs."""

    def test_incident_shows_markup_as_text(self, chrome: Any, url: str) -> None:
        """The symptom and the runbook quote the markup; it makes no element and runs no
        script, and the console says nothing of it."""
        chrome.get_log("browser")  # what came before
        visit(chrome, url, "/incident/markup-1", "incident-markup")
        assert "<script>window.pwned=1</script>" in text_of(chrome, "#symptom")
        assert "<b>bold</b>" in text_of(chrome, "#runbook")
        assert chrome.find_elements("css selector", "#symptom b, #runbook b, main script") == []
        assert chrome.execute_script("return window.pwned === undefined")
        assert [e for e in chrome.get_log("browser") if e["level"] != "INFO"] == []

    def test_jobs_and_job_pages_too(self, chrome: Any, url: str) -> None:
        """The job page's incident table shows the symptom as text as well."""
        visit(chrome, url, "/job/markup", "job-markup")
        assert "<b>bold</b>" in text_of(chrome, "td.symptom")
        assert chrome.find_elements("css selector", "td.symptom b") == []
        assert chrome.execute_script("return window.pwned === undefined")


def test_live_update(chrome: Any, url: str, daemon: Daemon) -> None:
    """A job stopped by wardenctl shows as preempted within 2 s, the page never reloaded."""
    daemon.drop("slow.toml", linreg_job("slow", run={"steps": 5000}, faults={"step_delay_s": 0.02}))
    daemon.wait("slow", states=("running",))
    visit(chrome, url, "/", "jobs-live")
    chrome.execute_script("window.sameLoad = true")
    assert ctl(daemon, "stop", "slow").returncode == 0
    daemon.wait("slow", states=("preempted",))
    changed = time.monotonic()
    cell = 'tr[data-job="slow"] td.state'
    wait_until(
        lambda: text_of(chrome, cell),
        lambda state: state == "preempted",
        timeout=5,
        what="the jobs page showing slow preempted",
        interval=0.05,
    )
    assert time.monotonic() - changed < 2.0
    assert chrome.execute_script("return window.sameLoad === true")


def test_one_status_request_per_second(daemon: Daemon) -> None:
    """Eight pages asking for the live table 20 times a second cost the daemon one
    status request a second."""
    server = Dashboard(("127.0.0.1", 0), Source(daemon.root / "control.sock"))
    serving = threading.Thread(target=server.serve)
    serving.start()
    cookie = f"{server.cookie}={server.token}"
    asked = [0]

    def page() -> None:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            ask = urllib.request.Request(
                f"{base(server.url)}/live.json", headers={"Cookie": cookie}
            )
            with urllib.request.urlopen(ask, timeout=10) as answer:
                assert answer.status == 200
            asked[0] += 1
            time.sleep(0.05)

    try:
        pages = [threading.Thread(target=page) for _ in range(8)]
        for thread in pages:
            thread.start()
        for thread in pages:
            thread.join()
    finally:
        server.shutdown()
        serving.join()
        server.server_close()
    assert asked[0] > 100
    assert 1 <= server.source.requests <= 5


@pytest.mark.slow
def test_drill_page(chrome: Any, daemon: Daemon, tmp_path: Path) -> None:
    """A crash drill's evidence folder shows its verdict, its checks and the resumed loss
    drawn over the reference's."""
    out = tmp_path / "evidence"
    done = subprocess.run(
        [*WARDENCTL, "drill", "crash", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    server = Dashboard(("127.0.0.1", 0), Source(daemon.root / "control.sock"), Drills((out,)))
    serving = threading.Thread(target=server.serve)
    serving.start()
    try:
        chrome.get(server.url)
        chrome.get(base(server.url) + "/drill/crash")
        chrome.save_screenshot(str(SHOTS / "drill.png"))
        assert text_of(chrome, "#drill-verdict") == "pass"
        assert chrome.find_elements("css selector", "table.checks tr.ok")
        assert chrome.find_elements("css selector", "svg.loss g.reference circle")
        assert chrome.find_elements("css selector", "svg.loss g.series circle")
        assert text_of(chrome, "article.runbook h1").startswith("Incident")
    finally:
        server.shutdown()
        serving.join()
        server.server_close()
