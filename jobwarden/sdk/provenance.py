"""Provenance from the program's side: its training config, its sources and its data.

* ``config`` holds the training fields (learning rate, seed, model shape...):
  nested mappings are flattened to dotted names (``optim.learning_rate``), so a
  refused resume names the very field that changed; the values must be JSON
  (numbers, strings, booleans, lists).  Operational settings (steps, faults)
  belong in `jobwarden.sdk.settings`, never here.
* ``sources`` are the files that define the update; the SDK's own step loop
  (`SDK_SOURCES`) is hashed with them, as the worker's is for built-in tasks.
* the data is hashed from ``data=`` (a pytree of arrays), ``data_hash=`` (a
  string, or a function returning one, called when first needed) or
  ``data_files=`` (streamed).

The runtime identity is captured as for the worker (`jobwarden.runtime`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from jobwarden.checkpoint.manifest import LeafSpec
from jobwarden.checkpoint.validate import Expected
from jobwarden.errors import JobFileError
from jobwarden.events import human
from jobwarden.hashing import config_hash, data_files_digest, files_digest, leaves_digest

_PACKAGE = Path(__file__).resolve().parent.parent
SDK_SOURCES = (_PACKAGE / "sdk" / "run.py", _PACKAGE / "statetree.py")
"""The step loop and the state's flattening: how an update's result becomes the next state."""

DataHash = Callable[[], str]


def _json_ready(value: Any) -> Any:
    """Numpy scalars and 0-d arrays as Python numbers; anything else unchanged."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) == ():
        return item()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _as_mapping(config: Any) -> Mapping[str, Any]:
    if config is None:
        return {}
    if isinstance(config, BaseModel):
        return config.model_dump(mode="json")
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    if isinstance(config, Mapping):
        return config
    raise JobFileError(
        "attach(config=...)",
        [f"config: a mapping, dataclass or pydantic model, found {type(config).__name__}"],
    )


def _flat(prefix: str, value: Any, into: dict[str, Any]) -> None:
    if isinstance(value, Mapping) and value:
        for key, item in value.items():
            _flat(f"{prefix}.{key}" if prefix else str(key), item, into)
    else:
        into[prefix] = value


def normalize_config(config: Any) -> dict[str, Any]:
    """The training fields as flat, JSON-normal values; raises `JobFileError` naming each bad one.

    The result is what a checkpoint stores and what a resume compares, so it is
    exactly what JSON gives back (a tuple becomes a list, a numpy float a float).
    """
    flat: dict[str, Any] = {}
    _flat("", _as_mapping(config), flat)
    normal, problems = {}, []
    for name, value in flat.items():
        try:
            text = json.dumps(value, default=_json_ready, allow_nan=False, sort_keys=True)
        except (TypeError, ValueError) as error:
            problems.append(f"config.{name}: {error} (found {value!r:.200})")
            continue
        normal[name] = json.loads(text)
    if problems:
        raise JobFileError("attach(config=...)", problems)
    return normal


def source_paths(sources: Iterable[str | Path]) -> list[Path]:
    """The program's source files, then `SDK_SOURCES`; raises `JobFileError` for a missing one."""
    paths = [Path(s).resolve() for s in sources]
    missing = [f"sources: {p}: not a readable file" for p in paths if not p.is_file()]
    if missing:
        raise JobFileError("attach(sources=...)", missing)
    return [*paths, *SDK_SOURCES]


def data_identity(
    data: Any = None,
    data_hash: str | DataHash | None = None,
    data_files: Iterable[str | Path] | None = None,
) -> DataHash:
    """A function giving the data hash from whichever one of the three ways was used.

    Raises `JobFileError` when more than one is given or a data file is missing.
    """
    ways = (("data", data), ("data_hash", data_hash), ("data_files", data_files))
    given = [name for name, value in ways if value is not None]
    if len(given) > 1:
        raise JobFileError("attach()", [f"data: give one of {', '.join(given)}, not several"])
    if isinstance(data_hash, str):
        text = data_hash
        return lambda: text
    if data_hash is not None:
        return data_hash
    if data_files is not None:
        paths = [Path(p).resolve() for p in data_files]
        missing = [f"data_files: {p}: not a readable file" for p in paths if not p.is_file()]
        if missing:
            raise JobFileError("attach(data_files=...)", missing)
        return lambda: data_files_digest(paths)
    if data is not None:
        from jobwarden import statetree as state

        return lambda: leaves_digest(state.flatten(data))
    human(
        "jobwarden: no data=, data_hash= or data_files= given: "
        "a resume on changed data will not be detected\n"
    )
    return lambda: leaves_digest([])


@dataclass(frozen=True)
class Identity:
    """What an experiment is, as a checkpoint records it and a resume compares it."""

    name: str
    job_id: str
    train: Mapping[str, Any]
    sources: tuple[Path, ...]
    data_hash: DataHash

    @property
    def config_hash(self) -> str:
        """sha256 over the name and the training fields."""
        return config_hash(self.name, self.train)

    def expected(
        self,
        leaves: tuple[LeafSpec, ...],
        runtime: Mapping[str, str],
        max_step: int,
        generation: int,
    ) -> Expected:
        """What a checkpoint must match to be restored into a state of ``leaves``."""
        return Expected(
            task=self.name,
            train=dict(self.train),
            config_hash=self.config_hash,
            data_hash=self.data_hash(),
            source_hash=files_digest(self.sources),
            runtime=dict(runtime),
            leaves=leaves,
            max_step=max_step,
            generation=generation,
        )
