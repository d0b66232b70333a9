"""Reliability benchmark: kills, full disks, socket abuse, hostile inputs, a long run, links.

Every section drives real processes the way users do: a ``python -m jobwarden.daemon``
on its own root, job files dropped Maildir-style (written in ``spool/tmp``, renamed into
``spool/incoming``), requests over the real control socket, real ``python -m
jobwarden.worker`` attempts on a shared warm compilation cache.  A section returns its
figures and its checks (each an acceptance condition, held or not); `main` prints one
table and writes ``bench/results/reliability.json``.  docs/reliability.md gives the
method of each section and the figures of a full run.

1. worker_kills: small linreg jobs (``checkpoint_every = 1``, ``step_delay_s``,
   ``every_attempt = true`` so later attempts are slow too, ``restart_backoff_s = 0``);
   the worker's pid is read from ``status JOB`` and SIGKILLed through a pidfd, at a
   random instant of the attempt (uniform over an attempt's measured life) or, one kill
   in four, the moment a ``*.pending`` file shows in the checkpoint directory.  A kill
   landed "in a commit" when a ``*.pending`` file is present right after it.
2. daemon_kills: the daemon is SIGKILLed while requests (valid and invalid) are
   dropped and jobs run, and restarted on the same root; instants are random, or the
   moment an intake is in progress (``jobs/+intake-*`` or ``spool/claimed/*``), or the
   moment a state write is (a ``*.pending`` under ``jobs/``).  At the end every request
   must be a completed job or a rejection with its error file.
3. disk_full: a small tmpfs as the root (the compile cache outside it), filled with a
   ballast file while a job runs; and a tmpfs at ``checkpoints/<name>`` too small for
   the job's checkpoints.  Recorded: the job's state and incident, whether the daemon
   lived; then space returns and ``resume`` and a new job must complete.
4. socket_abuse: many concurrent raw AF_UNIX clients (idle, non-readers, slowloris,
   oversized lines, nested JSON, invalid UTF-8) for a while; daemon rss and fds before
   and after, ``status`` latency during.
5. fuzz: hypothesis over job files, control request lines, event lines and checkpoint
   headers, in process and through a real daemon.
6. long_run: many jobs through one daemon, at most 20 waiting at a time; some run a
   worker to completion, the rest name the checkpoint of a held job and are refused by
   the duplicate-writer check (an incident each, no worker); rss, fds, ``status`` and
   ``status JOB`` latency after the first 10 jobs and after the last.
7. links: a symbolic link planted at each path the daemon or worker writes, pointing
   outside the root; every file outside the root hashed before and after.

Run with ``.venv/bin/python bench/reliability.py`` (``--quick`` for the CI sizes,
``--only SECTION`` for one section, ``--keep`` to keep the temporary roots,
``--render FILE --markdown`` to print a results file's table for docs/reliability.md).
Needs root for the tmpfs mounts of the disk-full section.  tests/reliability/ runs
each section at small sizes and asserts its acceptance conditions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import hashlib
import json
import math
import os
import platform
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import psutil

try:  # run as a script, bench/ is on the path; the tests import it as bench.reliability
    from figures import Figure, at_most, records, verdict
except ImportError:
    from bench.figures import Figure, at_most, records, verdict

from jobwarden.checkpoint import format as ckformat
from jobwarden.checkpoint.errors import CheckpointError
from jobwarden.control import client
from jobwarden.control.client import DaemonBusy, DaemonUnreachable
from jobwarden.control.harness import job_text
from jobwarden.errors import JobFileError
from jobwarden.events import Event, Malformed, parse_line
from jobwarden.jobfile import job_from_bytes
from jobwarden.protocol import ControlError, parse_request
from jobwarden.states import SETTLED
from jobwarden.worker.command import worker_argv

RESULTS = Path(__file__).resolve().parent / "results" / "reliability.json"
SETTLED_STATES = frozenset(state.value for state in SETTLED)
LIVE_STATES = frozenset({"starting", "running", "recovering"})
CKPT_NAME = re.compile(r"ckpt-(\d{10})\.safetensors")
Record = dict[str, Any]


# ---- sections and the table


@dataclass
class Section:
    """One section's sizes, figures and acceptance checks."""

    name: str
    sizes: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, bool] = field(default_factory=dict)
    rows: list[tuple[str, str, str]] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """Whether every check held."""
        return all(self.checks.values())

    def row(self, figure: str, value: object, target: str = "") -> None:
        """A table row: a figure, its value and (when it has one) its target."""
        self.rows.append((figure, str(value), target))

    def check(self, name: str, held: bool) -> bool:
        """Record an acceptance condition."""
        self.checks[name] = bool(held)
        return bool(held)

    def failures(self) -> list[str]:
        """The checks that did not hold."""
        return [name for name, held in self.checks.items() if not held]

    def as_record(self) -> Record:
        """JSON-ready form."""
        return {
            "section": self.name,
            "passed": self.passed,
            "seconds": round(self.seconds, 1),
            "sizes": self.sizes,
            "figures": self.figures,
            "checks": self.checks,
            "rows": [list(r) for r in self.rows],
            "details": self.details,
        }


def section_from(record: Record) -> Section:
    """A section back from its JSON form (to render a results file again)."""
    return Section(
        record["section"],
        sizes=record["sizes"],
        figures=record["figures"],
        checks=record["checks"],
        rows=[tuple(r) for r in record["rows"]],  # type: ignore[misc]
        details=record.get("details", {}),
        seconds=record["seconds"],
    )


def table(sections: list[Section], markdown: bool = False) -> str:
    """All sections as one table: section, sizes, figure, value, target, result."""
    head = ("section", "figure", "value", "target")
    rows: list[tuple[str, ...]] = []
    for s in sections:
        sizes = ", ".join(f"{k} {v}" for k, v in s.sizes.items())
        verdict = "PASS" if s.passed else "FAIL"
        rows.append((f"**{s.name}**" if markdown else s.name, f"sizes: {sizes}", "", ""))
        rows += [("", *r) for r in s.rows]
        rows.append(("", f"result ({s.seconds:.0f} s)", verdict, ""))
        rows += [("", "  failed check", name, "") for name in s.failures()]
    if markdown:
        rows = [
            (r[0], "· " + r[1].strip() if r[1].startswith("  ") else r[1], *r[2:]) for r in rows
        ]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [head, *rows]]
    lines.insert(1, "-" * max(len(line) for line in lines))
    return "\n".join(line.rstrip() for line in lines)


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (linear interpolation), None for no values."""
    return float(np.percentile(np.asarray(values), q)) if values else None


def ms(value: float | None) -> str:
    """Seconds as milliseconds, or '-'."""
    return "-" if value is None else f"{value * 1000:.1f} ms"


def mb(value: float | None) -> str:
    """Bytes as MB, or '-'."""
    return "-" if value is None else f"{value / 2**20:.1f} MB"


# ---- job files and references


def private_dir(path: Path) -> Path:
    """An empty 0700 directory (the worker refuses a compile cache others can read)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


@dataclass(frozen=True)
class Final:
    """The newest committed checkpoint of a directory, read and verified."""

    step: int
    state_hash: str
    arrays: dict[str, np.ndarray]

    def equals(self, other: Final) -> bool:
        """Same step and bit-equal leaves (names, dtypes, shapes, bytes)."""
        return (
            self.step == other.step
            and self.arrays.keys() == other.arrays.keys()
            and all(
                a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
                for a, b in ((self.arrays[k], other.arrays[k]) for k in self.arrays)
            )
        )


def final_of(directory: Path) -> Final | None:
    """The newest committed checkpoint in ``directory``, or None."""
    steps = []
    with contextlib.suppress(FileNotFoundError):
        steps = sorted(
            (int(m.group(1)), directory / name)
            for name in os.listdir(directory)
            if (m := CKPT_NAME.fullmatch(name))
        )
    if not steps:
        return None
    checkpoint = ckformat.read(steps[-1][1])
    return Final(
        checkpoint.manifest.step,
        checkpoint.manifest.state_hash,
        {k: np.array(v) for k, v in checkpoint.arrays.items()},
    )


class References:
    """Uninterrupted runs of a linreg job (no faults), by (seed, steps), run once each."""

    def __init__(self, base: Path, cache: Path) -> None:
        self.base = base
        self.cache = cache
        self.finals: dict[tuple[int, int], Final] = {}
        self.lock = threading.Lock()

    def get(self, seed: int, steps: int) -> Final:
        """The final checkpoint of the uninterrupted run."""
        with self.lock:
            if (seed, steps) not in self.finals:
                folder = self.base / f"reference-{seed}-{steps}"
                folder.mkdir(parents=True, exist_ok=True)
                spec = folder / "job.toml"
                spec.write_text(job_text("reference", train={"seed": seed}, run={"steps": steps}))
                argv = worker_argv(spec, folder / "checkpoints", self.cache)
                with (folder / "events.jsonl").open("wb") as out:
                    subprocess.run(
                        argv, stdout=out, stderr=subprocess.DEVNULL, check=True, timeout=600
                    )
                final = final_of(folder / "checkpoints")
                if final is None or final.step != steps:
                    raise RuntimeError(f"reference run in {folder} did not reach step {steps}")
                self.finals[seed, steps] = final
            return self.finals[seed, steps]


# ---- the daemon


class Wardend:
    """One wardend process on its own root; requests over its socket, files into its spool."""

    def __init__(self, root: Path, cache: Path | None, *extra: str) -> None:
        self.root = root
        self.cache = cache
        self.extra = extra
        self.socket = root / "control.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def launch(self) -> subprocess.Popen[bytes]:
        """Start the process without waiting for it."""
        argv = [sys.executable, "-m", "jobwarden.daemon", "--root", str(self.root)]
        argv += ["--rescan-interval", "1", *self.extra]
        if self.cache is not None:
            argv += ["--compile-cache", str(self.cache)]
        if not self.root.exists():
            self.root.mkdir(mode=0o700, parents=True)
        with (self.root.parent / f"{self.root.name}.stderr").open("ab") as err:
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        self.starts += 1
        return self.proc

    def start(self, timeout: float = 60) -> Wardend:
        """Start wardend and wait until its socket answers; raises if it exits."""
        status = self.start_or_exit(timeout)
        if status is not None:
            raise RuntimeError(f"wardend exited with {status}; see {self.stderr_path}")
        return self

    def start_or_exit(self, timeout: float = 60) -> int | None:
        """Start wardend; None once it answers, or its exit status if it exits first."""
        proc = self.launch()
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                return proc.returncode
            with contextlib.suppress(DaemonUnreachable, DaemonBusy, OSError, ControlError):
                if self.ask("version", timeout=2)["pid"] == proc.pid:
                    return None
            if time.monotonic() > deadline:
                raise TimeoutError(f"wardend on {self.root} not answering within {timeout} s")
            time.sleep(0.02)

    @property
    def stderr_path(self) -> Path:
        """Where the daemon's stderr goes."""
        return self.root.parent / f"{self.root.name}.stderr"

    @property
    def pid(self) -> int:
        """The daemon's pid."""
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        """Whether the daemon process is still running."""
        return self.proc is not None and self.proc.poll() is None

    def ask(self, cmd: str, timeout: float = 10, **args: Any) -> Any:
        """One control request."""
        return client.request(self.socket, cmd, timeout=timeout, **args)

    def status(self, job: str) -> Record | None:
        """``status JOB``, or None while the daemon does not know the job."""
        try:
            result: Record = self.ask("status", job=job)
        except ControlError as error:
            if error.code == "control.no_such_job":
                return None
            raise
        return result

    def wait(self, job: str, states: frozenset[str] = SETTLED_STATES, timeout: float = 300) -> Any:
        """Poll ``status JOB`` until it is in one of ``states``; returns the status."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"wardend exited with {self.proc and self.proc.returncode}")
            with contextlib.suppress(DaemonBusy, DaemonUnreachable):
                last = self.status(job)
                if isinstance(last, dict) and last["state"] in states:
                    return last
            time.sleep(0.05)
        raise TimeoutError(f"job {job} not in {sorted(states)} within {timeout} s: {last!r:.300}")

    def drop(self, name: str, data: str | bytes) -> None:
        """Write a request in spool/tmp and rename it into spool/incoming."""
        tmp = self.root / "spool" / "tmp" / name
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        os.rename(tmp, self.root / "spool" / "incoming" / name)

    def kill(self) -> None:
        """SIGKILL the daemon and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()

    def stop(self, timeout: float = 90) -> int | None:
        """SIGTERM the daemon and wait (SIGKILL past ``timeout``); returns its exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def process(self) -> psutil.Process:
        """The daemon as psutil sees it."""
        return psutil.Process(self.pid)

    def job_folder(self, job: str) -> Path:
        """jobs/<id>."""
        return self.root / "jobs" / job


@contextlib.contextmanager
def running(root: Path, cache: Path | None, *extra: str) -> Iterator[Wardend]:
    """A started daemon, stopped (SIGTERM) on the way out."""
    daemon = Wardend(root, cache, *extra)
    try:
        yield daemon.start()
    finally:
        daemon.stop()


def timed_status(sock: Path, job: str | None = None, timeout: float = 30) -> float:
    """Seconds one ``status`` (or ``status JOB``) takes, retries on a busy daemon included."""
    began = time.perf_counter()
    if job is None:
        client.request(sock, "status", timeout=timeout)
    else:
        client.request(sock, "status", timeout=timeout, job=job)
    return time.perf_counter() - began


def status_latencies(sock: Path, n: int, job: str | None = None) -> list[float]:
    """``n`` sequential status requests, each timed."""
    return [timed_status(sock, job) for _ in range(n)]


def read_json(path: Path) -> Any:
    """A JSON file, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def event_kinds(path: Path) -> list[str]:
    """The event kinds of an events.jsonl (malformed lines skipped)."""
    kinds = []
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_bytes().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    kinds.append(str(record.get("event")))
    return kinds


