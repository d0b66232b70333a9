"""Decoding text that comes from outside: JSON and TOML, bounded, finite, and real Unicode.

Job files, control requests and worker event lines all enter through here.
Every way a document can be unacceptable ends as one `DecodeError` (a
ValueError) whose message says what was found: a syntax error, nesting deeper
than `MAX_DEPTH` (which would otherwise exhaust the interpreter's recursion
limit and escape as RecursionError), ``NaN`` or ``Infinity`` (not JSON, and
not re-encodable as JSON), a number that overflows to infinity, or a lone
surrogate in a string (not Unicode text, and not encodable as UTF-8).
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 32
"""The deepest nesting of arrays and objects (tables) accepted; a job file needs four."""


class DecodeError(ValueError):
    """Raised for text that is not an acceptable document; the message names the reason."""


def _refuse_constant(name: str) -> Any:
    raise DecodeError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise DecodeError(f"number {text[:40]} overflows to {value}")
    return value


def check_document(value: Any, max_depth: int = MAX_DEPTH) -> None:
    """Raise `DecodeError` if ``value`` nests deeper than ``max_depth`` or holds a lone surrogate.

    Iterative, so that checking never recurses itself.
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, dict | list):
            if depth >= max_depth:
                raise DecodeError(f"nested deeper than {max_depth} levels")
            if isinstance(item, dict):
                for key, child in item.items():
                    if isinstance(key, str):
                        _check_text(key)
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)


def _check_text(text: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise DecodeError(
            f"a string holds a lone surrogate {text[error.start]!r} at position {error.start}"
        ) from None


def loads_json(text: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON from outside; raises `DecodeError` for anything `check_document` refuses."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise DecodeError(f"nested deeper than {max_depth} levels") from None
    except DecodeError:
        raise
    except ValueError as error:
        raise DecodeError(str(error)) from None
    check_document(value, max_depth)
    return value


def loads_toml(text: str, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """Parse TOML from outside; raises `DecodeError` naming the syntax error or the refusal."""
    import tomllib  # not at the top: the control client decodes JSON only

    try:
        value = tomllib.loads(text)
    except RecursionError:
        raise DecodeError(f"nested deeper than {max_depth} levels") from None
    except ValueError as error:
        raise DecodeError(str(error)) from None
    check_document(value, max_depth)
    return value
