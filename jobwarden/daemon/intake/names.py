"""Request file names: what makes one unusable, and how to show and keep it safely.

A request is claimed as ``<stamp>.<name>`` in ``spool/claimed``, so its name
must leave room for the stamp within NAME_MAX; a name that is not UTF-8 or
holds control characters is rejected, and kept under a safe name.
"""

from __future__ import annotations

import hashlib
import os

NAME_MAX = 255
STAMP_DIGITS = 19  # time.time_ns() until the year 2286
MAX_NAME_BYTES = NAME_MAX - STAMP_DIGITS - 1
"""The longest request name: the claim renames it to ``<stamp>.<name>`` within NAME_MAX."""


def name_problems(name: str) -> list[str]:
    """What makes a request's file name unusable (empty when it is fine)."""
    raw = os.fsencode(name)
    problems = []
    if len(raw) > MAX_NAME_BYTES:
        problems.append(
            f"name: {len(raw)} bytes, over the {MAX_NAME_BYTES}-byte limit "
            f"(the claim prefixes a {STAMP_DIGITS + 1}-byte stamp within NAME_MAX = {NAME_MAX})"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        problems.append(f"name: not UTF-8 text (byte {raw[error.start]:#04x} at {error.start})")
        text = name
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        problems.append("name: holds control characters")
    return problems


def printable(name: str) -> str:
    """``name`` as text safe to log and show: undecodable bytes and control characters escaped."""
    text = os.fsencode(name).decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def safe_name(name: str) -> str:
    """A short, printable name unique to ``name``, to keep a request with an unusable name."""
    raw = os.fsencode(name)
    stem = "".join(
        c if (c.isascii() and c.isalnum()) or c in "._-" else "_" for c in printable(name)
    )
    return f"badname-{hashlib.sha256(raw).hexdigest()[:16]}-{stem[:64].lstrip('.')}"


def original_name(claimed: str) -> str:
    """The name a claimed file arrived under: ``<stamp>.<name>`` without its stamp."""
    stamp, dot, rest = claimed.partition(".")
    return rest if dot and stamp.isdigit() and rest else claimed
