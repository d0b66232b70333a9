"""The program each attempt of section strays runs, and the helpers it leaves behind.

Each helper is a fresh interpreter whose command line carries a marker naming the run, the
job, the attempt and the helper's kind; it ignores SIGTERM and appends a timestamped line
to ``writes`` in the job's checkpoint directory every 50 ms while its program lives and
``linger`` s after.
"""

from __future__ import annotations

KINDS = ("group", "stdout", "detached", "orphan")
"""The helpers each attempt leaves: in the program's process group, in a session of its own
holding stdout, a detached grandchild in a session of its own, a double-fork orphan."""

HELPER = r"""
import os, select, signal, sys, time
mark, writes, linger, leader = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
_, _, attempt, kind = mark.rsplit("/", 3)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
fd = os.open(writes, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
try:
    program = os.pidfd_open(leader)
except ProcessLookupError:
    program = None
gone = None if program is not None else time.monotonic()
while gone is None or time.monotonic() < gone + linger:
    os.write(fd, f"{kind} {attempt} {time.time()!r}\n".encode())
    if gone is None and select.select([program], [], [], 0)[0]:
        gone = time.monotonic()
    time.sleep(0.05)
"""
"""One descendant: ignores SIGTERM, appends ``KIND ATTEMPT TIME`` every 50 ms as long as its
program lives and for ``linger`` s after (so it never ends first, to be left unreaped)."""

PROGRAM = f"HELPER = {HELPER!r}\n" + (
    """\
import json, os, sys, time
from pathlib import Path

token, plan, linger, held, hold = sys.argv[1:5] + [float(sys.argv[5])]
run = json.loads(Path(os.environ["JOBWARDEN_RUN_FILE"]).read_text())
writes = Path(run["checkpoint_dir"]) / "writes"
attempt = int(Path(os.environ["JOBWARDEN_ATTEMPT_FOLDER"]).name)
leader = os.getpid()
fd = os.open(writes, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)


def note(what):
    os.write(fd, f"{what} {attempt} {time.time()!r}\\n".encode())


def helper(kind, detach, life):
    if detach:
        null = os.open(os.devnull, os.O_RDWR)
        for n in (0, 1, 2):
            os.dup2(null, n)
    mark = f"{token}/{attempt}/{kind}"
    argv = [sys.executable, "-c", HELPER, mark, str(writes), life, str(leader)]
    os.execv(sys.executable, argv)


note("start")
if os.fork() == 0:
    helper("group", True, linger)
if os.fork() == 0:
    os.setsid()
    helper("stdout", False, held)
for kind, session in (("detached", True), ("orphan", False)):
    middle = os.fork()
    if middle == 0:
        if session:
            os.setsid()
        if os.fork() == 0:
            helper(kind, True, linger)
        os._exit(0)
    os.waitpid(middle, 0)  # as a daemonizing program does: the orphan is the grandchild
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    up = {line.split()[0] for line in writes.read_text().splitlines()
          if line.split()[1:2] == [str(attempt)]}
    if up >= {"group", "stdout", "detached", "orphan"}:
        break
    time.sleep(0.01)
note("ready")
if plan[min(attempt, len(plan)) - 1] == "w":
    time.sleep(120)  # until stopped or cancelled
else:
    time.sleep(hold)
    note("end")
sys.exit(1)
"""
)
"""An attempt's program: four helpers, then a crash or a wait for the section's stop."""
