"""supervisord running one program with ``autorestart``, and the events it writes, for the
benches that compare jobwarden with it (`peers.py`, `recovery.py`).

The program is one ``[program]`` with ``autorestart=true``, ``startsecs=0`` and
its stdout the events file, appended across starts; supervisord itself comes
with the ``bench`` extra.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from daemon import read_events

Record = dict[str, Any]


class Stream:
    """The events of every start of one worker, wherever the supervisor keeps them."""

    def __init__(self, files: Any) -> None:
        self.files = files

    def all(self) -> list[Record]:
        """Every event so far, in order of time."""
        found = [e for path in self.files() for e in read_events(path)]
        return sorted(found, key=lambda e: e.get("time", 0))

    def wait(self, match: Any, timeout: float = 180) -> Record:
        """The first event that matches."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.all():
                if match(e):
                    return e
            time.sleep(0.002)
        raise TimeoutError("no matching event")

    def kill_after(self, step: int, before_kill: Any = None) -> float:
        """SIGKILL the live worker after its progress of ``step``; the kill's time."""
        if before_kill is not None:
            before_kill()
        self.wait(lambda e: e.get("event") == "progress" and e["step"] >= step)
        pid = [e["pid"] for e in self.all() if e.get("event") == "started"][-1]
        os.kill(pid, signal.SIGKILL)
        return time.time()

    def resumed_after(self, killed: float) -> Record:
        """The first progress event after the kill."""
        return self.wait(lambda e: e.get("event") == "progress" and e["time"] > killed)


class Supervisord:
    """supervisord running one worker program, its stdout the events file."""

    def __init__(self, folder: Path, argv: list[str], cwd: Path | None = None) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)  # a job file may have made it
        conf = folder / "supervisord.conf"
        conf.write_text(
            "\n".join(
                [
                    "[supervisord]",
                    "nodaemon=true",
                    f"logfile={folder / 'supervisord.log'}",
                    f"pidfile={folder / 'supervisord.pid'}",
                    "[program:worker]",
                    f"command={' '.join(argv)}",
                    *([f"directory={cwd}"] if cwd is not None else []),
                    "autostart=true",
                    "autorestart=true",
                    "startsecs=0",
                    "startretries=100",
                    f"stdout_logfile={folder / 'events.jsonl'}",
                    "stdout_logfile_maxbytes=0",
                    f"stderr_logfile={folder / 'stderr.log'}",
                    "stderr_logfile_maxbytes=0",
                    "",
                ]
            )
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBWARDEN_")}
        binary = Path(sys.executable).with_name("supervisord")
        self.began = time.time()
        self.proc = subprocess.Popen(
            [str(binary), "-c", str(conf)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.stream = Stream(lambda: [folder / "events.jsonl"])

    def stop(self) -> None:
        """SIGTERM supervisord (it stops the worker) and wait."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
