"""What every drill needs: job files to drop, the shared reference run, evidence to keep."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobwarden.checkpoint.errors import CheckpointError
from jobwarden.control.drill.daemon import SETTLED_STATES, DaemonHandle
from jobwarden.control.drill.jobs import DrillJob, DrillJobError
from jobwarden.control.drill.plan import FaultPoints
from jobwarden.control.drill.plot import plot_loss
from jobwarden.control.drill.verdict import Check
from jobwarden.events import Event, read_events
from jobwarden.jobfolder import EVENTS_FILE, attempt_folder
from jobwarden.proof import verify
from jobwarden.shards.read import checkpoint_arrays


@dataclass(frozen=True)
class DrillParams:
    """The drill's knobs.  The first four shape the default job (``--job`` takes a user's
    instead); the fault points, when None, are chosen from the drilled job's ``[run]``."""

    seed: int = 3
    steps: int = 8
    checkpoint_every: int = 2
    task: str = "linreg"
    fail_after: int | None = None
    stall_at: int | None = None
    processes: int | None = None
    """the drilled job's members (``[run] processes``); None: the job's own"""


class Reference:
    """The uninterrupted reference run every drill of one `run_drills` compares against.

    It is the drilled job without faults, so one run serves every drill: submitted once,
    and waited for by whichever drill needs it first while the others wait on that.
    """

    def __init__(self, handle: DaemonHandle, job: DrillJob, job_id: str) -> None:
        self.handle = handle
        self.job = job
        self.id = job_id
        self._lock = threading.Lock()
        self._submitted = False
        self._status: dict[str, Any] | None = None

    def submit(self) -> None:
        """Hand the reference job to the daemon, the first time only."""
        with self._lock:
            if not self._submitted:
                text = self.job.text(self.id, self.id, run=self.job.reference_run())
                self.handle.submit(f"{self.id}.json", text)
                self._submitted = True

    def started(self) -> Event:
        """The reference's ``started`` event (its program's settings), once written; raises
        `DrillJobError` if the job settles without one, naming its state and evidence."""
        events = attempt_folder(self.handle.root / "jobs" / self.id, 1) / EVENTS_FILE
        deadline = time.monotonic() + self.job.settle_s
        while time.monotonic() < deadline:
            found = read_events(events) if events.exists() else []
            started = next((e for e in found if isinstance(e, Event) and e.kind == "started"), None)
            if started is not None:
                return started
            status = self.handle.status(self.id)
            if status is not None and status["state"] in SETTLED_STATES:
                raise DrillJobError(
                    self.job.origin,
                    [
                        f"its reference run {self.id} ended {status['state']} ({status['reason']})"
                        f" before its program said what its [run] is; see {events.parent}"
                    ],
                )
            self.handle.pause()
        raise TimeoutError(f"job {self.id} emitted no started event in {self.job.settle_s} s")

    def result(self) -> tuple[str, dict[str, Any]]:
        """The reference job's id and settled status."""
        self.submit()
        with self._lock:
            if self._status is None:
                self._status = self.handle.wait(self.id, timeout=self.job.settle_s)
            return self.id, self._status