def incident_records(root: Path, job: str) -> list[Record]:
    """The latest record of each of the job's incidents, read from disk."""
    folder = root / "jobs" / job / "incidents"
    found = []
    with contextlib.suppress(FileNotFoundError):
        for path in sorted(folder.glob("*.json")):
            record = read_json(path)
            if isinstance(record, dict):
                found.append(record)
    return found


def open_incidents(root: Path, jobs: list[str]) -> list[str]:
    """Incidents still open although their job has settled."""
    found = []
    for job in jobs:
        state = (read_json(root / "jobs" / job / "state.json") or {}).get("state")
        if state in SETTLED_STATES:
            found += [
                str(i.get("id")) for i in incident_records(root, job) if i.get("status") == "open"
            ]
    return found


def pending_inodes(directory: Path) -> set[tuple[str, int]]:
    """(name, inode) of each pending checkpoint file in ``directory``."""
    found = set()
    for name in pending_files(directory):
        if CKPT_NAME.match(name):
            with contextlib.suppress(FileNotFoundError):
                found.add((name, os.lstat(directory / name).st_ino))
    return found


def pending_files(directory: Path) -> list[str]:
    """Names ending in ``.pending`` directly in ``directory``."""
    try:
        return [name for name in os.listdir(directory) if name.endswith(".pending")]
    except (FileNotFoundError, NotADirectoryError):
        return []


# ---- 1. worker kills


WORKER_KILL_STEPS = 60


def worker_kill_job(job_id: str, seed: int, restarts: int) -> str:
    """A small linreg job that commits every update and stays slow on every attempt."""
    return job_text(
        job_id,
        train={"seed": seed},
        run={"steps": WORKER_KILL_STEPS, "checkpoint_every": 1},
        faults={"step_delay_s": 0.01, "every_attempt": True},
        supervision={"max_restarts": restarts, "restart_backoff_s": 0.0},
    )


def is_worker(pid: int) -> bool:
    """Whether ``pid`` runs ``jobwarden.worker``."""
    try:
        return "jobwarden.worker" in " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def exited(pidfd: int, timeout: float) -> bool:
    """Wait up to ``timeout`` for the process behind ``pidfd`` to exit; whether it did."""
    ready, _, _ = select.select([pidfd], [], [], max(0.0, timeout))
    return bool(ready)


def wait_for_pending(directory: Path, pidfd: int, timeout: float) -> bool:
    """Poll ``directory`` until a pending checkpoint file shows (True) or the process exits or
    time runs out (False).  A busy poll: a commit of this state lasts about a millisecond."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError), os.scandir(directory) as entries:
            if any(e.name.endswith(".pending") and CKPT_NAME.match(e.name) for e in entries):
                return True
        if exited(pidfd, 0):
            return False
    return False


class KillPlan:
    """Shared counters of the kill threads: how many kills landed, which to target."""

    def __init__(self, target: int, targeted_every: int, seed: int) -> None:
        self.target = target
        self.targeted_every = targeted_every
        self.seed = seed
        self.lock = threading.Lock()
        self.sent = 0
        self.jobs = 0

    def next_job(self) -> int | None:
        """A new job index while kills are still wanted."""
        with self.lock:
            if self.sent >= self.target:
                return None
            self.jobs += 1
            return self.jobs - 1

    def refund(self) -> None:
        """A kill that was not sent (its attempt ended first) does not count."""
        with self.lock:
            self.sent -= 1

    def next_kill(self) -> tuple[int, bool] | None:
        """The next kill's index and whether it waits for a pending file; None when done."""
        with self.lock:
            if self.sent >= self.target:
                return None
            self.sent += 1
            index = self.sent - 1
            return index, index % self.targeted_every == self.targeted_every - 1


def kill_one_job(
    daemon: Wardend, job_id: str, kills_per_job: int, window_s: float, plan: KillPlan
) -> list[Record]:
    """Kill the job's worker ``kills_per_job`` times (fewer if it completes first)."""
    rng = random.Random(f"{plan.seed}-{job_id}")
    checkpoints = daemon.root / "checkpoints" / job_id
    records: list[Record] = []
    killed: set[int] = set()
    while len(records) < kills_per_job:
        status = daemon.status(job_id)
        if status is None or status["state"] not in LIVE_STATES:
            if status is not None and status["state"] in SETTLED_STATES:
                break
            time.sleep(0.01)
            continue
        attempt, pid = status["attempt"], status["pid"]
        if pid is None or attempt in killed or not is_worker(pid):
            time.sleep(0.01)
            continue
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        # Pending files an earlier killed attempt left, not yet quarantined by this one.
        stale = pending_inodes(checkpoints)
        try:
            turn = plan.next_kill()
            if turn is None:
                break
            index, targeted = turn
            began = time.monotonic()
            if targeted:
                alive = wait_for_pending(checkpoints, pidfd, window_s * 2)
                alive = alive and not exited(pidfd, 0)
            else:
                alive = not exited(pidfd, rng.uniform(0, window_s))
            delay = time.monotonic() - began
            if alive:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                exited(pidfd, 10)  # the signal is asynchronous: look once the process is gone
            else:
                plan.refund()
            pending = pending_files(checkpoints)
            own = sorted(name for name, inode in pending_inodes(checkpoints) - stale)
        finally:
            os.close(pidfd)
        killed.add(attempt)
        records.append(
            {
                "index": index,
                "job": job_id,
                "attempt": attempt,
                "pid": pid,
                "targeted": targeted,
                "delay_s": round(delay, 4),
                "sent": alive,
                "pending_after": pending,
                "own_pending_after": own,
            }
        )
    return records


def classify_kill(root: Path, kill: Record) -> str:
    """Where a kill landed, from the killed attempt's own records."""
    folder = root / "jobs" / kill["job"] / "attempts" / str(kill["attempt"])
    ended = read_json(folder / "exit.json") or {}
    if not kill["sent"] or ended.get("signal") != "SIGKILL":
        return "not sent (the attempt ended first)"
    if kill["own_pending_after"]:
        return "in a checkpoint commit"
    if any(not CKPT_NAME.match(name) for name in kill["pending_after"]):
        return "in the writer record's commit (start-up)"
    kinds = event_kinds(folder / "events.jsonl")
    if "completed" in kinds:
        return "after completed, before exit"
    if "ready" not in kinds:
        return "start-up (before ready)"
    return "between commits"


def in_commit(kill: Record) -> bool:
    """Whether a kill left a pending checkpoint file behind."""
    return bool(kill["sent"] and kill["own_pending_after"])


def attempt_life(daemon: Wardend, job_id: str, text: str) -> float:
    """Seconds from an attempt's pid showing in ``status`` to the job's completion."""
    daemon.drop(f"{job_id}.toml", text)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        status = daemon.status(job_id)
        if status is not None and status["pid"] is not None:
            break
        time.sleep(0.005)
    began = time.monotonic()
    daemon.wait(job_id)
    return time.monotonic() - began


def worker_kills(
    base: Path,
    cache: Path,
    references: References,
    *,
    kills: int = 200,
    kills_per_job: int = 4,
    concurrency: int = 2,
    targeted_every: int = 4,
    seed: int = 0,
) -> Section:
    """SIGKILL workers at random instants (and in commits) over many small jobs."""
    section = Section("worker_kills")
    section.sizes = {
        "kills": kills,
        "kills/job": kills_per_job,
        "steps/job": WORKER_KILL_STEPS,
        "concurrent": concurrency,
    }
    plan = KillPlan(kills, targeted_every, seed)
    restarts = kills_per_job + 5
    results: list[Record] = []
    submitted: list[tuple[str, int]] = []
    errors: list[str] = []
    with running(base / "worker-kills", cache, "--max-concurrent", str(concurrency)) as daemon:
        window = attempt_life(daemon, "warmup", worker_kill_job("warmup", 3, 0))
        section.figures["attempt_life_s"] = round(window, 3)

        def work() -> None:
            try:
                while (index := plan.next_job()) is not None:
                    job_id, job_seed = f"wk-{index:04d}", index % 5
                    submitted.append((job_id, job_seed))
                    daemon.drop(f"{job_id}.toml", worker_kill_job(job_id, job_seed, restarts))
                    results.extend(kill_one_job(daemon, job_id, kills_per_job, window, plan))
                    daemon.wait(job_id)
            except Exception as error:  # noqa: BLE001 - reported as a failed check
                errors.append(repr(error))

        for _ in range(6):  # a kill sent just as its attempt ended does not count: top up
            threads = [threading.Thread(target=work) for _ in range(concurrency)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            where = Counter(classify_kill(daemon.root, k) for k in results)
            short = kills - sum(n for k, n in where.items() if not k.startswith("not sent"))
            if short <= 0 or errors:
                break
            plan.target += short
        section.figures.update(settle_jobs(daemon, submitted, references, WORKER_KILL_STEPS))
        quarantined = sum(
            1
            for j, _ in submitted
            for path in (daemon.root / "checkpoints" / j / "quarantine").glob("*.pending*")
            if not path.name.endswith(".reason.json")
        )
        still_open = open_incidents(daemon.root, [j for j, _ in submitted])
        verdicts = Counter(
            str(i.get("verdict") or i.get("status"))
            for j, _ in submitted
            for i in incident_records(daemon.root, j)
        )
    landed = sum(n for k, n in where.items() if not k.startswith("not sent"))
    targeted = [k for k in results if k["targeted"]]
    f = section.figures
    f.update(
        {
            "kills_sent": sum(k["sent"] for k in results),
            "kills_landed": landed,
            "where": dict(where),
            "targeted_kills": len(targeted),
            "targeted_in_commit": sum(in_commit(k) for k in targeted),
            "random_in_commit": sum(in_commit(k) for k in results if not k["targeted"]),
            "pending_files_quarantined": quarantined,
            "incident_verdicts": dict(verdicts),
            "incidents_left_open": still_open,
            "errors": errors,
        }
    )
    section.details["kills"] = results
    section.row("kills landed (SIGKILL seen in exit.json)", landed, f">= {kills}")
    for kind, count in sorted(where.items()):
        section.row(f"  {kind}", count)
    section.row(
        "  in a checkpoint commit: random / targeted",
        f"{f['random_in_commit']} / {f['targeted_in_commit']} of {len(targeted)}",
    )
    section.row("pending files quarantined on resume", quarantined)
    section.row("incident verdicts", ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items())))
    jobs_rows(section, f)
    section.row("incidents still open after their job completed", len(still_open), "0")
    section.check("kills landed >= target", landed >= kills)
    section.check("some kills in a commit", f["random_in_commit"] + f["targeted_in_commit"] > 0)
    section.check("no harness error", not errors)
    return section


