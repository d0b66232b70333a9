"""Reliability benchmark: kills, full disks, socket abuse, hostile inputs, a long run, links.

Every section drives real processes the way users do: a ``python -m jobwarden.daemon``
on its own root, job files dropped Maildir-style (written in ``spool/tmp``, renamed into
``spool/incoming``), requests over the real control socket, real ``python -m
jobwarden.worker`` attempts on a shared warm compilation cache.  A section returns its
figures and its checks (each an acceptance condition, held or not); `main` prints one
table and writes ``bench/results/reliability.json``.  docs/reliability.md gives the
method of each section and the figures of a full run.

1. worker_kills: small linreg jobs (``checkpoint_every = 1``, ``step_delay_s``,
   ``every_attempt = true`` so later attempts are slow too, ``restart_backoff_s = 0``);
   the worker's pid is read from ``status JOB`` and SIGKILLed through a pidfd, at a
   random instant of the attempt (uniform over an attempt's measured life) or, one kill
   in four, the moment a ``*.pending`` file shows in the checkpoint directory.  A kill
   landed "in a commit" when a ``*.pending`` file is present right after it.
2. daemon_kills: the daemon is SIGKILLed while requests (valid and invalid) are
   dropped and jobs run, and restarted on the same root; instants are random, or the
   moment an intake is in progress (``jobs/+intake-*`` or ``spool/claimed/*``), or the
   moment a state write is (a ``*.pending`` under ``jobs/``).  At the end every request
   must be a completed job or a rejection with its error file.
3. disk_full: a small tmpfs as the root (the compile cache outside it), filled with a
   ballast file while a job runs; and a tmpfs at ``checkpoints/<name>`` too small for
   the job's checkpoints.  Recorded: the job's state and incident, whether the daemon
   lived; then space returns and ``resume`` and a new job must complete.
4. socket_abuse: many concurrent raw AF_UNIX clients (idle, non-readers, slowloris,
   oversized lines, nested JSON, invalid UTF-8) for a while; daemon rss and fds before
   and after, ``status`` latency during.
5. fuzz: hypothesis over job files, control request lines, event lines and checkpoint
   headers, in process and through a real daemon.
6. long_run: many jobs through one daemon, at most 20 waiting at a time; some run a
   worker to completion, the rest name the checkpoint of a held job and are refused by
   the duplicate-writer check (an incident each, no worker); rss, fds, ``status`` and
   ``status JOB`` latency after the first 10 jobs and after the last.
7. links: a symbolic link planted at each path the daemon or worker writes, pointing
   outside the root; every file outside the root hashed before and after.

The third round's sections, one per defect class of users' programs, hooks, metrics
and floods (each module's docstring has its method):

8. strays: plain programs whose helpers (in the group, in a session holding stdout,
   setsid, double-forked) keep writing to the checkpoint directory through crashed,
   cancelled and stopped attempts: helpers left after their attempt, their writes
   after the next attempt started, zombies of the daemon.
9. settled: recoveries cancelled or stopped at random instants (a third while the
   worker imports JAX): incidents left open on jobs at rest.
10. stdout_flood: a command job floods stdout with lines that are no events while the
    daemon's stderr is read slowly: ``status`` p99 during it, the log's growth.
11. long_events: a long job's events file (250 MB at full size) in play through three
    daemon starts: the loop's longest block.
12. metrics_slowloris: slow clients hold ``--metrics-listen`` under a 1,024-descriptor
    limit: ``status`` p99, descriptors, a submit and a drop made meanwhile.
13. burst: 1,000 honest clients at once, and root's ``status`` while another uid holds
    the slots: answers, busy lines, closes without an answer.
14. hooks: an exec hook leaving a helper behind, a dripping and a redirecting webhook,
    each bounded by ``--notify-timeout``.

Run with ``.venv/bin/python bench/reliability.py`` (``--quick`` for the CI sizes,
``--only SECTION`` for one section, ``--keep`` to keep the temporary roots,
``--render FILE --markdown`` to print a results file's table for docs/reliability.md).
Needs root for the tmpfs mounts of the disk-full section.  tests/reliability/ runs
each section at small sizes and asserts its acceptance conditions.  Each section is a
module of bench/reliability_sections/, whose daemon is the package's harness
(`jobwarden.control.harness`); this file runs them and keeps the names the tests use.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

# Run as a script, import through the repository, as the tests (which import bench.reliability) do.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.figures import Figure, at_least, at_most, records, verdict
from bench.reliability_sections.burst import burst
from bench.reliability_sections.common import Record, Section, private_dir, section_from, table
from bench.reliability_sections.daemon_kills import daemon_kills
from bench.reliability_sections.disk_full import disk_full
from bench.reliability_sections.events_file import long_events_section
from bench.reliability_sections.evidence import References
from bench.reliability_sections.flood import stdout_flood
from bench.reliability_sections.fuzz import fuzz
from bench.reliability_sections.links import links
from bench.reliability_sections.long_run import long_run
from bench.reliability_sections.metrics_slowloris import metrics_slowloris
from bench.reliability_sections.settled import settled
from bench.reliability_sections.sinks import hooks_section
from bench.reliability_sections.socket_abuse import socket_abuse
from bench.reliability_sections.strays import strays
from bench.reliability_sections.worker_kills import WORKER_KILL_STEPS, worker_kills

RESULTS = Path(__file__).resolve().parent / "results" / "reliability.json"


SECTIONS = (
    "worker_kills",
    "daemon_kills",
    "disk_full",
    "socket_abuse",
    "fuzz",
    "long_run",
    "links",
    "strays",
    "settled",
    "stdout_flood",
    "long_events",
    "metrics_slowloris",
    "burst",
    "hooks",
)
RUNS: dict[str, Callable[..., Section]] = {
    "worker_kills": worker_kills,
    "daemon_kills": daemon_kills,
    "disk_full": disk_full,
    "socket_abuse": socket_abuse,
    "fuzz": fuzz,
    "long_run": long_run,
    "links": links,
    "strays": strays,
    "settled": settled,
    "stdout_flood": stdout_flood,
    "long_events": long_events_section,
    "metrics_slowloris": metrics_slowloris,
    "burst": burst,
    "hooks": hooks_section,
}


def sizes_for(quick: bool) -> dict[str, dict[str, Any]]:
    """Each section's keyword arguments: the CI-sized variant or the full one."""
    if quick:
        return {
            "worker_kills": {"kills": 12, "kills_per_job": 3},
            "daemon_kills": {"kills": 8},
            "disk_full": {"settle_s": 20},
            "socket_abuse": {"clients": 200, "attack_s": 4.0},
            "fuzz": {"examples": 150, "daemon_examples": 40},
            "long_run": {"jobs": 60, "workers": 10},
            "links": {"settle_s": 30},
            "strays": {"jobs": 6, "restarts": 2},
            "settled": {"jobs": 8},
            "stdout_flood": {"megabytes": 0.5, "stderr_kbps": 256},
            "long_events": {"megabytes": 25},
            "metrics_slowloris": {"clients": 200, "attack_s": 6, "fd_limit": 128},
            "burst": {
                "clients": 500,
                "status_clients": 200,
                "attackers": 200,
                "operator_bound_s": 2.0,
            },
            "hooks": {},
        }
    return {
        "worker_kills": {"kills": 200, "kills_per_job": 4},
        "daemon_kills": {"kills": 50},
        "disk_full": {},
        "socket_abuse": {"clients": 1000, "attack_s": 15.0},
        "fuzz": {"examples": 2000, "daemon_examples": 400},
        "long_run": {"jobs": 1000, "workers": 300},
        "links": {},
        "strays": {"jobs": 30, "restarts": 3},
        "settled": {"jobs": 48},
        "stdout_flood": {"megabytes": 2.0, "stderr_kbps": 256},
        "long_events": {"megabytes": 250},
        "metrics_slowloris": {},
        "burst": {},
        "hooks": {},
    }


