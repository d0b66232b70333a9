"""The recovery drill with the worker alone: fail, resume, and prove the continuation.

Runs an uninterrupted reference, a faulted attempt (``fail_after``) and a
resumed attempt on the faulted run's checkpoint directory, then `verify`.
Every attempt's events and stderr are kept under ``--out``.  ``make demo``
runs this until the daemon takes over.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from jobwarden.control import verify
from jobwarden.events import Event, read_events


def job_text(
    job_id: str, seed: int, steps: int, checkpoint_every: int, fail_after: int | None = None
) -> str:
    """A linreg job file with the lesson's training fields and the given run settings."""
    text = (
        f'id = "{job_id}"\ntask = "linreg"\n[train]\nseed = {seed}\nlearning_rate = 0.04\n'
        f"momentum = 0.8\nbatch_size = 8\n[run]\nsteps = {steps}\n"
        f"checkpoint_every = {checkpoint_every}\n"
    )
    if fail_after is not None:
        text += f"[faults]\nfail_after = {fail_after}\n"
    return text


@dataclass(frozen=True)
class AttemptResult:
    """One worker process run to its end."""

    folder: Path
    exit_status: int

    def events(self) -> list[Event]:
        """The attempt's valid events."""
        return [e for e in read_events(self.folder / "events.jsonl") if isinstance(e, Event)]


def run_worker(
    job: Path, checkpoint_dir: Path, folder: Path, cache: Path | None = None, timeout: float = 300
) -> AttemptResult:
    """Run ``python -m jobwarden.worker`` to completion, keeping its events and stderr."""
    folder.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "jobwarden.worker",
        "--job",
        str(job),
        "--checkpoint-dir",
        str(checkpoint_dir),
    ]
    if cache is not None:
        argv += ["--compile-cache", str(cache)]
    with (folder / "events.jsonl").open("wb") as out, (folder / "stderr.log").open("wb") as err:
        status = subprocess.run(
            argv, stdout=out, stderr=err, timeout=timeout, check=False
        ).returncode
    (folder / "exit.json").write_text(json.dumps({"exit_status": status}) + "\n")
    return AttemptResult(folder, status)


def rehearse(
    out: Path, seed: int, steps: int, checkpoint_every: int, fail_after: int
) -> tuple[verify.Report, dict[str, object]]:
    """Run the drill under ``out``; returns the verify report and a summary."""
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "compile-cache"
    (out / "reference.toml").write_text(job_text("reference", seed, steps, checkpoint_every))
    (out / "faulted.toml").write_text(job_text("drill", seed, steps, checkpoint_every, fail_after))
    (out / "resume.toml").write_text(job_text("drill", seed, steps, checkpoint_every))
    reference = run_worker(
        out / "reference.toml", out / "reference-checkpoints", out / "reference", cache
    )
    faulted = run_worker(out / "faulted.toml", out / "checkpoints", out / "attempts" / "1", cache)
    resumed = run_worker(out / "resume.toml", out / "checkpoints", out / "attempts" / "2", cache)
    report = verify.verify(verify.load_run(out / "reference"), verify.load_run(out / "attempts"))
    failure = next((e for e in faulted.events() if e.kind == "failed"), None)
    summary: dict[str, object] = {
        "reference_exit": reference.exit_status,
        "faulted_exit": faulted.exit_status,
        "failure_code": failure["code"] if failure else None,
        "failure": dict(failure.fields) if failure else None,
        "resumed_exit": resumed.exit_status,
        "restored_step": report.restored_steps[-1] if report.restored_steps else None,
        "replayed_steps": report.replayed_steps,
        "all_hashes_equal": all(c.ok for c in report.checks if c.name.endswith("state hashes")),
        "verdict": "verified" if report.proven else "NOT verified",
    }
    (out / "verdict.json").write_text(
        json.dumps({**summary, "verify": report.as_record()}, indent=2, default=str) + "\n"
    )
    return report, summary


def main(argv: list[str] | None = None) -> int:
    """Run the drill and print its verdict; exit 0 only when the recovery is proven."""
    parser = argparse.ArgumentParser(
        prog="python -m jobwarden.control.rehearsal", description=__doc__
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for the evidence")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--checkpoint-every", type=int, default=2)
    parser.add_argument("--fail-after", type=int, default=3)
    args = parser.parse_args(argv)
    report, summary = rehearse(
        args.out, args.seed, args.steps, args.checkpoint_every, args.fail_after
    )
    print(
        f"drill: seed {args.seed}, {args.steps} steps, checkpoint every "
        f"{args.checkpoint_every}, injected failure after update {args.fail_after}"
    )
    print(
        f"faulted attempt exited {summary['faulted_exit']}: "
        f"{summary['failure_code'] or 'no failed event'}"
    )
    print(f"restored step: {summary['restored_step']}")
    print(f"replayed updates: {summary['replayed_steps']}")
    print(
        f"every replayed state hash matched the reference: "
        f"{'yes' if summary['all_hashes_equal'] else 'NO'}"
    )
    print(verify.render(report))
    print(f"verdict: recovery {summary['verdict']}; evidence in {args.out}")
    return 0 if report.proven and summary["faulted_exit"] != 0 else 1


if __name__ == "__main__":
    sys.exit(main())
