"""Member 0 that cannot listen on its coordinator address fails naming the address, with
its own code and status, instead of JAX's bare runtime error (exit 70, worker.internal)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

PROGRAM = """
import json, sys
from jobwarden.errors import JobwardenError
from jobwarden.sdk.distributed import Membership
try:
    Membership(0, 2, sys.argv[1]).join()
except JobwardenError as error:
    print(json.dumps({"code": error.code, "status": error.exit_status, **error.as_record()}))
"""


def test_a_coordinator_port_held_by_another_process_is_named() -> None:
    """The port is bound and listened on here, so member 0's bind fails at once."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        done = subprocess.run(
            [sys.executable, "-c", PROGRAM, address],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(done.stdout)
    assert (record["code"], record["status"]) == ("distributed.coordinator", 37)
    assert record["coordinator"] == address
    assert f"could not listen on the coordinator address {address}" in record["message"]
