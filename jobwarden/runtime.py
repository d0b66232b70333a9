"""What bit-exact replay on CPU needs, pinned before JAX starts; the runtime's identity; exit,
and what makes it quick.

XLA's CPU backend can return different bits for the same compiled module when
it runs intra-op work on several threads (jax-ml/jax#39741), so the worker
pins single-threaded execution.  Its CPU client also sizes its own thread pools
to the CPUs the process may use, and shares some reductions among the pool's
threads whatever the intra-op threads, in parts that depend on the pool's size:
the pool is pinned to two threads (``NPROC``, which the client reads), so that
the bits do not depend on the machine.  The pinned flags and pool are part of
the runtime identity written into every checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import platform
import stat
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from jobwarden.errors import UnsafeCacheError

SUPERVISOR_ENV = "JOBWARDEN_SUPERVISOR_PID"
PINNED_XLA_FLAGS = ("--xla_cpu_multi_thread_eigen=false", "intra_op_parallelism_threads=1")
PINNED_ENV = {
    "JAX_PLATFORMS": "cpu",
    "JAX_ENABLE_X64": "0",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NPROC": "2",
}
"""``NPROC`` sizes XLA's CPU client thread pools (else the CPUs the process may use): the
mlp task's state after 50 updates has one set of bits with a pool of 1 thread, another
with 2 to 5, others with 6 or 7, with 8, and with 16 or 64 (on one CPU or on two alike)."""
THREAD_ENV = frozenset({"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NPROC"})


def pin_environment(environ: dict[str, str] | None = None, *, exact: bool = True) -> str:
    """Set the pinned XLA flags and thread limits; must run before `import jax`.

    Returns the resulting ``XLA_FLAGS``.  Flags the caller set are kept, the
    pinned ones are appended unless already present.  ``exact=False`` (``[run]
    exact = false``) sets only the platform and the precision, leaving XLA and
    the BLAS libraries their own threads: faster on many cores, not bit-exact.
    """
    env = os.environ if environ is None else environ
    flags = env.get("XLA_FLAGS", "").split()
    for flag in PINNED_XLA_FLAGS if exact else ():
        if flag not in flags:
            flags.append(flag)
    env["XLA_FLAGS"] = " ".join(flags)
    for name, value in PINNED_ENV.items():
        if exact or name not in THREAD_ENV:
            env.setdefault(name, value)
    return env["XLA_FLAGS"]


def unpinned(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without what `pin_environment` pins (the XLA flags, the thread limits at
    their pinned value): what a job that gave up exactness inherits from a daemon started
    in a pinned environment.  Other flags are kept."""
    env = dict(environ)
    if "XLA_FLAGS" in env:
        env["XLA_FLAGS"] = " ".join(
            flag for flag in env["XLA_FLAGS"].split() if flag not in PINNED_XLA_FLAGS
        )
    for name in THREAD_ENV:
        if env.get(name) == PINNED_ENV[name]:
            del env[name]
    return env