@dataclass
class Drill:
    """One drill's run: its daemon, the job it drills and where the faults go, its evidence
    folder, its job names and the reference it shares with the other drills of the run."""

    handle: DaemonHandle
    job: DrillJob
    points: FaultPoints
    out: Path
    tag: str
    shared: Reference
    report: verify.Report | None = None
    """the last `verify` made, whose first divergence the verdict names"""

    def job_id(self, role: str) -> str:
        """A job id unique to this drill run."""
        return f"{self.tag}-{role}"

    def submit(self, job_id: str, checkpoint: str | None = None, **changes: Any) -> None:
        """Hand the daemon a copy of the drilled job as ``job_id`` (on its own checkpoint
        unless ``checkpoint``), with the ``faults`` and sections given (`DrillJob.text`)."""
        self.handle.submit(f"{job_id}.json", self.job.text(job_id, checkpoint or job_id, **changes))

    def wait(
        self, job: str, states: tuple[str, ...] = SETTLED_STATES, timeout: float | None = None
    ) -> dict[str, Any]:
        """The job's status once it reaches one of ``states`` (by default: settled)."""
        return self.handle.wait(job, states, timeout=timeout or self.job.settle_s)

    def folder(self, job: str) -> Path:
        """The job's folder under the daemon root."""
        return self.handle.root / "jobs" / job

    def checkpoint_dir(self, name: str) -> Path:
        """A checkpoint directory under the daemon root."""
        return self.handle.root / "checkpoints" / name

    def events(self, job: str) -> list[Event]:
        """Every valid event of every attempt, in order."""
        found: list[Event] = []
        paths = sorted(
            self.folder(job).glob("attempts/*/events.jsonl"), key=lambda p: int(p.parent.name)
        )
        for path in paths:
            found += [e for e in read_events(path) if isinstance(e, Event)]
        return found

    def attempt_events(self, job: str, attempt: int) -> list[Event]:
        """Events of one attempt."""
        path = attempt_folder(self.folder(job), attempt) / EVENTS_FILE
        return [e for e in read_events(path) if isinstance(e, Event)] if path.exists() else []

    def reference(self) -> tuple[str, dict[str, Any]]:
        """The uninterrupted reference job, once it has settled: its id and status."""
        return self.shared.result()

    def wait_for_event(self, job: str, kind: str, **fields: Any) -> Event:
        """The first event of ``kind`` (with ``fields``) of the job's first attempt, once
        the worker has written it."""
        timeout = self.job.settle_s
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.attempt_events(job, 1):
                if event.kind == kind and all(event.get(k) == v for k, v in fields.items()):
                    return event
            self.handle.pause()
        raise TimeoutError(f"job {job} emitted no {kind} {fields} event within {timeout} s")

    def verify(self, reference: str, job: str) -> verify.Report:
        """`wardenctl verify` of the job's attempts against the reference."""
        report = verify.verify(
            verify.load_run(self.folder(reference)), verify.load_run(self.folder(job))
        )
        self.write("verify.json", report.as_record())
        self.report = report
        return report

    def write(self, name: str, data: Any) -> Path:
        """Keep one piece of evidence as JSON."""
        path = self.out / name
        path.write_text(json.dumps(data, indent=2, default=str) + "\n")
        return path

    def keep_incidents(self, job: str) -> list[dict[str, Any]]:
        """Save the job's incident records and rendered runbooks; return the records."""
        incidents: list[dict[str, Any]] = self.handle.ask("incidents", job=job)
        self.write(f"incidents-{job}.json", incidents)
        for incident in incidents:
            book = self.handle.ask("runbook", incident=incident["id"])
            (self.out / f"runbook-{incident['id']}.md").write_text(book["text"])
        return incidents

    def runbook(self, incident: dict[str, Any]) -> str | None:
        """Where `keep_incidents` kept the incident's runbook; None for no incident."""
        return str(self.out / f"runbook-{incident['id']}.md") if incident.get("id") else None

    def timeline(self, *jobs: str) -> None:
        """The failure timeline: the milestones of every attempt of ``jobs``."""
        rows = []
        for job in jobs:
            attempts = sorted(self.folder(job).glob("attempts/*"), key=lambda p: int(p.name))
            for folder in attempts:
                for event in self.attempt_events(job, int(folder.name)):
                    if event.kind in (
                        "started",
                        "restored",
                        "ready",
                        "checkpoint",
                        "stall_injected",
                        "failed",
                        "preempted",
                        "completed",
                    ):
                        rows.append(
                            {
                                "job": job,
                                "attempt": int(folder.name),
                                "event": event.kind,
                                **{
                                    k: event.fields.get(k)
                                    for k in ("time", "step", "code", "message", "file", "skipped")
                                    if k in event.fields
                                },
                            }
                        )
                exit_file = folder / "exit.json"
                if exit_file.exists():
                    rows.append(
                        {
                            "job": job,
                            "attempt": int(folder.name),
                            "event": "exit",
                            **json.loads(exit_file.read_text()),
                        }
                    )
        self.write(
            "timeline.json", sorted(rows, key=lambda r: r.get("time") or r.get("ended") or 0)
        )

    def comparison(self, reference: str, job: str, first_attempt: int = 2) -> list[dict[str, Any]]:
        """Every resumed update's full-state hash and loss beside the reference's."""
        ref = {e["step"]: e for e in self.events(reference) if e.kind == "progress"}
        rows = []
        attempts = sorted(self.folder(job).glob("attempts/*"), key=lambda p: int(p.name))
        for folder in attempts:
            number = int(folder.name)
            if number < first_attempt:
                continue
            for event in self.attempt_events(job, number):
                if event.kind != "progress":
                    continue
                theirs = ref.get(event["step"])
                rows.append(
                    {
                        "step": event["step"],
                        "attempt": number,
                        "resumed_state_hash": event.get("state_hash"),
                        "reference_state_hash": theirs.get("state_hash") if theirs else None,
                        "equal": theirs is not None
                        and theirs.get("state_hash") == event.get("state_hash"),
                        "components_differing": sorted(
                            k
                            for k in set(event.get("components") or {})
                            if theirs is None
                            or (theirs.get("components") or {}).get(k) != event["components"][k]
                        ),
                        "resumed_loss": event["loss"],
                        "reference_loss": theirs["loss"] if theirs else None,
                    }
                )
        self.write("comparison.json", rows)
        return rows

    def accepted_checkpoint(self, job: str) -> dict[str, Any] | None:
        """The identity of the checkpoint the recovery restored, kept as evidence."""
        from jobwarden.proof.inspect import describe

        restored = [e for e in self.events(job) if e.kind == "restored"]
        if not restored:
            self.write("accepted-checkpoint.json", None)
            return None
        event = restored[-1]
        path = Path(event["file"])
        identity = {
            "restored_event": dict(event.fields),
            "inspect": describe(path) if path.exists() else "file no longer on disk",
        }
        self.write("accepted-checkpoint.json", identity)
        return identity

    def plot(self, rows: list[dict[str, Any]], title: str) -> Path | None:
        """loss.svg: the uninterrupted and the restored continuation over the resumed steps."""
        return plot_loss(rows, title, self.out / "loss.svg")