def settle_jobs(
    daemon: Wardend, jobs: list[tuple[str, int]], references: References, steps: int
) -> Record:
    """Wait for every job; count completed, lost, and finals equal to the reference."""
    states: Counter[str] = Counter()
    equal, unequal, lost = 0, [], []
    for job_id, seed in jobs:
        status = daemon.status(job_id)
        if status is None:
            lost.append(job_id)
            continue
        status = daemon.wait(job_id)
        states[status["state"]] += 1
        if status["state"] != "completed":
            continue
        final = final_of(daemon.root / "checkpoints" / status["checkpoint"])
        if final is not None and final.equals(references.get(seed, steps)):
            equal += 1
        else:
            unequal.append(job_id)
    return {
        "jobs": len(jobs),
        "completed": states["completed"],
        "states": dict(states),
        "lost": len(lost),
        "lost_jobs": lost,
        "finals_equal": equal,
        "finals_unequal": unequal,
    }


def jobs_rows(section: Section, f: Record) -> None:
    """The rows and checks every job-running section shares."""
    section.row("jobs completed", f"{f['completed']} of {f['jobs']}", "all")
    section.row("jobs lost", f["lost"], "0")
    section.row("final states equal to the reference", f"{f['finals_equal']}", "all")
    section.check("jobs lost == 0", f["lost"] == 0)
    section.check("all completed", f["completed"] == f["jobs"])
    section.check("finals equal", f["finals_equal"] == f["jobs"])


# ---- 2. daemon kills


DAEMON_KILL_STEPS = 16
DEEP_JSON = "[" * 5000 + "]" * 5000


def daemon_kill_job(job_id: str, seed: int) -> str:
    """A small job that runs across several daemon lives."""
    return job_text(
        job_id,
        train={"seed": seed},
        run={"steps": DAEMON_KILL_STEPS, "checkpoint_every": 2},
        faults={"step_delay_s": 0.03, "every_attempt": True},
        supervision={"max_restarts": 1000, "restart_backoff_s": 0.0},
    )


@dataclass
class Dropped:
    """One request the benchmark dropped, and what it must become."""

    name: str
    data: bytes
    job: str | None  # the job it must become, or None: a rejection
    seed: int = 3


def hostile_request(index: int, taken_id: str | None) -> tuple[str, bytes]:
    """An invalid request of one of several kinds (name, bytes)."""
    kinds: list[tuple[str, str]] = [
        ("toml", 'id = "x\ntask = linreg\n'),
        ("toml", f'id = "bad-{index}"\ntask = "nope"\n'),
        ("json", '{"id": "nested", "task": "linreg", "train": ' + DEEP_JSON + "}"),
        ("json", '{"id": "nan", "task": "linreg", "train": {"learning_rate": NaN}}'),
        ("toml", f'id = "unk-{index}"\ntask = "linreg"\n[run]\nsteps = 4\nstepz = 1\n'),
        ("toml", f'id = "{taken_id or "dup"}"\ntask = "linreg"\n'),
    ]
    suffix, text = kinds[index % len(kinds)]
    return f"bad-{index:04d}.{suffix}", text.encode()


def kill_instant(root: Path, mode: str, rng: random.Random) -> bool:
    """Wait for the instant to kill at; whether the awaited condition was seen."""
    if mode == "random":
        time.sleep(rng.uniform(0, 1.5))
        return True
    deadline = time.monotonic() + 3
    jobs = root / "jobs"
    while time.monotonic() < deadline:
        if mode == "intake":
            with contextlib.suppress(FileNotFoundError):
                if any(n.startswith("+intake-") for n in os.listdir(jobs)):
                    return True
                if os.listdir(root / "spool" / "claimed"):
                    return True
        else:
            with contextlib.suppress(FileNotFoundError):
                if any(pending_files(jobs / name) for name in os.listdir(jobs)):
                    return True
    return False


def at_kill(root: Path) -> Record:
    """What the root shows right after a kill: requests in intake, state writes pending."""
    jobs = root / "jobs"
    names = os.listdir(jobs)
    staging = [n for n in names if n.startswith("+intake-")]
    pending = [f"{n}/{name}" for n in names for name in pending_files(jobs / n)]
    return {
        "incoming": len(os.listdir(root / "spool" / "incoming")),
        "claimed": len(os.listdir(root / "spool" / "claimed")),
        "staging": staging,
        "state_pending": pending,
    }


def rejections(root: Path) -> dict[str, list[Record]]:
    """Error files in spool/rejected by the name each request was submitted as."""
    found: dict[str, list[Record]] = {}
    for path in (root / "spool" / "rejected").glob("*.error.json"):
        record = read_json(path)
        if isinstance(record, dict):
            record["kept"] = (path.parent / record.get("file", "")).is_file()
            found.setdefault(str(record.get("submitted_as")), []).append(record)
    return found


def daemon_kills(
    base: Path,
    cache: Path,
    references: References,
    *,
    kills: int = 50,
    per_cycle: int = 3,
    seed: int = 1,
) -> Section:
    """SIGKILL the daemon at random instants, in intake and in state writes; restart it."""
    section = Section("daemon_kills")
    section.sizes = {"kills": kills, "requests/life": f"1-{per_cycle}", "steps/job": 16}
    rng = random.Random(seed)
    root = base / "root"
    daemon = Wardend(root, cache, "--max-concurrent", "2")
    dropped: list[Dropped] = []
    instants: list[Record] = []
    modes = ("random", "intake", "state")
    try:
        for cycle in range(kills):
            daemon.start()
            mode = modes[cycle % len(modes)]
            for _ in range(rng.randint(1, per_cycle)):
                index = len(dropped)
                if rng.random() < 0.7:
                    job_id, job_seed = f"dk-{index:04d}", index % 5
                    item = Dropped(
                        f"{job_id}.toml",
                        daemon_kill_job(job_id, job_seed).encode(),
                        job_id,
                        job_seed,
                    )
                else:
                    taken = next((d.job for d in reversed(dropped) if d.job), None)
                    name, data = hostile_request(index, taken)
                    item = Dropped(name, data, None)
                dropped.append(item)
                daemon.drop(item.name, item.data)
            seen = kill_instant(root, mode, rng)
            daemon.kill()
            instants.append({"cycle": cycle, "mode": mode, "seen": seen, **at_kill(root)})
        daemon.start()
        deadline = time.monotonic() + 120 + 15 * len(dropped)
        for item in dropped:
            if item.job is not None:
                while daemon.status(item.job) is None and time.monotonic() < deadline:
                    if item.name in rejections(root):
                        break
                    time.sleep(0.1)
                if daemon.status(item.job) is not None:
                    daemon.wait(item.job, timeout=max(1, deadline - time.monotonic()))
        while time.monotonic() < deadline:
            outcome = rejections(root)
            if all(d.name in outcome for d in dropped if d.job is None):
                break
            time.sleep(0.2)
        status = {d.job: daemon.status(d.job) for d in dropped if d.job}
    finally:
        daemon.stop()
    outcome = rejections(root)
    still_open = open_incidents(root, [d.job for d in dropped if d.job])
    lost, doubled, wrong, unequal, altered = [], [], [], [], []
    states: Counter[str] = Counter()
    equal = 0
    for item in dropped:
        rejected = outcome.get(item.name, [])
        if item.job is None:
            if not rejected:
                lost.append(item.name)
            elif len(rejected) > 1:
                doubled.append(item.name)
            elif not rejected[0]["kept"] or not rejected[0].get("problems"):
                wrong.append(item.name)
            continue
        record = status.get(item.job)
        if record is None:
            (wrong if rejected else lost).append(item.name)
            continue
        if rejected:
            doubled.append(item.name)
        states[record["state"]] += 1
        kept = daemon.job_folder(item.job) / "request.toml"
        if not kept.is_file() or kept.read_bytes() != item.data:
            altered.append(item.name)
        final = final_of(root / "checkpoints" / item.job)
        if record["state"] == "completed" and final is not None:
            if final.equals(references.get(item.seed, DAEMON_KILL_STEPS)):
                equal += 1
            else:
                unequal.append(item.job)
    jobs = [d for d in dropped if d.job]
    f = section.figures
    f.update(
        {
            "daemon_lives": daemon.starts,
            "requests": len(dropped),
            "jobs": len(jobs),
            "rejections_expected": len(dropped) - len(jobs),
            "completed": states["completed"],
            "states": dict(states),
            "lost": len(lost),
            "lost_requests": lost,
            "doubled": doubled,
            "wrong_outcome": wrong,
            "request_not_kept_verbatim": altered,
            "finals_equal": equal,
            "finals_unequal": unequal,
            "kills_in_intake": sum(bool(i["claimed"] or i["staging"]) for i in instants),
            "kills_in_state_write": sum(bool(i["state_pending"]) for i in instants),
            "kills_with_requests_unclaimed": sum(bool(i["incoming"]) for i in instants),
            "incidents_left_open": still_open,
        }
    )
    section.details["instants"] = instants
    section.row("daemon SIGKILLs", kills, f">= {kills}")
    section.row("  during intake (claimed/ or +intake-* present)", f["kills_in_intake"])
    section.row("  during a state write (*.pending under jobs/)", f["kills_in_state_write"])
    section.row("  with requests still in incoming/", f["kills_with_requests_unclaimed"])
    section.row(
        "requests dropped (jobs / invalid)",
        f"{len(dropped)} ({len(jobs)} / {len(dropped) - len(jobs)})",
    )
    bad = [d.name for d in dropped if d.job is None]
    filed = sum(1 for n in bad if n not in lost and n not in wrong and n not in doubled)
    section.row("rejections with their error file", f"{filed} of {len(bad)}", "all")
    section.row("requests doubled / wrong outcome", f"{len(doubled)} / {len(wrong)}", "0 / 0")
    jobs_rows(section, f)
    section.row("incidents still open after their job completed", len(still_open), "0")
    section.check("requests lost == 0", not lost)
    section.check("no request doubled or misfiled", not doubled and not wrong)
    section.check("kept requests verbatim", not altered)
    section.check(
        "kills during intake and state writes",
        f["kills_in_intake"] > 0 and f["kills_in_state_write"] > 0,
    )
    return section


# ---- 3. disk full


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (mode 0700), unmounted on the way out."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    try:
        yield path
    finally:
        done = subprocess.run(["umount", str(path)], capture_output=True, timeout=30, check=False)
        if done.returncode:
            subprocess.run(
                ["umount", "-l", str(path)], capture_output=True, timeout=30, check=False
            )


def fill(path: Path) -> int:
    """Write ``path`` until its filesystem is full; returns the bytes written."""
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for chunk in (1 << 20, 4096, 1):
            block = b"\0" * chunk
            while True:
                try:
                    written += os.write(fd, block)
                except OSError as error:
                    if error.errno != errno.ENOSPC:
                        raise
                    break
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
    return written


def free_bytes(path: Path) -> int:
    """Bytes available on ``path``'s filesystem."""
    info = os.statvfs(path)
    return info.f_bavail * info.f_frsize


def incident_summary(root: Path, job: str) -> list[str]:
    """Each incident of the job as 'kind/status: first line of its symptom or details'."""
    found = []
    for record in incident_records(root, job):
        details = record.get("details") or {}
        code = details.get("code") or details.get("error_code") or ""
        found.append(f"{record.get('kind')}/{record.get('status')} {code}".strip())
    return found


