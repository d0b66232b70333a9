"""The package's shape, read from its source with ast alone: no import cycle, small modules
and folders, and the rule of what each room may import (docs/daemon.md, "Rooms")."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
PACKAGE = PROJECT / "jobwarden"
MAX_LINES = 400
MAX_MODULES = 15
"""Modules directly in one folder, its ``__init__.py`` (the folder itself) not counted."""


def module_name(path: Path) -> str:
    """``jobwarden/daemon/api/status.py`` -> ``jobwarden.daemon.api.status``."""
    parts = list(path.relative_to(PROJECT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
SOURCES: dict[str, str] = {m: p.read_text() for m, p in MODULES.items()}
TREES: dict[str, ast.Module] = {m: ast.parse(SOURCES[m], str(MODULES[m])) for m in MODULES}


def file_of(module: str) -> str:
    """``jobwarden.daemon.api.status`` -> ``jobwarden/daemon/api/status.py``."""
    return str(MODULES[module].relative_to(PROJECT))


@dataclass(frozen=True)
class Import:
    """One import of a module of the package by another."""

    source: str
    target: str
    line: int

    def __str__(self) -> str:
        return f"{file_of(self.source)}:{self.line} imports {self.target}"


def resolve(name: str) -> str | None:
    """The package's module that ``name`` names, or the nearest package holding it."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> Iterator[Import]:
    """Every import in ``module``: at module level, under ``if TYPE_CHECKING:`` and in
    functions alike, relative ones resolved; only those of the package's own modules."""
    is_package = MODULES[module].name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(TREES[module]):
        targets: list[str | None] = []
        if isinstance(node, ast.Import):
            targets = [resolve(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                whole = f"{base}.{alias.name}"
                targets.append(whole if whole in MODULES else resolve(base))
        for target in targets:
            if target is not None and target != module:
                yield Import(module, target, node.lineno)


IMPORTS: list[Import] = [found for module in MODULES for found in imports_of(module)]


# ---- the rooms

ROOMS: dict[str, str] = {
    # foundation: the standard library, third parties and each other
    "jobwarden": "foundation",  # the package itself: its version
    "jobwarden.errors": "foundation",
    "jobwarden.files": "foundation",
    "jobwarden.hashing": "foundation",
    "jobwarden.decoding": "foundation",
    "jobwarden.program": "foundation",
    "jobwarden.testfaults": "foundation",
    "jobwarden.tasks": "foundation",
    "jobwarden.runtime": "runtime",
    "jobwarden.protocol": "protocol",
    # what a job says, and the names of its folder's files
    "jobwarden.jobfile": "job",
    "jobwarden.jobwarnings": "job",
    "jobwarden.sections": "job",
    "jobwarden.states": "job",
    "jobwarden.events": "job",
    "jobwarden.jobfolder": "job",
    "jobwarden.statetree": "statetree",
    "jobwarden.checkpoint": "checkpoint",
    "jobwarden.shards": "shards",
    "jobwarden.proof": "proof",
    "jobwarden.sdk": "sdk",
    "jobwarden.worker": "worker",
    "jobwarden.control": "control",
    "jobwarden.dashboard": "dashboard",
    "jobwarden.daemon": "daemon",  # the package's __init__ alone
    "jobwarden.daemon.cli": "daemon.cli",
    "jobwarden.daemon.__main__": "daemon.cli",
    "jobwarden.daemon.config": "daemon.config",
    "jobwarden.daemon.background": "daemon.background",
    "jobwarden.daemon.children": "daemon.children",
    "jobwarden.daemon.stats": "daemon.stats",
    "jobwarden.daemon.sandbox": "daemon.sandbox",
    "jobwarden.daemon.wardend": "daemon.wardend",
    "jobwarden.daemon.view": "daemon.view",
    "jobwarden.daemon.api": "daemon.api",
    "jobwarden.daemon.observe": "daemon.observe",
    "jobwarden.daemon.supervise": "daemon.supervise",
    "jobwarden.daemon.launch": "daemon.launch",
    "jobwarden.daemon.intake": "daemon.intake",
    "jobwarden.daemon.incidents": "daemon.incidents",
    "jobwarden.daemon.store": "daemon.store",
}


def room(module: str) -> str | None:
    """The room ``module`` is in: the entry of its longest prefix in `ROOMS`."""
    name = module
    while name not in ROOMS and "." in name:
        name = name.rpartition(".")[0]
    if name == "jobwarden" and module != "jobwarden":
        return None  # a new top-level module: it must be given a room
    return ROOMS.get(name)


SHARED = frozenset(
    {"daemon.config", "daemon.background", "daemon.children", "daemon.stats", "daemon.sandbox"}
)
"""The daemon's leaves (its typed settings, its task keeper, its own children, its
counters, what its sandbox permits): every room of the daemon but store/ may import them,
and they import nothing of the daemon."""


def rooms(*names: str) -> frozenset[str]:
    """The rooms named, and the foundation, which every room may import."""
    return frozenset({"foundation", *names})


ALLOWED: dict[str, frozenset[str]] = {
    # Besides its own room, each room may import these rooms and no other.
    "foundation": rooms(),
    "runtime": rooms(),
    "protocol": rooms(),
    "job": rooms(),
    "checkpoint": rooms("job"),
    "statetree": rooms("runtime", "checkpoint"),
    # shards/: a state laid out over the members, hashed, committed and restored by its boxes
    "shards": rooms("job", "statetree", "checkpoint"),
    "proof": rooms("job", "checkpoint", "shards"),
    # sdk/ and worker/: runtime, checkpoint, proof; never daemon/ or control/
    "sdk": rooms("runtime", "job", "statetree", "checkpoint", "shards", "proof"),
    "worker": rooms("runtime", "job", "statetree", "checkpoint", "proof", "sdk"),
    # control/: protocol and proof (the drills also build job and run files); never daemon/;
    # cli.py starts the dashboard (imported only when that command runs)
    "control": rooms(
        "runtime", "protocol", "job", "checkpoint", "shards", "proof", "sdk", "worker", "dashboard"
    ),
    # dashboard/: reads the daemon through control's client alone; never daemon/
    "dashboard": rooms("protocol", "job", "control"),
    # the daemon never imports control/: the two share protocol.py alone
    "daemon": rooms(),
    "daemon.config": rooms(),
    "daemon.background": rooms(),
    "daemon.children": rooms(),
    "daemon.stats": rooms(),
    "daemon.sandbox": rooms(),
    # store/: nothing else of the daemon, nothing but the foundation and what a job says
    "daemon.store": rooms("job"),
    "daemon.intake": SHARED | rooms("job", "daemon.store"),
    # incidents/: store/ of the daemon (kinds.py names every error class a failure can carry)
    "daemon.incidents": SHARED
    | rooms("job", "protocol", "statetree", "checkpoint", "sdk", "daemon.store"),
    # launch/: never supervise/, api/, observe/, intake/, nor incidents/ or the view
    "daemon.launch": SHARED
    | rooms("runtime", "job", "checkpoint", "proof", "sdk", "worker", "daemon.store"),
    "daemon.supervise": SHARED
    | rooms(
        "job",
        "checkpoint",
        "proof",
        "sdk",
        "worker",
        "daemon.store",
        "daemon.incidents",
        "daemon.launch",
    ),
    # observe/ and api/ read the daemon through the view; never wardend or cli
    "daemon.observe": SHARED | rooms("job", "daemon.view", "daemon.incidents", "daemon.store"),
    "daemon.api": SHARED
    | rooms(
        "job",
        "protocol",
        "checkpoint",
        "proof",
        "daemon.view",
        "daemon.supervise",
        "daemon.intake",
        "daemon.store",
    ),
    # the view names what api/ and observe/ may read (for typing only), nothing of observe/
    "daemon.view": SHARED
    | rooms("daemon.store", "daemon.incidents", "daemon.intake", "daemon.supervise"),
    # the wiring: every room of the daemon; only cli.py imports it
    "daemon.wardend": SHARED
    | rooms(
        "job",
        "daemon.store",
        "daemon.incidents",
        "daemon.intake",
        "daemon.launch",
        "daemon.supervise",
        "daemon.observe",
        "daemon.api",
        "daemon.view",
    ),
    "daemon.cli": SHARED
    | rooms("checkpoint", "daemon.wardend", "daemon.launch", "daemon.observe", "daemon.store"),
}

# ---- the tests


def test_no_import_cycle() -> None:
    """No module imports itself through others (TYPE_CHECKING and function imports count)."""
    edges: dict[str, list[Import]] = {module: [] for module in MODULES}
    for found in IMPORTS:
        edges[found.source].append(found)
    done: set[str] = set()
    path: list[Import] = []
    on_path: dict[str, int] = {}

    def visit(module: str) -> list[Import] | None:
        on_path[module] = len(path)
        for found in edges[module]:
            if found.target in on_path:
                return [*path[on_path[found.target] :], found]
            if found.target not in done:
                path.append(found)
                cycle = visit(found.target)
                if cycle is not None:
                    return cycle
                path.pop()
        del on_path[module]
        done.add(module)
        return None

    for module in MODULES:
        if module not in done:
            cycle = visit(module)
            assert cycle is None, "import cycle:\n  " + "\n  ".join(map(str, cycle))


def test_modules_are_short() -> None:
    """No module is longer than MAX_LINES lines."""
    long = {
        file_of(module): lines
        for module, text in SOURCES.items()
        if (lines := len(text.splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_folders_are_small() -> None:
    """No folder holds more than MAX_MODULES modules directly (its __init__.py aside)."""
    counts: dict[str, int] = {}
    for path in MODULES.values():
        if path.name != "__init__.py":
            folder = str(path.parent.relative_to(PROJECT))
            counts[folder] = counts.get(folder, 0) + 1
    crowded = {folder: n for folder, n in counts.items() if n > MAX_MODULES}
    assert not crowded, f"folders with more than {MAX_MODULES} modules: {crowded}"


def test_every_module_is_in_a_room() -> None:
    """Each module of the package belongs to a room that has an import rule."""
    homeless = [m for m in MODULES if room(m) not in ALLOWED]
    assert not homeless, f"modules in no room of ROOMS/ALLOWED: {homeless}"


def test_each_room_imports_only_what_its_rule_allows() -> None:
    """Each import goes to the importer's own room or to one its ALLOWED entry names."""
    broken = [
        f"{found}: room {room(found.source)} may not import room {room(found.target)}"
        for found in IMPORTS
        if room(found.target) != room(found.source)
        and room(found.target) not in ALLOWED.get(room(found.source) or "", frozenset())
    ]
    assert not broken, "\n".join(broken)


def test_only_cli_imports_wardend() -> None:
    """Nothing but daemon/cli.py imports daemon.wardend (__main__ goes through cli)."""
    broken = [
        str(found)
        for found in IMPORTS
        if found.target == "jobwarden.daemon.wardend" and found.source != "jobwarden.daemon.cli"
    ]
    assert not broken, "\n".join(broken)
