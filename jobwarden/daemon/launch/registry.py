"""Which launcher runs attempts: found by name, made with the daemon's typed settings.

``wardend --launcher NAME`` picks one: a name registered in the
``jobwarden.launchers`` entry point group (``local``, ``slurm``), or
``module:attribute`` for one that is not installed as a distribution.  A
launcher is a `Launcher` subclass (called with the daemon's `LaunchSettings`)
or a ready instance.  Adding one is a folder under ``daemon/launch/`` and its
registration; nothing else in the daemon names it.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from jobwarden.daemon.config import LaunchSettings
from jobwarden.daemon.launch.base import Launcher, LauncherError

ENTRY_POINT_GROUP = "jobwarden.launchers"


def load(name: str, settings: LaunchSettings | None = None) -> Launcher:
    """The launcher called ``name`` (a ``jobwarden.launchers`` entry point or ``module:attr``),
    made with ``settings``; raises `LauncherError` naming what is wrong."""
    if ":" in name:
        module, _, attribute = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as error:
            raise LauncherError(f"launcher {name!r} cannot be loaded: {error}") from error
    else:
        found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
        if name not in found:
            raise LauncherError(
                f"no launcher {name!r}; known: {', '.join(sorted(found)) or 'none'}",
                launcher=name,
            )
        factory = found[name].load()
    if isinstance(factory, Launcher):
        return factory
    if not (isinstance(factory, type) and issubclass(factory, Launcher)):
        raise LauncherError(f"launcher {name!r} is not a Launcher: {factory!r}", launcher=name)
    return factory(settings or LaunchSettings(name=name))
