"""``wardenctl drill``: rehearse a failure through a real daemon and keep the evidence.

Each drill drops an uninterrupted reference job and a faulted job with the
same training fields into the daemon's spool, as an operator would, waits
for both, and checks the outcome update by update.  With no ``--root`` it
starts a private daemon on a temporary root and stops it afterwards.  The
evidence bundle under ``--out`` holds the failure timeline, the accepted
checkpoint's identity, the full-state comparison of every resumed update,
the incident records and the rendered runbook, and ``verdict.json``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobwarden.checkpoint import format
from jobwarden.checkpoint.errors import CheckpointError
from jobwarden.control import client, verify
from jobwarden.control.inspect import describe
from jobwarden.control.protocol import ControlError
from jobwarden.events import Event, read_events

TERMINAL = ("completed", "escalated", "failed", "cancelled")


@dataclass(frozen=True)
class DrillParams:
    """The drill's knobs; training fields match between the reference and the faulted job."""

    seed: int = 3
    steps: int = 8
    checkpoint_every: int = 2
    fail_after: int = 3
    stall_at: int = 5
    task: str = "linreg"

    def job_text(
        self,
        job_id: str,
        checkpoint: str,
        faults: dict[str, Any] | None = None,
        supervision: dict[str, Any] | None = None,
    ) -> str:
        """A job file for this drill."""
        lines = [
            f'id = "{job_id}"',
            f'task = "{self.task}"',
            f'checkpoint = "{checkpoint}"',
            "[train]",
            f"seed = {self.seed}",
            "[run]",
            f"steps = {self.steps}",
            f"checkpoint_every = {self.checkpoint_every}",
            f"keep_checkpoints = {self.steps}",
        ]
        for name, section in (("faults", faults), ("supervision", supervision)):
            if section:
                lines.append(f"[{name}]")
                lines += [f"{k} = {json.dumps(v)}" for k, v in section.items()]
        return "\n".join(lines) + "\n"


@dataclass
class Check:
    """One check of a drill, with what was observed."""

    name: str
    ok: bool
    observed: dict[str, Any] = field(default_factory=dict)


@dataclass
class DrillResult:
    """A drill's checks and the evidence it kept."""

    drill: str
    checks: list[Check]
    out: Path
    summary: dict[str, Any]

    @property
    def ok(self) -> bool:
        """True only when every check held."""
        return bool(self.checks) and all(c.ok for c in self.checks)

    def as_record(self) -> dict[str, Any]:
        """verdict.json's content."""
        return {
            "drill": self.drill,
            "verdict": "pass" if self.ok else "FAIL",
            "ok": self.ok,
            **self.summary,
            "checks": [{"name": c.name, "ok": c.ok, **c.observed} for c in self.checks],
        }


class DaemonHandle:
    """Talks to the daemon of one root."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def ask(self, cmd: str, **args: Any) -> Any:
        """One control request."""
        return client.request(self.root / "control.sock", cmd, **args)

    def submit(self, name: str, text: str) -> None:
        """Drop a request file the Maildir way."""
        tmp = self.root / "spool" / "tmp" / name
        tmp.write_text(text)
        tmp.rename(self.root / "spool" / "incoming" / name)

    def wait(self, job: str, timeout: float = 300) -> dict[str, Any]:
        """Poll until the job ends; returns its status."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                status: dict[str, Any] = self.ask("status", job=job)
                if status["state"] in TERMINAL:
                    return status
            except ControlError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"job {job} did not end within {timeout} s")


@contextmanager
def daemon_for(root: Path | None, private: Path) -> Iterator[DaemonHandle]:
    """The daemon at ``root``, or a private one on root ``private``, stopped afterwards."""
    if root is not None:
        handle = DaemonHandle(root)
        handle.ask("version")
        yield handle
        return
    private.mkdir(parents=True, exist_ok=True)
    stderr = (private.parent / "wardend.stderr").open("wb")
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
        proc.wait(60)
        stderr.close()


def _events(folder: Path) -> list[Event]:
    found: list[Event] = []
    for path in sorted(folder.glob("attempts/*/events.jsonl"), key=lambda p: int(p.parent.name)):
        found += [e for e in read_events(path) if isinstance(e, Event)]
    return found


def _final_file(events: list[Event]) -> Path | None:
    done = [e for e in events if e.kind == "completed"]
    return Path(done[-1]["file"]) if done and done[-1].get("file") else None


def _arrays_equal(a: Path | None, b: Path | None) -> bool:
    if a is None or b is None:
        return False
    try:
        left, right = format.read(a), format.read(b)
    except CheckpointError:
        return False
    return left.arrays.keys() == right.arrays.keys() and all(
        left.arrays[k].tobytes() == right.arrays[k].tobytes() for k in left.arrays
    )


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def _keep_incidents(handle: DaemonHandle, job: str, out: Path) -> list[dict[str, Any]]:
    incidents: list[dict[str, Any]] = handle.ask("incidents", job=job)
    _write_json(out / "incidents.json", incidents)
    for incident in incidents:
        book = handle.ask("runbook", incident=incident["id"])
        (out / f"runbook-{incident['id']}.md").write_text(book["text"])
    return incidents


