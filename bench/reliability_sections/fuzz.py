"""Section 5, fuzz: hostile inputs in process and through a real daemon, each answered or
refused with a reason, never a crash."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobwarden.checkpoint import format as ckformat
from jobwarden.checkpoint.errors import CheckpointError
from jobwarden.control.harness import job_text
from jobwarden.errors import JobFileError
from jobwarden.events import Event, Malformed, parse_line
from jobwarden.jobfile import job_from_bytes
from jobwarden.protocol import SUPPORTED_VERSIONS, ControlError, parse_request
from jobwarden.worker.command import worker_argv

from .common import Record, Section
from .evidence import rejections
from .fuzz_inputs import checkpoint_files, fuzz_strategies
from .wardend import running


@dataclass
class Property:
    """One fuzzed property: examples run, and each crash (an answer outside the contract)."""

    name: str
    examples: int = 0
    crashes: list[str] = field(default_factory=list)
    kinds: Counter[str] = field(default_factory=Counter)

    def crash(self, example: object, error: BaseException | str) -> None:
        """Record an example the code under test did not handle."""
        self.kinds["crash"] += 1
        if len(self.crashes) < 20:
            self.crashes.append(f"{error!r:.300} on {example!r:.300}")


def run_property(strategy: Any, check: Callable[[Any], None], examples: int, seed: int) -> int:
    """Run ``check`` on ``examples`` values drawn from ``strategy``; returns how many ran.


    ``check`` records what it finds and never raises, so hypothesis neither shrinks nor
    stops at the first finding; no example database is written.
    """
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fixed_seed

    count = 0

    @fixed_seed(seed)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def prop(value: Any) -> None:
        nonlocal count
        count += 1
        check(value)

    prop()
    return count


def check_job_file(found: Property) -> Callable[[tuple[str, bytes]], None]:
    """A job file must validate into a Job or be refused with every problem listed."""

    def check(example: tuple[str, bytes]) -> None:
        fmt, raw = example
        try:
            job_from_bytes(raw, f"fuzz.{fmt}", fmt)  # type: ignore[arg-type]
        except JobFileError as error:
            if not error.problems or not all(isinstance(p, str) and p for p in error.problems):
                found.crash(example, f"refused without a reason: {error.problems!r}")
            else:
                found.kinds["rejected"] += 1
        except Exception as error:  # noqa: BLE001 - the finding
            found.crash(example, error)
        else:
            found.kinds["accepted"] += 1

    return check


def check_request_line(found: Property) -> Callable[[bytes], None]:
    """A request line must parse or be refused with a code and a message."""

    def check(line: bytes) -> None:
        try:
            parse_request(line.rstrip(b"\n"))
        except ControlError as error:
            if not error.code or not error.message:
                found.crash(line, f"refused without a reason: {error!r}")
            else:
                found.kinds[error.code] += 1
        except Exception as error:  # noqa: BLE001 - the finding
            found.crash(line, error)
        else:
            found.kinds["parsed"] += 1

    return check


def check_event_line(found: Property) -> Callable[[str], None]:
    """parse_line must return an Event (whose required fields have their types) or a
    Malformed, and never raise."""
    from jobwarden.events import REQUIRED

    def check(line: str) -> None:
        try:
            result = parse_line(line)
        except Exception as error:  # noqa: BLE001 - the finding
            found.crash(line, error)
            return
        if isinstance(result, Malformed):
            found.kinds["malformed"] += 1
        elif isinstance(result, Event):
            wrong = [
                name
                for name, types in REQUIRED[result.kind].items()
                if not isinstance(result.fields.get(name), types)
                or isinstance(result.fields.get(name), bool)
            ]
            if wrong:
                found.crash(line, f"event accepted with mistyped {wrong}")
            else:
                found.kinds["event"] += 1
        else:
            found.crash(line, f"returned {type(result).__name__}")

    return check


def check_checkpoint(
    found: Property, folder: Path, peaks: list[tuple[int, int]]
) -> Callable[[bytes], None]:
    """Reading a checkpoint file raises only CheckpointError subclasses, and allocates no
    more than a small multiple of the file's own size."""

    def check(raw: bytes) -> None:
        path = folder / "ckpt-0000000001.safetensors"
        path.write_bytes(raw)
        tracemalloc.reset_peak()
        base_memory = tracemalloc.get_traced_memory()[0]
        try:
            ckformat.read(path)
        except CheckpointError as error:
            found.kinds[type(error).__name__] += 1
        except Exception as error:  # noqa: BLE001 - the finding
            found.crash(raw, error)
        else:
            found.kinds["read"] += 1
        peak = tracemalloc.get_traced_memory()[1] - base_memory
        peaks.append((peak, len(raw)))
        if peak > 2 * len(raw) + (256 << 10):
            found.crash(raw, f"allocated {peak} bytes for a file of {len(raw)}")

    return check