def wait_settled_or(daemon: Wardend, job: str, timeout: float) -> Record | None:
    """The job's status once settled (or None if the daemon died or time ran out)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline and daemon.alive():
        with contextlib.suppress(DaemonBusy, DaemonUnreachable, ControlError):
            last = daemon.status(job)
            if last is not None and last["state"] in SETTLED_STATES:
                return last
        time.sleep(0.1)
    return last


RESUMABLE = frozenset({"preempted", "failed", "escalated"})


def disk_case(
    section: Section,
    label: str,
    daemon: Wardend,
    *,
    job: str,
    seed: int,
    steps: int,
    references: References,
    settle_s: float,
) -> Record:
    """After space returns: the job settles (or, stuck, a daemon restart is tried), is
    resumed, and completes; then a new job must complete too."""
    story: Record = {}
    if not daemon.alive():
        story["daemon_exit"] = daemon.proc.returncode if daemon.proc else None
        daemon.start()
    status = wait_settled_or(daemon, job, settle_s) or {}
    if status.get("state") not in SETTLED_STATES:
        story["stuck_in"] = f"{status.get('state')} at step {status.get('step')}"
        story["daemon_restart_needed"] = True
        daemon.stop()
        daemon.start()
        status = wait_settled_or(daemon, job, 120) or {}
    if status.get("state") in RESUMABLE:
        daemon.ask("resume", job=job)
        status = wait_settled_or(daemon, job, 180) or {}
    story["resumed_state"] = status.get("state")
    story["incidents_after"] = incident_summary(daemon.root, job)
    final = final_of(daemon.root / "checkpoints" / str(status.get("checkpoint", job)))
    story["final_equal"] = bool(
        status.get("state") == "completed"
        and final is not None
        and final.equals(references.get(seed, steps))
    )
    fresh = f"{job}-after"
    daemon.drop(f"{fresh}.toml", job_text(fresh, run={"steps": 4}))
    story["new_job_state"] = (wait_settled_or(daemon, fresh, 180) or {}).get("state")
    section.check(f"{label}: daemon alive while full", "daemon_exit" not in story)
    section.check(f"{label}: job settles without a daemon restart", "stuck_in" not in story)
    section.check(f"{label}: resumed job completed", story["resumed_state"] == "completed")
    section.check(f"{label}: resumed final equal", story["final_equal"])
    section.check(f"{label}: new job completed", story["new_job_state"] == "completed")
    return story


def recovery_text(seen: Record) -> str:
    """How the job came back once space returned."""
    restart = " after a daemon restart" if seen.get("daemon_restart_needed") else ""
    stuck = f"stuck in {seen['stuck_in']} until then; " if seen.get("stuck_in") else ""
    return (
        f"{stuck}{seen['resumed_state']}{restart} (final equal: {seen['final_equal']}) / "
        f"new job {seen['new_job_state']}"
    )


def disk_full(base: Path, cache: Path, references: References, *, settle_s: float = 60) -> Section:
    """A full root and a full checkpoint directory: the outcome, and the recovery."""
    section = Section("disk_full")
    section.sizes = {"root tmpfs": "24 MiB", "checkpoint tmpfs": "16 KiB"}
    steps = 300
    text = job_text(
        "full-root",
        run={"steps": steps, "checkpoint_every": 1},
        faults={"step_delay_s": 0.02},
    )
    # 1. the whole root on a tmpfs, filled by a ballast file while the job commits
    with tmpfs(base / "rootfs", "24m") as root:
        daemon = Wardend(root, cache, "--max-concurrent", "2")
        try:
            daemon.start()
            late = root / "spool" / "tmp" / "late.toml"
            late.write_text(job_text("late", run={"steps": 4}))
            daemon.drop("full-root.toml", text)
            daemon.wait("full-root", frozenset({"running"}), timeout=120)
            while (daemon.status("full-root") or {}).get("step", 0) < 5:
                time.sleep(0.05)
            ballast = fill(root / "ballast")
            os.rename(late, root / "spool" / "incoming" / "late.toml")
            full = wait_settled_or(daemon, "full-root", settle_s) or {}
            time.sleep(2)  # the late request's intake, and anything the daemon does meanwhile
            seen: Record = {
                "ballast_bytes": ballast,
                "state": full.get("state"),
                "reason": full.get("reason"),
                "incidents": incident_summary(root, "full-root"),
                "daemon_alive": daemon.alive(),
                "late_request": spool_place(root, "late.toml", "late"),
            }
            (root / "ballast").unlink()
            seen["free_after"] = free_bytes(root)
            seen.update(
                disk_case(
                    section,
                    "root",
                    daemon,
                    job="full-root",
                    seed=3,
                    steps=steps,
                    references=references,
                    settle_s=settle_s,
                )
            )
            seen["late_after"] = (daemon.status("late") or {}).get("state") or spool_place(
                root, "late.toml", "late"
            )
            section.check(
                "root: late request taken after space returns",
                seen["late_after"] == "completed" or "rejected" in seen["late_after"],
            )
        finally:
            daemon.stop()
    section.figures["root"] = seen
    section.row("root full: job state, reason", f"{seen['state']}: {seen['reason']}")
    section.row(
        "  incidents (while full / once space returned)",
        f"{'; '.join(seen['incidents']) or 'none'} / {'; '.join(seen['incidents_after'])}",
    )
    section.row("  daemon alive while full", seen["daemon_alive"], "yes")
    section.row("  request renamed in while full", seen["late_request"])
    section.row(
        "  after space returns: the job / a new job / the late request",
        f"{recovery_text(seen)} / {seen['late_after']}",
        "completed",
    )
    # 2. the checkpoint directory on a tmpfs too small for the job's checkpoints
    root = base / "root"
    ck_steps = 20
    daemon = Wardend(root, cache, "--max-concurrent", "2")
    try:
        daemon.start()
        with tmpfs(root / "checkpoints" / "full-ck", "16k") as folder:
            daemon.drop(
                "full-ck.toml", job_text("full-ck", run={"steps": ck_steps, "checkpoint_every": 1})
            )
            full = wait_settled_or(daemon, "full-ck", settle_s * 2) or {}
            seen = {
                "state": full.get("state"),
                "reason": full.get("reason"),
                "step": full.get("step"),
                "newest_checkpoint_step": full.get("newest_checkpoint_step"),
                "incidents": incident_summary(root, "full-ck"),
                "daemon_alive": daemon.alive(),
                "pending_left": pending_files(folder),
            }
            subprocess.run(
                ["mount", "-o", "remount,size=4m", str(folder)],
                check=True,
                capture_output=True,
                timeout=30,
            )
            seen.update(
                disk_case(
                    section,
                    "checkpoint",
                    daemon,
                    job="full-ck",
                    seed=3,
                    steps=ck_steps,
                    references=references,
                    settle_s=settle_s,
                )
            )
            daemon.stop()
    finally:
        daemon.stop()
    section.figures["checkpoint"] = seen
    section.row(
        "checkpoint dir full: job state, reason",
        f"{seen['state']} at step {seen['step']}: {seen['reason']}",
    )
    section.row(
        "  incidents (while full / once space returned)",
        f"{'; '.join(seen['incidents']) or 'none'} / {'; '.join(seen['incidents_after'])}",
    )
    section.row("  pending files left in the full directory", len(seen["pending_left"]), "0")
    section.row("  after space returns: the job / a new job", recovery_text(seen), "completed")
    section.check("checkpoint: no pending file left", not seen["pending_left"])
    return section


def spool_place(root: Path, name: str, job: str) -> str:
    """Where a request is: still in the spool, a job folder, or rejected."""
    if (root / "jobs" / job / "state.json").is_file():
        return "job " + str((read_json(root / "jobs" / job / "state.json") or {}).get("state"))
    for folder in ("incoming", "claimed", "tmp"):
        if any(p.name.endswith(name) for p in (root / "spool" / folder).iterdir()):
            return f"still in spool/{folder}"
    found = rejections(root).get(name)
    if found:
        return "rejected: " + "; ".join(found[0].get("problems", []))[:120]
    return "nowhere (lost)"


# ---- 4. socket abuse


ABUSE_KINDS = ("idle", "non_reader", "slowloris", "oversized", "nested", "bad_utf8")
STATUS_LINE = b'{"v": 1, "id": 1, "cmd": "status", "args": {}}\n'
NESTED_LINE = b'{"v": 1, "id": 2, "cmd": "status", "args": {"x": ' + b"[" * 200_000
NESTED_LINE += b"]" * 200_000 + b"}}\n"
BAD_UTF8_LINE = b'{"v": 1, "id": "\xff\xfe\xc0", "cmd": "status", "args": {}}\n'


def settled_root(root: Path, count: int) -> None:
    """A root holding ``count`` completed jobs, their folders written directly."""
    from jobwarden.daemon.store.jobs import new_record, state_text
    from jobwarden.daemon.store.layout import Root
    from jobwarden.jobfile import job_from_mapping
    from jobwarden.states import JobState

    layout = Root(root)
    layout.create()
    for index in range(count):
        job = job_from_mapping({"id": f"done-{index:04d}", "task": "linreg"})
        folder = layout.job(job.id)
        folder.mkdir(mode=0o700)
        (folder / "job.json").write_text(json.dumps(job.to_record()))
        record = new_record(job)
        record.state, record.attempt = JobState.COMPLETED, 1
        (folder / "state.json").write_text(state_text(record))


class Attack:
    """Abusive clients on one loop in a thread, each reconnecting until told to stop.

    Raw non-blocking sockets, as wardenctl uses blocking ones: a failed write (the
    daemon answered and hung up first) never hides an answer already received.
    """

    def __init__(self, sock: Path, clients: int, seed: int = 0) -> None:
        self.sock = sock
        self.clients = clients
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.answers: Counter[str] = Counter()
        self.connections: Counter[str] = Counter()
        self.unanswered: Counter[str] = Counter()
        self.connect_errors: Counter[str] = Counter()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()))

    def __enter__(self) -> Attack:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(120)

    async def _main(self) -> None:
        await asyncio.gather(*(self._client(i) for i in range(self.clients)))

    async def _client(self, index: int) -> None:
        loop = asyncio.get_running_loop()
        kind = ABUSE_KINDS[index % len(ABUSE_KINDS)]
        await asyncio.sleep(self.rng.uniform(0, 0.5))
        while not self.stop.is_set():
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.setblocking(False)
            try:
                await asyncio.wait_for(loop.sock_connect(conn, str(self.sock)), 10)
            except (OSError, TimeoutError) as error:
                conn.close()
                self.connect_errors[type(error).__name__] += 1
                await asyncio.sleep(self.rng.uniform(0.2, 0.5))
                continue
            self.connections[kind] += 1
            try:
                code = await self._behave(kind, conn)
            except (OSError, TimeoutError):
                code = "connection reset"
            finally:
                conn.close()
            if code is None:
                self.unanswered[kind] += 1
            else:
                self.answers[f"{kind}: {code}"] += 1
            await asyncio.sleep(self.rng.uniform(0.2, 0.5))

    async def _answer(self, conn: socket.socket) -> str | None:
        loop = asyncio.get_running_loop()
        data = b""
        deadline = time.monotonic() + 60
        while not data.endswith(b"\n"):
            chunk = await asyncio.wait_for(
                loop.sock_recv(conn, 1 << 16), max(0.01, deadline - time.monotonic())
            )
            if not chunk:
                break
            data += chunk
        if not data:
            return None
        try:
            reply = json.loads(data.split(b"\n")[0])
        except ValueError:
            return "answer not JSON"
        if reply.get("ok"):
            return "ok"
        return str((reply.get("error") or {}).get("code"))

    async def _behave(self, kind: str, conn: socket.socket) -> str | None:
        loop = asyncio.get_running_loop()
        if kind == "idle":
            return await self._answer(conn)
        if kind == "non_reader":
            with contextlib.suppress(OSError):
                await asyncio.wait_for(loop.sock_sendall(conn, STATUS_LINE * 20), 5)
            for _ in range(50):
                if self.stop.is_set():
                    break
                await asyncio.sleep(0.1)
            return "never read"
        if kind == "slowloris":
            payload, pace = b'{"v": 1, "id": 3, "cmd": "status", "args": {}' * 50, 0.25
        elif kind == "oversized":
            payload, pace = b"a" * (2 << 20), 0.0
        else:
            payload, pace = (NESTED_LINE if kind == "nested" else BAD_UTF8_LINE), 0.0

        async def send() -> None:
            step = 1 if pace else 65536
            for at in range(0, len(payload), step):
                await loop.sock_sendall(conn, payload[at : at + step])
                if pace:
                    await asyncio.sleep(pace)

        # The answer is awaited while the line is still being written: the daemon may
        # answer (busy, too large, timeout) and hang up before the client is done.
        sender = asyncio.create_task(send())
        try:
            return await self._answer(conn)
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await sender


def socket_abuse(
    base: Path,
    cache: Path,
    *,
    clients: int = 1000,
    attack_s: float = 15.0,
    jobs: int = 300,
    p99_bound_s: float = 0.050,
    rss_growth_bound: int = 20 << 20,
) -> Section:
    """Many abusive clients at once; rss and fds before and after, ``status`` during."""
    section = Section("socket_abuse")
    section.sizes = {"clients": clients, "attack": f"{attack_s:g} s", "jobs known": jobs}
    root = base / "root"
    settled_root(root, jobs)
    samples: list[tuple[int, int]] = []
    during: list[float] = []
    during_job: list[float] = []
    failed: list[str] = []
    with running(root, cache) as daemon:
        process = daemon.process()
        before = status_latencies(daemon.socket, 100)
        rss_before, fds_before = process.memory_info().rss, process.num_fds()
        with Attack(daemon.socket, clients) as attack:
            end = time.monotonic() + attack_s
            while time.monotonic() < end:
                samples.append((process.memory_info().rss, process.num_fds()))
                try:
                    during.append(timed_status(daemon.socket))
                    during_job.append(timed_status(daemon.socket, "done-0000"))
                except (DaemonBusy, DaemonUnreachable, ControlError) as error:
                    failed.append(repr(error)[:200])
                time.sleep(0.02)
        deadline = time.monotonic() + 60
        while process.num_fds() > fds_before + 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)
        rss_after, fds_after = process.memory_info().rss, process.num_fds()
        after = status_latencies(daemon.socket, 100)
        alive = daemon.alive() and daemon.ask("version")["pid"] == daemon.pid
    peak_rss = max((r for r, _ in samples), default=rss_before)
    peak_fds = max((n for _, n in samples), default=fds_before)
    f = section.figures
    f.update(
        {
            "connections": dict(attack.connections),
            "answers": dict(attack.answers),
            "hung_up_without_answer": dict(attack.unanswered),
            "connect_errors": dict(attack.connect_errors),
            "status_before_p50_s": percentile(before, 50),
            "status_before_p99_s": percentile(before, 99),
            "status_during_n": len(during),
            "status_during_p50_s": percentile(during, 50),
            "status_during_p99_s": percentile(during, 99),
            "status_during_max_s": max(during, default=None),
            "status_job_during_p99_s": percentile(during_job, 99),
            "status_failed_during": failed,
            "status_after_p99_s": percentile(after, 99),
            "rss_before": rss_before,
            "rss_peak": peak_rss,
            "rss_after": rss_after,
            "fds_before": fds_before,
            "fds_peak": peak_fds,
            "fds_after": fds_after,
            "daemon_alive": alive,
        }
    )
    hostile = {k: v for k, v in attack.answers.items() if k.split(":")[0] in ABUSE_KINDS[3:]}
    section.row("connections made", sum(attack.connections.values()))
    section.row(
        "  answers",
        ", ".join(f"{k} {v}" for k, v in sorted(attack.answers.items())),
    )
    section.row(
        "  hung up without an answer",
        ", ".join(f"{k} {v}" for k, v in sorted(attack.unanswered.items())) or "0",
    )
    section.row(
        "status p50 / p99 / max during the attack",
        f"{ms(f['status_during_p50_s'])} / {ms(f['status_during_p99_s'])} / "
        f"{ms(f['status_during_max_s'])} (n {len(during)}, {len(failed)} failed)",
        f"p99 <= {ms(p99_bound_s)}",
    )
    section.row("status JOB p99 during", ms(f["status_job_during_p99_s"]))
    section.row(
        "status p99 before / after",
        f"{ms(f['status_before_p99_s'])} / {ms(f['status_after_p99_s'])}",
    )
    section.row(
        "daemon rss before / peak / after",
        f"{mb(rss_before)} / {mb(peak_rss)} / {mb(rss_after)}",
        f"after - before <= {mb(rss_growth_bound)}",
    )
    section.row("daemon fds before / peak / after", f"{fds_before} / {peak_fds} / {fds_after}")
    section.check("daemon alive", alive)
    section.check("status answered throughout", not failed and bool(during))
    section.check("status p99 during attack", (f["status_during_p99_s"] or 1e9) <= p99_bound_s)
    section.check("memory released", rss_after - rss_before <= rss_growth_bound)
    section.check("descriptors released", fds_after <= fds_before + 2)
    section.check(
        "every hostile line answered",
        bool(hostile)
        and not any(attack.unanswered[k] for k in ABUSE_KINDS[3:])
        and not any(k.endswith(("ok", "answer not JSON", "connection reset")) for k in hostile),
    )
    return section


# ---- 5. fuzz


def fuzz_strategies() -> dict[str, Any]:
    """The hypothesis strategies: job files, request lines, event lines, checkpoint files."""
    from hypothesis import strategies as st

    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**70), max_value=2**70)
        | st.floats()
        | st.text(max_size=12)
        | st.sampled_from([0, 1, -1, 2**31, 2**63, 10**400, 1e308, "", "..", "a/b", "\x00"])
    )
    values = st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=12,
    )
    names = st.from_regex(r"[A-Za-z0-9._-]{1,70}", fullmatch=True) | st.text(max_size=70)
    depth = st.integers(min_value=1, max_value=5000)

    def section(keys: list[str]) -> Any:
        return st.dictionaries(st.sampled_from(keys) | st.text(max_size=8), values, max_size=6)

    document = st.fixed_dictionaries(
        {},
        optional={
            "id": names | values,
            "task": st.sampled_from(["linreg", "mlp", "nope", ""]) | values,
            "checkpoint": names | values,
            "train": section(["seed", "learning_rate", "momentum", "batch_size", "width"]) | values,
            "run": section(["steps", "checkpoint_every", "keep_checkpoints", "resume"]) | values,
            "faults": section(
                [
                    "fail_after",
                    "crash_after",
                    "crash_in_commit",
                    "stall_at",
                    "stall_seconds",
                    "step_delay_s",
                    "every_attempt",
                ]
            )
            | values,
            "supervision": section(
                [
                    "startup_timeout_s",
                    "stall_timeout_s",
                    "max_restarts",
                    "restart_backoff_s",
                    "max_rss_mb",
                    "stop_grace_s",
                ]
            )
            | values,
            "extra": values,
        },
    )
    valid = job_text("fuzz", run={"steps": 4}).encode()
    job_files = st.one_of(
        st.tuples(st.just("json"), document.map(lambda d: json.dumps(d, default=str).encode())),
        st.tuples(st.just("toml"), document.map(lambda d: toml_document(d).encode())),
        st.tuples(st.sampled_from(["json", "toml"]), st.binary(max_size=600)),
        st.tuples(
            st.just("toml"),
            st.tuples(st.binary(max_size=40), st.integers(0, len(valid))).map(
                lambda b: valid[: b[1]] + b[0] + valid[b[1] :]
            ),
        ),
        st.tuples(
            st.just("json"),
            depth.map(
                lambda n: b'{"id": "deep", "task": "linreg", "train": ' + b"[" * n + b"]" * n + b"}"
            ),
        ),
        st.tuples(st.just("toml"), depth.map(lambda n: b"x = " + b"[" * n + b"]" * n + b"\n")),
        st.tuples(
            st.just("toml"),
            st.integers(256 * 1024 - 2, 256 * 1024 + 2).map(lambda n: (valid + b"#" * n)[:n]),
        ),
    )
    commands = [
        "status",
        "incidents",
        "runbook",
        "events",
        "checkpoints",
        "submit",
        "stop",
        "resume",
        "metrics",
        "version",
    ]
    args = st.dictionaries(
        st.sampled_from(["job", "attempt", "offset", "name", "content", "incident", "limit"])
        | st.text(max_size=8),
        names | values,
        max_size=4,
    )
    request = st.fixed_dictionaries(
        {},
        optional={
            "v": st.just(1) | values,
            "id": values,
            "cmd": st.sampled_from(commands) | st.text(max_size=12) | values,
            "args": args | values,
        },
    )
    request_lines = st.one_of(
        st.binary(max_size=400).map(lambda b: b.replace(b"\n", b"") + b"\n"),
        st.tuples(request, st.booleans()).map(
            lambda r: json.dumps(r[0], ensure_ascii=r[1], default=str).encode() + b"\n"
        ),
        st.tuples(request, st.binary(min_size=1, max_size=3), st.integers(0, 200)).map(
            lambda r: splice(json.dumps(r[0], default=str).encode(), r[1], r[2]) + b"\n"
        ),
        depth.map(
            lambda n: (
                b'{"v": 1, "id": 1, "cmd": "status", "args": {"job": '
                + b"[" * n * 20
                + b"]" * n * 20
                + b"}}\n"
            )
        ),
    )
    from jobwarden.events import REQUIRED

    event = st.fixed_dictionaries(
        {"v": st.just(1) | values, "event": st.sampled_from(sorted(REQUIRED)) | values},
        optional={k: values for spec in REQUIRED.values() for k in spec},
    )
    lines = st.one_of(
        st.text(max_size=300),
        st.text(alphabet=st.characters(codec=None, categories=None), max_size=50),
        event.map(lambda e: json.dumps(e, default=str)),
        st.tuples(event, st.text(max_size=3), st.integers(0, 100)).map(
            lambda r: (t := json.dumps(r[0], default=str))[: r[2]] + r[1] + t[r[2] :]
        ),
        depth.map(lambda n: '{"v": 1, "event": "progress", "x": ' + "[" * n + "]" * n + "}"),
        st.sampled_from(
            [
                '{"v": 1, "event": "progress", "step": 1e999}',
                '{"v": 1, "time": NaN}',
                '"\ud800"',
                '{"v": 1, "event": "\\ud800"}',
            ]
        ),
    )
    return {
        "values": values,
        "depth": depth,
        "job_files": job_files,
        "request_lines": request_lines,
        "event_lines": lines,
        "st": st,
    }


def splice(data: bytes, insert: bytes, at: int) -> bytes:
    """``insert`` put into ``data`` at ``at`` (bounded by its length)."""
    at = min(at, len(data))
    return data[:at] + insert + data[at:]


def toml_key(key: str) -> str:
    """A TOML key, quoted as a basic string."""
    return json.dumps(key)


def toml_inline(value: Any) -> str | None:
    """A value as inline TOML; None for null (which TOML lacks)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        items = [t for t in (toml_inline(v) for v in value) if t is not None]
        return "[" + ", ".join(items) + "]"
    items = [f"{toml_key(k)} = {t}" for k, v in value.items() if (t := toml_inline(v)) is not None]
    return "{" + ", ".join(items) + "}"


