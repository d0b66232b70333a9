"""`runtime.release_code_pages`: a worker lets go of its libraries' clean code pages, and
never of a page it wrote (relocated data) nor of a data file's mapping: real mappings,
read back after the release."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple, cast

import pytest

from jobwarden.runtime import release_code_pages
from jobwarden.worker.command import worker_argv
from tests.helpers import job

PAGE = mmap.PAGESIZE
PAGES = 64
SIZE = PAGES * PAGE


class Mapping(NamedTuple):
    """One mapping of a process, as /proc/PID/smaps lists it (sizes in kB)."""

    start: int
    length: int
    path: str
    rss: int
    anonymous: int


def mappings(pid: int | str = "self") -> Iterator[Mapping]:
    """Every mapping of process ``pid``."""
    start = length = rss = 0
    path = ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if line and line[0] in "0123456789abcdef":
            fields = line.split(maxsplit=5)
            low, high = (int(bound, 16) for bound in fields[0].split("-"))
            start, length, path = low, high - low, fields[5] if len(fields) == 6 else ""
        elif line.startswith("Rss:"):
            rss = int(line.split()[1])
        elif line.startswith("Anonymous:"):
            yield Mapping(start, length, path, rss, int(line.split()[1]))


def mapped(path: Path, size: int = SIZE) -> tuple[int, int, int]:
    """The start, Rss and Anonymous (kB) of this process's mapping of ``path`` that is
    ``size`` bytes long."""
    for found in mappings():
        if found.path == str(path) and found.length == size:
            return found.start, found.rss, found.anonymous
    raise AssertionError(f"{path} is not mapped")


@contextmanager
def mapping(path: Path, prot: int) -> Iterator[mmap.mmap]:
    """A private mapping of the whole of ``path``."""
    with path.open("rb") as file:
        mapped_file = mmap.mmap(file.fileno(), SIZE, flags=mmap.MAP_PRIVATE, prot=prot)
    try:
        yield mapped_file
    finally:
        mapped_file.close()


@contextmanager
def library(path: Path) -> Iterator[None]:
    """``path``'s first page also mapped executable, as the loader maps a library's code."""
    with path.open("rb") as file:
        code = mmap.mmap(
            file.fileno(), PAGE, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_EXEC
        )
    try:
        yield
    finally:
        code.close()


def test_a_library_s_clean_pages_are_released_and_read_back(tmp_path: Path) -> None:
    data = bytes(range(256)) * (SIZE // 256)
    path = tmp_path / "library.so"
    path.write_bytes(data)
    with library(path), mapping(path, mmap.PROT_READ) as rodata:
        assert rodata[:] == data  # every page mapped
        assert mapped(path)[1:] == (SIZE // 1024, 0)
        released = release_code_pages()
        assert released >= SIZE
        assert mapped(path)[1:] == (0, 0)
        assert rodata[:] == data  # mapped again, from the page cache, on the touch


def test_a_data_file_mapped_read_only_is_not_touched(tmp_path: Path) -> None:
    """A program may unmap a data file at any time, and the range be reused for its other
    memory before the release reaches it: only what the loader mapped is named."""
    path = tmp_path / "data.bin"
    path.write_bytes(b"d" * SIZE)
    with mapping(path, mmap.PROT_READ) as data:
        assert data[:] == b"d" * SIZE
        release_code_pages()
        assert mapped(path)[1:] == (SIZE // 1024, 0)


def test_a_page_written_before_it_was_made_read_only_is_kept(tmp_path: Path) -> None:
    """The case of relocated data: a library's private mapping, written, then read-only
    (RELRO).  Releasing its pages would bring back the file's bytes in place of what was
    written."""
    path = tmp_path / "relocated.so"
    path.write_bytes(b"\0" * SIZE)
    with library(path), mapping(path, mmap.PROT_READ | mmap.PROT_WRITE) as relocated:
        relocated[:PAGE] = b"w" * PAGE  # one page copied on write
        _ = relocated[PAGE:]  # the others mapped from the file
        address = mapped(path)[0]
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        assert libc.mprotect(address, SIZE, mmap.PROT_READ) == 0
        _, rss, anonymous = mapped(path)
        assert anonymous == PAGE // 1024
        assert rss == SIZE // 1024
        release_code_pages()
        assert mapped(path)[1:] == (rss, anonymous)  # not touched at all
        assert relocated[:PAGE] == b"w" * PAGE


def test_a_missing_smaps_releases_nothing(tmp_path: Path) -> None:
    assert release_code_pages(tmp_path / "absent") == 0


def program_result(code: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter (JAX on the CPU); the JSON of its last line."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    return cast(dict[str, Any], json.loads(out.stdout.splitlines()[-1]))


def skip_unless_huge_pages() -> None:
    """Skip, loudly, where this kernel cannot collapse anonymous memory into huge pages."""
    if not huge_pages_collapse():
        pytest.skip(
            "SKIPPED LOUDLY: this kernel cannot collapse anonymous memory into huge pages "
            f"({os.uname().release}); a spare then keeps 4 KiB pages"
        )


PROGRAM = """
import json, os, sys
import jax, jax.numpy as jnp
from jobwarden.runtime import release_code_pages_once
def rss():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) << 10
update = jax.jit(lambda x: (x @ x.T).sum())
x = jnp.arange(64 * 64, dtype=jnp.float32).reshape(64, 64)
before, first = rss(), float(update(x))
thread = release_code_pages_once(wait=False)  # on a thread, as a run's first update does
thread.join()
after, twice = rss(), release_code_pages_once(wait=False)
again = float(update(x))  # the code runs on, its pages mapped again
later = float(jax.jit(lambda x: jnp.tanh(x).mean())(x))  # and the compiler too
print(json.dumps({"before": before, "after": after, "twice": twice is None,
                  "first": first, "again": again, "later": later}))
