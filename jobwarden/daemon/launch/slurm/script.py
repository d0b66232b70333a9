"""What one attempt submits: its sbatch options and its batch script (and, for N members, theirs).

Settings come from the daemon (``wardend --slurm-*``: `config.SlurmOptions`, handed to the
launcher as typed settings), and a job's own ``[slurm]`` section overrides partition, time
limit and nodes (`sections`). The batch script runs ``srun`` of the very argv the local
launcher would exec; with ``[run] processes = N`` it runs N tasks, each a member
(`member_script`): task i sets the membership variables the SDK reads (from
``SLURM_PROCID``), keeps its stdout in ``events.<i>.jsonl`` and its stderr in
``stderr.<i>.log`` (member 0: ``events.jsonl``, ``stderr.log``), as locally, and records its
own exit status in ``member.<i>.exit`` and the node it ran on in ``member.<i>.node``.  The
coordinator is on the first node of the job's allocation (`member_script`), never on the
daemon's host, which need not be a compute node.  ``[slurm] nodes = M`` spreads the N members
over M nodes, at most ``ceil(N / M)`` on each (block distribution: member 0 on the first).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from jobwarden.daemon.config import SlurmOptions
from jobwarden.daemon.launch.base import LaunchSpec
from jobwarden.jobfolder import member_file
from jobwarden.sdk.distributed import (
    COORDINATOR_ENV,
    COORDINATOR_FILE_ENV,
    PROCESS_ID_ENV,
    PROCESSES_ENV,
)
from jobwarden.sections import SlurmSection

SCRIPT = "slurm.sh"
MEMBER_SCRIPT = "slurm-member.sh"
EXIT_RECORD = "slurm.exit"
MEMBER_EXIT = "member.exit"
"""Member i's exit status, in ``member_file(MEMBER_EXIT, i)``."""
MEMBER_NODE = "member.node"
"""The Slurm node member i runs on, in ``member_file(MEMBER_NODE, i)``."""
RENDEZVOUS = "coordinator"
"""Where member 0 publishes the coordinator's ``host:port`` for the others."""
JOB_RECORD = "slurm.json"