def fuzz(
    base: Path,
    cache: Path,
    *,
    examples: int = 2000,
    daemon_examples: int = 400,
    seed: int = 0,
) -> Section:
    """Hypothesis over job files, request lines, event lines and checkpoint files."""
    section = Section("fuzz")
    section.sizes = {"examples/property": examples, "through the daemon": daemon_examples}
    strategies = fuzz_strategies()
    found: dict[str, Property] = {}

    def run(
        name: str, strategy: Any, make: Callable[[Property], Callable[[Any], None]], count: int
    ) -> None:
        found[name] = prop = Property(name)
        prop.examples = run_property(strategy, make(prop), count, seed)

    run("job files (jobfile.job_from_bytes)", strategies["job_files"], check_job_file, examples)
    run(
        "request lines (protocol.parse_request)",
        strategies["request_lines"],
        check_request_line,
        examples,
    )
    run("event lines (events.parse_line)", strategies["event_lines"], check_event_line, examples)
    valid = valid_checkpoint(base / "valid", cache)
    folder = base / "checkpoints"
    folder.mkdir(mode=0o700)
    peaks: list[tuple[int, int]] = []
    tracemalloc.start()
    try:
        run(
            "checkpoint files (checkpoint.format.read)",
            checkpoint_files(strategies, valid),
            lambda prop: check_checkpoint(prop, folder, peaks),
            examples,
        )
    finally:
        tracemalloc.stop()
    peak, size = max(peaks, default=(0, 0))
    section.figures["checkpoint_read_peak_allocation"] = {"bytes": peak, "file_bytes": size}
    daemon_found = fuzz_daemon(base, cache, strategies, daemon_examples, seed)
    found.update(daemon_found)
    for prop in found.values():
        outcome = ", ".join(f"{k} {v}" for k, v in prop.kinds.most_common(6))
        section.row(prop.name, f"{prop.examples} examples: {outcome}", "crash 0")
        section.check(f"{prop.name}: no crash", not prop.crashes)
    section.row(
        "checkpoint read: largest peak allocation (its file's size)",
        f"{peak / 1024:.0f} KiB ({size} bytes)",
        "<= 2 x size + 256 KiB",
    )
    section.figures["properties"] = {
        p.name: {"examples": p.examples, "outcomes": dict(p.kinds), "crashes": p.crashes}
        for p in found.values()
    }
    section.figures["examples_total"] = sum(p.examples for p in found.values())
    section.row("examples run, in all", section.figures["examples_total"])
    return section


def valid_checkpoint(folder: Path, cache: Path) -> bytes:
    """The bytes of a real linreg checkpoint, from a short standalone worker run."""
    folder.mkdir(parents=True)
    spec = folder / "job.toml"
    spec.write_text(job_text("fuzz", run={"steps": 2}))
    argv = worker_argv(spec, folder / "checkpoints", cache)
    subprocess.run(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=600
    )
    return (folder / "checkpoints" / "ckpt-0000000002.safetensors").read_bytes()


