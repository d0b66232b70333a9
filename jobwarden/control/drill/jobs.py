"""The job a drill rehearses, and the copies of it that the drill submits.

The drilled job is a job document: the default linreg job built from the drill's knobs, or a
user's own job file (``wardenctl drill --job FILE``): a task job, or a command job whose
program uses the SDK.  Every copy the drill submits (the reference, the faulted job, the
retries) is that document with only ``id``, ``checkpoint`` and ``[faults]`` changed, plus the
few ``[supervision]`` fields a drill's mechanism needs (the stall drill's timeout, the
duplicate-writer drill's stop grace...) and, for the incompatible drill alone, the one
change it must see refused.  Copies are JSON, which carries any TOML job document but its
dates, and go to the daemon over its control socket.

A command job's program may keep its own ``steps``, ``checkpoint_every`` and
``keep_checkpoints`` (those its ``[run]`` leaves out); the drill then reads them from the
reference run's ``started`` event and writes them into the faulted copies (`DrillJob.learned`),
so that the daemon checks the faults against the run they are meant for.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from jobwarden.control.drill.daemon import activated
from jobwarden.control.drill.plan import checkpoint_steps
from jobwarden.errors import JobFileError, JobwardenError
from jobwarden.jobfile import (
    MAX_JOB_FILE_BYTES,
    Job,
    RunSection,
    format_of,
    job_from_mapping,
    parse_text,
    resolve_workdir,
)
from jobwarden.sdk.settings import RUN_FILE_ENV, RunFile
from jobwarden.worker.command import worker_argv

DEFAULT_ORIGIN = "the default job"
# How long a drill waits for one of its jobs to settle: the default job takes seconds, a
# user's model may take many minutes.
DEFAULT_SETTLE_S = 300.0
USER_SETTLE_S = 3600.0
# A copy's id is <label>-<drill>-<stamp>-<role>, at most 64 characters: the label (the user's
# job id) is cut to leave room for the longest drill name, stamp and role.
LABEL_CHARS = 20
RUN_FIELDS = ("steps", "checkpoint_every", "keep_checkpoints")
# The reference of a program whose [run] is not known yet keeps this many checkpoints: all.
KEEP_EVERY = 10**9
# The incompatible drill's change for a command job, whose training fields are its program's
# own: the XLA flags of its runtime, with a flag that only restates XLA's CPU default.  The
# retry is refused before it computes anything.
RUNTIME_FLAG = "--xla_force_host_platform_device_count=1"


class DrillJobError(JobwardenError):
    """Raised when a job file cannot be drilled (unreadable, invalid, or a program without
    the SDK, whose resumes cannot be compared); lists every problem."""

    code = "drill.job"
    exit_status = 2

    def __init__(self, origin: str, problems: list[str]) -> None:
        super().__init__(f"{origin}: " + "; ".join(problems), origin=origin, problems=problems)
        self.origin = origin
        self.problems = problems


@dataclass(frozen=True)
class Incompatibility:
    """What the incompatible drill changes for its retry, and the refusal that must name it.

    ``old`` and ``new`` are the values the refusal must give for ``field``; for a runtime
    change ``old`` is None (the original run's own, whatever it was) and ``new`` the flag
    its new value must hold.
    """

    what: str
    code: str
    field: str
    changes: Mapping[str, Mapping[str, Any]]
    """the document sections the retry's copy lays over the job's (``train``, ``env``)"""
    old: Any
    new: Any

    def named_in(self, fields: Mapping[str, Any]) -> bool:
        """Whether a refusal's ``fields`` name this change with both values."""
        found = fields.get(self.field)
        if not isinstance(found, list) or len(found) != 2:
            return False
        if self.old is None:
            return str(self.new) in str(found[1]) and str(self.new) not in str(found[0])
        return found == [self.old, self.new]


@dataclass(frozen=True)
class HandStart:
    """How to start the drilled job's program by hand on a checkpoint directory."""

    argv: list[str]
    cwd: Path | None = None
    env: Mapping[str, str] | None = None
    """the whole environment, None: this process's"""


@dataclass(frozen=True)
class DrillJob:
    """The job every drill of one run copies: its document and what the drill reads from it."""

    document: Mapping[str, Any]
    origin: str
    """the job file's path, or `DEFAULT_ORIGIN`"""
    label: str
    """what the copies' ids start with: the user's job id, empty for the default job"""
    run: RunSection | None
    """the effective ``[run]``; None until learned, for a program that keeps its own"""
    change: Incompatibility | None
    stall_timeout_s: float | None
    """the job file's own ``[supervision] stall_timeout_s``, when it sets one"""
    settle_s: float

    @property
    def is_default(self) -> bool:
        """Whether this is the default job rather than a user's job file."""
        return self.origin == DEFAULT_ORIGIN

    @property
    def is_command(self) -> bool:
        """Whether the job runs the user's own program (a command job)."""
        return "command" in self.document

    @property
    def name(self) -> str:
        """The drilled job as a report names it."""
        return self.origin if self.is_default else f"job {self.document['id']} ({self.origin})"

    @property
    def processes(self) -> int:
        """The job's cooperating processes (``[run] processes``, 1 unless set)."""
        return int((self.document.get("run") or {}).get("processes", 1))

    def with_processes(self, processes: int) -> DrillJob:
        """The job as ``processes`` cooperating members (``[run] processes``); raises
        `DrillJobError` for a count the job file schema refuses."""
        run = {**(self.document.get("run") or {}), "processes": processes}
        return _drill_job({**self.document, "run": run}, self.origin, self.label, self.settle_s)

    def tag(self, drill: str, stamp: str) -> str:
        """The prefix of one drill's job ids."""
        return "-".join(part for part in (self.label, drill, stamp) if part)

    def reference_run(self) -> dict[str, Any]:
        """The reference copy's ``[run]`` changes: a user's job's reference keeps every
        checkpoint it commits, so that a divergence can be shown leaf by leaf (the default
        job keeps them all already)."""
        if self.is_default:
            return {}
        if self.run is None:
            return {"keep_checkpoints": KEEP_EVERY}
        return {
            "keep_checkpoints": len(checkpoint_steps(self.run.steps, self.run.checkpoint_every))
        }

    def learned(self, run: RunSection) -> DrillJob:
        """The job once its program's own ``[run]`` is known (``run``, as its reference ran):
        its ``steps`` and ``checkpoint_every``, which the daemon checks the faults against,
        are written into every later copy.  Its ``keep_checkpoints`` stays the program's: the
        reference's own was the drill's (`reference_run`), so the corrupt drill cannot check
        it beforehand."""
        given = {"steps": run.steps, "checkpoint_every": run.checkpoint_every}
        document = {**self.document, "run": {**self.document.get("run", {}), **given}}
        return dataclasses.replace(self, document=document, run=run)

    def text(
        self,
        job_id: str,
        checkpoint: str,
        *,
        faults: Mapping[str, Any] | None = None,
        **sections: Mapping[str, Any],
    ) -> str:
        """A copy of the job as ``job_id`` on ``checkpoint``, with exactly ``faults``, and
        each of ``sections`` (``supervision``, ``train``, ``env``) laid over the job's."""
        document = copy.deepcopy(dict(self.document))
        document["id"], document["checkpoint"] = job_id, checkpoint
        if not self.is_default:  # every update's state hash, to compare step by step
            document["run"] = {**document.get("run", {}), "hash_every": 1}
        document.pop("faults", None)
        if faults:
            document["faults"] = dict(faults)
        for name, given in sections.items():
            if given:
                document[name] = {**document.get(name, {}), **given}
        return json.dumps(document, indent=2) + "\n"

    def hand_started(self, job_id: str, checkpoint_dir: Path, folder: Path) -> HandStart:
        """The job started by hand on ``checkpoint_dir`` (its files kept in ``folder``), the
        way an operator would start a second writer by mistake: the built-in worker on a
        task job's copy, or a command job's program told the directory by a run file."""
        if not self.is_command:
            spec = folder / "hand-started-job.json"
            spec.write_text(self.text(job_id, checkpoint_dir.name))
            return HandStart(worker_argv(spec, checkpoint_dir))
        run_file = folder / "hand-started-run.json"
        run_file.write_text(
            RunFile(checkpoint_dir=str(checkpoint_dir), job_id=job_id).model_dump_json(
                exclude_unset=True
            )
        )
        workdir = self.document.get("workdir")
        env = activated({**os.environ, **self.document.get("env", {}), RUN_FILE_ENV: str(run_file)})
        return HandStart(list(self.document["command"]), Path(workdir or folder), env)


def default_job(task: str, seed: int, steps: int, checkpoint_every: int) -> DrillJob:
    """The drills' own job: ``task`` (linreg unless told) with the drill's knobs, keeping
    every checkpoint; raises `DrillJobError` for knobs the job file schema refuses."""
    document = {
        "id": "drill",
        "task": task,
        "train": {"seed": seed},
        "run": {"steps": steps, "checkpoint_every": checkpoint_every, "keep_checkpoints": steps},
    }
    return _drill_job(document, DEFAULT_ORIGIN, "", DEFAULT_SETTLE_S)


def load_job_file(path: Path) -> DrillJob:
    """A user's job file as a `DrillJob`; raises `DrillJobError` listing every problem."""
    origin = str(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise DrillJobError(origin, [f"cannot read: {error.strerror}"]) from error
    if len(raw) > MAX_JOB_FILE_BYTES:
        raise DrillJobError(origin, [f"{len(raw)} bytes, over {MAX_JOB_FILE_BYTES}"])
    try:
        document = parse_text(raw.decode(), format_of(path))
    except (ValueError, UnicodeDecodeError) as error:
        raise DrillJobError(origin, [f"syntax: {error}"]) from error
    document = resolve_workdir(document, path.absolute().parent)
    return _drill_job(document, origin, _label(document), USER_SETTLE_S)


def _label(document: Mapping[str, Any]) -> str:
    job_id = document.get("id")
    return job_id[:LABEL_CHARS].rstrip(".-") if isinstance(job_id, str) else ""


def _drill_job(document: dict[str, Any], origin: str, label: str, settle_s: float) -> DrillJob:
    problems = []
    if document.get("sdk") is False:
        problems.append(
            "sdk = false: the program reports no state hashes and writes no jobwarden "
            "checkpoints, so a drill has nothing to compare with a reference step by step "
            "and cannot tell whether it resumes exactly; attach it with jobwarden.sdk "
            "(docs/sdk.md) and set sdk = true"
        )
    job: Job | None = None
    try:
        job = job_from_mapping(document, origin, check_workdir=True)
    except JobFileError as error:
        problems += error.problems
    try:
        json.dumps(document, allow_nan=False)
    except (TypeError, ValueError) as error:
        problems.append(f"holds a value a JSON job file cannot carry (a TOML date?): {error}")
    if problems or job is None:
        raise DrillJobError(origin, problems)
    supervision = document.get("supervision")
    stall = supervision.get("stall_timeout_s") if isinstance(supervision, dict) else None
    given_run = document.get("run") or {}
    known = job.program is None or all(name in given_run for name in RUN_FIELDS)
    return DrillJob(
        document=document,
        origin=origin,
        label=label,
        run=job.run if known else None,
        change=runtime_change(document) if job.program is not None else config_change(job),
        stall_timeout_s=float(stall) if stall is not None else None,
        settle_s=settle_s,
    )


def config_change(job: Job) -> Incompatibility | None:
    """A training field changed to another valid value: ``learning_rate`` when the task has
    one, else the first other field the task's schema lets change; None if none can."""
    fields = job.train_fields()
    order = sorted(fields, key=lambda n: (n != "learning_rate", not isinstance(fields[n], float)))
    for name in order:
        for candidate in _nearby(fields[name]):
            try:
                type(job.train).model_validate({**fields, name: candidate})
            except ValidationError:
                continue
            return Incompatibility(
                what=f"a changed {name}",
                code="checkpoint.config",
                field=name,
                changes={"train": {name: candidate}},
                old=fields[name],
                new=candidate,
            )
    return None


def runtime_change(document: Mapping[str, Any]) -> Incompatibility:
    """A command job's runtime changed: `RUNTIME_FLAG` added to the XLA flags of its ``env``."""
    flags = str(document.get("env", {}).get("XLA_FLAGS", ""))
    return Incompatibility(
        what="changed XLA flags",
        code="checkpoint.runtime",
        field="xla_flags",
        changes={"env": {"XLA_FLAGS": f"{flags} {RUNTIME_FLAG}".strip()}},
        old=None,
        new=RUNTIME_FLAG,
    )


def _nearby(value: Any) -> list[Any]:
    """Valid-looking neighbours of a training field's value, nearest first."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value - 1]
    if isinstance(value, float):
        return [value * 1.25, value * 0.8]
    return []
