"""Section 7, links: a symbolic link planted at each path the daemon or a worker writes,
pointing outside the root; every file outside hashed before and after."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from jobwarden.control.harness import job_text

from .common import SETTLED_STATES, Record, Section
from .evidence import References, rejections
from .wardend import Wardend, running, wait_settled_or


def snapshot(folder: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under ``folder``: type, size, mtime, and a file's sha256 (links not followed)."""
    found: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            info = path.lstat()
            digest = ""
            if path.is_file() and not path.is_symlink():
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            key = str(path.relative_to(folder))
            found[key] = (info.st_mode, info.st_size, info.st_mtime_ns, digest)
    return found


class Outside:
    """Link targets outside every root: a file and a folder per planted link."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(mode=0o700, parents=True)
        self.count = 0
        self.before: dict[str, tuple[Any, ...]] = {}
        self.lock = threading.Lock()

    def target(self, kind: str) -> Path:
        """A fresh file (``kind`` "file") or folder holding one file, outside the roots."""
        with self.lock:
            self.count += 1
            path = self.folder / f"target-{self.count:03d}"
        if kind == "dir":
            path.mkdir(mode=0o700)
            (path / "keep.txt").write_text(f"outside folder {self.count}\n")
        else:
            path.write_text(f"outside file {self.count}\n")
        with self.lock:
            taken = snapshot(self.folder)
            self.before.update({k: v for k, v in taken.items() if k.split("/")[0] == path.name})
        return path


def plant(path: Path, target: Path) -> None:
    """Replace whatever is at ``path`` with a symbolic link to ``target``, atomically."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    temporary = path.with_name(f".plant-{path.name}")
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(target)
    os.replace(temporary, path)


def after_plant(path: Path) -> str:
    """What is at a planted path afterwards."""
    if path.is_symlink():
        return "link left in place"
    if path.exists():
        return "replaced by the daemon's own " + ("folder" if path.is_dir() else "file")
    return "link removed"


START_LINKS = (
    ("wardend.lock", "file"),
    ("wardend.log", "file"),
    ("incidents.jsonl", "file"),
    ("control.sock", "file"),
    ("spool", "dir"),
    ("spool/tmp", "dir"),
    ("spool/incoming", "dir"),
    ("spool/claimed", "dir"),
    ("spool/rejected", "dir"),
    ("jobs", "dir"),
    ("checkpoints", "dir"),
    ("cache", "dir"),
    ("cache/jax", "dir"),
)


def refusal(daemon: Wardend) -> str:
    """The last line the daemon wrote to stderr (its refusal, or a traceback's last line)."""
    lines = daemon.stderr_path.read_text(errors="replace").strip().splitlines()
    return lines[-1] if lines else ""


def start_links(base: Path, cache: Path, outside: Outside) -> list[Record]:
    """A link planted at each path under the root before the daemon starts."""
    from jobwarden.daemon.store.layout import Root

    def one(index: int, relative: str, kind: str) -> Record:
        root = base / f"start-{index:02d}"
        Root(root).create()
        target = outside.target(kind)
        plant(root / relative, target)
        daemon = Wardend(root, None if relative.startswith("cache") else cache)
        status = daemon.start_or_exit(60)
        if status is not None:
            result = f"refused at start (exit {status}): {refusal(daemon)[:160]}"
        else:
            daemon.drop("after.toml", job_text("after", run={"steps": 2}))
            state = (wait_settled_or(daemon, "after", 120) or {}).get("state")
            daemon.stop()
            result = f"started; a job {state}; {after_plant(root / relative)}"
        return {"path": relative, "target": target.name, "result": result}

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(one, i, r, k) for i, (r, k) in enumerate(START_LINKS)]
        return [f.result() for f in futures]


