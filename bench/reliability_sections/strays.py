"""Section strays: plain programs that leave descendants of every kind behind them, through
many crashed, cancelled and stopped attempts; what outlives an attempt, what writes beside
the next one, how long a crash takes to be restarted, what is left a zombie of the daemon.

Each attempt's program (`PROGRAM`) starts four helpers, each a fresh interpreter whose
command line carries a marker naming the run, the job, the attempt and the helper's kind:
one in the program's process group, one in a session of its own holding the program's
stdout, a detached grandchild (``setsid``, double fork, stdio on ``/dev/null``) and a
double-fork orphan left in the group.  Every helper ignores SIGTERM and appends a
timestamped line to ``writes`` in the job's checkpoint directory every 50 ms while its
program lives and ``linger_s`` after (the stdout holder ``stdout_s``, shorter, so that a
daemon that waits for the pipe to close still starts the next attempt while the others
write); once all four have written, the program says ``ready`` and either exits 1 after
``hold_s`` (a crash) or waits for the section to stop or cancel it.  A thread scans /proc
for the markers meanwhile: a helper alive once its attempt's ``exit.json`` exists is left
behind.  No helper ends before its program: one leading a session of its own that did, its
program never waiting for it, would stay a zombie of the daemon (docs/daemon.md says so),
and the zombies counted here are those the daemon could reap.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from jobwarden.control.harness import toml_value

from .common import SETTLED_STATES, Record, Section, ms, percentile
from .evidence import read_json
from .strays_program import KINDS, PROGRAM
from .wardend import Wardend, running


@dataclass
class Plan:
    """One job: what each attempt does (``c`` crashes, ``w`` waits), and how a waiting
    attempt ends (``cancel``, or ``stop`` then ``resume``)."""

    job: str
    attempts: str
    ending: str
    done: set[int] = field(default_factory=set)


def plans(jobs: int, restarts: int) -> list[Plan]:
    """Jobs in turn: every attempt crashes; the last is cancelled; one is stopped, resumed."""
    out = []
    for index in range(jobs):
        job = f"st-{index:03d}"
        ending = ("crash", "cancel", "stop")[index % 3]
        if ending == "crash":
            out.append(Plan(job, "c" * (restarts + 1), ending))
        elif ending == "cancel":
            out.append(Plan(job, "c" * restarts + "w", ending))
        else:  # after the resume, the restarts count again from 0
            out.append(Plan(job, "c" * (restarts // 2) + "w" + "c" * (restarts + 1), ending))
    return out


def job_file(plan: Plan, program: Path, token: str, restarts: int, lives: list[float]) -> str:
    """A plain command job running `PROGRAM` with its plan and its helpers' lives (the
    others', the stdout holder's, the program's after ready), restarted at once on a crash."""
    command = [sys.executable, str(program), f"{token}/{plan.job}", plan.attempts]
    command += [f"{life:g}" for life in lives]
    return "\n".join(
        [
            f'id = "{plan.job}"',
            "command = [" + ", ".join(toml_value(a) for a in command) + "]",
            "sdk = false",
            "[supervision]",
            f"max_restarts = {restarts}",
            "restart_backoff_s = 0.0",
            "stop_grace_s = 1.0",
        ]
    )


def marked(token: str) -> dict[int, tuple[str, int, str]]:
    """The live processes whose command line carries ``token``: pid -> (job, attempt, kind)."""
    found = {}
    needle = token.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        for arg in argv:
            parts = arg.split(b"/")
            if parts[0] == needle and len(parts) == 4:  # a helper's; a program's names no attempt
                _, job, attempt, kind = (part.decode() for part in parts)
                found[int(name)] = (job, int(attempt), kind)
                break
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has exited)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


