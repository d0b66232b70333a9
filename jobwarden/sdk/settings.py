"""How a program attached to jobwarden learns its settings, and in which order they win.

Highest first:

1. the **run file** named by ``$JOBWARDEN_RUN_FILE`` (`RUN_FILE_ENV`): what a
   supervisor says (wardend, for a command job).  A JSON object (`RunFile`):
   ``checkpoint_dir``, ``run`` and ``faults`` (the job file's ``[run]`` and
   ``[faults]`` sections, `RunSection` and `FaultSection`), ``compile_cache``,
   ``signing_key`` (a key file's path, never the key) and ``job_id``.  A field
   it gives replaces the program's; one it leaves out keeps the program's;
2. the **command line**: ``--checkpoint-dir DIR``, ``--compile-cache DIR`` and
   ``--signing-key FILE`` (`OWNED_OPTIONS`), taken out of the program's
   arguments; everything else is left to the program;
3. ``$JOBWARDEN_COMPILE_CACHE`` for the compilation cache;
4. the program's own **arguments to** `jobwarden.sdk.attach` (``steps=``,
   ``checkpoint_every=``, ``faults=``, ...);
5. the defaults of `RunSection` and `FaultSection`.

Every problem is listed in one `JobFileError` (``job.invalid``, exit 3).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from jobwarden.decoding import loads_json
from jobwarden.errors import JobFileError
from jobwarden.jobfile import FaultSection, RunSection, _fault_problems
from jobwarden.sdk.provenance import DataHash

RUN_FILE_ENV = "JOBWARDEN_RUN_FILE"
CACHE_ENV = "JOBWARDEN_COMPILE_CACHE"
MAX_RUN_FILE_BYTES = 256 * 1024
OWNED_OPTIONS = ("--checkpoint-dir", "--compile-cache", "--signing-key")

Checkpoints = Literal["jobwarden", "external"]


class RunFile(BaseModel):
    """The run file a supervisor writes for a program that uses the SDK (schema version 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    v: Literal[1] = 1
    checkpoint_dir: str
    run: RunSection = RunSection()
    faults: FaultSection = FaultSection()
    compile_cache: str | None = None
    signing_key: str | None = None
    job_id: str | None = None


@dataclass(frozen=True)
class Settings:
    """The resolved, validated settings of one attached run."""

    checkpoint_dir: Path | None
    run: RunSection
    faults: FaultSection
    compile_cache: Path | None
    signing_key: Path | None
    job_id: str | None
    run_file: Path | None


def _problems(error: ValidationError, prefix: str) -> list[str]:
    return [
        f"{prefix}{'.'.join(str(p) for p in item['loc']) or '(top level)'}: "
        f"{'unknown field' if item['type'] == 'extra_forbidden' else item['msg']} "
        f"(found {item['input']!r})"
        for item in error.errors()
    ]


def split_argv(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """The SDK's own options (`OWNED_OPTIONS`) found in ``argv``, and the rest in order.

    Raises `JobFileError` for an owned option without its value.
    """
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    for option in OWNED_OPTIONS:
        parser.add_argument(option)
    try:
        known, rest = parser.parse_known_args(list(argv))
    except argparse.ArgumentError as error:
        raise JobFileError("command line", [str(error)]) from error
    found = {name: value for name, value in vars(known).items() if value is not None}
    return found, rest


def read_run_file(path: Path) -> RunFile:
    """Read and validate a run file; raises `JobFileError` listing every problem."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise JobFileError(str(path), [f"cannot read: {error.strerror}"]) from error
    if len(raw) > MAX_RUN_FILE_BYTES:
        raise JobFileError(str(path), [f"{len(raw)} bytes, over {MAX_RUN_FILE_BYTES}"])
    try:
        document = loads_json(raw.decode())
        return RunFile.model_validate(document)
    except ValidationError as error:
        raise JobFileError(str(path), _problems(error, "")) from error
    except (ValueError, UnicodeDecodeError) as error:
        raise JobFileError(str(path), [f"syntax: {error}"]) from error


def _section(
    kind: type[RunSection] | type[FaultSection],
    ours: Mapping[str, Any],
    given: RunSection | FaultSection | None,
    prefix: str,
    problems: list[str],
) -> Any:
    """``ours`` (the program's) with the run file's explicitly given fields laid over it."""
    merged = dict(ours)
    if given is not None:
        merged.update(given.model_dump(include=set(given.model_fields_set)))
    try:
        return kind.model_validate(merged)
    except ValidationError as error:
        problems.extend(_problems(error, prefix))
        return kind()


def resolve(
    *,
    checkpoint_dir: str | Path | None,
    run: Mapping[str, Any],
    faults: FaultSection | Mapping[str, Any] | None,
    compile_cache: str | Path | None,
    signing_key: str | Path | None,
    job_id: str | None,
    options: Mapping[str, str],
    environ: Mapping[str, str],
    checkpoints: Checkpoints = "jobwarden",
) -> Settings:
    """Lay the run file over the command line over the environment over the program's arguments.

    ``run`` holds the program's own `RunSection` fields (None values left out),
    ``options`` the command line's (`split_argv`).  Raises `JobFileError`.
    """
    where = environ.get(RUN_FILE_ENV)
    document = read_run_file(Path(where)) if where else None
    problems: list[str] = []
    program_faults = faults.model_dump() if isinstance(faults, FaultSection) else dict(faults or {})
    section = _section(RunSection, run, document.run if document else None, "run.", problems)
    drills = _section(
        FaultSection, program_faults, document.faults if document else None, "faults.", problems
    )

    def pick(name: str, ours: str | Path | None, env: str | None = None) -> Path | None:
        given = getattr(document, name) if document is not None else None
        value = given or options.get(name) or env or ours
        return Path(value).absolute() if value else None

    directory = pick("checkpoint_dir", checkpoint_dir)
    if not problems:
        problems.extend(_fault_problems(section, drills))
    if directory is None and checkpoints == "jobwarden":
        problems.append(
            "checkpoint_dir: none given (attach(checkpoint_dir=...), --checkpoint-dir DIR, "
            f"or ${RUN_FILE_ENV}); a program that keeps its own checkpoints says "
            "checkpoints='external'"
        )
    if checkpoints == "external" and drills.crash_in_commit is not None:
        problems.append(
            "faults.crash_in_commit: the program keeps its own checkpoints "
            "(checkpoints='external'); the fault would never fire"
        )
    if problems:
        raise JobFileError(where or "attach()", problems)
    return Settings(
        checkpoint_dir=directory,
        run=section,
        faults=drills,
        compile_cache=pick("compile_cache", compile_cache, environ.get(CACHE_ENV)),
        signing_key=pick("signing_key", signing_key),
        job_id=(document.job_id if document is not None else None) or job_id,
        run_file=Path(where) if where else None,
    )


@dataclass(frozen=True)
class Request:
    """What the program asked `jobwarden.sdk.attach` for, before anything is resolved."""

    config: Any = None
    sources: Sequence[str | Path] = ()
    data: Any = None
    data_hash: str | DataHash | None = None
    data_files: Sequence[str | Path] | None = None
    name: str | None = None
    job_id: str | None = None
    checkpoint_dir: str | Path | None = None
    run: Mapping[str, Any] = field(default_factory=dict)
    faults: FaultSection | Mapping[str, Any] | None = None
    compile_cache: str | Path | None = None
    signing_key: str | Path | None = None
    events: str | Path | IO[str] | None = None
    checkpoints: Checkpoints = "jobwarden"
    key_impl: str | None = None
    argv: Sequence[str] | None = None
    environ: Mapping[str, str] | None = None
    redirect_prints: bool = True
