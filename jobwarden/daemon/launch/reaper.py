"""Every descendant of a local attempt ends with it, whether it left its process group or not.

The daemon makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``):
a process whose parent exits is then re-parented to the daemon instead of to
init, so a child that called ``setsid`` or double-forked stays within reach.
When an attempt's leader exits, `sweep` SIGKILLs the leader's process group
and every stray that still names the attempt's folder in its environment
(`ATTEMPT_ENV`, inherited from the leader) together with its own descendants,
then reaps the strays re-parented to the daemon.  A subreaper rather than a
cgroup per attempt: it needs no privilege, no delegated cgroup tree and no
systemd, works the same on cgroup v1 and v2, and costs one scan of the
daemon's own children.  Where prctl is refused, the strays are looked for
among every process of the daemon's user instead (logged once).  A descendant
that both clears its environment and leaves its group is not recognised.
A descendant orphaned while its attempt runs and ending on its own is reaped
by `reap_orphans` (at each sweep and each sample), so none is left a zombie:
every zombie child of the daemon that the daemon did not start itself
(`children.CHILDREN`: workers, spares, hooks and Slurm commands, each until
its own waiter has reaped it); while one of those starts is under way, only a
zombie older than `ORPHAN_GRACE_S` (the child just forked may not be named
yet).  Whether it leads a session does not matter: a
``setsid`` child that ended before its program, which never waited for it,
comes to the daemon a zombie when the program exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from pathlib import Path

import psutil
import structlog

from jobwarden.daemon.children import CHILDREN
from jobwarden.daemon.launch.base import ATTEMPT_ENV, suppress_gone

log = structlog.get_logger("wardend.reaper")
PR_SET_CHILD_SUBREAPER = 36
REAP_WAIT_S = 2.0
"""How long a sweep waits for a killed stray to die before it leaves it to the next one."""
ROUNDS = 8
"""Sweeps in a row at most: a stray's own children, re-parented when it dies, are the next."""
LEADERS: set[int] = set()
"""The pids of the attempts' leaders still followed: never strays, even in the same folder
(the members of one attempt share it)."""
ORPHAN_GRACE_S = 2.0
"""While a start of the daemon's own is under way, a zombie child younger than this is left
for the next turn: it may be that child, forked and not yet named."""
_subreaper: list[bool] = []


def become_subreaper() -> bool:
    """Make this process the subreaper of its descendants, once; False (logged once) where the
    kernel refuses it, and strays are then looked for by a scan of the user's processes."""
    if not _subreaper:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            refused = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0
            error = os.strerror(ctypes.get_errno()) if refused else ""
        except (OSError, AttributeError) as failure:
            refused, error = True, repr(failure)
        if refused:
            log.warning(
                "reaper.no_subreaper",
                error=error,
                effect="strays are looked for among all of this user's processes",
            )
        _subreaper.append(not refused)
    return _subreaper[0]


def _candidates() -> list[psutil.Process]:
    if become_subreaper():
        found = []
        for pid in children_of_this_process():
            with contextlib.suppress(psutil.Error):
                found.append(psutil.Process(pid))
        return found
    uid = os.getuid()
    procs = psutil.process_iter(["uids"])
    return [p for p in procs if p.info["uids"] is not None and p.info["uids"].real == uid]


def children_of_this_process() -> list[int]:
    """The pids of this process's children, from each of its threads' ``children`` file in
    /proc (a few small reads, where psutil reads the status of every process on the box);
    psutil's scan where the kernel has no such files."""
    if not Path(f"/proc/self/task/{os.getpid()}/children").exists():
        try:
            return [child.pid for child in psutil.Process().children()]
        except psutil.Error:
            return []
    pids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError, ValueError):  # a thread that ended while listed
            pids.update(int(pid) for pid in (task / "children").read_text().split())
    return sorted(pids)


def strays(folders: set[str]) -> list[psutil.Process]:
    """The processes, not a followed leader, whose environment names one of ``folders``."""
    found = []
    for proc in _candidates():
        if proc.pid in LEADERS or proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(ATTEMPT_ENV) in folders:
                found.append(proc)
        except psutil.Error:  # gone, a zombie, or not ours to read
            continue
    return found


def sweep(group: int, folders: set[str]) -> int:
    """SIGKILL process group ``group`` and every stray of ``folders`` with its descendants, reap
    those re-parented to this process; the number of strays killed.  Blocking: run off the loop."""
    with suppress_gone():
        os.killpg(group, signal.SIGKILL)
    reap_orphans()
    killed = 0
    for _ in range(ROUNDS):
        found = strays(folders)
        if not found:
            break
        doomed = list(found)
        for proc in found:
            try:
                doomed.extend(proc.children(recursive=True))
            except psutil.Error:
                continue
        for proc in doomed:
            try:
                proc.kill()
            except psutil.Error:
                continue
        killed += len(found)
        _reap([p.pid for p in found])
    return killed


def _reap(pids: list[int]) -> None:
    """Wait (bounded) for each killed child of this process, so none is left a zombie."""
    deadline = time.monotonic() + REAP_WAIT_S
    for pid in pids:
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not our child (no subreaper), or reaped already
                break
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.005)


def reap_orphans() -> int:
    """Reap this process's zombie children that it never started itself, the number reaped:
    a child `children.CHILDREN` does not name came to it as an orphan, and nothing else
    waits for it."""
    if not become_subreaper():
        return 0
    try:  # one system call when no child has ended (the common case): no scan of /proc
        if os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            return 0
    except ChildProcessError:
        return 0
    reaped = 0
    young = None if CHILDREN.settled else time.time() - ORPHAN_GRACE_S
    for pid in children_of_this_process():
        try:
            child = psutil.Process(pid)
            if child.pid in CHILDREN.own or child.status() != psutil.STATUS_ZOMBIE:
                continue
            if young is not None and child.create_time() > young:
                continue
            reaped += bool(os.waitpid(child.pid, os.WNOHANG)[0])
        except (psutil.Error, OSError):  # reaped meanwhile, or gone
            continue
    return reaped