def run_section(
    name: str, base: Path, cache: Path, references: References, **sizes: Any
) -> Section:
    """Run one section on its own folder under ``base``, timed."""
    began = time.monotonic()
    folder = base / name
    folder.mkdir(parents=True, exist_ok=True)
    function = RUNS[name]
    try:
        if name in WORKER_SECTIONS:
            section = function(folder, cache, references, **sizes)
        else:
            section = function(folder, cache, **sizes)
    except Exception as error:  # noqa: BLE001 - a section that breaks is a failed row
        section = Section(name, sizes=sizes)
        section.figures["error"] = repr(error)
        section.row("the section did not finish", f"{error!r:.300}")
        section.check("section finished", False)
    section.seconds = time.monotonic() - began
    return section


WORKER_SECTIONS = ("worker_kills", "daemon_kills", "disk_full", "long_run", "links")


def warm_cache(base: Path, warm: bool = True) -> tuple[Path, References]:
    """A private compile cache, warmed by the default reference run when ``warm``."""
    cache = private_dir(base / "cache")
    references = References(base / "references", cache)
    if warm:
        references.get(3, WORKER_KILL_STEPS)
    return cache, references


def main(argv: list[str] | None = None) -> int:
    """Run the sections, print the table, write the JSON results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="the CI-sized variant")
    parser.add_argument("--only", choices=SECTIONS, action="append", help="run only this section")
    parser.add_argument("--keep", action="store_true", help="keep the temporary roots")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the JSON results file")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the other sections already in the results file (with --only)",
    )
    parser.add_argument(
        "--render", type=Path, metavar="JSON", help="print the table of a results file and exit"
    )
    args = parser.parse_args(argv)
    if args.render is not None:
        saved = json.loads(args.render.read_text())
        print(table([section_from(r) for r in saved["sections"]], markdown=args.markdown))
        return 0
    sizes = sizes_for(args.quick)
    chosen = args.only or list(SECTIONS)
    base = Path(tempfile.mkdtemp(prefix="jw-reliability-"))
    sections: list[Section] = []
    began = time.monotonic()
    try:
        print("warming the compilation cache ...", flush=True)
        cache, references = warm_cache(base, any(n in WORKER_SECTIONS for n in chosen))
        for name in chosen:
            print(f"{name} {sizes[name]} ...", flush=True)
            section = run_section(name, base, cache, references, **sizes[name])
            sections.append(section)
            print(
                f"  {'PASS' if section.passed else 'FAIL'} in {section.seconds:.0f} s", flush=True
            )
    finally:
        if args.keep:
            print(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    print()
    print(table(sections, markdown=args.markdown))
    result = {
        "benchmark": "reliability",
        "quick": args.quick,
        "created": time.time(),
        "duration_s": round(time.monotonic() - began, 1),
        "platform": {
            "python": platform.python_version(),
            "jax": metadata.version("jax"),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
        "passed": all(s.passed for s in sections),
        "sections": [s.as_record() for s in sections],
    }
    if args.merge and args.out.exists():
        saved = json.loads(args.out.read_text())
        ran = {s.name for s in sections}
        kept = [r for r in saved["sections"] if r["section"] not in ran]
        merged = kept + [s.as_record() for s in sections]
        merged.sort(key=lambda r: SECTIONS.index(r["section"]))
        result["sections"] = merged
        result["passed"] = all(r["passed"] for r in merged)
        result["merged_from"] = saved.get("created")
    result["figures"] = records(reliability_figures(result["sections"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\nwrote {os.path.relpath(args.out)}")
    return 0 if result["passed"] else 1


def reliability_figures(sections: list[Record]) -> list[Figure]:
    """The summary's rows: jobs lost and writes outside the root, then each section's checks."""
    lost = [s["figures"]["lost"] for s in sections if "lost" in s["figures"]]
    outside = [s["figures"]["writes_outside_root"] for s in sections if s["section"] == "links"]
    out = []
    if lost:
        out.append(at_most("jobs lost, kill sweeps and long run", sum(lost), 0, "d"))
    if outside:
        out.append(at_most("writes outside the root, links planted", sum(outside), 0, "d"))
    out += third_round_figures({s["section"]: s["figures"] for s in sections})
    for s in sections:
        out.append(
            Figure(
                f"section {s['section']}: every check",
                "held" if s["passed"] else "missed",
                "all hold",
                verdict(s["passed"]),
            )
        )
    return out


def third_round_figures(found: dict[str, Record]) -> list[Figure]:
    """The figures issue 19 asks for, from whichever of their sections ran."""
    out = []
    if "strays" in found:
        f = found["strays"]
        out.append(at_most("descendants left after their attempt", f["left_after_attempt"], 0, "d"))
        out.append(at_most("writes overlapping the next attempt", f["overlapping_writes"], 0, "d"))
    if "settled" in found:
        f = found["settled"]
        out.append(at_most("open incidents on settled jobs", f["open_on_settled"], 0, "d"))
    if "stdout_flood" in found:
        p99 = found["stdout_flood"]["status_p99_s"]
        out.append(
            at_most("status p99 under a stdout flood", 1e3 * (p99 or 1e9), 100, ".1f", " ms")
        )
    if "metrics_slowloris" in found:
        p99 = found["metrics_slowloris"]["status_during_p99_s"]
        name = "status p99 under a metrics-port slowloris"
        out.append(at_most(name, 1e3 * (p99 or 1e9), 100, ".1f", " ms"))
    if "long_events" in found:
        longest = found["long_events"]["longest_block_s"]
        name = "the loop's longest block, a long events file in play"
        out.append(at_most(name, 1e3 * longest, 100, ".1f", " ms"))
    if "burst" in found:
        f = found["burst"]["version"]
        clients = sum(f["outcomes"].values())
        answered = f["outcomes"].get("ok", 0)
        out.append(at_least(f"answers to {clients} simultaneous clients", answered, clients, "d"))
    if "hooks" in found:
        held = found["hooks"].get("dripping webhook: one try held its sink")
        if held is not None:
            out.append(at_most("a dripping webhook's try", held, 2.5, ".2f", " s"))
    return out


if __name__ == "__main__":
    sys.exit(main())
