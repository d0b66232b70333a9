"""Section 5's inputs: the hypothesis strategies for job files, request lines, event
lines and checkpoint files."""

from __future__ import annotations

import json
import math
from typing import Any

from jobwarden.control.harness import job_text


def fuzz_strategies() -> dict[str, Any]:
    """The hypothesis strategies: job files, request lines, event lines, checkpoint files."""
    from hypothesis import strategies as st

    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**70), max_value=2**70)
        | st.floats()
        | st.text(max_size=12)
        | st.sampled_from([0, 1, -1, 2**31, 2**63, 10**400, 1e308, "", "..", "a/b", "\x00"])
    )
    values = st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=12,
    )
    names = st.from_regex(r"[A-Za-z0-9._-]{1,70}", fullmatch=True) | st.text(max_size=70)
    depth = st.integers(min_value=1, max_value=5000)

    def section(keys: list[str]) -> Any:
        return st.dictionaries(st.sampled_from(keys) | st.text(max_size=8), values, max_size=6)

    document = st.fixed_dictionaries(
        {},
        optional={
            "id": names | values,
            "task": st.sampled_from(["linreg", "mlp", "nope", ""]) | values,
            "checkpoint": names | values,
            "train": section(["seed", "learning_rate", "momentum", "batch_size", "width"]) | values,
            "run": section(["steps", "checkpoint_every", "keep_checkpoints", "resume"]) | values,
            "faults": section(
                [
                    "fail_after",
                    "crash_after",
                    "crash_in_commit",
                    "stall_at",
                    "stall_seconds",
                    "step_delay_s",
                    "every_attempt",
                ]
            )
            | values,
            "supervision": section(
                [
                    "startup_timeout_s",
                    "stall_timeout_s",
                    "max_restarts",
                    "restart_backoff_s",
                    "max_rss_mb",
                    "stop_grace_s",
                ]
            )
            | values,
            "extra": values,
        },
    )
    valid = job_text("fuzz", run={"steps": 4}).encode()
    job_files = st.one_of(
        st.tuples(st.just("json"), document.map(lambda d: json.dumps(d, default=str).encode())),
        st.tuples(st.just("toml"), document.map(lambda d: toml_document(d).encode())),
        st.tuples(st.sampled_from(["json", "toml"]), st.binary(max_size=600)),
        st.tuples(
            st.just("toml"),
            st.tuples(st.binary(max_size=40), st.integers(0, len(valid))).map(
                lambda b: valid[: b[1]] + b[0] + valid[b[1] :]
            ),
        ),
        st.tuples(
            st.just("json"),
            depth.map(
                lambda n: b'{"id": "deep", "task": "linreg", "train": ' + b"[" * n + b"]" * n + b"}"
            ),
        ),
        st.tuples(st.just("toml"), depth.map(lambda n: b"x = " + b"[" * n + b"]" * n + b"\n")),
        st.tuples(
            st.just("toml"),
            st.integers(256 * 1024 - 2, 256 * 1024 + 2).map(lambda n: (valid + b"#" * n)[:n]),
        ),
    )
    commands = [
        "status",
        "incidents",
        "runbook",
        "events",
        "checkpoints",
        "submit",
        "stop",
        "resume",
        "metrics",
        "version",
    ]
    args = st.dictionaries(
        st.sampled_from(["job", "attempt", "offset", "name", "content", "incident", "limit"])
        | st.text(max_size=8),
        names | values,
        max_size=4,
    )
    request = st.fixed_dictionaries(
        {},
        optional={
            "v": st.just(1) | values,
            "id": values,
            "cmd": st.sampled_from(commands) | st.text(max_size=12) | values,
            "args": args | values,
        },
    )
    request_lines = st.one_of(
        st.binary(max_size=400).map(lambda b: b.replace(b"\n", b"") + b"\n"),
        st.tuples(request, st.booleans()).map(
            lambda r: json.dumps(r[0], ensure_ascii=r[1], default=str).encode() + b"\n"
        ),
        st.tuples(request, st.binary(min_size=1, max_size=3), st.integers(0, 200)).map(
            lambda r: splice(json.dumps(r[0], default=str).encode(), r[1], r[2]) + b"\n"
        ),
        depth.map(
            lambda n: (
                b'{"v": 2, "id": 1, "cmd": "status", "args": {"job": '
                + b"[" * n * 20
                + b"]" * n * 20
                + b"}}\n"
            )
        ),
    )
    from jobwarden.events import REQUIRED

    event = st.fixed_dictionaries(
        {"v": st.just(1) | values, "event": st.sampled_from(sorted(REQUIRED)) | values},
        optional={k: values for spec in REQUIRED.values() for k in spec},
    )
    lines = st.one_of(
        st.text(max_size=300),
        st.text(alphabet=st.characters(codec=None, categories=None), max_size=50),
        event.map(lambda e: json.dumps(e, default=str)),
        st.tuples(event, st.text(max_size=3), st.integers(0, 100)).map(
            lambda r: (t := json.dumps(r[0], default=str))[: r[2]] + r[1] + t[r[2] :]
        ),
        depth.map(lambda n: '{"v": 1, "event": "progress", "x": ' + "[" * n + "]" * n + "}"),
        st.sampled_from(
            [
                '{"v": 1, "event": "progress", "step": 1e999}',
                '{"v": 1, "time": NaN}',
                '"\ud800"',
                '{"v": 1, "event": "\\ud800"}',
            ]
        ),
    )
    return {
        "values": values,
        "depth": depth,
        "job_files": job_files,
        "request_lines": request_lines,
        "event_lines": lines,
        "st": st,
    }


