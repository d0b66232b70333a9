"""A command job's argv and env are refused at intake where execve would refuse them.

Each bound is checked against a real execve of ``/bin/true`` from this
process: a string of `EXEC_STRING_MAX` bytes (its NUL included) runs and one
byte more is E2BIG, whatever the stack limit; and under the smallest stack
limit (where execve takes its floor, 32 pages, in all), strings that intake
counts at its total, less the program's path, run, one byte more is E2BIG,
and one byte over the total is refused: intake counts what the kernel counts.
"""

from __future__ import annotations

import errno
import resource
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from jobwarden.errors import JobFileError
from jobwarden.jobfile import Job, job_from_mapping
from jobwarden.program import EXEC_STRING_MAX, EXEC_TOTAL_FLOOR, POINTER_BYTES, exec_total_max

PROGRAM = "/bin/true"
SMALL_STACK = 256 * 1024
"""A stack limit whose quarter is under 32 pages: execve then takes its floor, 128 KiB."""


@pytest.fixture
def small_stack() -> Iterator[None]:
    """This process's stack limit lowered (intake reads it, its children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    resource.setrlimit(resource.RLIMIT_STACK, (SMALL_STACK, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_STACK, (soft, hard))


def intake(env: dict[str, str], argv: tuple[str, ...] = (PROGRAM,)) -> Job:
    """Take in a command job with ``env``, as the spool does (`check_workdir`)."""
    document: dict[str, Any] = {"id": "big", "command": list(argv), "env": env}
    return job_from_mapping(document, "big.toml", check_workdir=True)


def problems(env: dict[str, str]) -> list[str]:
    """What intake says of a job with ``env``."""
    with pytest.raises(JobFileError) as refused:
        intake(env)
    return refused.value.problems


def execve(env: dict[str, str]) -> int:
    """Run ``/bin/true`` with exactly ``env``: 0, or the errno execve failed with."""
    try:
        subprocess.run([PROGRAM], env=env, check=True)
    except OSError as error:
        return error.errno or -1
    return 0


def value_of(size: int, name: str = "BIG") -> str:
    """A value whose ``NAME=value`` string takes ``size`` bytes with its NUL."""
    return "v" * (size - len(name) - 2)


def test_one_string_at_the_limit_is_taken_and_one_byte_more_is_refused() -> None:
    """NAME=value of 128 KiB with its NUL: accepted, and execve runs it; one byte more (a
    two-byte character included): refused naming the variable and both sizes, and E2BIG."""
    assert exec_total_max() > 2 * EXEC_STRING_MAX, "the total must leave room for the string"
    at_limit = {"BIG": value_of(EXEC_STRING_MAX)}
    assert intake(at_limit).program is not None
    assert execve(at_limit) == 0
    over = {"BIG": value_of(EXEC_STRING_MAX - 1) + "é"}
    assert execve(over) == errno.E2BIG
    assert problems(over) == [
        "env.BIG: NAME=value is 131,073 bytes with its NUL; execve takes at most 131,072 "
        "(128 KiB) in one string (pass large data in a file)"
    ]


def test_a_long_argument_is_refused_naming_its_place() -> None:
    """The same bound holds for each argument of the command."""
    with pytest.raises(JobFileError) as refused:
        intake({}, (PROGRAM, "a" * EXEC_STRING_MAX))
    assert refused.value.problems[0].startswith("command[1]: the argument is 131,073 bytes")


@pytest.mark.usefixtures("small_stack")
def test_strings_over_the_total_are_refused_as_execve_refuses_them() -> None:
    """Values each well under the string limit that come to more than execve takes together
    under a small stack limit: refused, naming the total; the same count less the program's
    path runs, and one byte more is E2BIG."""
    assert exec_total_max() == EXEC_TOTAL_FLOOR
    program_path = len(PROGRAM) + 1
    argv_counted = program_path + POINTER_BYTES
    small = {f"V{i}": "b" * 10_000 for i in range(12)}
    counted = sum(len(f"{k}={v}") + 1 + POINTER_BYTES for k, v in small.items())
    rest = EXEC_TOTAL_FLOOR - argv_counted - counted - POINTER_BYTES
    assert intake({**small, "LAST": value_of(rest, "LAST")}).program is not None
    assert execve({**small, "LAST": value_of(rest - program_path, "LAST")}) == 0
    assert execve({**small, "LAST": value_of(rest - program_path + 1, "LAST")}) == errno.E2BIG
    assert problems({**small, "LAST": value_of(rest + 1, "LAST")}) == [
        "command, env: 131,073 bytes together (each string with its NUL and an 8-byte "
        "pointer); execve takes at most 131,072 here (a quarter of the stack limit, "
        "ulimit -s), before the daemon's own environment"
    ]


def test_a_job_read_back_from_its_folder_is_not_held_to_the_limits() -> None:
    """A job accepted before the limits were checked still loads from its own job.json (its
    launch then fails with an incident), so no job is lost to them."""
    document = {"id": "old", "command": [PROGRAM], "env": {"BIG": value_of(EXEC_STRING_MAX + 1)}}
    assert job_from_mapping(document).program is not None
