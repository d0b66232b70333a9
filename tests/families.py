"""``python -m tests.families AF_UNIX,AF_INET -- PROGRAM ARGS``: exec PROGRAM under a seccomp
filter that lets socket(2) make only the address families named, as the unit's
``RestrictAddressFamilies=`` does.

systemd implements that setting with a seccomp filter on socket(2) that fails every other
family with EAFNOSUPPORT; this installs the same filter with the kernel's own interface
(prctl(PR_SET_SECCOMP) with a classic BPF program, through ctypes), so a test can run a
real wardend under the unit's restriction without systemd as init.  The filter and
no-new-privileges are inherited by everything PROGRAM starts, its workers included.
Other system calls, and socketpair(2) (which systemd does not filter either), pass.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import socket
import struct
import sys

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
LOAD_WORD = 0x20  # BPF_LD | BPF_W | BPF_ABS
JUMP_EQUAL = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
RETURN = 0x06  # BPF_RET | BPF_K
NR_OFFSET, ARCH_OFFSET, ARG0_OFFSET = 0, 4, 16  # struct seccomp_data, little-endian
ARCHES = {"x86_64": (0xC000003E, 41), "aarch64": (0xC00000B7, 198)}
"""The audit architecture and socket(2)'s number on each machine this runs on."""


def instruction(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    """One ``struct sock_filter``."""
    return struct.pack("=HBBI", code, jt, jf, k)


def program(allowed: list[int]) -> bytes:
    """The filter: socket(2) with a family not in ``allowed`` fails with EAFNOSUPPORT; a call
    of a foreign architecture fails with ENOSYS (``SystemCallArchitectures=native``)."""
    arch, socket_nr = ARCHES[platform.machine()]
    deny = SECCOMP_RET_ERRNO | errno.EAFNOSUPPORT
    checks = len(allowed)
    code = [
        instruction(LOAD_WORD, ARCH_OFFSET),
        instruction(JUMP_EQUAL, arch, jt=1),
        instruction(RETURN, SECCOMP_RET_ERRNO | errno.ENOSYS),
        instruction(LOAD_WORD, NR_OFFSET),
        instruction(JUMP_EQUAL, socket_nr, jf=checks + 2),  # not socket(2): allow
        instruction(LOAD_WORD, ARG0_OFFSET),
    ]
    for index, family in enumerate(allowed):
        code.append(instruction(JUMP_EQUAL, family, jt=checks - index))  # to allow
    code += [instruction(RETURN, deny), instruction(RETURN, SECCOMP_RET_ALLOW)]
    return b"".join(code)


def restrict(families: list[int]) -> None:
    """Install the filter on this process (and all it starts from now on)."""
    libc = ctypes.CDLL(None, use_errno=True)
    code = program(families)
    buffer = ctypes.create_string_buffer(code, len(code))

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Program(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    for option, arg in ((PR_SET_NO_NEW_PRIVS, 1), (PR_SET_SECCOMP, SECCOMP_MODE_FILTER)):
        pointer = ctypes.byref(fprog) if option == PR_SET_SECCOMP else None
        if libc.prctl(option, arg, pointer, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl({option})")


def main(argv: list[str]) -> None:
    """Parse ``FAMILIES -- PROGRAM ARGS``, restrict, exec (the pid stays the same)."""
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: python -m tests.families AF_UNIX[,AF_INET...] -- PROGRAM [ARGS]")
    restrict([int(getattr(socket, name)) for name in argv[0].split(",")])
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
