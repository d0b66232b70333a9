"""A worker killed by a signal the daemon did not send: the runbook says where to look, not
"read the traceback", since a signal leaves none."""

from __future__ import annotations

import signal
from pathlib import Path

from jobwarden.states import JobState as S
from tests.scripted import Exit
from tests.unit.rig import Rig, play


def test_a_sigkill_from_outside_points_at_the_oom_killer_not_a_traceback(
    tmp_path: Path,
) -> None:
    """SIGKILLed after update 3: the prevention names the kill, the OOM killer and the
    last sample, and asks for no traceback; a plain exit 1 still asks for the traceback."""

    async def scenario(rig: Rig) -> None:
        killed = rig.submit("killed")
        work = rig.worker(killed)
        rig.launcher.plan(
            "killed", [*work.start(), *work.updates(1, 3), Exit(-signal.SIGKILL)], work.run(2)
        )
        crashed = rig.submit("crashed")
        other = rig.worker(crashed)
        rig.launcher.plan("crashed", [*other.start(), *other.updates(1, 3), Exit(1)], other.run(2))
        await rig.launched(killed)
        await rig.until_settled("killed")
        await rig.launched(crashed)
        await rig.until_settled("crashed")
        assert (killed.state, crashed.state) == (S.COMPLETED, S.COMPLETED)
        [by_signal] = rig.incident_records("killed")
        told = " ".join(by_signal["prevention"])
        assert "killed by SIGKILL, not by the daemon: a signal leaves no traceback" in told
        assert "OOM killer" in told
        assert "Read the traceback" not in told
        [by_exit] = rig.incident_records("crashed")
        assert any("Read the traceback" in line for line in by_exit["prevention"])

    play(tmp_path, scenario)