def drill_crash(handle: DaemonHandle, params: DrillParams, out: Path, tag: str) -> DrillResult:
    """Fail after update N; the committed checkpoint, replay and every hash are checked."""
    ref_id, job_id = f"{tag}-reference", f"{tag}-crash"
    handle.submit(f"{ref_id}.toml", params.job_text(ref_id, ref_id))
    handle.submit(
        f"{job_id}.toml", params.job_text(job_id, job_id, {"fail_after": params.fail_after})
    )
    ref_status, status = handle.wait(ref_id), handle.wait(job_id)
    ref_folder, job_folder = handle.root / "jobs" / ref_id, handle.root / "jobs" / job_id
    report = verify.verify(verify.load_run(ref_folder), verify.load_run(job_folder))
    events = _events(job_folder)
    failed = next((e for e in events if e.kind == "failed"), None)
    restored = next((e for e in events if e.kind == "restored"), None)
    expected_restore = (params.fail_after // params.checkpoint_every) * params.checkpoint_every
    replayed = report.replayed_steps
    incidents = _keep_incidents(handle, job_id, out)
    crash = next((i for i in incidents if i["kind"] == "crash"), None)
    ref_final, job_final = _final_file(_events(ref_folder)), _final_file(events)
    comparison = _comparison(ref_folder, job_folder)
    _write_json(out / "comparison.json", comparison)
    _write_json(
        out / "timeline.json",
        [
            {
                "attempt": e.get("pid"),
                **{
                    k: e.fields.get(k) for k in ("event", "time", "step", "code", "message", "file")
                },
            }
            for e in events
            if e.kind in ("started", "restored", "ready", "checkpoint", "failed", "completed")
        ],
    )
    accepted = describe(Path(restored["file"])) if restored else None
    _write_json(
        out / "accepted-checkpoint.json",
        {"restored_event": dict(restored.fields) if restored else None, "inspect": accepted},
    )
    checks = [
        Check(
            "reference completed",
            ref_status["state"] == "completed",
            {"state": ref_status["state"]},
        ),
        Check(
            "failure injected after the named update",
            failed is not None and failed.get("step") == params.fail_after,
            {
                "failed_after": failed.get("step") if failed else None,
                "code": failed.get("code") if failed else None,
            },
        ),
        Check(
            "newest committed checkpoint chosen",
            restored is not None and restored["step"] == expected_restore,
            {"restored_step": restored["step"] if restored else None, "expected": expected_restore},
        ),
        Check(
            "replayed updates",
            replayed == list(range(expected_restore + 1, params.steps + 1)),
            {"replayed_steps": replayed},
        ),
        Check(
            "every resumed update equals the reference",
            report.proven,
            {
                "mismatches": [c.name for c in report.checks if not c.ok],
                "compared": sum(1 for row in comparison if row["equal"] is not None),
            },
        ),
        Check(
            "daemon verified the replay against the failed attempt's log",
            crash is not None and crash["status"] == "verified",
            {
                "incident": crash["id"] if crash else None,
                "status": crash["status"] if crash else None,
            },
        ),
        Check(
            "final checkpoints equal",
            _arrays_equal(ref_final, job_final),
            {"reference": str(ref_final), "resumed": str(job_final)},
        ),
        Check("job completed", status["state"] == "completed", {"state": status["state"]}),
    ]
    summary = {
        "restored_step": restored["step"] if restored else None,
        "replayed_steps": replayed,
        "all_hashes_equal": report.proven,
        "runbook": str(out / f"runbook-{crash['id']}.md") if crash else None,
        "job": job_id,
        "reference": ref_id,
    }
    return DrillResult("crash", checks, out, summary)


def _comparison(ref_folder: Path, job_folder: Path) -> list[dict[str, Any]]:
    """Every resumed update's full-state hash beside the reference's."""
    ref = {e["step"]: e for e in _events(ref_folder) if e.kind == "progress"}
    rows = []
    attempt = 0
    for event in _events(job_folder):
        if event.kind == "started":
            attempt += 1
        if event.kind == "progress" and attempt > 1:
            theirs = ref.get(event["step"])
            rows.append(
                {
                    "step": event["step"],
                    "attempt": attempt,
                    "resumed_hash": event.get("state_hash"),
                    "reference_hash": theirs.get("state_hash") if theirs else None,
                    "equal": (theirs.get("state_hash") == event.get("state_hash"))
                    if theirs
                    else None,
                    "resumed_loss": event["loss"],
                    "reference_loss": theirs["loss"] if theirs else None,
                }
            )
    return rows


DRILLS = {"crash": drill_crash}


def run_drill(name: str, root: Path | None, out: Path, params: DrillParams) -> DrillResult:
    """Run one drill and write its evidence and verdict under ``out/<name>``.

    A private daemon's root is kept at ``out/root``, so the evidence stays whole.
    """
    folder = out / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    tag = f"drill-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**6:06d}"
    with daemon_for(root, out / "root") as handle:
        result = DRILLS[name](handle, params, folder, tag)
    _write_json(folder / "verdict.json", result.as_record())
    return result


def render(result: DrillResult) -> str:
    """The drill's verdict for a terminal."""
    lines = [f"drill {result.drill}: {'PASS' if result.ok else 'FAIL'}"]
    lines += [
        f"  [{'ok' if c.ok else 'FAIL'}] {c.name}: "
        + ", ".join(f"{k}={v}" for k, v in c.observed.items())
        for c in result.checks
    ]
    summary = result.summary
    if "restored_step" in summary:
        lines.append(f"restored step: {summary['restored_step']}")
        lines.append(f"replayed steps: {summary['replayed_steps']}")
        lines.append(
            f"every state hash matched the reference: "
            f"{'yes' if summary['all_hashes_equal'] else 'NO'}"
        )
    if summary.get("runbook"):
        lines.append(f"runbook: {summary['runbook']}")
    lines.append(f"evidence: {result.out}")
    lines.append(f"verdict: {'recovery verified' if result.ok else 'drill FAILED'}")
    return "\n".join(lines)
