"""An attempt of N cooperating processes (``[run] processes = N``), seen by its supervisor as one.

`GroupAttempt` starts every member through a launcher's ``spawn`` (each its
own process group, with ``JOBWARDEN_PROCESS_ID``, ``JOBWARDEN_PROCESSES`` and
a loopback coordinator address), keeps member i's stdout in
``events.<i>.jsonl`` (member 0's in ``events.jsonl``) and stderr in
``stderr.<i>.log``, and hands the supervisor one stream:

- member 0's events, with ``ready`` held until every member is ready, each
  ``progress`` held until every member has reported that step (so the stall
  watch follows the slowest member), and ``completed`` until all completed;
- the first ``failed`` of any member, tagged with its ``process``;
- for a recovery, each member's replay checked against its own log of the
  failed attempt: a member whose state differs has its event forwarded in
  place of member 0's, so the supervisor's proof fails at that step.

One member failing fails the attempt: the survivors are stopped (SIGTERM,
`MEMBER_STOP_GRACE_S`, SIGKILL to each group), since gloo would leave them
blocked in a collective forever.  A member that reports events and exits 0
before its ``completed`` has failed too (its peers would wait for it in a
collective): it is the one blamed, with a ``failed`` event of code `EARLY_EXIT_CODE`.
``members.json`` keeps what each member did.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from jobwarden.daemon.launch.base import ExitInfo, LaunchSpec, OnEvent, OnMalformed, RunningAttempt
from jobwarden.daemon.store import evidence
from jobwarden.events import Event, Malformed
from jobwarden.jobfolder import MEMBERS_FILE, member_file
from jobwarden.proof.replay import ReplayPlan
from jobwarden.sdk.distributed import COORDINATOR_ENV, PROCESS_ID_ENV, PROCESSES_ENV

MEMBER_STOP_GRACE_S = 3.0
"""How long a survivor of a failed member gets after SIGTERM before SIGKILL."""
MEMBER_SETTLE_S = 0.5
"""How long after a member's failure the others may end on their own before they are stopped:
the member that failed first is told from those whose collective it broke (the attempt ends
as soon as all have ended, without waiting the rest of it)."""
EARLY_EXIT_CODE = "member.exited_early"
"""The code of the failure of a member that exited 0 before it completed."""
PEER_LOST_MARKS = ("Gloo", "Connection reset by peer", "Connection closed", "coordination service")
"""What the error of a member whose collective lost a peer says (gloo, the coordinator)."""

Spawn = Callable[[LaunchSpec, str], Awaitable[RunningAttempt]]
"""Start one member: its spec, and the name of its stderr file in the attempt folder."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, for the coordinator (member 0 binds it at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def member_spec(spec: LaunchSpec, index: int, coordinator: str) -> LaunchSpec:
    """The launch of member ``index``: the attempt's, with its membership and its own stdout."""
    env = {
        **spec.env,
        PROCESS_ID_ENV: str(index),
        PROCESSES_ENV: str(spec.processes),
        COORDINATOR_ENV: coordinator,
    }
    return replace(spec, env=env, stdout=member_file(spec.stdout, index), processes=1)


@dataclass
class Member:
    """What the group has learned of one member."""

    index: int
    running: RunningAttempt
    plan: ReplayPlan | None = None
    ready: bool = False
    step: int = -1
    progress_at: float | None = None
    completed: bool = False
    checks: list[dict[str, Any]] = field(default_factory=list)

    def view(self, now: float) -> dict[str, Any]:
        """One line of the detail view: pid, rss, step, last-progress age, how it ended."""
        info = self.running.exit_info
        age = None if self.progress_at is None else round(now - self.progress_at, 3)
        return {
            "process": self.index,
            "pid": self.running.pid,
            "node": self.running.node,
            "rss_mb": self.running.sample().get("rss_mb"),
            "ready": self.ready,
            "step": max(self.step, 0),
            "progress_age_s": age,
            "exit_status": None if info is None else info.status,
            "exit_signal": None if info is None else info.signal,
            "replay_checks": len(self.checks),
            "replay_ok": all(c["ok"] for c in self.checks),
        }


