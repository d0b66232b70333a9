"""``wardend --root DIR``: run the supervisor daemon in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from jobwarden.daemon import logs
from jobwarden.daemon.core import Options, Wardend
from jobwarden.daemon.layout import Root, RootLockedError


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, take the root lock, run the loop."""
    parser = argparse.ArgumentParser(prog="wardend", description=__doc__)
    parser.add_argument("--root", type=Path, required=True, help="the daemon's root folder")
    parser.add_argument("--socket", type=Path, help="control socket (default ROOT/control.sock)")
    parser.add_argument("--group", help="a group whose members may use the control socket")
    parser.add_argument(
        "--max-concurrent",
        type=int,
        default=max(1, os.cpu_count() or 1),
        help="jobs run at once (default: the number of CPUs)",
    )
    parser.add_argument(
        "--rescan-interval",
        type=float,
        default=5.0,
        help="seconds between safety-net rescans of the spool",
    )
    parser.add_argument(
        "--control-timeout",
        type=float,
        default=5.0,
        help="seconds a control client has to send a complete request",
    )
    parser.add_argument(
        "--compile-cache",
        type=Path,
        help="the workers' JAX compilation cache (default ROOT/cache/jax)",
    )
    parser.add_argument(
        "--sample-interval",
        type=float,
        default=1.0,
        help="seconds between psutil samples of each worker",
    )
    args = parser.parse_args(argv)
    root = Root(args.root.absolute())
    root.create()
    try:
        lock = root.lock()
    except RootLockedError as error:
        sys.stderr.write(f"wardend: {error.message}\n")
        return error.exit_status
    stream = logs.configure(root.log)
    options = Options(
        max_concurrent=args.max_concurrent,
        socket=args.socket,
        group=args.group,
        rescan_interval_s=args.rescan_interval,
        sample_interval_s=args.sample_interval,
        compile_cache=args.compile_cache,
        control_timeout_s=args.control_timeout,
    )
    try:
        return asyncio.run(Wardend(root, options).run())
    finally:
        stream.close()
        os.close(lock)


if __name__ == "__main__":
    sys.exit(main())