@dataclass(frozen=True)
class SlurmSettings:
    """How attempts are submitted: the sbatch options every attempt gets."""

    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None
    signal_lead_s: int = 60
    extra: tuple[str, ...] = ()
    nodes: int | None = None
    exclude: tuple[str, ...] = ()
    """Nodes that failed under an earlier attempt of the job (`exclude`)."""

    @classmethod
    def of(cls, options: SlurmOptions) -> SlurmSettings:
        """The settings the daemon was given (``wardend --slurm-*``)."""
        return cls(
            options.partition,
            options.account,
            options.time_limit,
            options.signal_lead_s,
            options.extra,
        )

    def for_job(self, section: SlurmSection | None) -> SlurmSettings:
        """These settings with a job's ``[slurm]`` section laid over them."""
        if section is None:
            return self
        return replace(
            self,
            partition=section.partition or self.partition,
            time_limit=section.time_limit or self.time_limit,
            nodes=section.nodes or self.nodes,
        )

    def sbatch_options(self, spec: LaunchSpec) -> list[str]:
        """The options of one attempt's sbatch."""
        options = [
            "--parsable",
            f"--job-name=jw-{spec.job_id}-{spec.attempt}",
            f"--ntasks={spec.processes}",
            f"--signal=B:TERM@{self.signal_lead_s}",
            f"--output={spec.folder / 'slurm.log'}",
            "--open-mode=append",
            f"--chdir={spec.cwd or spec.folder}",
            "--export=ALL",
        ]
        options += [f"--partition={self.partition}"] if self.partition else []
        options += [f"--account={self.account}"] if self.account else []
        options += [f"--time={self.time_limit}"] if self.time_limit else []
        options += [f"--exclude={','.join(self.exclude)}"] if self.exclude else []
        if self.nodes:
            per_node = -(-spec.processes // self.nodes)
            options += [f"--nodes={self.nodes}", f"--ntasks-per-node={per_node}"]
        return options + list(self.extra)


def batch_script(spec: LaunchSpec) -> str:
    """The batch script of one attempt: srun of the worker (or of N members), SIGTERM passed
    to its step, and srun's exit status recorded.  A job Slurm requeued runs it again: it
    then exits 75 at once, since jobwarden starts the next attempt itself."""
    folder = spec.folder
    if spec.processes == 1:
        io = [f"--output={folder / spec.stdout}", f"--error={folder / 'stderr.log'}"]
        task = list(spec.argv)
    else:
        io = [f"--output={folder / 'slurm-tasks.log'}", "--open-mode=append"]
        task = ["/bin/bash", str(folder / MEMBER_SCRIPT), *spec.argv]
    srun = ["srun", f"--ntasks={spec.processes}", "--input=none", *io, *task]
    exit_record = shlex.quote(str(folder / EXIT_RECORD))
    return f"""#!/bin/bash
# jobwarden: attempt {spec.attempt} of job {spec.job_id}
umask 077
if [ "${{SLURM_RESTART_COUNT:-0}}" != 0 ]; then
    echo "jobwarden: requeued by Slurm; the daemon starts the next attempt" >&2
    exit 75
fi
trap 'scancel --signal=TERM "$SLURM_JOB_ID"' TERM
{shlex.join(srun)} &
child=$!
while :; do
    wait "$child"; status=$?
    kill -0 "$child" 2>/dev/null || break
done
printf '%s\\n' "$status" > {exit_record}.tmp && mv {exit_record}.tmp {exit_record}
exit "$status"
"""


def member_script(spec: LaunchSpec) -> str:
    """The script each srun task runs for a job of ``spec.processes`` members: member
    ``SLURM_PROCID``, with the coordinator on the first node of the job's allocation
    (``scontrol show hostnames``; srun's block distribution puts member 0 there), at a port
    member 0 finds free on that node and publishes in `RENDEZVOUS` (`publish_coordinator`):
    a port picked anywhere else could be taken there, by another job on the same node.

    The worker gets the step's signals straight from Slurm (the whole task is signalled);
    the script only waits for it (its own traps are no-ops) and records its exit status.
    JAX's own Slurm detection (``SlurmCluster``) would pick the same members from the same
    variables; the SDK is given them explicitly so a member's files are named as locally.
    """
    folder = spec.folder
    rendezvous = shlex.quote(str(folder / RENDEZVOUS))
    cases = []
    for index in range(spec.processes):
        files = [
            member_file(spec.stdout, index),
            member_file("stderr.log", index),
            member_file(MEMBER_EXIT, index),
            member_file(MEMBER_NODE, index),
        ]
        out, err, record, node = (shlex.quote(str(folder / name)) for name in files)
        cases.append(f"    {index}) out={out} err={err} record={record} node={node} ;;")
    arms = "\n".join(cases)
    return f"""#!/bin/bash
# jobwarden: one member of attempt {spec.attempt} of job {spec.job_id} (srun task $SLURM_PROCID)
umask 077
case "$SLURM_PROCID" in
{arms}
    *) echo "jobwarden: task $SLURM_PROCID of {spec.processes}?" >&2; exit 2 ;;
esac
printf '%s\n' "${{SLURMD_NODENAME:-$(hostname)}}" > "$node.tmp" && mv "$node.tmp" "$node"
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export {PROCESS_ID_ENV}="$SLURM_PROCID" {PROCESSES_ENV}={spec.processes}
export {COORDINATOR_ENV}="${{first:-$(hostname)}}" {COORDINATOR_FILE_ENV}={rendezvous}
trap : TERM USR1 INT
"$@" < /dev/null > "$out" 2> "$err" &
child=$!
while :; do
    wait "$child"; status=$?
    kill -0 "$child" 2>/dev/null || break
done
printf '%s\\n' "$status" > "$record.tmp" && mv "$record.tmp" "$record"
exit "$status"
"""


def member_status(folder: Path, index: int) -> int | None:
    """Member ``index``'s exit status as its script recorded it (a shell's: 137 is SIGKILL)."""
    return read_status(folder / member_file(MEMBER_EXIT, index))


def member_node(folder: Path, index: int) -> str | None:
    """The node member ``index`` runs on, as its script recorded it; None before it started."""
    try:
        return (folder / member_file(MEMBER_NODE, index)).read_text().strip() or None
    except OSError:
        return None


def read_status(path: Path) -> int | None:
    """An exit status written by a batch or member script; None before it is written."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