def toml_document(document: dict[str, Any]) -> str:
    """A job document as TOML: scalars at the top, tables as [sections]."""
    lines, tables = [], []
    for key, value in document.items():
        if isinstance(value, dict):
            tables.append((key, value))
        elif (text := toml_inline(value)) is not None:
            lines.append(f"{toml_key(key)} = {text}")
    for key, table_ in tables:
        lines.append(f"[{toml_key(key)}]")
        lines += [
            f"{toml_key(k)} = {t}" for k, v in table_.items() if (t := toml_inline(v)) is not None
        ]
    return "\n".join(lines) + "\n"


@dataclass
class Property:
    """One fuzzed property: examples run, and each crash (an answer outside the contract)."""

    name: str
    examples: int = 0
    crashes: list[str] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)

    def crash(self, example: object, error: BaseException | str) -> None:
        """Record an example the code under test did not handle."""
        self.kinds["crash"] += 1
        if len(self.crashes) < 20:
            self.crashes.append(f"{error!r:.300} on {example!r:.300}")


def run_property(strategy: Any, check: Callable[[Any], None], examples: int, seed: int) -> int:
    """Run ``check`` on ``examples`` values drawn from ``strategy``; returns how many ran.

    ``check`` records what it finds and never raises, so hypothesis neither shrinks nor
    stops at the first finding; no example database is written.
    """
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fixed_seed

    count = 0

    @fixed_seed(seed)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def prop(value: Any) -> None:
        nonlocal count
        count += 1
        check(value)

    prop()
    return count


