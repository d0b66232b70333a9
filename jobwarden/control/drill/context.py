"""What every drill needs: a daemon to talk to, job files to drop, evidence to keep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobwarden.checkpoint import format
from jobwarden.checkpoint.errors import CheckpointError
from jobwarden.control import client, verify
from jobwarden.control.protocol import ControlError
from jobwarden.events import Event, read_events
from jobwarden.states import SETTLED

# The states a drill waits for: the daemon will do nothing more for the job on its own.
SETTLED_STATES = tuple(sorted(state.value for state in SETTLED))


@dataclass(frozen=True)
class DrillParams:
    """The drill's knobs; the reference and the faulted job share the training fields."""

    seed: int = 3
    steps: int = 8
    checkpoint_every: int = 2
    fail_after: int = 3
    stall_at: int = 5
    task: str = "linreg"


class DaemonHandle:
    """Talks to the daemon of one root, the way an operator would."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def ask(self, cmd: str, **args: Any) -> Any:
        """One control request."""
        return client.request(self.root / "control.sock", cmd, **args)

    def submit(self, name: str, text: str) -> None:
        """Drop a request file: create in spool/tmp, rename into spool/incoming."""
        tmp = self.root / "spool" / "tmp" / name
        tmp.write_text(text)
        os.rename(tmp, self.root / "spool" / "incoming" / name)

    def wait(
        self, job: str, states: tuple[str, ...] = SETTLED_STATES, timeout: float = 300
    ) -> dict[str, Any]:
        """Poll until the job reaches one of ``states``; returns its status."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                status: dict[str, Any] = self.ask("status", job=job)
                if status["state"] in states:
                    return status
            except ControlError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"job {job} did not reach {states} within {timeout} s")


@contextmanager
def daemon_for(root: Path | None, private: Path) -> Iterator[DaemonHandle]:
    """The daemon at ``root``, or a private one on ``private``, stopped afterwards."""
    if root is not None:
        handle = DaemonHandle(root)
        handle.ask("version")
        yield handle
        return
    private.mkdir(parents=True, exist_ok=True)
    with (private.parent / "wardend.stderr").open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobwarden.daemon", "--root", str(private)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        handle = DaemonHandle(private)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    handle.ask("version")
                    break
                except client.DaemonUnreachable:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            yield handle
        finally:
            proc.terminate()
            proc.wait(120)


def job_text(
    params: DrillParams,
    job_id: str,
    checkpoint: str,
    *,
    train: dict[str, Any] | None = None,
    faults: dict[str, Any] | None = None,
    supervision: dict[str, Any] | None = None,
) -> str:
    """A job file for a drill: the drill's training fields unless ``train`` overrides them."""
    lines = [f'id = "{job_id}"', f'task = "{params.task}"', f'checkpoint = "{checkpoint}"']
    sections = {
        "train": {"seed": params.seed, **(train or {})},
        "run": {
            "steps": params.steps,
            "checkpoint_every": params.checkpoint_every,
            "keep_checkpoints": params.steps,
        },
        "faults": faults,
        "supervision": supervision,
    }
    for name, section in sections.items():
        if section:
            lines.append(f"[{name}]")
            lines += [f"{key} = {json.dumps(value)}" for key, value in section.items()]
    return "\n".join(lines) + "\n"


@dataclass
class Drill:
    """One drill's run: its daemon, its parameters, its evidence folder and its job names."""

    handle: DaemonHandle
    params: DrillParams
    out: Path
    tag: str

    def job_id(self, role: str) -> str:
        """A job id unique to this drill run."""
        return f"{self.tag}-{role}"

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
        path = self.folder(job) / "attempts" / str(attempt) / "events.jsonl"
        return [e for e in read_events(path) if isinstance(e, Event)] if path.exists() else []

    def reference(self) -> tuple[str, dict[str, Any]]:
        """Submit the uninterrupted reference job and wait for it."""
        ref = self.job_id("reference")
        self.handle.submit(f"{ref}.toml", job_text(self.params, ref, ref))
        return ref, self.handle.wait(ref)

    def verify(self, reference: str, job: str) -> verify.Report:
        """`wardenctl verify` of the job's attempts against the reference."""
        report = verify.verify(
            verify.load_run(self.folder(reference)), verify.load_run(self.folder(job))
        )
        self.write("verify.json", report.as_record())
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
        from jobwarden.control.inspect import describe

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
        try:
            import matplotlib

            matplotlib.use("Agg")
            matplotlib.rcParams["svg.fonttype"] = "none"  # keep labels as searchable text
            import matplotlib.pyplot as plt
        except ImportError:
            return None
        steps = [r["step"] for r in rows if r["reference_loss"] is not None]
        if not steps:
            return None
        figure, axes = plt.subplots(figsize=(6, 3.6))
        axes.plot(
            steps,
            [r["reference_loss"] for r in rows if r["reference_loss"] is not None],
            gid="uninterrupted",
            color="#1f77b4",
            linewidth=3,
            alpha=0.6,
            label="uninterrupted",
        )
        axes.plot(
            steps,
            [r["resumed_loss"] for r in rows if r["reference_loss"] is not None],
            gid="restored",
            color="#d62728",
            linestyle="--",
            marker="o",
            label="restored continuation",
        )
        axes.set_xlabel("completed training step")
        axes.set_ylabel("minibatch loss")
        axes.set_title(title)
        axes.set_xticks(steps)
        axes.legend()
        figure.tight_layout()
        path = self.out / "loss.svg"
        figure.savefig(path, format="svg", metadata={"Date": None})
        plt.close(figure)
        return path


def final_file(events: list[Event]) -> Path | None:
    """The checkpoint file a run's ``completed`` event names."""
    done = [e for e in events if e.kind == "completed"]
    return Path(done[-1]["file"]) if done and done[-1].get("file") else None


def arrays_equal(a: Path | None, b: Path | None) -> bool:
    """Whether two checkpoint files hold bit-identical state."""
    if a is None or b is None:
        return False
    try:
        left, right = format.read(a), format.read(b)
    except CheckpointError:
        return False
    return left.arrays.keys() == right.arrays.keys() and all(
        left.arrays[k].tobytes() == right.arrays[k].tobytes() for k in left.arrays
    )
