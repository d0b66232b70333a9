"""Who of the control socket's clients is served, who waits for a slot, who is told busy.

The policy alone, on plain records and an injected clock: `ControlServer` does the
sockets.  A client waits in a queue of its own uid and readiness (whether a complete
request line is already in its socket); a freed slot goes to a ready client before a
silent one, to root or the daemon's uid (the *operators*) before anyone else, then to
the uid holding the fewest slots, then to whoever has waited longest.  A slot is taken
back from its connection (*evicted*) only for a ready waiter, and only from one that
has had its chance: waiting for a request for `GRACE_S`, or for its client to take an
answer for `STUCK_S`; among those, from the uid holding the most slots.  When the queue
is full a newcomer takes the place of the newest waiter of a heavier uid, else it is
the one told busy.  A waiter without a request is told busy after `WAIT_S`, one with
a request after `READY_WAIT_S`.  So one uid, an attacker in the control group, holding every slot
and every place in the queue, keeps no operator waiting longer than `GRACE_S` or
`STUCK_S`, and an honest burst of clients is served in turn instead of evicted.
"""

from __future__ import annotations

import enum
import socket
import time
from collections import Counter, deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

GRACE_S = 0.1
"""How long a served connection may wait for its request before a waiting client may take
its slot: a client sends its line as soon as it is connected."""
STUCK_S = 0.5
"""How long an answer waits for its client before a waiting client may take the slot."""
WAIT_S = 5.0
"""How long a client without a complete request waits for a slot before it is told
``control.busy``."""
READY_WAIT_S = 30.0
"""How long a client whose request is in its socket waits: it is served in turn however
slow the daemon is (an honest burst on a loaded machine), up to this."""
PEEK_BYTES = 4096
"""How much of a waiting client's first line is looked at to tell whether it is complete."""


class Phase(enum.Enum):
    """What a connection in a slot waits for."""

    READING = "a complete request line from the client"
    ANSWERING = "the daemon's answer"
    SENDING = "the client to take its answer"


@dataclass(eq=False)
class Slot:
    """One served connection: its peer's uid, what it waits for, and since when (monotonic)."""

    uid: int
    since: float
    phase: Phase = Phase.READING
    task: Any = None
    writer: Any = None
    conn: Any = None
    """its socket, to look for a request that came before the daemon read it"""
    evicted: bool = False
    ready: bool = False
    """A complete request of it has come (before the slot was granted, or since) and has
    not been read yet: a loaded daemon may take longer than `GRACE_S` to read it, which is
    not the client's fault, so the slot is not taken back meanwhile."""

    def wait(self, phase: Phase, now: float) -> None:
        """Enter ``phase`` at ``now``."""
        self.phase, self.since = phase, now

    def evictable(self, now: float) -> bool:
        """Whether the connection has had its chance: no request in `GRACE_S`, or its answer
        not taken in `STUCK_S`.  One still opening (no writer yet), or whose request came
        before its slot and is not read yet, is never evicted."""
        if self.writer is None:
            return False
        if self.phase is Phase.READING:
            return not self.ready and now - self.since >= GRACE_S
        return self.phase is Phase.SENDING and now - self.since >= STUCK_S


@dataclass(eq=False)
class Waiter:
    """An accepted connection waiting for a slot; nothing of it is read meanwhile."""

    conn: socket.socket
    pid: int
    uid: int
    since: float
    ready: bool = False