def exchange(sock: Path, line: bytes, timeout: float = 30) -> bytes:
    """Send one raw request line; the first answer line (b"" if the daemon hung up)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(str(sock))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.sendall(line)
        data = b""
        with contextlib.suppress(ConnectionResetError):
            while not data.endswith(b"\n"):
                chunk = conn.recv(1 << 20)
                if not chunk:
                    break
                data += chunk
        # A fuzzed line may hold a newline: then it is two requests, and both answers may
        # come in one read. The first line is the first request's answer.
        first, newline, _ = data.partition(b"\n")
        return first + newline


def strict_answer(data: bytes) -> Record | None:
    """The answer as strict JSON (no NaN or Infinity), or None if it is not one."""

    def refuse(name: str) -> None:
        raise ValueError(name)

    try:
        answer = json.loads(data, parse_constant=refuse)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def kept_request(folder: Path) -> bytes | None:
    """The request a job folder kept, as bytes."""
    for name in ("request.toml", "request.json"):
        with contextlib.suppress(OSError):
            return (folder / name).read_bytes()
    return None


def fuzz_daemon(
    base: Path, cache: Path, strategies: dict[str, Any], examples: int, seed: int
) -> dict[str, Property]:
    """Fuzzed job files dropped into a real daemon's spool, and request lines sent to it."""
    files, lines = Property("job files through a daemon"), Property("request lines to a daemon")
    root = base / "root"
    hold = job_text(
        "hold",
        faults={"stall_at": 0, "stall_seconds": 600},
        supervision={"stall_timeout_s": 600, "startup_timeout_s": 600, "stop_grace_s": 1},
    )
    dropped: list[tuple[str, bytes]] = []
    with running(root, cache, "--max-concurrent", "1") as daemon:
        daemon.drop("hold.toml", hold)
        daemon.wait("hold", frozenset({"running"}), timeout=180)

        def drop(example: tuple[str, bytes]) -> None:
            name = f"fuzz-{len(dropped):05d}.{example[0]}"
            dropped.append((name, example[1]))
            daemon.drop(name, example[1])

        files.examples = run_property(strategies["job_files"], drop, examples, seed + 1)

        def send(line: bytes) -> None:
            if b'"shutdown"' in line or b'"hold"' in line:
                line = line.replace(b'"shutdown"', b'"version"').replace(b'"hold"', b'"h"')
            try:
                answer = strict_answer(exchange(daemon.socket, line))
            except OSError as error:
                lines.crash(line, error)
                return
            speaks = answer is not None and answer.get("v") in SUPPORTED_VERSIONS
            if answer is None or not speaks or not isinstance(answer.get("ok"), bool):
                lines.crash(line, f"answer outside the protocol: {answer!r:.200}")
            elif answer["ok"]:
                lines.kinds["ok"] += 1
            elif not (answer.get("error") or {}).get("code") or not answer["error"].get("message"):
                lines.crash(line, f"error without a code or message: {answer!r:.200}")
            else:
                lines.kinds[answer["error"]["code"]] += 1

        lines.examples = run_property(strategies["request_lines"], send, examples * 5, seed + 2)
        deadline = time.monotonic() + 60 + examples * 0.2
        while time.monotonic() < deadline:
            left = len(os.listdir(root / "spool" / "incoming")) + len(
                os.listdir(root / "spool" / "claimed")
            )
            if not left:
                break
            time.sleep(0.2)
        alive = daemon.alive() and daemon.ask("version")["pid"] == daemon.pid
    if not alive:
        files.crash("the daemon", "died")
    outcome = rejections(root)
    for name, raw in dropped:
        rejected = outcome.get(name)
        if rejected:
            if rejected[0].get("problems") and rejected[0]["kept"]:
                files.kinds["rejected with reasons"] += 1
            else:
                files.crash(raw, f"rejected without reasons: {rejected[0]!r:.200}")
            continue
        accepted = [f for f in (root / "jobs").iterdir() if kept_request(f) == raw]
        if accepted:
            files.kinds["accepted as a job"] += 1
        else:
            files.crash(raw, "neither a job nor a rejection")
    return {files.name: files, lines.name: lines}