"""


def test_a_jax_process_runs_on_after_the_release() -> None:
    """A real JAX process: most of its resident memory was its libraries' code, and the
    update compiled before the release still gives the same bits after it."""
    result = program_result(PROGRAM)
    assert result["first"] == result["again"]
    assert result["after"] < result["before"] - (40 << 20), result
    assert result["twice"]  # once per process


def library_kb(pid: int, name: str) -> int:
    """The resident kB of process ``pid``'s mappings of the library file ``name``."""
    return sum(found.rss for found in mappings(pid) if found.path.endswith("/" + name))


def test_the_built_in_worker_lets_go_before_ready(compile_cache: Path, tmp_path: Path) -> None:
    """A real worker, stalled after its first updates: of JAX's library, which compiling
    its update mapped (about 100 MB), it keeps only what its loop runs."""
    spec = job(tmp_path / "s.toml", "stall", faults={"stall_at": 2, "stall_seconds": 30})
    with subprocess.Popen(
        worker_argv(spec, tmp_path / "ck", compile_cache), stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if '"stall_injected"' in line:
                break
        try:
            resident = library_kb(proc.pid, "libjax_common.so")
        finally:
            proc.kill()
            proc.communicate(timeout=30)
    assert 0 < resident < 24 << 10, f"{resident} kB of libjax_common.so still mapped"


def huge_pages_collapse() -> bool:
    """Whether this kernel backs anonymous memory with huge pages on request (Linux 6.1+,
    transparent huge pages not ``never``)."""
    try:
        mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False
    release = tuple(int(part) for part in os.uname().release.split(".")[:2])
    return "[never]" not in mode and release >= (6, 1)


HUGE_KB = """
def huge_kb(address):
    found = None
    for line in open("/proc/self/smaps").read().splitlines():
        if line[0] in "0123456789abcdef":
            low, high = (int(b, 16) for b in line.split()[0].split("-"))
            found = low <= address < high
        elif found and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
"""
"""A helper of the programs below: the huge pages' kB of the mapping holding ``address``."""

COLLAPSING = (
    HUGE_KB
    + """
import ctypes, json, mmap
import jax, jax.numpy as jnp
from jobwarden.runtime import release_code_pages
block = mmap.mmap(-1, 16 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # ours
address = ctypes.addressof(ctypes.c_char.from_buffer(block))
pattern = bytes(range(256)) * (len(block) // 256)
block.write(pattern)
update = jax.jit(lambda x: (x @ x.T).sum())
x = jnp.arange(64 * 64, dtype=jnp.float32).reshape(64, 64)
first, before = float(update(x)), huge_kb(address)
release_code_pages(heap=True, collapse=True)
print(json.dumps({"before": before, "after": huge_kb(address), "same": block[:] == pattern,
                  "first": first, "again": float(update(x))}))
"""
)


def test_a_spare_s_anonymous_memory_is_put_in_huge_pages() -> None:
    """``collapse=True``: a real JAX process's anonymous memory (a block of ours among it)
    is backed by huge pages, its bytes and the compiled update's bits unchanged."""
    skip_unless_huge_pages()
    result = program_result(COLLAPSING)
    assert result["same"]
    assert result["first"] == result["again"]
    assert result["after"] >= result["before"] + (14 << 10), result  # 7 whole huge pages


HOLES = (
    HUGE_KB
    + """
import ctypes, json, mmap, os
from jobwarden.runtime import HUGE_PAGE, collapse_anonymous
libc = ctypes.CDLL(None)
libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
def block():
    private = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    area = mmap.mmap(-1, 4 * HUGE_PAGE, flags=private)  # whole aligned huge pages inside
    base = ctypes.addressof(ctypes.c_char.from_buffer(area))
    start = -(-base // HUGE_PAGE) * HUGE_PAGE
    area.write(b"x" * len(area))
    return area, start
def present(start):
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(start // mmap.PAGESIZE * 8)
        entries = pagemap.read(HUGE_PAGE // mmap.PAGESIZE * 8)
    return sum(entries[i + 7] >> 7 for i in range(0, len(entries), 8))
full, full_start = block()
sparse, sparse_start = block()
libc.madvise(sparse_start, HUGE_PAGE // 2, 4)  # MADV_DONTNEED: half of that huge page
collapse_anonymous()
print(json.dumps({"full": huge_kb(full_start), "sparse_present": present(sparse_start),
                  "pages": HUGE_PAGE // mmap.PAGESIZE}))
"""
)


def test_memory_with_holes_is_not_collapsed() -> None:
    """A huge page's worth of memory half given back stays as it is (a collapse would fill
    the holes); one fully written becomes a huge page."""
    skip_unless_huge_pages()
    result = program_result(HOLES)
    assert result["full"] >= 2048, result
    assert result["sparse_present"] == result["pages"] // 2, result