class Watch:
    """A thread scanning /proc every ``interval`` s for helpers alive after their attempt's
    ``exit.json`` was written: pid -> (job, attempt, kind)."""

    def __init__(self, root: Path, token: str, interval: float = 0.05) -> None:
        self.root = root
        self.token = token
        self.interval = interval
        self.left: dict[int, tuple[str, int, str]] = {}
        self.scans = 0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)

    def scan(self) -> None:
        """One scan: a helper counts once its attempt ended and it is still alive after."""
        for pid, (job, attempt, kind) in marked(self.token).items():
            ended = self.root / "jobs" / job / "attempts" / str(attempt) / "exit.json"
            if pid not in self.left and ended.exists() and alive(pid):
                self.left[pid] = (job, attempt, kind)
        self.scans += 1

    def _run(self) -> None:
        while not self.stop.wait(self.interval):
            try:
                self.scan()
            except Exception as error:  # noqa: BLE001 - a thread's error is a failed check
                self.errors.append(repr(error))
                return


def drive(daemon: Wardend, plan: Plan, writes: Path, rng: random.Random, hold_s: float) -> None:
    """Stop or cancel the job's waiting attempt once it is ready (after a random delay), and
    resume a stopped job once it rests preempted."""
    lines = [line.split() for line in read_lines(writes)]
    for attempt in [int(n) for what, n, _ in lines if what == "ready"]:
        if plan.attempts[min(attempt, len(plan.attempts)) - 1] != "w" or attempt in plan.done:
            continue
        time.sleep(rng.uniform(0, hold_s))
        if plan.ending == "cancel":
            daemon.ask("cancel", jobs=[plan.job])
        else:
            daemon.ask("stop", job=plan.job)
            daemon.wait(plan.job, ("preempted",), timeout=60)
            daemon.ask("resume", job=plan.job)
        plan.done.add(attempt)


def read_lines(path: Path) -> list[str]:
    """The whole lines of a file others append to (none while it is missing)."""
    with contextlib.suppress(FileNotFoundError):
        return [line for line in path.read_text().splitlines() if len(line.split()) == 3]
    return []


def daemon_zombies(pid: int) -> list[int]:
    """The daemon's children that have exited and are not reaped."""
    try:
        children = psutil.Process(pid).children()
    except psutil.Error:
        return []
    found = []
    for child in children:
        with contextlib.suppress(psutil.Error):
            if child.status() == psutil.STATUS_ZOMBIE:
                found.append(child.pid)
    return found


