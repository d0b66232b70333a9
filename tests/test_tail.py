"""wardenctl tail and maintail through a real daemon: the end first, the daemon's actions
interleaved in time, -f from the end, --attempt, --stderr, Ctrl-C; and reading from the end."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.control.commands.tailing import render_action
from jobwarden.daemon.api import reading
from jobwarden.protocol import ControlError
from tests.daemon import Daemon, ctl, linreg_job
from tests.helpers import wait_until


def lines(daemon: Daemon, *args: str) -> list[str]:
    """The non-empty lines wardenctl prints."""
    done = ctl(daemon, *args)
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, compile_cache: Path) -> Iterator[Daemon]:
    """One daemon with a long job and a crashed-and-recovered one, both completed."""
    root = tmp_path_factory.mktemp("tail") / "root"
    with Daemon(root, compile_cache) as daemon:
        daemon.drop("long.toml", linreg_job("long", run={"steps": 2500, "checkpoint_every": 500}))
        daemon.drop("crash.toml", linreg_job("crash", faults={"fail_after": 3}))
        assert daemon.wait("long", timeout=300)["state"] == "completed"
        assert daemon.wait("crash")["state"] == "completed"
        yield daemon


class TestActionLines:
    """A daemon action as a tail line: long fields cut, a list's items one by one."""

    def test_every_member_of_a_large_job_keeps_its_pid_in_view(self) -> None:
        """attempt.started of 8 members: each member's pid is on the line (a list used to be
        cut as a whole at 120 characters, hiding every member past the third)."""
        members = [{"process": i, "pid": 100000 + i} for i in range(8)]
        record = {"event": "attempt.started", "time": 0, "attempt": 2, "members": members}
        line = render_action(record)
        assert all(f'"pid": {100000 + i}' in line for i in range(8)), line

    def test_a_long_list_is_shown_in_part_and_counted(self) -> None:
        """A list of 40 items shows 32 and says how many more there are."""
        line = render_action({"event": "x", "time": 0, "steps": list(range(40))})
        assert line.endswith("steps=[" + ", ".join(map(str, range(32))) + ", ... 8 more]")

    def test_a_long_text_is_cut_at_120_characters(self) -> None:
        """Any other value is cut as before."""
        line = render_action({"event": "x", "time": 0, "why": "w" * 200})
        assert line.endswith("why=" + "w" * 117 + "...")


class TestReadingFromTheEnd:
    """The backward reader: the lines asked for, without reading the file."""

    class Counted(io.BytesIO):
        """A stream that counts the bytes read from it."""

        taken = 0

        def read(self, size: int | None = -1) -> bytes:
            data = super().read(size)
            self.taken += len(data)
            return data

    def test_last_lines_read_a_little_of_a_large_file(self) -> None:
        """The last 10 lines of 20 MiB cost one block, and a partial last line is left out."""
        body = b"".join(b'{"n": %d}\n' % n for n in range(2_000_000)) + b'{"partial'
        stream = self.Counted(body)
        end = reading.complete_end(stream, len(body))
        found = []
        for line in reading.reverse_lines(stream, end):
            found.append(line)
            if len(found) == 11:
                break
        assert end == len(body) - len(b'{"partial')
        assert [b'{"n": %d}' % n for n in range(1_999_999, 1_999_989, -1)] == found[1:]
        assert stream.taken < 3 * reading.BLOCK

    def test_a_file_shorter_than_a_block_is_read_whole(self) -> None:
        """Every line of a small file, oldest first, with the offset after the last."""
        stream = self.Counted(b"a\nb\nc\n")
        assert list(reading.reverse_lines(stream, 6)) == [b"", b"c", b"b", b"a"]


@pytest.mark.slow
def test_tail_shows_the_end_of_a_long_job(live: Daemon) -> None:
    """tail JOB ends with the completion; -n counts; --no-daemon ends with the worker's line."""
    shown = lines(live, "tail", "long")
    assert len(shown) == 20
    assert "completed" in shown[-1]
    assert "wardend job.transition running -> completed" in shown[-1]
    assert any("progress" in line and "step=2500" in line for line in shown)
    assert len(lines(live, "tail", "long", "-n", "3")) == 3
    worker = lines(live, "tail", "long", "--no-daemon", "-n", "2")
    assert "completed" in worker[-1]
    assert "wardend" not in " ".join(worker)