def has_request(conn: socket.socket) -> bool:
    """Whether a complete request line (or the start of a long one) waits in the socket."""
    try:
        head = conn.recv(PEEK_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:
        return False
    return b"\n" in head


@dataclass
class Admission:
    """The slots and the queue of one control socket (see the module's docstring)."""

    operators: Collection[int]
    capacity: int
    room: int
    clock: Callable[[], float] = time.monotonic
    slots: list[Slot] = field(default_factory=list)
    held: Counter[int] = field(default_factory=Counter)
    queues: dict[tuple[bool, int], deque[Waiter]] = field(default_factory=dict)
    waiting: int = 0

    def free(self) -> bool:
        """Whether a slot is free."""
        return len(self.slots) < self.capacity

    def take(self, uid: int) -> Slot:
        """A slot for a client of ``uid``, which must be free."""
        slot = Slot(uid, self.clock())
        self.slots.append(slot)
        self.held[uid] += 1
        return slot

    def release(self, slot: Slot) -> bool:
        """Give ``slot`` back; False when it was already given back."""
        if slot not in self.slots:
            return False
        self.slots.remove(slot)
        self.held[slot.uid] -= 1
        if not self.held[slot.uid]:
            del self.held[slot.uid]
        return True

    def _weight(self, uid: int) -> tuple[bool, int]:
        queued = sum(len(self.queues.get((ready, uid), ())) for ready in (True, False))
        return uid not in self.operators, self.held[uid] + queued

    def enqueue(self, waiter: Waiter) -> Waiter | None:
        """Queue ``waiter``; when the queue is full, returns the one to tell busy: the
        newest waiter of the heaviest uid if that uid is heavier, else ``waiter`` itself."""
        pushed_out = None
        if self.waiting >= self.room:
            heaviest = max({uid for _, uid in self.queues}, key=self._weight)
            if self._weight(heaviest) <= self._weight(waiter.uid):
                return waiter
            pushed_out = self._pop_newest(heaviest)
        self.queues.setdefault((waiter.ready, waiter.uid), deque()).append(waiter)
        self.waiting += 1
        return pushed_out

    def _pop_newest(self, uid: int) -> Waiter:
        key = (False, uid) if (False, uid) in self.queues else (True, uid)
        return self._pop(key, newest=True)

    def _pop(self, key: tuple[bool, int], newest: bool = False) -> Waiter:
        queue = self.queues[key]
        waiter = queue.pop() if newest else queue.popleft()
        if not queue:
            del self.queues[key]
        self.waiting -= 1
        return waiter

    def next_waiter(self) -> Waiter | None:
        """Take the waiter a freed slot goes to (see the module's docstring), if any."""
        if not self.queues:
            return None
        key = min(
            self.queues,
            key=lambda k: (
                not k[0],
                k[1] not in self.operators,
                self.held[k[1]],
                self.queues[k][0].since,
            ),
        )
        return self._pop(key)

    def has_ready(self) -> bool:
        """Whether a waiter holds a complete request, and so may have a slot evicted for it."""
        return any(ready for ready, _ in self.queues)

    def victim(self, arrived: Callable[[Slot], bool] = lambda slot: False) -> Slot | None:
        """The slot to take back for a ready waiter: among those that had their chance, of
        the heaviest uid (others before the operators), the one waiting longest.  A slot
        waiting for its request for which ``arrived`` says the request has come since
        (not yet read by a busy daemon) is made ready instead: it had its chance in time."""
        now = self.clock()
        if not self.has_ready():
            return None
        chances = [s for s in self.slots if s.evictable(now)]
        for slot in chances:
            if slot.phase is Phase.READING and arrived(slot):
                slot.ready = True
        chances = [s for s in chances if not s.ready]
        if not chances:
            return None
        return max(chances, key=lambda s: (*self._weight(s.uid), now - s.since))

    def promote(self, ready: Callable[[Waiter], bool]) -> None:
        """Move the silent waiters whose request has come since into the ready queues,
        where they keep their turn."""
        grown = set()
        for key in [k for k in self.queues if not k[0]]:
            stay: deque[Waiter] = deque()
            for waiter in self.queues.pop(key):
                if ready(waiter):
                    waiter.ready = True
                    self.queues.setdefault((True, key[1]), deque()).append(waiter)
                    grown.add((True, key[1]))
                else:
                    stay.append(waiter)
            if stay:
                self.queues[key] = stay
        for key in grown:
            self.queues[key] = deque(sorted(self.queues[key], key=lambda w: w.since))

    def expired(self) -> list[Waiter]:
        """Take every waiter that has waited for a slot `WAIT_S` without a request, or
        `READY_WAIT_S` with one."""
        now, gone = self.clock(), []
        for key in list(self.queues):
            limit = now - (READY_WAIT_S if key[0] else WAIT_S)
            while key in self.queues and self.queues[key][0].since <= limit:
                gone.append(self._pop(key))
        return gone
