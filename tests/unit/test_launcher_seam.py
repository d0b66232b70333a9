"""The launcher seam: a launcher written outside the daemon is loaded by name and just works.

`tests.scripted.ScriptedLauncher` is written against `daemon.launch.base`
alone; the daemon's registry loads it as ``module:attribute`` (as
``wardend --launcher tests.scripted:ScriptedLauncher`` would), and a job's
supervisor runs attempts through it with no edit anywhere in the daemon.
These tests also pin the scripted attempt's own contract, which every other
test in this folder relies on.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from jobwarden.daemon.config import LaunchSettings
from jobwarden.daemon.launch import registry
from jobwarden.daemon.launch.base import LauncherError, LaunchSpec
from jobwarden.events import Event, Malformed, read_events
from jobwarden.states import JobState
from tests.scripted import STACK_DUMP, Exit, Hang, Line, Script, ScriptedLauncher
from tests.unit.clock import MockClock
from tests.unit.rig import Rig, play


def test_the_scripted_launcher_loads_by_name_and_runs_a_job(tmp_path: Path) -> None:
    """registry.load("tests.scripted:ScriptedLauncher", settings) gives a launcher made with
    those settings, and a supervisor completes a job through it."""
    settings = LaunchSettings(name="tests.scripted:ScriptedLauncher", warm_spares=False)
    loaded = registry.load("tests.scripted:ScriptedLauncher", settings)
    assert (type(loaded), loaded.name, loaded.settings) == (ScriptedLauncher, "scripted", settings)

    async def scenario(rig: Rig) -> None:
        record = rig.submit("seam")
        rig.launcher.plan("seam", rig.worker(record).run())
        await rig.launched(record)
        await rig.until_settled("seam")
        assert record.state is JobState.COMPLETED
        assert [spec.job_id for spec in rig.launcher.specs] == ["seam"]

    play(tmp_path, scenario, loaded)


def test_a_name_that_names_no_launcher_is_refused() -> None:
    """module:attribute that does not exist, or is no Launcher, is a LauncherError naming it."""
    with pytest.raises(LauncherError, match=r"tests\.scripted:Nothing"):
        registry.load("tests.scripted:Nothing")
    with pytest.raises(LauncherError, match="is not a Launcher"):
        registry.load("tests.scripted:Worker")


def spec(tmp_path: Path, attempt: int = 1) -> LaunchSpec:
    """A spec naming only what the scripted launcher reads."""
    return LaunchSpec("job", attempt, tmp_path / "attempts" / str(attempt), ["unused"], {})


def test_every_byte_is_kept_and_each_line_dispatched(tmp_path: Path) -> None:
    """Events and malformed lines go to the callbacks and, verbatim, into events.jsonl."""

    async def scenario(rig: Rig) -> None:
        launcher = ScriptedLauncher()
        events: list[Event] = []
        malformed: list[Malformed] = []
        launcher.plan("job", [*rig.worker(rig.submit("job")).start(), Line("{oops"), Exit(3)])
        attempt = await launcher.start(spec(tmp_path))
        info = await attempt.follow(events.append, malformed.append)
        assert (info.status, info.signal) == (3, None)
        assert [e.kind for e in events] == ["started", "ready"]
        assert events[0]["pid"] == attempt.pid
        assert [m.line for m in malformed] == ["{oops"]
        kept = read_events(attempt.spec.folder / "events.jsonl")
        assert [getattr(item, "kind", "malformed") for item in kept] == [
            "started",
            "ready",
            "malformed",
        ]
        assert attempt.exit_info is info
        assert attempt.ended.is_set()

    play(tmp_path, scenario)


def test_signals_kill_and_stop_are_recorded_and_answered_as_the_worker_does(
    tmp_path: Path,
) -> None:
    """SIGUSR1 dumps stacks and goes on; stop sends SIGTERM, the attempt commits its step,
    reports preempted and exits 75; nothing is recorded once it has exited."""

    async def scenario(rig: Rig) -> None:
        launcher = ScriptedLauncher()
        work = rig.worker(rig.submit("job"))
        launcher.plan("job", [*work.start(), *work.updates(1, 3), Hang()])
        attempt = await launcher.start(spec(tmp_path))
        events: list[Event] = []
        following = rig.spawn(attempt.follow(events.append, lambda _: None))
        await attempt.reached()
        attempt.signal(signal.SIGUSR1)
        await attempt.stop(5.0)
        info = await following
        assert (info.status, attempt.received) == (75, ["SIGUSR1", "stop(5)", "SIGTERM"])
        assert [e.kind for e in events][-2:] == ["checkpoint", "preempted"]
        assert (events[-2]["step"], events[-1]["step"]) == (3, 3)
        assert (attempt.spec.folder / "stderr.log").read_text() == STACK_DUMP
        attempt.signal(signal.SIGTERM)
        attempt.kill()
        assert attempt.received == ["SIGUSR1", "stop(5)", "SIGTERM"]

    play(tmp_path, scenario)


def test_a_kill_ends_the_attempt_before_its_next_line(tmp_path: Path) -> None:
    """kill() while an event is dispatched: no further line, killed by SIGKILL."""

    async def scenario(rig: Rig) -> None:
        launcher = ScriptedLauncher()
        launcher.plan("job", rig.worker(rig.submit("job")).run())
        attempt = await launcher.start(spec(tmp_path))
        seen: list[str] = []

        def on_event(event: Event) -> None:
            seen.append(event.kind)
            if event.kind == "ready":
                attempt.kill()

        info = await attempt.follow(on_event, lambda _: None)
        assert (seen, info.signal, attempt.received) == (["started", "ready"], "SIGKILL", ["kill"])

    play(tmp_path, scenario)


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    """on_term="ignore": stop waits its grace, then kills."""

    async def scenario(rig: Rig) -> None:
        launcher = ScriptedLauncher()
        launcher.plan("job", Script((Hang(),), on_term="ignore"))
        attempt = await launcher.start(spec(tmp_path))
        following = rig.spawn(attempt.follow(lambda _: None, lambda _: None))
        await attempt.reached()
        await attempt.stop(0.01)
        assert ((await following).signal, attempt.received) == (
            "SIGKILL",
            ["stop(0.01)", "SIGTERM", "kill"],
        )

    play(tmp_path, scenario)


def test_a_start_with_no_script_left_is_a_launcher_error(tmp_path: Path) -> None:
    """An attempt the test did not plan is refused, naming it, rather than invented."""

    async def scenario(rig: Rig) -> None:
        with pytest.raises(LauncherError, match="attempt 2 of job job"):
            await ScriptedLauncher().start(spec(tmp_path, attempt=2))

    play(tmp_path, scenario)


def test_the_mock_clock_runs_timers_only_when_advanced() -> None:
    """Timers run in order at their own instant, a cancelled one never; time never goes back."""
    clock, ran = MockClock(), []
    clock.call_at(1002.0, lambda: ran.append(("b", clock.time())))
    clock.call_at(1001.0, lambda: ran.append(("a", clock.time())))
    clock.call_at(1001.5, lambda: ran.append(("x", clock.time()))).cancel()
    assert (clock.advance(0.5), ran) == (0, [])
    assert clock.advance(5.0) == 2
    assert (ran, clock.time()) == ([("a", 1001.0), ("b", 1002.0)], 1005.5)
    with pytest.raises(ValueError, match="does not go back"):
        clock.advance(-1.0)