def final_check(reference: list[Event], job: list[Event]) -> Check:
    """Whether the two runs ended in the same state, by what their checkpoints allow.

    jobwarden's checkpoints: the final files hold bit-identical arrays.  A program that
    keeps its own (``checkpoints = "external"`` in its ``started`` event: Orbax...) leaves
    no file jobwarden can read, so the ``completed`` events' full-state hashes are compared,
    and the check says so.
    """
    if any(e.kind == "started" and e.get("checkpoints") == "external" for e in job):
        ends = [_completed_hash(reference), _completed_hash(job)]
        return Check(
            "final states are equal (the completed events' state hashes: "
            "the program keeps its own checkpoints)",
            ends[0] is not None and ends[0] == ends[1],
            {"reference_state_hash": ends[0], "resumed_state_hash": ends[1]},
        )
    ref_final, job_final = final_file(reference), final_file(job)
    return Check(
        "final checkpoints are equal",
        arrays_equal(ref_final, job_final),
        {"reference": str(ref_final), "resumed": str(job_final)},
    )


def _completed_hash(events: list[Event]) -> str | None:
    done = [e for e in events if e.kind == "completed"]
    return str(done[-1]["state_hash"]) if done else None


def final_file(events: list[Event]) -> Path | None:
    """The checkpoint file a run's ``completed`` event names."""
    done = [e for e in events if e.kind == "completed"]
    return Path(done[-1]["file"]) if done and done[-1].get("file") else None


def arrays_equal(a: Path | None, b: Path | None) -> bool:
    """Whether two checkpoint files hold bit-identical state."""
    if a is None or b is None:
        return False
    try:
        left, right = checkpoint_arrays(a), checkpoint_arrays(b)
    except CheckpointError:
        return False
    return left.keys() == right.keys() and all(
        left[k].tobytes() == right[k].tobytes() for k in left
    )
