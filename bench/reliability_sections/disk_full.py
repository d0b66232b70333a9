"""Section 3, disk_full: a full root and a full checkpoint directory (tmpfs mounts, so
root only), the outcome while full and the recovery once space returns."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from jobwarden.control.harness import job_text

from .common import SETTLED_STATES, Record, Section
from .evidence import References, final_of, incident_records, pending_files, read_json, rejections
from .wardend import Wardend, wait_settled_or


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