def jax_started() -> bool:
    """Whether a JAX backend is already running in this process (then the pins come too late)."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    started = getattr(bridge, "backends_are_initialized", None)
    return bool(started()) if callable(started) else False


def pin_before_start(*, exact: bool = True) -> str | None:
    """`pin_environment`, unless a JAX backend already runs: then a warning, if the pins are off
    (and exactness is wanted).

    The runtime identity then records the flags truly in force, so a checkpoint
    written without the pins is never resumed as if it had them.
    """
    if not jax_started():
        pin_environment(exact=exact)
        return None
    if not exact:
        return None
    flags = os.environ.get("XLA_FLAGS", "").split()
    if all(flag in flags for flag in PINNED_XLA_FLAGS) and "NPROC" in os.environ:
        return None
    return (
        "jobwarden: JAX started before the single-threaded CPU pins were set; replay may not "
        "be bit-exact (attach before the first JAX computation, or set "
        f"XLA_FLAGS='{' '.join(PINNED_XLA_FLAGS)}' NPROC={PINNED_ENV['NPROC']})"
    )


def runtime_identity() -> dict[str, str]:
    """Versions and settings that decide the bits of a replay.

    ``nproc`` (XLA's CPU client pool size) is recorded when it is set, as the pins set it: a
    checkpoint written before the pin records none, and had a pool of its machine's CPUs,
    whose bits may differ (it is refused rather than resumed into a replay that may fail).
    ``NPROC`` set empty (the pool of the machine's CPUs again, on the machine that wrote
    such a checkpoint) and a run that gave up exactness record none, as before.
    """
    from importlib.metadata import version

    import jax

    identity = {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": version("jaxlib"),
        "numpy": version("numpy"),
        "backend": jax.default_backend(),
        "machine": platform.machine(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "x64": str(jax_setting("jax_enable_x64")).lower(),
        "prng_impl": str(jax_setting("jax_default_prng_impl")),
    }
    if os.environ.get("NPROC"):
        identity["nproc"] = os.environ["NPROC"]
    return identity


def jax_setting(name: str) -> object:
    """A JAX setting by name (its typed accessors are not all exported)."""
    import jax

    return getattr(jax.config, name)


def check_private_directory(path: Path) -> Path:
    """Create ``path`` mode 0700 if missing; refuse it if others may read or write it.

    The compilation cache holds executable code, so it must be private to the
    user that runs jobs.  Raises `UnsafeCacheError`.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeCacheError(f"compilation cache {path} is not a directory", path=str(path))
    if info.st_uid != os.getuid():
        raise UnsafeCacheError(
            f"compilation cache {path} is owned by uid {info.st_uid}, not {os.getuid()}",
            path=str(path),
            owner=info.st_uid,
        )
    if info.st_mode & 0o077:
        raise UnsafeCacheError(
            f"compilation cache {path} has mode {stat.S_IMODE(info.st_mode):04o}; expected 0700",
            path=str(path),
            mode=f"{stat.S_IMODE(info.st_mode):04o}",
        )
    return path


def enable_compilation_cache(path: Path) -> None:
    """Point JAX's persistent compilation cache at a private directory."""
    import jax

    check_private_directory(path)
    settings = {
        "jax_compilation_cache_dir": str(path),
        "jax_persistent_cache_min_compile_time_secs": 0.0,
        "jax_persistent_cache_min_entry_size_bytes": 0,
    }
    for name, value in settings.items():
        jax.config.update(name, value)  # type: ignore[no-untyped-call]


MADV_DONTNEED = 4
MADV_COLLAPSE = 25
"""Linux 6.1 and later: back a range of anonymous memory with huge pages now."""
HUGE_PAGE = 2 << 20
HUGE_PAGE_HOLES = 16
"""small pages a huge page may lack and still be collapsed (64 KiB more memory at most)"""
RELEASED = threading.Event()
"""Set once this process has let go of its code pages (`release_code_pages`)."""


def _smaps_and_libc(smaps: Path) -> tuple[list[str], Any] | None:
    """The lines of ``smaps`` and the C library, its ``madvise`` typed; None where either
    cannot be had."""
    import ctypes

    try:
        lines = smaps.read_text().splitlines()
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return lines, libc


def release_code_pages(
    smaps: Path = Path("/proc/self/smaps"), *, heap: bool = False, collapse: bool = False
) -> int:
    """Unmap this process's resident pages of its libraries' code and read-only data, and
    return their bytes (0 where the system does not tell or allow it); ``heap``: also give
    the C heap's free memory back (glibc's ``malloc_trim``, which holds the allocator's
    locks while it runs: for a process that waits, not one that trains); ``collapse``:
    then `collapse_anonymous` (for a spare, before it waits).

    Why: an exit frees a process's mapped pages one by one before its parent can see
    it, and a JAX process, once it has compiled, maps about 130 MB of its libraries
    (most of it the compiler's), so that teardown stands between a worker's crash and
    the supervisor's incident (bench/teardown.py: 14 ms, and 8 ms after this).

    Only a library's mapping is touched: a private file mapping, not writable, of a
    file that is also mapped executable here (code the loader mapped: a data file that
    a program maps and unmaps is never named, so its range cannot be reused for other
    memory before it is released; Python never unloads a library), and that holds no
    page of its own (a copy-on-write copy, such as relocated data, would be lost).  Its
    pages stay in the page cache, and the code that still runs maps them again.
    """
    opened = _smaps_and_libc(smaps)
    if opened is None:
        return 0
    lines, libc = opened
    madvise = libc.madvise
    mappings: list[tuple[int, int, str, int]] = []  # clean ones: range, file, resident kB
    code: set[str] = set()  # the files mapped executable
    candidate: tuple[int, int, str] | None = None
    resident = 0
    for line in lines:
        if line and line[0] in "0123456789abcdef":  # a header: range perms offset dev inode path
            fields = line.split(maxsplit=5)
            named = len(fields) == 6 and fields[4] != "0" and fields[5].startswith("/")
            if named and fields[1][2] == "x":
                code.add(fields[5])
            candidate = None
            if named and fields[1][1] != "w" and fields[1][3] == "p":
                low, high = (int(bound, 16) for bound in fields[0].split("-"))
                candidate = (low, high, fields[5])
        elif candidate is not None and line.startswith("Rss:"):
            resident = int(line.split()[1])
        elif candidate is not None and line.startswith("Anonymous:"):
            if int(line.split()[1]) == 0 and resident:
                mappings.append((*candidate, resident))
            candidate = None
    released = 0
    for low, high, path, kilobytes in mappings:
        if path in code and madvise(low, high - low, MADV_DONTNEED) == 0:
            released += kilobytes << 10
    if heap and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
    if collapse:
        collapse_anonymous(smaps)
    RELEASED.set()
    return released


def collapse_anonymous(
    smaps: Path = Path("/proc/self/smaps"), pagemap: Path = Path("/proc/self/pagemap")
) -> int:
    """Back this process's anonymous memory (the heaps, Python's arenas, XLA's buffers)
    with huge pages where whole ones fit (`MADV_COLLAPSE`, Linux 6.1 and later), and
    return the bytes asked for (0 where the system does not tell or allow it).

    Why: an exit frees one huge page where it frees 512 small ones, and a JAX worker
    holds about 80 MB of its own (bench/teardown.py).  The kernel copies the pages
    (about 0.1 s for 40 MB), so it is for a process that waits or compiles, not one
    that trains; its bytes are unchanged.  Only private writable memory of no file is
    touched, only where nearly every small page is present (a collapse fills the holes),
    and later allocations come in small pages as before.
    """
    opened = _smaps_and_libc(smaps)
    if opened is None:
        return 0
    lines, libc = opened
    madvise = libc.madvise
    anonymous: list[tuple[int, int]] = []
    candidate: tuple[int, int] | None = None
    for line in lines:
        if line and line[0] in "0123456789abcdef":  # a header: range perms offset dev inode path
            fields = line.split(maxsplit=5)
            candidate = None
            if fields[1] == "rw-p" and (len(fields) == 5 or fields[5] == "[heap]"):
                low, high = (int(bound, 16) for bound in fields[0].split("-"))
                candidate = (-(-low // HUGE_PAGE) * HUGE_PAGE, high // HUGE_PAGE * HUGE_PAGE)
        elif candidate is not None and line.startswith("Anonymous:"):
            if int(line.split()[1]) << 10 >= HUGE_PAGE and candidate[1] > candidate[0]:
                anonymous.append(candidate)
            candidate = None
    asked = 0
    for start, end in _mostly_resident(anonymous, pagemap):
        if madvise(start, end - start, MADV_COLLAPSE) == 0:  # refused: an older kernel
            asked += end - start
    return asked


def _mostly_resident(ranges: list[tuple[int, int]], pagemap: Path) -> Iterator[tuple[int, int]]:
    """Of the huge-page-aligned ``ranges``, the runs of huge pages whose small pages are
    nearly all present (`HUGE_PAGE_HOLES` missing at most): a collapse fills every hole,
    and a sparse range (a heap with freed memory given back) would grow by its holes."""
    import numpy as np

    try:
        fd = os.open(pagemap, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    page = os.sysconf("SC_PAGE_SIZE")
    per_huge = HUGE_PAGE // page
    try:
        for start, end in ranges:
            run = None
            for address in range(start, end, HUGE_PAGE):
                entries = os.pread(fd, per_huge * 8, address // page * 8)
                present = np.frombuffer(entries, np.uint64) >> np.uint64(63)
                if len(present) == per_huge and per_huge - int(present.sum()) <= HUGE_PAGE_HOLES:
                    run = (run[0] if run else address, address + HUGE_PAGE)
                    continue
                if run:
                    yield run
                run = None
            if run:
                yield run
    except OSError:
        return
    finally:
        os.close(fd)


def release_code_pages_once(*, wait: bool) -> threading.Thread | None:
    """`release_code_pages`, unless this process did it already (a spare, before it was
    handed its attempt): now (``wait``: the heap's free memory too, as the training has
    not begun), or on a thread of its own, started and returned.  Most of the thread's
    time is the kernel's, reading the mappings and unmapping pages, when it holds no lock
    of the interpreter's: the loop that started it goes on."""
    if RELEASED.is_set():
        return None
    if wait:
        release_code_pages(heap=True)
        return None
    thread = threading.Thread(target=release_code_pages, name="jobwarden-code-pages", daemon=True)
    thread.start()
    return thread


def exit_now(status: int) -> None:
    """Flush and leave at once, skipping interpreter and JAX teardown.

    Everything that matters is already durable (checkpoints are fsynced, events
    flushed); the teardown only delays the supervisor's recovery by about 0.2 s.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # the reader may be gone
            stream.flush()
    os._exit(status)
