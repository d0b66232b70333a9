"""Job files: TOML or JSON in, a frozen validated `Job` out, or every problem listed.

One format serves the worker and the spool.  A job runs a registered
``task``, whose ``[train]`` fields are hashed into the config hash, or a user's
own ``command`` (`jobwarden.program`).  ``[run]`` and ``[faults]`` are
operational and never hashed, so a compatible retry may change them.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from jobwarden.decoding import loads_json, loads_toml
from jobwarden.errors import JobFileError
from jobwarden.program import (
    HeartbeatSection,
    Program,
    argv_problem,
    exec_problems,
    kind_problems,
    workdir_problem,
    workdir_problems,
)
from jobwarden.sections import SlurmSection, SupervisionSection
from jobwarden.tasks import BUILTIN, Task, TrainFields, broken_tasks, known_tasks, task_class

MAX_JOB_FILE_BYTES = 256 * 1024
NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")


def check_name(value: str) -> str:
    """A job id or checkpoint name: one safe path segment, never ``.`` or ``..``."""
    if not NAME_PATTERN.fullmatch(value) or set(value) == {"."}:
        raise ValueError("must match [A-Za-z0-9._-]{1,64} and not be '.' or '..'")
    return value


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class RunSection(_Section):
    """Operational settings of a run."""

    steps: int = Field(8, ge=1, le=10**9)
    checkpoint_every: int = Field(2, ge=1)
    keep_checkpoints: int = Field(3, ge=1)
    resume: Literal["auto", "require", "never"] = "auto"
    hash_every: int = Field(1, ge=1)
    processes: int = Field(1, ge=1, le=16)
    """cooperating JAX processes, one job (docs/multiprocess.md)"""
    async_commit: bool = False
    """write, fsync and replace each checkpoint on a background thread (docs/sdk.md)"""
    exact: bool = True
    """pin XLA's CPU backend to one thread for bit-exact replay; ``false`` lets it use its
    own threads, and every recovery is then concluded unverified (docs/jobfile.md)"""


class FaultSection(_Section):
    """Drill faults; operational, never hashed."""

    fail_after: int | None = Field(None, ge=1)
    crash_after: int | None = Field(None, ge=1)
    crash_in_commit: int | None = Field(None, ge=1)
    stall_at: int | None = Field(None, ge=0)
    stall_seconds: float = Field(10.0, gt=0, le=86400)
    step_delay_s: float = Field(0.0, ge=0, le=60)
    commit_delay_s: float = Field(0.0, ge=0, le=3600)
    """a slow disk: every commit waits this long before its pending file is replaced"""
    crash_every_s: float | None = Field(None, gt=0, le=86400)
    """chaos: SIGKILL after this many seconds of running, in every attempt"""
    every_attempt: bool = False
    process: int | None = Field(None, ge=0, le=15)
    """the member the faults apply to in a multi-process job (None: every member)"""

    def active(self) -> bool:
        """Whether any fault is set."""
        return any(
            v is not None
            for v in (self.fail_after, self.crash_after, self.crash_in_commit, self.stall_at)
        )


class _Document(_Section):
    id: str
    task: str | None = None
    command: list[str] | None = None
    workdir: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    sdk: bool = True
    heartbeat: HeartbeatSection | None = None
    checkpoint: str | None = None
    train: dict[str, Any] = Field(default_factory=dict)
    run: RunSection = RunSection()
    faults: FaultSection = FaultSection()
    supervision: SupervisionSection = SupervisionSection()
    slurm: SlurmSection | None = None

    _names = field_validator("id", "checkpoint")(
        lambda value: value if value is None else check_name(value)
    )

    @field_validator("command", mode="before")
    @classmethod
    def _argv(cls, value: Any) -> Any:
        problem = argv_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _nodes(self) -> _Document:
        nodes = self.slurm.nodes if self.slurm is not None else None
        if nodes is not None and nodes > self.run.processes:
            raise ValueError(
                f"[slurm] nodes = {nodes} is more than [run] processes = "
                f"{self.run.processes}: a node would run no member"
            )
        return self

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str | None) -> str | None:
        problem = workdir_problem(value) if value is not None else None
        if problem is not None:
            raise ValueError(problem)
        return value


@dataclass(frozen=True)
class Job:
    """A validated job: a task and its training fields, or a program; run settings, faults."""

    id: str
    task: str | None
    checkpoint: str
    train: TrainFields
    """The task's training fields; empty for a command job (its program's config is its own)."""
    run: RunSection
    faults: FaultSection
    supervision: SupervisionSection
    program: Program | None = None

    @property
    def emits_events(self) -> bool:
        """Whether the job's stdout carries jobwarden events (a task, or an SDK program)."""
        return self.program is None or self.program.sdk

    def label(self) -> str:
        """What the job runs, in words: ``task linreg``, or ``command `python train.py```."""
        if self.program is not None:
            return f"command `{self.program.label()}`"
        return f"task {self.task}"

    def task_instance(self) -> Task:
        """The task object for this job's training fields; raises `JobFileError` for a
        command job, which has none."""
        if self.task is None:
            raise JobFileError(self.id, ["task: a command job runs its own program, not a task"])
        task = task_class(self.task)
        if task is None:
            raise JobFileError(self.id, [f"task: unknown task {self.task!r}"])
        return task(self.train)

    def without_faults(self) -> Job:
        """The job as a recovery attempt runs it: faults off unless they apply to every attempt."""
        if self.faults.every_attempt:
            return self
        chaos = self.faults.crash_every_s  # a soak's fault: every attempt by definition
        kept = FaultSection() if chaos is None else FaultSection(crash_every_s=chaos)
        return dataclasses.replace(self, faults=kept)

    def train_fields(self) -> dict[str, Any]:
        """The normalized training fields, defaults filled in (none for a command job)."""
        return self.train.model_dump()

    def to_record(self) -> dict[str, Any]:
        """The normalized request, as JSON-ready data.

        A command job keeps only the ``[run]`` and ``[faults]`` fields its file
        sets: the others are its program's own, which the daemon does not know.
        """
        if self.program is not None:
            return {
                "id": self.id,
                **self.program.to_record(),
                "checkpoint": self.checkpoint,
                "run": self.run.model_dump(exclude_unset=True),
                "faults": self.faults.model_dump(exclude_unset=True),
                "supervision": self.supervision.model_dump(),
            }
        return {
            "id": self.id,
            "task": self.task,
            "checkpoint": self.checkpoint,
            "train": self.train_fields(),
            "run": self.run.model_dump(),
            "faults": self.faults.model_dump(),
            "supervision": self.supervision.model_dump(),
        }


