"""jobwarden's SDK: a few lines in a training loop buy the whole recovery contract.

    import jobwarden.sdk as jw

    with jw.attach(config=cfg, sources=[__file__], data_hash=digest, steps=1000) as run:
        state = run.restore(init_state)        # newest accepted compatible checkpoint, else init
        for step in run.steps(state):          # restored step + 1 .. steps; stops on preemption
            state, loss = train_step(state)
            run.progress(step, state, loss=loss)  # state hash in the event; commits on cadence

Standalone it reads ``--checkpoint-dir DIR`` from the command line; under
wardend, the run file named by ``$JOBWARDEN_RUN_FILE`` (`jobwarden.sdk.settings`
says which wins).  docs/sdk.md is the user's guide.  Importing this package
neither imports nor configures JAX; `attach` pins the CPU runtime for exact
replay when the run is entered, so enter it before the first JAX computation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from jobwarden.jobfile import FaultSection
from jobwarden.sdk.generators import rng_state, set_rng_state
from jobwarden.sdk.leaves import UsageError
from jobwarden.sdk.position import Epochs, Position
from jobwarden.sdk.provenance import DataHash
from jobwarden.sdk.run import Run
from jobwarden.sdk.script import ScriptRun
from jobwarden.sdk.session import RunEnded
from jobwarden.sdk.settings import RUN_FILE_ENV, Checkpoints, Request, RunFile

__all__ = [
    "RUN_FILE_ENV",
    "Epochs",
    "Position",
    "Run",
    "RunEnded",
    "RunFile",
    "ScriptRun",
    "UsageError",
    "attach",
    "rng_state",
    "set_rng_state",
    "start",
]


def attach(
    *,
    config: Any = None,
    sources: Sequence[str | Path] = (),
    data: Any = None,
    data_hash: str | DataHash | None = None,
    data_files: Sequence[str | Path] | None = None,
    name: str | None = None,
    job_id: str | None = None,
    checkpoint_dir: str | Path | None = None,
    steps: int | None = None,
    checkpoint_every: int | None = None,
    keep_checkpoints: int | None = None,
    resume: str | None = None,
    hash_every: int | None = None,
    processes: int | None = None,
    async_commit: bool | None = None,
    exact: bool | None = None,
    faults: FaultSection | Mapping[str, Any] | None = None,
    compile_cache: str | Path | None = None,
    signing_key: str | Path | None = None,
    events: str | Path | IO[str] | None = None,
    checkpoints: Checkpoints = "jobwarden",
    key_impl: str | None = None,
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    redirect_prints: bool = True,
) -> Run:
    """A run of this program under jobwarden; enter it with ``with`` (or see `start`).

    Provenance: ``config`` (the training fields, hashed and compared on resume,
    each differing one named), ``sources`` (the files that define the update),
    the data (``data=`` arrays, ``data_hash=`` a string or a function giving
    one, or ``data_files=``), and ``name`` (default: the first source's stem).

    Settings (the run file and the command line win over these, see
    `jobwarden.sdk.settings`): ``checkpoint_dir``, the ``[run]`` fields
    ``steps``, ``checkpoint_every``, ``keep_checkpoints``, ``resume``,
    ``hash_every``, ``processes`` (docs/multiprocess.md), ``async_commit``
    (write each checkpoint on a background thread), ``exact`` (False: XLA's own
    threads, recoveries unverified; docs/jobfile.md), the ``[faults]`` drill
    faults, ``compile_cache``, ``signing_key`` (a key file's path) and ``job_id``.

    ``events``: a path to append events to, or a text stream; default stdout
    (where a supervisor reads them, always), with the program's own output
    moved to stderr unless ``redirect_prints=False``.  ``checkpoints="external"``:
    the program keeps its own checkpoints (Orbax...) and reports them with
    `Run.restored`; see docs/sdk.md for what that gives up.  ``argv`` (default
    ``sys.argv[1:]``, from which the SDK's options are then removed) and
    ``environ`` (default ``os.environ``) are where settings are looked up.
    """
    ours = {
        "steps": steps,
        "checkpoint_every": checkpoint_every,
        "keep_checkpoints": keep_checkpoints,
        "resume": resume,
        "hash_every": hash_every,
        "processes": processes,
        "async_commit": async_commit,
        "exact": exact,
    }
    request = Request(
        config=config,
        sources=tuple(sources),
        data=data,
        data_hash=data_hash,
        data_files=None if data_files is None else tuple(data_files),
        name=name,
        job_id=job_id,
        checkpoint_dir=checkpoint_dir,
        run={key: value for key, value in ours.items() if value is not None},
        faults=faults,
        compile_cache=compile_cache,
        signing_key=signing_key,
        events=events,
        checkpoints=checkpoints,
        key_impl=key_impl,
        argv=argv,
        environ=environ,
        redirect_prints=redirect_prints,
    )
    return Run(request)


def start(**options: Any) -> ScriptRun:
    """`attach` without the ``with`` block: the run is entered now and left at exit.

    ``run = jw.start(...)`` takes `attach`'s arguments.  An SDK error ends the
    process where it is raised, with its status; an exception escaping the
    script is reported as ``failed`` and exits 70; ``run.close()`` (or the
    interpreter's exit) leaves the run, exiting 75 after a preemption.  See
    `jobwarden.sdk.script` and docs/sdk.md for the limits.
    """
    return ScriptRun(attach(**options).request).open()