def splice(data: bytes, insert: bytes, at: int) -> bytes:
    """``insert`` put into ``data`` at ``at`` (bounded by its length)."""
    at = min(at, len(data))
    return data[:at] + insert + data[at:]


def toml_key(key: str) -> str:
    """A TOML key, quoted as a basic string."""
    return json.dumps(key)


def toml_inline(value: Any) -> str | None:
    """A value as inline TOML; None for null (which TOML lacks)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        items = [t for t in (toml_inline(v) for v in value) if t is not None]
        return "[" + ", ".join(items) + "]"
    items = [f"{toml_key(k)} = {t}" for k, v in value.items() if (t := toml_inline(v)) is not None]
    return "{" + ", ".join(items) + "}"


def toml_document(document: dict[str, Any]) -> str:
    """A job document as TOML: scalars at the top, tables as [sections]."""
    lines, tables = [], []
    for key, value in document.items():
        if isinstance(value, dict):
            tables.append((key, value))
        elif (text := toml_inline(value)) is not None:
            lines.append(f"{toml_key(key)} = {text}")
    for key, table_ in tables:
        lines.append(f"[{toml_key(key)}]")
        lines += [
            f"{toml_key(k)} = {t}" for k, v in table_.items() if (t := toml_inline(v)) is not None
        ]
    return "\n".join(lines) + "\n"


def checkpoint_files(strategy: dict[str, Any], valid: bytes) -> Any:
    """Checkpoint files: raw bytes, odd length prefixes, mutated headers and manifests."""
    st = strategy["st"]
    values = strategy["values"]
    (length,) = struct_unpack(valid[:8])
    header = json.loads(valid[8 : 8 + length])
    data = valid[8 + length :]
    manifest = json.loads(header["__metadata__"]["jobwarden"])

    def assemble(head: Any, body: bytes, skew: int) -> bytes:
        text = json.dumps(head, default=str).encode()
        return (len(text) + skew).to_bytes(8, "little") + text + body

    def set_path(tree: Any, path: list[Any], value: Any) -> Any:
        tree = json.loads(json.dumps(tree))
        node = tree
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        return tree

    header_paths = [
        ["__metadata__"],
        ["__metadata__", "checksum"],
        ["__metadata__", "signature"],
        ["key"],
        ["key", "dtype"],
        ["key", "shape"],
        ["key", "data_offsets"],
        ["params", "shape"],
        ["params", "data_offsets"],
        ["extra"],
    ]
    manifest_paths = [
        ["schema_version"],
        ["leaves"],
        ["leaves", 0],
        ["leaves", 0, 1],
        ["leaves", 0, 2],
        ["leaves", 2, 2],
        ["step"],
        ["created"],
        ["train"],
        ["provenance"],
        ["provenance", "runtime"],
        ["components"],
        ["task"],
    ]
    skews = st.integers(-3, 3) | st.just(0)
    bodies = st.sampled_from([data, data[:-1], data + b"\0", b"", data * 2])

    def with_manifest(m: Any) -> Any:
        return set_path(header, ["__metadata__", "jobwarden"], json.dumps(m, default=str))

    return st.one_of(
        st.binary(max_size=2048),
        st.tuples(st.integers(0, 2**64 - 1), st.binary(max_size=512)).map(
            lambda t: t[0].to_bytes(8, "little") + t[1]
        ),
        st.tuples(st.sampled_from(header_paths), values, bodies, skews).map(
            lambda t: assemble(set_path(header, t[0], t[1]), t[2], t[3])
        ),
        st.tuples(st.sampled_from(manifest_paths), values, bodies, skews).map(
            lambda t: assemble(with_manifest(set_path(manifest, t[0], t[1])), t[2], t[3])
        ),
        st.tuples(st.integers(0, len(valid)), st.binary(min_size=1, max_size=4)).map(
            lambda t: valid[: t[0]] + t[1] + valid[t[0] + len(t[1]) :]
        ),
        strategy["depth"].map(
            lambda n: (2 * n + 7).to_bytes(8, "little") + b'{"a": ' + b"[" * n + b"]" * n + b"}"
        ),
        st.tuples(strategy["depth"], bodies).map(
            lambda t: assemble(
                set_path(header, ["__metadata__", "jobwarden"], "[" * t[0] + "]" * t[0]), t[1], 0
            )
        ),
    )


def struct_unpack(prefix: bytes) -> tuple[int]:
    """The 8-byte little-endian header length of a checkpoint file."""
    return (int.from_bytes(prefix, "little"),)