def check_job_file(found: Property) -> Callable[[tuple[str, bytes]], None]:
    """A job file must validate into a Job or be refused with every problem listed."""

    def check(example: tuple[str, bytes]) -> None:
        fmt, raw = example
        try:
            job_from_bytes(raw, f"fuzz.{fmt}", fmt)  # type: ignore[arg-type]
        except JobFileError as error:
            if not error.problems or not all(isinstance(p, str) and p for p in error.problems):
                found.crash(example, f"refused without a reason: {error.problems!r}")
            else:
                found.kinds["rejected"] += 1
        except Exception as error:  # noqa: BLE001 - the finding
            found.crash(example, error)
        else:
            found.kinds["accepted"] += 1

    return check


def check_request_line(found: Property) -> Callable[[bytes], None]:
    """A request line must parse or be refused with a code and a message."""

    def check(line: bytes) -> None:
        try:
            parse_request(line.rstrip(b"\n"))
        except ControlError as error:
            if not error.code or not error.message:
                found.crash(line, f"refused without a reason: {error!r}")
            else:
                found.kinds[error.code] += 1
        except Exception as error:  # noqa: BLE001 - the finding
            found.crash(line, error)
        else:
            found.kinds["parsed"] += 1

    return check


def check_event_line(found: Property) -> Callable[[str], None]:
    """parse_line must return an Event (whose required fields have their types) or a
    Malformed, and never raise."""
    from jobwarden.events import REQUIRED

    def check(line: str) -> None:
        try:
            result = parse_line(line)
        except Exception as error:  # noqa: BLE001 - the finding
            found.crash(line, error)
            return
        if isinstance(result, Malformed):
            found.kinds["malformed"] += 1
        elif isinstance(result, Event):
            wrong = [
                name
                for name, types in REQUIRED[result.kind].items()
                if not isinstance(result.fields.get(name), types)
                or isinstance(result.fields.get(name), bool)
            ]
            if wrong:
                found.crash(line, f"event accepted with mistyped {wrong}")
            else:
                found.kinds["event"] += 1
        else:
            found.crash(line, f"returned {type(result).__name__}")

    return check


def checkpoint_files(strategy: dict[str, Any], valid: bytes) -> Any:
    """Checkpoint files: raw bytes, odd length prefixes, mutated headers and manifests."""
    st = strategy["st"]
    values = strategy["values"]
    (length,) = struct_unpack(valid[:8])
    header = json.loads(valid[8 : 8 + length])
    data = valid[8 + length :]
    manifest = json.loads(header["__metadata__"]["jobwarden"])

    def assemble(head: Any, body: bytes, skew: int) -> bytes:
        text = json.dumps(head, default=str).encode()
        return (len(text) + skew).to_bytes(8, "little") + text + body

    def set_path(tree: Any, path: list[Any], value: Any) -> Any:
        tree = json.loads(json.dumps(tree))
        node = tree
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        return tree

    header_paths = [
        ["__metadata__"],
        ["__metadata__", "checksum"],
        ["__metadata__", "signature"],
        ["key"],
        ["key", "dtype"],
        ["key", "shape"],
        ["key", "data_offsets"],
        ["params", "shape"],
        ["params", "data_offsets"],
        ["extra"],
    ]
    manifest_paths = [
        ["schema_version"],
        ["leaves"],
        ["leaves", 0],
        ["leaves", 0, 1],
        ["leaves", 0, 2],
        ["leaves", 2, 2],
        ["step"],
        ["created"],
        ["train"],
        ["provenance"],
        ["provenance", "runtime"],
        ["components"],
        ["task"],
    ]
    skews = st.integers(-3, 3) | st.just(0)
    bodies = st.sampled_from([data, data[:-1], data + b"\0", b"", data * 2])

    def with_manifest(m: Any) -> Any:
        return set_path(header, ["__metadata__", "jobwarden"], json.dumps(m, default=str))

    return st.one_of(
        st.binary(max_size=2048),
        st.tuples(st.integers(0, 2**64 - 1), st.binary(max_size=512)).map(
            lambda t: t[0].to_bytes(8, "little") + t[1]
        ),
        st.tuples(st.sampled_from(header_paths), values, bodies, skews).map(
            lambda t: assemble(set_path(header, t[0], t[1]), t[2], t[3])
        ),
        st.tuples(st.sampled_from(manifest_paths), values, bodies, skews).map(
            lambda t: assemble(with_manifest(set_path(manifest, t[0], t[1])), t[2], t[3])
        ),
        st.tuples(st.integers(0, len(valid)), st.binary(min_size=1, max_size=4)).map(
            lambda t: valid[: t[0]] + t[1] + valid[t[0] + len(t[1]) :]
        ),
        strategy["depth"].map(
            lambda n: (2 * n + 7).to_bytes(8, "little") + b'{"a": ' + b"[" * n + b"]" * n + b"}"
        ),
        st.tuples(strategy["depth"], bodies).map(
            lambda t: assemble(
                set_path(header, ["__metadata__", "jobwarden"], "[" * t[0] + "]" * t[0]), t[1], 0
            )
        ),
    )


def struct_unpack(prefix: bytes) -> tuple[int]:
    """The 8-byte little-endian header length of a checkpoint file."""
    return (int.from_bytes(prefix, "little"),)


def check_checkpoint(
    found: Property, folder: Path, peaks: list[tuple[int, int]]
) -> Callable[[bytes], None]:
    """Reading a checkpoint file raises only CheckpointError subclasses, and allocates no
    more than a small multiple of the file's own size."""

    def check(raw: bytes) -> None:
        path = folder / "ckpt-0000000001.safetensors"
        path.write_bytes(raw)
        tracemalloc.reset_peak()
        base_memory = tracemalloc.get_traced_memory()[0]
        try:
            ckformat.read(path)
        except CheckpointError as error:
            found.kinds[type(error).__name__] += 1
        except Exception as error:  # noqa: BLE001 - the finding
            found.crash(raw, error)
        else:
            found.kinds["read"] += 1
        peak = tracemalloc.get_traced_memory()[1] - base_memory
        peaks.append((peak, len(raw)))
        if peak > 2 * len(raw) + (256 << 10):
            found.crash(raw, f"allocated {peak} bytes for a file of {len(raw)}")

    return check


def fuzz(
    base: Path,
    cache: Path,
    *,
    examples: int = 2000,
    daemon_examples: int = 400,
    seed: int = 0,
) -> Section:
    """Hypothesis over job files, request lines, event lines and checkpoint files."""
    section = Section("fuzz")
    section.sizes = {"examples/property": examples, "through the daemon": daemon_examples}
    strategies = fuzz_strategies()
    found: dict[str, Property] = {}

    def run(
        name: str, strategy: Any, make: Callable[[Property], Callable[[Any], None]], count: int
    ) -> None:
        found[name] = prop = Property(name)
        prop.examples = run_property(strategy, make(prop), count, seed)

    run("job files (jobfile.job_from_bytes)", strategies["job_files"], check_job_file, examples)
    run(
        "request lines (protocol.parse_request)",
        strategies["request_lines"],
        check_request_line,
        examples,
    )
    run("event lines (events.parse_line)", strategies["event_lines"], check_event_line, examples)
    valid = valid_checkpoint(base / "valid", cache)
    folder = base / "checkpoints"
    folder.mkdir(mode=0o700)
    peaks: list[tuple[int, int]] = []
    tracemalloc.start()
    try:
        run(
            "checkpoint files (checkpoint.format.read)",
            checkpoint_files(strategies, valid),
            lambda prop: check_checkpoint(prop, folder, peaks),
            examples,
        )
    finally:
        tracemalloc.stop()
    peak, size = max(peaks, default=(0, 0))
    section.figures["checkpoint_read_peak_allocation"] = {"bytes": peak, "file_bytes": size}
    daemon_found = fuzz_daemon(base, cache, strategies, daemon_examples, seed)
    found.update(daemon_found)
    for prop in found.values():
        outcome = ", ".join(f"{k} {v}" for k, v in prop.kinds.most_common(6))
        section.row(prop.name, f"{prop.examples} examples: {outcome}", "crash 0")
        section.check(f"{prop.name}: no crash", not prop.crashes)
    section.row(
        "checkpoint read: largest peak allocation (its file's size)",
        f"{peak / 1024:.0f} KiB ({size} bytes)",
        "<= 2 x size + 256 KiB",
    )
    section.figures["properties"] = {
        p.name: {"examples": p.examples, "outcomes": dict(p.kinds), "crashes": p.crashes}
        for p in found.values()
    }
    section.figures["examples_total"] = sum(p.examples for p in found.values())
    section.row("examples run, in all", section.figures["examples_total"])
    return section


def valid_checkpoint(folder: Path, cache: Path) -> bytes:
    """The bytes of a real linreg checkpoint, from a short standalone worker run."""
    folder.mkdir(parents=True)
    spec = folder / "job.toml"
    spec.write_text(job_text("fuzz", run={"steps": 2}))
    argv = worker_argv(spec, folder / "checkpoints", cache)
    subprocess.run(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=600
    )
    return (folder / "checkpoints" / "ckpt-0000000002.safetensors").read_bytes()


def exchange(sock: Path, line: bytes, timeout: float = 30) -> bytes:
    """Send one raw request line; the first answer line (b"" if the daemon hung up)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(str(sock))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.sendall(line)
        data = b""
        with contextlib.suppress(ConnectionResetError):
            while not data.endswith(b"\n"):
                chunk = conn.recv(1 << 20)
                if not chunk:
                    break
                data += chunk
        return data


def strict_answer(data: bytes) -> Record | None:
    """The answer as strict JSON (no NaN or Infinity), or None if it is not one."""

    def refuse(name: str) -> None:
        raise ValueError(name)

    try:
        answer = json.loads(data, parse_constant=refuse)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def kept_request(folder: Path) -> bytes | None:
    """The request a job folder kept, as bytes."""
    for name in ("request.toml", "request.json"):
        with contextlib.suppress(OSError):
            return (folder / name).read_bytes()
    return None


def fuzz_daemon(
    base: Path, cache: Path, strategies: dict[str, Any], examples: int, seed: int
) -> dict[str, Property]:
    """Fuzzed job files dropped into a real daemon's spool, and request lines sent to it."""
    files, lines = Property("job files through a daemon"), Property("request lines to a daemon")
    root = base / "root"
    hold = job_text(
        "hold",
        faults={"stall_at": 0, "stall_seconds": 600},
        supervision={"stall_timeout_s": 600, "startup_timeout_s": 600, "stop_grace_s": 1},
    )
    dropped: list[tuple[str, bytes]] = []
    with running(root, cache, "--max-concurrent", "1") as daemon:
        daemon.drop("hold.toml", hold)
        daemon.wait("hold", frozenset({"running"}), timeout=180)

        def drop(example: tuple[str, bytes]) -> None:
            name = f"fuzz-{len(dropped):05d}.{example[0]}"
            dropped.append((name, example[1]))
            daemon.drop(name, example[1])

        files.examples = run_property(strategies["job_files"], drop, examples, seed + 1)

        def send(line: bytes) -> None:
            if b'"shutdown"' in line or b'"hold"' in line:
                line = line.replace(b'"shutdown"', b'"version"').replace(b'"hold"', b'"h"')
            try:
                answer = strict_answer(exchange(daemon.socket, line))
            except OSError as error:
                lines.crash(line, error)
                return
            if answer is None or answer.get("v") != 1 or not isinstance(answer.get("ok"), bool):
                lines.crash(line, f"answer outside the protocol: {answer!r:.200}")
            elif answer["ok"]:
                lines.kinds["ok"] += 1
            elif not (answer.get("error") or {}).get("code") or not answer["error"].get("message"):
                lines.crash(line, f"error without a code or message: {answer!r:.200}")
            else:
                lines.kinds[answer["error"]["code"]] += 1

        lines.examples = run_property(strategies["request_lines"], send, examples * 5, seed + 2)
        deadline = time.monotonic() + 60 + examples * 0.2
        while time.monotonic() < deadline:
            left = len(os.listdir(root / "spool" / "incoming")) + len(
                os.listdir(root / "spool" / "claimed")
            )
            if not left:
                break
            time.sleep(0.2)
        alive = daemon.alive() and daemon.ask("version")["pid"] == daemon.pid
    if not alive:
        files.crash("the daemon", "died")
    outcome = rejections(root)
    for name, raw in dropped:
        rejected = outcome.get(name)
        if rejected:
            if rejected[0].get("problems") and rejected[0]["kept"]:
                files.kinds["rejected with reasons"] += 1
            else:
                files.crash(raw, f"rejected without reasons: {rejected[0]!r:.200}")
            continue
        accepted = [f for f in (root / "jobs").iterdir() if kept_request(f) == raw]
        if accepted:
            files.kinds["accepted as a job"] += 1
        else:
            files.crash(raw, "neither a job nor a rejection")
    return {files.name: files, lines.name: lines}