def job_links(base: Path, cache: Path, outside: Outside, settle_s: float) -> list[Record]:
    """Links planted under a running daemon's root, before or while it or a worker writes."""
    root = base / "root"
    results: list[Record] = []
    failing = {"steps": 8, "checkpoint_every": 2}
    slow = {"step_delay_s": 0.3, "fail_after": 3}
    with running(root, cache, "--max-concurrent", "6") as daemon:

        def planted(relative: str, kind: str) -> Record:
            target = outside.target(kind)
            plant(root / relative, target)
            record = {"path": relative, "target": target.name}
            results.append(record)
            return record

        def when_running(job: str) -> None:
            daemon.wait(job, frozenset({"running"}), timeout=180)

        def finish(job: str, records: list[Record]) -> None:
            status = wait_settled_or(daemon, job, settle_s) or {}
            if status.get("state") not in SETTLED_STATES:
                status["reason"] = f"{status.get('reason')} (not settled within {settle_s:g} s)"
            for record in records:
                where = after_plant(root / record["path"])
                record["result"] = f"{where}; job {status.get('state')}: {status.get('reason')}"

        def rejected_names() -> None:
            name = "bad-link.toml"
            records = [
                planted(f"spool/rejected/{name}", "file"),
                planted(f"spool/rejected/{name}.error.json", "file"),
            ]
            daemon.drop(name, b'id = "bad-link"\ntask = "nope"\n')
            deadline = time.monotonic() + 30
            while name not in rejections(root) and time.monotonic() < deadline:
                time.sleep(0.1)
            kept = [r["file"] for r in rejections(root).get(name, [])]
            for record in records:
                record["result"] = f"{after_plant(root / record['path'])}; request kept as {kept}"

        def job_folder(relative: str, job: str) -> None:
            record = planted(relative, "dir")
            daemon.drop(f"{job}.toml", job_text(job, run={"steps": 2}))
            deadline = time.monotonic() + 30
            status = None
            while time.monotonic() < deadline:
                status = daemon.status(job)
                if status is not None or f"{job}.toml" in rejections(root):
                    break
                time.sleep(0.1)
            found = rejections(root).get(f"{job}.toml")
            if status is not None:
                status = wait_settled_or(daemon, job, 120) or status
                outcome = f"job {status.get('state')}: {status.get('reason')}"
            elif found:
                outcome = "rejected: " + "; ".join(found[0].get("problems", []))[:160]
            else:
                outcome = "neither a job nor a rejection within 30 s"
            record["result"] = f"{after_plant(root / relative)}; {outcome}"

        def attempt_files() -> None:
            job = "link-files"
            daemon.drop(f"{job}.toml", job_text(job, run=failing, faults=slow))
            when_running(job)
            folder = f"jobs/{job}"
            records = [
                planted(f"{folder}/state.json", "file"),
                planted(f"{folder}/state.json.pending", "file"),
                planted(f"{folder}/attempts/1/exit.json", "file"),
                planted(f"{folder}/attempts/2/job.json", "file"),
                planted(f"{folder}/attempts/2/events.jsonl", "file"),
                planted(f"{folder}/attempts/2/stderr.log", "file"),
                planted(f"{folder}/attempts/2/exit.json", "file"),
            ]
            finish(job, records)

        def folder_link(job: str, relative: str, kind: str = "dir") -> None:
            daemon.drop(f"{job}.toml", job_text(job, run=failing, faults=slow))
            when_running(job)
            finish(job, [planted(f"jobs/{job}/{relative}", kind)])

        def incident_files() -> None:
            job = "link-incident-files"
            daemon.drop(f"{job}.toml", job_text(job, run=failing, faults=slow))
            when_running(job)
            records = [
                planted(f"jobs/{job}/incidents/{job}-1.json", "file"),
                planted(f"jobs/{job}/incidents/{job}-1.md", "file"),
            ]
            finish(job, records)

        def stall_dump() -> None:
            job = "link-stall"
            daemon.drop(
                f"{job}.toml",
                job_text(
                    job,
                    faults={"stall_at": 2, "stall_seconds": 30, "step_delay_s": 0.3},
                    supervision={"stall_timeout_s": 2, "max_restarts": 0, "stop_grace_s": 1},
                ),
            )
            when_running(job)
            finish(job, [planted(f"jobs/{job}/attempts/1/stack-dump.txt", "file")])

        def checkpoint_links(job: str, names: list[tuple[str, str]], stale: bool = False) -> None:
            folder = root / "checkpoints" / job
            folder.mkdir(mode=0o700)
            if stale:
                (folder / "ckpt-0000000002.safetensors.pending").write_bytes(b"stale")
            records = [planted(f"checkpoints/{job}/{name}", kind) for name, kind in names]
            daemon.drop(f"{job}.toml", job_text(job, run={"steps": 6, "checkpoint_every": 2}))
            finish(job, records)

        def checkpoint_folder() -> None:
            job = "link-ckdir"
            record = planted(f"checkpoints/{job}", "dir")
            daemon.drop(f"{job}.toml", job_text(job, run={"steps": 4}))
            finish(job, [record])

        cases: list[Callable[[], None]] = [
            rejected_names,
            lambda: job_folder("jobs/link-jobdir", "link-jobdir"),
            lambda: job_folder("jobs/+intake-link-staging", "link-staging"),
            attempt_files,
            lambda: folder_link("link-attempt-dir", "attempts/2"),
            lambda: folder_link("link-incidents", "incidents"),
            incident_files,
            lambda: folder_link("link-incident-log", "incidents.jsonl", kind="file"),
            stall_dump,
            lambda: checkpoint_links(
                "link-ckfiles",
                [
                    ("ckpt-0000000004.safetensors", "file"),
                    ("ckpt-0000000004.safetensors.pending", "file"),
                ],
            ),
            lambda: checkpoint_links("link-writer", [("writer.json", "file")]),
            lambda: checkpoint_links("link-lock", [(".writer.lock", "file")]),
            lambda: checkpoint_links("link-quarantine", [("quarantine", "dir")], stale=True),
            checkpoint_folder,
        ]
        errors: list[str] = []

        def guarded(case: Callable[[], None]) -> None:
            try:
                case()
            except Exception as error:  # noqa: BLE001 - reported as a failed check
                errors.append(repr(error))

        threads = [threading.Thread(target=guarded, args=(case,)) for case in cases]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        alive = daemon.alive()
    if errors or not alive:
        results.append(
            {
                "path": "(harness)",
                "target": "",
                "result": f"errors: {errors}; daemon alive: {alive}",
            }
        )
    return results


def links(base: Path, cache: Path, references: References, *, settle_s: float = 60) -> Section:
    """A link planted at each path the daemon or worker writes; writes outside the root."""
    section = Section("links")
    outside = Outside(base / "outside")
    planted: list[Record] = []
    planted += start_links(base, cache, outside)
    planted += job_links(base, cache, outside, settle_s)
    after, before = snapshot(outside.folder), outside.before
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    writes = 0
    for record in planted:
        record["result"] = record.get("result", "?").replace(str(base), "BASE")
        touched = (
            [k for k in changed if k.split("/")[0] == record["target"]] if record["target"] else []
        )
        record["outside_changed"] = touched
        writes += bool(touched)
        section.row(
            record["path"],
            record.get("result", "?"),
            "outside unchanged" if not touched else f"CHANGED: {touched}",
        )
    section.sizes = {"links planted": len([r for r in planted if r["target"]])}
    section.figures = {"writes_outside_root": writes, "changed": changed, "planted": planted}
    section.row("writes outside the root", writes, "0")
    section.check("writes outside the root == 0", writes == 0 and not changed)
    section.check("no harness error", all(r["path"] != "(harness)" for r in planted))
    section.check("every planted link has a result", all("result" in r for r in planted))
    return section