@pytest.mark.slow
def test_daemon_actions_are_interleaved_in_time(live: Daemon) -> None:
    """The crash, the restart scheduled and the verification sit between the attempts' lines."""
    items = [json.loads(line) for line in lines(live, "tail", "crash", "-n", "200", "--json")]
    times = [item.get("read", item["time"]) for item in items]  # on the daemon's clock
    assert times == sorted(times)
    assert all("read" in item for item in items if item.get("origin") != "wardend")
    assert all("time_iso" in item for item in items if "time" in item)  # the ISO twin
    ours = [(i.get("attempt"), i.get("event")) for i in items if i.get("origin") == "wardend"]
    assert (1, "attempt.exited") in ours
    assert (2, "attempt.started") in ours
    kinds = [i.get("event") for i in items]
    failed, restarted = kinds.index("failed"), kinds.index("incident.opened")
    verified = kinds.index("incident.verified")
    second_start = max(n for n, i in enumerate(items) if i.get("event") == "started")
    assert failed < restarted < second_start < verified
    text = lines(live, "tail", "crash", "-n", "200")
    assert any("running -> recovering" in line for line in text)
    assert text[0].startswith("#-") or text[0].startswith("#1")


@pytest.mark.slow
def test_tail_of_one_attempt_and_its_stderr(live: Daemon) -> None:
    """--attempt N keeps to that attempt; --stderr shows its stderr through the socket."""
    first = [json.loads(line) for line in lines(live, "tail", "crash", "--attempt", "1", "--json")]
    assert {item["attempt"] for item in first} == {1}
    kinds = [item.get("event") for item in first]
    assert "failed" in kinds
    assert "completed" not in kinds  # the worker's completion is attempt 2's
    stderr = ctl(live, "tail", "crash", "--attempt", "1", "--stderr", "-n", "50")
    assert stderr.returncode == 0
    assert "worker.injected_failure" in stderr.stdout
    assert stderr.stdout.startswith("==> attempt 1 stderr <==")
    assert ctl(live, "tail", "crash", "--attempt", "9").returncode == 4  # no such attempt


INTERRUPTIBLE = [
    sys.executable,
    "-c",
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from jobwarden.control.cli import main; sys.exit(main(sys.argv[1:]))",
]
"""wardenctl with SIGINT raising KeyboardInterrupt even when the suite runs where SIGINT is
ignored (a background job of a shell without job control), which Python would keep."""


@pytest.mark.slow
def test_follow_starts_at_the_end_and_ctrl_c_exits_cleanly(live: Daemon) -> None:
    """tail -f of a running job begins near its end, follows it, and exits 130 on SIGINT."""
    live.drop(
        "slow.toml",
        linreg_job(
            "slow", run={"steps": 3000, "checkpoint_every": 500}, faults={"step_delay_s": 0.01}
        ),
    )
    wait_until(
        lambda: live.state("slow"),
        lambda s: s["step"] >= 200,
        timeout=90,
        what="job slow past step 200",
        retry=(ControlError,),
    )
    follow = subprocess.Popen(
        [*INTERRUPTIBLE, "--root", str(live.root), "tail", "slow", "-f", "-n", "2", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follow.stdout is not None
    first = json.loads(follow.stdout.readline())
    assert first.get("event") == "progress"
    assert first["step"] >= 150
    later = [json.loads(follow.stdout.readline()) for _ in range(30)]
    assert max(e.get("step", 0) for e in later) > first["step"]
    follow.send_signal(signal.SIGINT)
    _, err = follow.communicate(timeout=30)
    assert follow.returncode == 130
    assert "Traceback" not in err
    assert ctl(live, "stop", "slow").returncode == 0
    live.wait("slow", ("preempted",), timeout=60)
    ended = subprocess.run(
        [*INTERRUPTIBLE, "--root", str(live.root), "tail", "slow", "-f", "-n", "1"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert ended.returncode == 0
    assert "preempted" in ended.stdout


@pytest.mark.slow
def test_maintail_is_readable(live: Daemon) -> None:
    """maintail prints the daemon's records one readable line each, not JSON."""
    shown = lines(live, "maintail", "-n", "5")
    assert len(shown) == 5
    assert not any(line.startswith("{") for line in shown)
    level = shown[-1].split()[1]
    assert level in ("INFO", "WARNING", "ERROR", "DEBUG")
    records = [json.loads(line) for line in lines(live, "maintail", "-n", "500", "--json")]
    assert "wardend.ready" in [r.get("event") for r in records]
    assert all(isinstance(r["time"], float) and "time_iso" in r for r in records)
    assert not [r for r in records if "timestamp" in r or "source" in r or "target" in r]
    started = time.monotonic()
    follow = subprocess.Popen(
        [*INTERRUPTIBLE, "--root", str(live.root), "maintail", "-f", "-n", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follow.stdout is not None
    follow.stdout.readline()
    live.drop("after.toml", linreg_job("after"))
    seen = ""
    while "job.queued" not in seen and time.monotonic() - started < 60:
        seen = follow.stdout.readline()
    follow.send_signal(signal.SIGINT)
    follow.communicate(timeout=30)
    assert "job.queued" in seen
    assert "job=after" in seen