def _problems(
    error: ValidationError, prefix: str = "", model: type[BaseModel] | None = None
) -> list[str]:
    found = []
    for item in error.errors():
        where = prefix + ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown field" + _did_you_mean(model or _Document, item["loc"])
        found.append(f"{where}: {message} (found {item['input']!r})")
    return found


def _did_you_mean(model: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """``; did you mean 'stall_timeout_s'?`` for a misspelled field at ``loc``, or ''."""
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        kinds = (field.annotation, *get_args(field.annotation)) if field else ()
        inner = [t for t in kinds if isinstance(t, type) and issubclass(t, BaseModel)]
        if not inner:
            return ""
        model = inner[0]
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def parse_text(text: str, fmt: Literal["toml", "json"]) -> dict[str, Any]:
    """Decode a job document; raises ValueError naming the syntax error.

    Nesting deeper than `jobwarden.decoding.MAX_DEPTH`, NaN or Infinity in JSON and
    lone surrogates are refused here too (`jobwarden.decoding`), before validation.
    """
    if fmt == "json":
        value = loads_json(text)
        if not isinstance(value, dict):
            raise ValueError(f"a JSON job file holds an object, found {type(value).__name__}")
        return value
    return loads_toml(text)


def job_from_mapping(
    document: dict[str, Any], origin: str = "<job>", *, check_workdir: bool = False
) -> Job:
    """Validate a decoded job document; raises `JobFileError` listing every problem.

    A ``workdir`` must be absolute.  That it exists is a fact of the moment,
    checked where a file comes in (``check_workdir``, as `job_from_bytes` does):
    a job read back from its own folder is not lost when its workdir goes away;
    its attempt then fails to launch, naming the directory.  So are the sizes
    execve takes (`exec_problems`): no job accepted before is lost to them.
    """
    problems: list[str] = []
    parsed: _Document | None = None
    try:
        parsed = _Document.model_validate(document)
    except ValidationError as error:
        problems.extend(_problems(error))
    task_name = document.get("task")
    builtin = isinstance(task_name, str) and task_name in BUILTIN
    tasks = dict(BUILTIN) if builtin else known_tasks()  # no plugin shadows a built-in
    task_cls = tasks.get(task_name) if isinstance(task_name, str) else None
    broken = broken_tasks() if isinstance(task_name, str) and task_cls is None else {}
    if isinstance(task_name, str) and task_name in broken:
        problems.append(f"task: the plugin task {task_name!r} cannot be used: {broken[task_name]}")
    elif isinstance(task_name, str) and task_cls is None:
        problems.append(f"task: unknown task {task_name!r} (known: {', '.join(sorted(tasks))})")
    train: TrainFields | None = None
    raw_train = document.get("train", {})
    if task_cls is not None and isinstance(raw_train, dict) and "command" not in document:
        try:
            train = task_cls.Train.model_validate(raw_train)
        except ValidationError as error:
            problems.extend(_problems(error, "train.", task_cls.Train))
    problems.extend(kind_problems(document))
    workdir = document.get("workdir")
    if check_workdir and isinstance(workdir, str) and workdir_problem(workdir) is None:
        problems.extend(workdir_problems(workdir))
    if check_workdir:
        problems.extend(exec_problems(document))
    if parsed is not None:
        partial = parsed.command is not None
        problems.extend(_fault_problems(parsed.run, parsed.faults, partial=partial))
    if problems or parsed is None:
        raise JobFileError(origin, problems)
    program = None
    if parsed.command is not None:
        program = Program(
            tuple(parsed.command), parsed.workdir, dict(parsed.env), parsed.sdk, parsed.heartbeat
        )
        train = TrainFields()
    elif train is None:
        raise JobFileError(origin, ["train: must be a table"])
    return Job(
        id=parsed.id,
        task=parsed.task,
        checkpoint=parsed.checkpoint or parsed.id,
        train=train,
        run=parsed.run,
        faults=parsed.faults,
        supervision=parsed.supervision,
        program=program,
    )


def _fault_problems(run: RunSection, faults: FaultSection, *, partial: bool = False) -> list[str]:
    """Faults that could never fire are mistakes in a drill, not silent no-ops.

    ``partial``: ``run`` holds only what a command job's file sets, the rest being
    its program's own; only what can be told from those fields is checked here
    (the SDK checks the rest when the run is entered).
    """
    found: list[str] = []
    known = run.model_fields_set if partial else set(RunSection.model_fields)
    if "steps" not in known:
        return found
    for name in ("fail_after", "crash_after", "crash_in_commit", "stall_at"):
        step = getattr(faults, name)
        if step is not None and step > run.steps:
            found.append(
                f"faults.{name}: {step} is past run.steps = {run.steps}; the fault would never fire"
            )
    step = faults.crash_in_commit
    if "checkpoint_every" not in known:
        return found
    if step is not None and step <= run.steps and step % run.checkpoint_every and step != run.steps:
        found.append(
            f"faults.crash_in_commit: step {step} is not a checkpoint step "
            f"(checkpoint_every = {run.checkpoint_every}, steps = {run.steps})"
        )
    return found


def job_from_bytes(raw: bytes, origin: str, fmt: Literal["toml", "json"]) -> Job:
    """Validate a job file's bytes, and that a command job's workdir exists; raises
    `JobFileError` listing every problem."""
    if len(raw) > MAX_JOB_FILE_BYTES:
        raise JobFileError(
            origin, [f"file is {len(raw)} bytes, over the {MAX_JOB_FILE_BYTES}-byte limit"]
        )
    try:
        document = parse_text(raw.decode(), fmt)
    except (ValueError, UnicodeDecodeError) as error:
        raise JobFileError(origin, [f"syntax: {error}"]) from error
    return job_from_mapping(document, origin, check_workdir=True)


def format_of(path: Path) -> Literal["toml", "json"]:
    """A job file's format by its name: ``.json`` is JSON, anything else TOML."""
    return "json" if path.suffix == ".json" else "toml"


def load_job(path: Path) -> Job:
    """Read and validate a job file (a relative ``workdir`` counts from the file's folder)."""
    return job_from_mapping(load_document(path), str(path), check_workdir=True)


def load_document(path: Path) -> dict[str, Any]:
    """A job file's document as a client submits it: a relative ``workdir`` made absolute
    against the file's own folder (the daemon, which never sees that folder, refuses one)."""
    return resolve_workdir(read_document(path), path.absolute().parent)


def read_document(path: Path) -> dict[str, Any]:
    """A job file's decoded document, not yet validated."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise JobFileError(str(path), [f"cannot read: {error.strerror}"]) from error
    if len(raw) > MAX_JOB_FILE_BYTES:
        raise JobFileError(
            str(path), [f"file is {len(raw)} bytes, over the {MAX_JOB_FILE_BYTES}-byte limit"]
        )
    try:
        document = parse_text(raw.decode(), format_of(path))
    except (ValueError, UnicodeDecodeError) as error:
        raise JobFileError(str(path), [f"syntax: {error}"]) from error
    return document


def resolve_workdir(document: dict[str, Any], base: Path) -> dict[str, Any]:
    """``document`` with a relative ``workdir`` joined to ``base`` (and normalised)."""
    workdir = document.get("workdir")
    if not isinstance(workdir, str) or "\0" in workdir or Path(workdir).is_absolute():
        return document
    return {**document, "workdir": os.path.normpath(base / workdir)}