# ---- 6. long run


def daemon_figures(daemon: Wardend, probes: int, job: str) -> Record:
    """The daemon's rss and fds, and ``status`` / ``status JOB`` latencies, now."""
    process = daemon.process()
    kinds: Counter[str] = Counter()
    for name in os.listdir(f"/proc/{daemon.pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{daemon.pid}/fd/{name}")
            kinds[Path(target).name if target.startswith("/") else target.split(":")[0]] += 1
    table = status_latencies(daemon.socket, probes)
    single = status_latencies(daemon.socket, probes, job)
    return {
        "rss": process.memory_info().rss,
        "fds": process.num_fds(),
        "fds_by_target": dict(kinds.most_common(8)),
        "status_p50_s": percentile(table, 50),
        "status_p99_s": percentile(table, 99),
        "status_job_p50_s": percentile(single, 50),
        "status_job_p99_s": percentile(single, 99),
    }


def long_run(
    base: Path,
    cache: Path,
    references: References,
    *,
    jobs: int = 1000,
    workers: int = 1000,
    concurrency: int = 2,
    probes: int = 300,
    p99_bound_s: float = 0.005,
    queue: int = 20,
) -> Section:
    """Many jobs through one daemon: rss, fds and status latency before and after.

    ``workers`` of the jobs run a worker to completion; the others name the checkpoint of
    a held job and are refused by the duplicate-writer check without a worker.
    """
    section = Section("long_run")
    refused = jobs - workers
    section.sizes = {"jobs": jobs, "with a worker": workers, "refused (duplicate writer)": refused}
    every = jobs / max(workers, 1)
    real = {round(i * every) for i in range(workers)}
    plan = [(f"lr-{i:04d}", i in real) for i in range(jobs)]
    steps = 2
    during: list[float] = []
    hold = job_text(
        "hold",
        "shared",
        faults={"stall_at": 0, "stall_seconds": 3600},
        supervision={"stall_timeout_s": 3600, "startup_timeout_s": 600, "stop_grace_s": 1},
    )
    outcomes: dict[str, Record] = {}
    slots = concurrency + (1 if refused else 0)  # the held job takes one
    with running(base / "root", cache, "--max-concurrent", str(slots)) as d:
        if refused:
            d.drop("hold.toml", hold)
            d.wait("hold", frozenset({"running"}), timeout=180)
        settled: set[str] = set()
        dropped = 0
        before: Record | None = None
        last_probe = time.monotonic()
        began = time.monotonic()
        while len(settled) < jobs:
            while dropped < jobs and dropped - len(settled) < queue:
                job_id, runs = plan[dropped]
                text = job_text(
                    job_id,
                    None if runs else "shared",
                    train={"seed": dropped % 5},
                    run={"steps": steps},
                )
                d.drop(f"{job_id}.toml", text)
                dropped += 1
            table = d.ask("status", timeout=30)["jobs"]
            for row in table:
                if row["id"] not in settled | {"hold"} and row["state"] in SETTLED_STATES:
                    settled.add(row["id"])
                    outcomes[row["id"]] = row
            if before is None and len(settled) >= min(10, jobs // 4):
                before = daemon_figures(d, probes, plan[0][0])
                before["jobs_known"] = len(table)
            if time.monotonic() - last_probe > 0.5:
                during.append(timed_status(d.socket))
                last_probe = time.monotonic()
            if time.monotonic() - began > 3600 * 3:
                break
            time.sleep(0.05)
        duration = time.monotonic() - began
        after = daemon_figures(d, probes, plan[0][0])
        after["jobs_known"] = len(d.ask("status")["jobs"])
    assert before is not None
    lost = [j for j, _ in plan if j not in outcomes]
    wrong = [
        j
        for j, runs in plan
        if j in outcomes and outcomes[j]["state"] != ("completed" if runs else "escalated")
    ]
    equal = 0
    for index, (job_id, runs) in enumerate(plan):
        if runs and outcomes.get(job_id, {}).get("state") == "completed":
            final = final_of(base / "root" / "checkpoints" / job_id)
            equal += bool(final and final.equals(references.get(index % 5, steps)))
    f = section.figures
    f.update(
        {
            "duration_s": round(duration, 1),
            "before": before,
            "after": after,
            "status_during_p99_s": percentile(during, 99),
            "lost": len(lost),
            "wrong_outcome": wrong[:20],
            "finals_equal": equal,
            "rss_growth_per_job": (after["rss"] - before["rss"]) / max(jobs - 10, 1),
        }
    )
    section.row("jobs settled as expected", f"{jobs - len(lost) - len(wrong)} of {jobs}", "all")
    section.row("jobs lost", len(lost), "0")
    section.row("final states equal to the reference", f"{equal} of {workers}", "all")
    section.row("jobs known before / after", f"{before['jobs_known']} / {after['jobs_known']}")
    section.row("daemon rss before / after", f"{mb(before['rss'])} / {mb(after['rss'])}")
    section.row(
        "daemon fds before / after (most held after)",
        f"{before['fds']} / {after['fds']} ("
        + ", ".join(f"{k} {v}" for k, v in list(after["fds_by_target"].items())[:3])
        + ")",
        "after <= before + 5",
    )
    section.row(
        "status p50 / p99 before", f"{ms(before['status_p50_s'])} / {ms(before['status_p99_s'])}"
    )
    section.row(
        "status p50 / p99 after",
        f"{ms(after['status_p50_s'])} / {ms(after['status_p99_s'])}",
        f"p99 <= {ms(p99_bound_s)}",
    )
    section.row(
        "status JOB p50 before / after",
        f"{ms(before['status_job_p50_s'])} / {ms(after['status_job_p50_s'])}",
        "after <= 3 x before (or 1 ms)",
    )
    section.row(
        "status JOB p99 before / after",
        f"{ms(before['status_job_p99_s'])} / {ms(after['status_job_p99_s'])}",
    )
    section.row("status p99 during the run", ms(f["status_during_p99_s"]))
    section.row("run time", f"{duration:.0f} s")
    section.check("jobs lost == 0", not lost)
    section.check("every job settled as expected", not wrong)
    section.check("finals equal", equal == workers)
    section.check("descriptors not leaked", after["fds"] <= before["fds"] + 5)
    section.check("status p99 after", after["status_p99_s"] <= p99_bound_s)
    section.check(
        "status JOB independent of table size",
        after["status_job_p50_s"] <= max(3 * before["status_job_p50_s"], 0.001),
    )
    return section


# ---- 7. links


def snapshot(folder: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under ``folder``: type, size, mtime, and a file's sha256 (links not followed)."""
    found: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            info = path.lstat()
            digest = ""
            if path.is_file() and not path.is_symlink():
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            key = str(path.relative_to(folder))
            found[key] = (info.st_mode, info.st_size, info.st_mtime_ns, digest)
    return found


class Outside:
    """Link targets outside every root: a file and a folder per planted link."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(mode=0o700, parents=True)
        self.count = 0
        self.before: dict[str, tuple[Any, ...]] = {}
        self.lock = threading.Lock()

    def target(self, kind: str) -> Path:
        """A fresh file (``kind`` "file") or folder holding one file, outside the roots."""
        with self.lock:
            self.count += 1
            path = self.folder / f"target-{self.count:03d}"
        if kind == "dir":
            path.mkdir(mode=0o700)
            (path / "keep.txt").write_text(f"outside folder {self.count}\n")
        else:
            path.write_text(f"outside file {self.count}\n")
        with self.lock:
            taken = snapshot(self.folder)
            self.before.update({k: v for k, v in taken.items() if k.split("/")[0] == path.name})
        return path


def plant(path: Path, target: Path) -> None:
    """Replace whatever is at ``path`` with a symbolic link to ``target``, atomically."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    temporary = path.with_name(f".plant-{path.name}")
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(target)
    os.replace(temporary, path)


def after_plant(path: Path) -> str:
    """What is at a planted path afterwards."""
    if path.is_symlink():
        return "link left in place"
    if path.exists():
        return "replaced by the daemon's own " + ("folder" if path.is_dir() else "file")
    return "link removed"


START_LINKS = (
    ("wardend.lock", "file"),
    ("wardend.log", "file"),
    ("incidents.jsonl", "file"),
    ("control.sock", "file"),
    ("spool", "dir"),
    ("spool/tmp", "dir"),
    ("spool/incoming", "dir"),
    ("spool/claimed", "dir"),
    ("spool/rejected", "dir"),
    ("jobs", "dir"),
    ("checkpoints", "dir"),
    ("cache", "dir"),
    ("cache/jax", "dir"),
)


def refusal(daemon: Wardend) -> str:
    """The last line the daemon wrote to stderr (its refusal, or a traceback's last line)."""
    lines = daemon.stderr_path.read_text(errors="replace").strip().splitlines()
    return lines[-1] if lines else ""


def start_links(base: Path, cache: Path, outside: Outside) -> list[Record]:
    """A link planted at each path under the root before the daemon starts."""
    from jobwarden.daemon.store.layout import Root

    def one(index: int, relative: str, kind: str) -> Record:
        root = base / f"start-{index:02d}"
        Root(root).create()
        target = outside.target(kind)
        plant(root / relative, target)
        daemon = Wardend(root, None if relative.startswith("cache") else cache)
        status = daemon.start_or_exit(60)
        if status is not None:
            result = f"refused at start (exit {status}): {refusal(daemon)[:160]}"
        else:
            daemon.drop("after.toml", job_text("after", run={"steps": 2}))
            state = (wait_settled_or(daemon, "after", 120) or {}).get("state")
            daemon.stop()
            result = f"started; a job {state}; {after_plant(root / relative)}"
        return {"path": relative, "target": target.name, "result": result}

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(one, i, r, k) for i, (r, k) in enumerate(START_LINKS)]
        return [f.result() for f in futures]


def job_links(base: Path, cache: Path, outside: Outside, settle_s: float) -> list[Record]:
    """Links planted under a running daemon's root, before or while it or a worker writes."""
    root = base / "root"
    results: list[Record] = []
    failing = {"steps": 8, "checkpoint_every": 2}
    slow = {"step_delay_s": 0.3, "fail_after": 3}
    with running(root, cache, "--max-concurrent", "6") as daemon:

        def planted(relative: str, kind: str) -> Record:
            target = outside.target(kind)
            plant(root / relative, target)
            record = {"path": relative, "target": target.name}
            results.append(record)
            return record

        def when_running(job: str) -> None:
            daemon.wait(job, frozenset({"running"}), timeout=180)

        def finish(job: str, records: list[Record]) -> None:
            status = wait_settled_or(daemon, job, settle_s) or {}
            if status.get("state") not in SETTLED_STATES:
                status["reason"] = f"{status.get('reason')} (not settled within {settle_s:g} s)"
            for record in records:
                where = after_plant(root / record["path"])
                record["result"] = f"{where}; job {status.get('state')}: {status.get('reason')}"

        def rejected_names() -> None:
            name = "bad-link.toml"
            records = [
                planted(f"spool/rejected/{name}", "file"),
                planted(f"spool/rejected/{name}.error.json", "file"),
            ]
            daemon.drop(name, b'id = "bad-link"\ntask = "nope"\n')
            deadline = time.monotonic() + 30
            while name not in rejections(root) and time.monotonic() < deadline:
                time.sleep(0.1)
            kept = [r["file"] for r in rejections(root).get(name, [])]
            for record in records:
                record["result"] = f"{after_plant(root / record['path'])}; request kept as {kept}"

        def job_folder(relative: str, job: str) -> None:
            record = planted(relative, "dir")
            daemon.drop(f"{job}.toml", job_text(job, run={"steps": 2}))
            deadline = time.monotonic() + 30
            status = None
            while time.monotonic() < deadline:
                status = daemon.status(job)
                if status is not None or f"{job}.toml" in rejections(root):
                    break
                time.sleep(0.1)
            found = rejections(root).get(f"{job}.toml")
            if status is not None:
                status = wait_settled_or(daemon, job, 120) or status
                outcome = f"job {status.get('state')}: {status.get('reason')}"
            elif found:
                outcome = "rejected: " + "; ".join(found[0].get("problems", []))[:160]
            else:
                outcome = "neither a job nor a rejection within 30 s"
            record["result"] = f"{after_plant(root / relative)}; {outcome}"

        def attempt_files() -> None:
            job = "link-files"
            daemon.drop(f"{job}.toml", job_text(job, run=failing, faults=slow))
            when_running(job)
            folder = f"jobs/{job}"
            records = [
                planted(f"{folder}/state.json", "file"),
                planted(f"{folder}/state.json.pending", "file"),
                planted(f"{folder}/attempts/1/exit.json", "file"),
                planted(f"{folder}/attempts/2/job.json", "file"),
                planted(f"{folder}/attempts/2/events.jsonl", "file"),
                planted(f"{folder}/attempts/2/stderr.log", "file"),
                planted(f"{folder}/attempts/2/exit.json", "file"),
            ]
            finish(job, records)

        def folder_link(job: str, relative: str, kind: str = "dir") -> None:
            daemon.drop(f"{job}.toml", job_text(job, run=failing, faults=slow))
            when_running(job)
            finish(job, [planted(f"jobs/{job}/{relative}", kind)])

        def incident_files() -> None:
            job = "link-incident-files"
            daemon.drop(f"{job}.toml", job_text(job, run=failing, faults=slow))
            when_running(job)
            records = [
                planted(f"jobs/{job}/incidents/{job}-1.json", "file"),
                planted(f"jobs/{job}/incidents/{job}-1.md", "file"),
            ]
            finish(job, records)

        def stall_dump() -> None:
            job = "link-stall"
            daemon.drop(
                f"{job}.toml",
                job_text(
                    job,
                    faults={"stall_at": 2, "stall_seconds": 30, "step_delay_s": 0.3},
                    supervision={"stall_timeout_s": 2, "max_restarts": 0, "stop_grace_s": 1},
                ),
            )
            when_running(job)
            finish(job, [planted(f"jobs/{job}/attempts/1/stack-dump.txt", "file")])

        def checkpoint_links(job: str, names: list[tuple[str, str]], stale: bool = False) -> None:
            folder = root / "checkpoints" / job
            folder.mkdir(mode=0o700)
            if stale:
                (folder / "ckpt-0000000002.safetensors.pending").write_bytes(b"stale")
            records = [planted(f"checkpoints/{job}/{name}", kind) for name, kind in names]
            daemon.drop(f"{job}.toml", job_text(job, run={"steps": 6, "checkpoint_every": 2}))
            finish(job, records)

        def checkpoint_folder() -> None:
            job = "link-ckdir"
            record = planted(f"checkpoints/{job}", "dir")
            daemon.drop(f"{job}.toml", job_text(job, run={"steps": 4}))
            finish(job, [record])

        cases: list[Callable[[], None]] = [
            rejected_names,
            lambda: job_folder("jobs/link-jobdir", "link-jobdir"),
            lambda: job_folder("jobs/+intake-link-staging", "link-staging"),
            attempt_files,
            lambda: folder_link("link-attempt-dir", "attempts/2"),
            lambda: folder_link("link-incidents", "incidents"),
            incident_files,
            lambda: folder_link("link-incident-log", "incidents.jsonl", kind="file"),
            stall_dump,
            lambda: checkpoint_links(
                "link-ckfiles",
                [
                    ("ckpt-0000000004.safetensors", "file"),
                    ("ckpt-0000000004.safetensors.pending", "file"),
                ],
            ),
            lambda: checkpoint_links("link-writer", [("writer.json", "file")]),
            lambda: checkpoint_links("link-lock", [(".writer.lock", "file")]),
            lambda: checkpoint_links("link-quarantine", [("quarantine", "dir")], stale=True),
            checkpoint_folder,
        ]
        errors: list[str] = []

        def guarded(case: Callable[[], None]) -> None:
            try:
                case()
            except Exception as error:  # noqa: BLE001 - reported as a failed check
                errors.append(repr(error))

        threads = [threading.Thread(target=guarded, args=(case,)) for case in cases]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        alive = daemon.alive()
    if errors or not alive:
        results.append(
            {
                "path": "(harness)",
                "target": "",
                "result": f"errors: {errors}; daemon alive: {alive}",
            }
        )
    return results


def links(base: Path, cache: Path, references: References, *, settle_s: float = 60) -> Section:
    """A link planted at each path the daemon or worker writes; writes outside the root."""
    section = Section("links")
    outside = Outside(base / "outside")
    planted: list[Record] = []
    planted += start_links(base, cache, outside)
    planted += job_links(base, cache, outside, settle_s)
    after, before = snapshot(outside.folder), outside.before
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    writes = 0
    for record in planted:
        record["result"] = record.get("result", "?").replace(str(base), "BASE")
        touched = (
            [k for k in changed if k.split("/")[0] == record["target"]] if record["target"] else []
        )
        record["outside_changed"] = touched
        writes += bool(touched)
        section.row(
            record["path"],
            record.get("result", "?"),
            "outside unchanged" if not touched else f"CHANGED: {touched}",
        )
    section.sizes = {"links planted": len([r for r in planted if r["target"]])}
    section.figures = {"writes_outside_root": writes, "changed": changed, "planted": planted}
    section.row("writes outside the root", writes, "0")
    section.check("writes outside the root == 0", writes == 0 and not changed)
    section.check("no harness error", all(r["path"] != "(harness)" for r in planted))
    section.check("every planted link has a result", all("result" in r for r in planted))
    return section


# ---- main


SECTIONS = (
    "worker_kills",
    "daemon_kills",
    "disk_full",
    "socket_abuse",
    "fuzz",
    "long_run",
    "links",
)


def sizes_for(quick: bool) -> dict[str, dict[str, Any]]:
    """Each section's keyword arguments: the CI-sized variant or the full one."""
    if quick:
        return {
            "worker_kills": {"kills": 12, "kills_per_job": 3},
            "daemon_kills": {"kills": 8},
            "disk_full": {"settle_s": 20},
            "socket_abuse": {"clients": 200, "attack_s": 4.0},
            "fuzz": {"examples": 150, "daemon_examples": 40},
            "long_run": {"jobs": 60, "workers": 10},
            "links": {"settle_s": 30},
        }
    return {
        "worker_kills": {"kills": 200, "kills_per_job": 4},
        "daemon_kills": {"kills": 50},
        "disk_full": {},
        "socket_abuse": {"clients": 1000, "attack_s": 15.0},
        "fuzz": {"examples": 2000, "daemon_examples": 400},
        "long_run": {"jobs": 1000, "workers": 300},
        "links": {},
    }


def run_section(
    name: str, base: Path, cache: Path, references: References, **sizes: Any
) -> Section:
    """Run one section on its own folder under ``base``, timed."""
    began = time.monotonic()
    folder = base / name
    folder.mkdir(parents=True, exist_ok=True)
    function: Callable[..., Section] = globals()[name]
    try:
        if name in WORKER_SECTIONS:
            section = function(folder, cache, references, **sizes)
        else:
            section = function(folder, cache, **sizes)
    except Exception as error:  # noqa: BLE001 - a section that breaks is a failed row
        section = Section(name, sizes=sizes)
        section.figures["error"] = repr(error)
        section.row("the section did not finish", f"{error!r:.300}")
        section.check("section finished", False)
    section.seconds = time.monotonic() - began
    return section


WORKER_SECTIONS = ("worker_kills", "daemon_kills", "disk_full", "long_run", "links")


def warm_cache(base: Path, warm: bool = True) -> tuple[Path, References]:
    """A private compile cache, warmed by the default reference run when ``warm``."""
    cache = private_dir(base / "cache")
    references = References(base / "references", cache)
    if warm:
        references.get(3, WORKER_KILL_STEPS)
    return cache, references


def main(argv: list[str] | None = None) -> int:
    """Run the sections, print the table, write the JSON results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="the CI-sized variant")
    parser.add_argument("--only", choices=SECTIONS, action="append", help="run only this section")
    parser.add_argument("--keep", action="store_true", help="keep the temporary roots")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the JSON results file")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the other sections already in the results file (with --only)",
    )
    parser.add_argument(
        "--render", type=Path, metavar="JSON", help="print the table of a results file and exit"
    )
    args = parser.parse_args(argv)
    if args.render is not None:
        saved = json.loads(args.render.read_text())
        print(table([section_from(r) for r in saved["sections"]], markdown=args.markdown))
        return 0
    sizes = sizes_for(args.quick)
    chosen = args.only or list(SECTIONS)
    base = Path(tempfile.mkdtemp(prefix="jw-reliability-"))
    sections: list[Section] = []
    began = time.monotonic()
    try:
        print("warming the compilation cache ...", flush=True)
        cache, references = warm_cache(base, any(n in WORKER_SECTIONS for n in chosen))
        for name in chosen:
            print(f"{name} {sizes[name]} ...", flush=True)
            section = run_section(name, base, cache, references, **sizes[name])
            sections.append(section)
            print(
                f"  {'PASS' if section.passed else 'FAIL'} in {section.seconds:.0f} s", flush=True
            )
    finally:
        if args.keep:
            print(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    print()
    print(table(sections, markdown=args.markdown))
    result = {
        "benchmark": "reliability",
        "quick": args.quick,
        "created": time.time(),
        "duration_s": round(time.monotonic() - began, 1),
        "platform": {
            "python": platform.python_version(),
            "jax": metadata.version("jax"),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
        "passed": all(s.passed for s in sections),
        "sections": [s.as_record() for s in sections],
    }
    if args.merge and args.out.exists():
        saved = json.loads(args.out.read_text())
        ran = {s.name for s in sections}
        kept = [r for r in saved["sections"] if r["section"] not in ran]
        merged = kept + [s.as_record() for s in sections]
        merged.sort(key=lambda r: SECTIONS.index(r["section"]))
        result["sections"] = merged
        result["passed"] = all(r["passed"] for r in merged)
        result["merged_from"] = saved.get("created")
    result["figures"] = records(reliability_figures(result["sections"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\nwrote {os.path.relpath(args.out)}")
    return 0 if result["passed"] else 1


def reliability_figures(sections: list[Record]) -> list[Figure]:
    """The summary's rows: jobs lost and writes outside the root, then each section's checks."""
    lost = [s["figures"]["lost"] for s in sections if "lost" in s["figures"]]
    outside = [s["figures"]["writes_outside_root"] for s in sections if s["section"] == "links"]
    out = []
    if lost:
        out.append(at_most("jobs lost, kill sweeps and long run", sum(lost), 0, "d"))
    if outside:
        out.append(at_most("writes outside the root, links planted", sum(outside), 0, "d"))
    for s in sections:
        out.append(
            Figure(
                f"section {s['section']}: every check",
                "held" if s["passed"] else "missed",
                "all hold",
                verdict(s["passed"]),
            )
        )
    return out


if __name__ == "__main__":
    sys.exit(main())