class GroupAttempt(RunningAttempt):
    """N members run as one attempt; one failing fails all (restart-all)."""

    def __init__(self, spec: LaunchSpec, members: list[RunningAttempt]) -> None:
        super().__init__(spec)
        self.members = [Member(i, running) for i, running in enumerate(members)]
        self.started_mono = time.monotonic()
        self.failed_member: int | None = None
        self.lost: dict[int, str] = {}
        """Members whose node was lost under them, each with its node and state (`_lost_nodes`)."""
        self._emits = spec.job is None or spec.job.emits_events
        """Whether members report events: then an exit 0 before ``completed`` is a failure."""
        self._failing = False
        self._stopping = False
        self._failures: dict[int, Event] = {}
        self._ends: list[tuple[int, bool]] = []
        self._one_ended = asyncio.Event()
        """(member, whether it ended on its own: not stopped by the group or the daemon)"""
        self._ready: Event | None = None
        self._completed: Event | None = None
        self._held: list[Event] = []
        self._replaced: dict[int, Event] = {}
        self._forward: OnEvent = lambda event: None
        previous = spec.folder.parent / str(spec.attempt - 1)
        for member in self.members[1:] if spec.attempt > 1 else []:
            log = previous / member_file(spec.stdout, member.index)
            if log.exists():
                member.plan = ReplayPlan.from_events(spec.attempt - 1, log)

    @classmethod
    async def start(cls, spec: LaunchSpec, spawn: Spawn) -> GroupAttempt:
        """Start all ``spec.processes`` members; if one cannot start, kill those that did."""
        coordinator = f"127.0.0.1:{free_port()}"
        started: list[RunningAttempt] = []
        try:
            for index in range(spec.processes):
                stderr = member_file("stderr.log", index)
                started.append(await spawn(member_spec(spec, index, coordinator), stderr))
        except BaseException:
            for running in started:
                running.kill()
            raise
        return cls(spec, started)

    @property
    def pid(self) -> int | None:
        """Member 0's pid (it holds the writer lock)."""
        return self.members[0].running.pid

    def create_time(self) -> float | None:
        """Member 0's start time."""
        return self.members[0].running.create_time()

    def sample(self) -> dict[str, Any]:
        """The largest member's rss (the limit is per member), CPU summed, and each member."""
        samples = [m.running.sample() for m in self.members]
        rss = [s["rss_mb"] for s in samples if "rss_mb" in s]
        out = dict(samples[0])
        if rss:
            out["rss_mb"] = max(rss)
        if all("cpu_s" in s for s in samples):
            out["cpu_s"] = sum(s["cpu_s"] for s in samples)
        out["members"] = self.members_view()["members"]
        return out

    def member_pids(self) -> dict[str, Any]:
        """Every member's index and pid."""
        return {"members": [{"process": m.index, "pid": m.running.pid} for m in self.members]}

    def members_view(self) -> dict[str, Any]:
        """Every member's line, which are missing (not ready) and which one lags the rest."""
        now = time.monotonic()
        missing = [m.index for m in self.members if not m.ready]
        alive = [m for m in self.members if m.running.exit_info is None]
        lagging = min(alive or self.members, key=_lag_order).index
        alone = dict(self._ends)
        lines = []
        for member in self.members:
            failure = self._failures.get(member.index)
            lines.append(
                {
                    **member.view(now),
                    "stopped": None if member.index not in alone else not alone[member.index],
                    "failure": None if failure is None else failure.get("code"),
                    "peer_lost": _peer_lost(failure),
                    "node_lost": self.lost.get(member.index),
                }
            )
        return {
            "members": lines,
            "missing": missing,
            "stalled_member": missing[0] if missing else lagging,
            "failed_member": self.failed_member,
        }

    def signal(self, signum: int) -> None:
        """Send ``signum`` to every member (a stop, or a stack dump of all N)."""
        if signum != signal.SIGUSR1:  # a stack dump, not a stop
            self._stopping = True
        for member in self.members:
            member.running.signal(signum)

    def kill(self) -> None:
        """SIGKILL every member's process group."""
        self._stopping = True
        for member in self.members:
            member.running.kill()

    async def follow(self, on_event: OnEvent, on_malformed: OnMalformed) -> ExitInfo:
        """Follow every member until all have ended; the first to fail decides the exit."""
        self._forward = on_event
        await asyncio.gather(*(self._follow(m, on_malformed) for m in self.members))
        if any(_failed(m, self._emits) for m in self.members):
            self.lost = await self._lost_nodes()
        self.failed_member = self._first_failure()
        if self.failed_member is not None:
            failure = self._failures.get(self.failed_member) or self._early_exit()
            if failure is not None:  # a member killed by a signal reported nothing
                on_event(Event(failure.kind, {**failure.fields, "process": self.failed_member}))
        evidence.keep(
            self.spec.folder / MEMBERS_FILE, json.dumps(self.members_view(), indent=2) + "\n"
        )
        self.events.close()
        return self._ended(self._exit())

    async def _follow(self, member: Member, on_malformed: OnMalformed) -> None:
        def malformed(line: Malformed) -> None:
            if member.index == 0:
                on_malformed(line)

        await member.running.follow(lambda e: self._event(member, e), malformed)
        self._ends.append((member.index, not self._stopping))
        self._one_ended.set()
        if _failed(member, self._emits) and not self._stopping:
            self._failing = True
            await self._settle()  # a peer that died at once ends on its own
            if not self._stopping:
                await self._stop_survivors()

    async def _settle(self) -> None:
        """Until every member has ended, or `MEMBER_SETTLE_S` has passed."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(MEMBER_SETTLE_S):
                while len(self._ends) < len(self.members):
                    self._one_ended.clear()
                    await self._one_ended.wait()

    async def _lost_nodes(self) -> dict[int, str]:
        """Members whose machine was lost under them, with what names it; none where members
        share this machine (a launcher of several hosts says which, `SlurmGroupAttempt`)."""
        return {}

    def _first_failure(self) -> int | None:
        """The member whose failure ended the attempt: one whose node was lost, else the first
        to end on its own with a failure of its own, before one that only reports a collective
        broken by a lost peer."""
        if self.lost:
            return min(self.lost)
        ended = [index for index, alone in self._ends if alone]
        failed = [index for index in ended if _failed(self.members[index], self._emits)]
        primary = [i for i in failed if not _peer_lost(self._failures.get(i))]
        chosen = primary or failed
        return chosen[0] if chosen else None

    async def _stop_survivors(self) -> None:
        """SIGTERM, grace, SIGKILL for each member still running."""
        self._stopping = True
        alive = [m.running for m in self.members if m.running.exit_info is None]
        await asyncio.gather(*(running.stop(MEMBER_STOP_GRACE_S) for running in alive))

    def _exit(self) -> ExitInfo:
        duration = time.monotonic() - self.started_mono
        infos = [m.running.exit_info for m in self.members]
        if self.failed_member is not None:
            chosen = infos[self.failed_member]
        else:
            chosen = next((i for i in infos if i is not None and i.status != 0), infos[0])
        status = chosen.status if chosen is not None else -9
        return ExitInfo(status, chosen.signal if chosen else "SIGKILL", duration)

    # ---- the one stream the supervisor reads

    def _event(self, member: Member, event: Event) -> None:
        kind = event.kind
        if kind == "failed":  # forwarded once the first failure is known (`follow`)
            self._failures[member.index] = event
            self._failing = True
            return
        if kind == "completed":
            member.completed = True
        if self._failing:
            if member.index == 0 and kind == "checkpoint":
                self._forward(event)
            return
        if kind == "ready":
            member.ready = True
            self._check(member, event, "restored state")
            if member.index == 0:
                self._ready = event
            if self._ready is not None and all(m.ready for m in self.members):
                self._forward(self._replaced.pop(self._ready["step"], self._ready))
        elif kind == "progress":
            member.step, member.progress_at = event["step"], time.monotonic()
            self._check(member, event, "update")
            if member.index == 0:
                self._held.append(event)
            self._release()
        elif kind == "completed":
            if member.index == 0:
                self._completed = event
            if self._completed is not None and all(m.completed for m in self.members):
                self._release()
                self._forward(self._completed)
        elif member.index == 0:
            self._forward(event)

    def _check(self, member: Member, event: Event, what: str) -> None:
        """Member ``member``'s replay against its own log of the failed attempt."""
        plan = member.plan
        if plan is None or plan.mismatch is not None:
            return
        if not plan.observe(event["step"], event.get("state_hash"), what):
            self._replaced[event["step"]] = Event(
                event.kind, {**event.fields, "process": member.index}
            )
        member.checks = plan.checks

    def _release(self) -> None:
        """Forward member 0's progress for every step all members have reported."""
        slowest = min(m.step for m in self.members)
        while self._held and self._held[0]["step"] <= slowest:
            event = self._held.pop(0)
            self._forward(self._replaced.pop(event["step"], event))

    def _early_exit(self) -> Event | None:
        """The failure of the member blamed when it exited 0 before it completed."""
        index = self.failed_member
        info = None if index is None else self.members[index].running.exit_info
        return None if index is None or info is None or info.status != 0 else _exit_0(index)


def _failed(member: Member, emits_events: bool) -> bool:
    """Whether an ended member failed: a status other than 0, or (for members that report
    events; a plain program's never completes) 0 before its ``completed``."""
    info = member.running.exit_info
    return info is None or info.status != 0 or (emits_events and not member.completed)


def _exit_0(index: int) -> Event:
    """The failure of member ``index``, which exited 0 before it completed."""
    message = f"member {index} exited with status 0 before it completed"
    return Event("failed", {"code": EARLY_EXIT_CODE, "message": message, "exit_status": 0})


def _peer_lost(failure: Event | None) -> bool:
    """Whether a member's failure is a collective that lost its peer (a consequence)."""
    message = "" if failure is None else str(failure.get("message", ""))
    return any(mark in message for mark in PEER_LOST_MARKS)


def _lag_order(member: Member) -> tuple[int, float]:
    """Lowest step first, then the oldest progress: the member the others wait for."""
    return (member.step, member.progress_at or 0.0)