def strays(
    folder: Path,
    cache: Path,
    *,
    jobs: int = 30,
    restarts: int = 3,
    concurrency: int = 3,
    linger_s: float = 3.0,
    stdout_s: float = 1.0,
    hold_s: float = 0.2,
    seed: int = 0,
    timeout_s: float = 900.0,
) -> Section:
    """Many attempts of plain programs leaving helpers of each kind; what outlives them."""
    section = Section("strays")
    section.sizes = {
        "jobs": jobs,
        "restarts/job": restarts,
        "helpers/attempt": len(KINDS),
        "helper life": f"{linger_s:g} s ({stdout_s:g} s holding stdout)",
        "concurrent": concurrency,
    }
    rng = random.Random(seed)
    token = f"strays-{uuid.uuid4().hex[:12]}"
    program = folder / "strays_program.py"
    program.write_text(PROGRAM)
    root = folder / "root"
    todo = plans(jobs, restarts)
    errors: list[str] = []
    states: dict[str, Record] = {}
    extra = ("--max-concurrent", str(concurrency), "--no-warm-spare")
    began = time.monotonic()
    with running(root, cache, *extra) as daemon, Watch(root, token) as watch:
        for plan in todo:
            text = job_file(plan, program, token, restarts, [linger_s, stdout_s, hold_s])
            daemon.drop(f"{plan.job}.toml", text)
        while len(states) < jobs and time.monotonic() - began < timeout_s:
            for plan in todo:
                if plan.job in states:
                    continue
                try:
                    drive(daemon, plan, root / "checkpoints" / plan.job / "writes", rng, hold_s)
                    status = daemon.status(plan.job)
                except Exception as error:  # noqa: BLE001 - reported as a failed check
                    errors.append(f"{plan.job}: {error!r:.300}")
                    states[plan.job] = {"state": "harness error"}
                    continue
                waited = plan.attempts.count("w")
                if status is None or status["state"] not in SETTLED_STATES:
                    continue
                if len(plan.done) == waited or status["state"] == "cancelled":
                    states[plan.job] = status
            time.sleep(0.05)
        duration = time.monotonic() - began
        time.sleep(1.0)  # what the daemon reaps it reaps at once; give it a moment
        watch.scan()
        zombies = daemon_zombies(daemon.pid)
        stale = marked(token)
        for pid in stale:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
    f = section.figures
    f.update(writes_figures(root, todo))
    left = Counter(kind for _, _, kind in watch.left.values())
    attempts_ended = sum(len(list(root.glob(f"jobs/{p.job}/attempts/*/exit.json"))) for p in todo)
    f.update(
        {
            "duration_s": round(duration, 1),
            "attempts_ended": attempts_ended,
            "left_after_attempt": len(watch.left),
            "left_by_kind": dict(left),
            "left_at_end": len(stale),
            "scans": watch.scans,
            "daemon_zombies": len(zombies),
            "states": dict(Counter(str(s["state"]) for s in states.values())),
            "unsettled": [p.job for p in todo if p.job not in states],
            "errors": errors + watch.errors,
        }
    )
    section.row("attempts ended", attempts_ended)
    section.row(
        "descendants alive after their attempt ended",
        f"{len(watch.left)} of {attempts_ended * len(KINDS)}"
        + (f" ({', '.join(f'{k} {n}' for k, n in sorted(left.items()))})" if left else ""),
        "0",
    )
    section.row("  still alive once every job had settled", len(stale), "0")
    section.row(
        "writes of attempt k's descendants after attempt k+1 started",
        f"{f['overlapping_writes']} (in {f['overlapping_attempts']} attempts)",
        "0",
    )
    section.row("  writes after their own attempt ended", f["writes_after_end"], "0")
    section.row(
        "crash to the next attempt's start, median / p95",
        f"{ms(f['restart_p50_s'])} / {ms(f['restart_p95_s'])} (n {f['restarts']})",
    )
    section.row("zombies of the daemon once every job settled", len(zombies), "0")
    section.row("job states", ", ".join(f"{k} {n}" for k, n in sorted(f["states"].items())))
    section.check("descendants left after attempts == 0", not watch.left and not stale)
    section.check("overlapping writes == 0", f["overlapping_writes"] == 0)
    section.check("no zombie of the daemon", not zombies)
    section.check("all settled", not f["unsettled"] and not f["errors"])
    return section


def writes_figures(root: Path, todo: list[Plan]) -> Record:
    """From each job's ``writes`` and ``exit.json`` files: helpers' writes after the next
    attempt started and after their own attempt ended; crash to next start latencies."""
    overlapping, after_end = 0, 0
    attempts: set[tuple[str, int]] = set()
    latencies: list[float] = []
    for plan in todo:
        lines = [line.split() for line in read_lines(root / "checkpoints" / plan.job / "writes")]
        starts = {int(n): float(t) for what, n, t in lines if what == "start"}
        crashes = {int(n): float(t) for what, n, t in lines if what == "end"}
        ended = {}
        for number in starts:
            record = read_json(root / "jobs" / plan.job / "attempts" / str(number) / "exit.json")
            ended[number] = float((record or {}).get("ended", 1e18))
        for what, written_by, when in lines:
            if what not in KINDS:
                continue
            attempt, at = int(written_by), float(when)
            if at > starts.get(attempt + 1, 1e18):
                overlapping += 1
                attempts.add((plan.job, attempt))
            after_end += at > ended.get(attempt, 1e18)
        latencies += [starts[n + 1] - t for n, t in crashes.items() if n + 1 in starts]
    return {
        "overlapping_writes": overlapping,
        "overlapping_attempts": len(attempts),
        "writes_after_end": after_end,
        "restarts": len(latencies),
        "restart_p50_s": percentile(latencies, 50),
        "restart_p95_s": percentile(latencies, 95),
    }
