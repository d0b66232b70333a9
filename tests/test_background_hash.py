"""State hashes computed on the emitter's thread: the same hash, events in order, a crash
before a hash is written leaving no verification point, and the replay still verified."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import jobwarden.sdk as jw
from jobwarden import statetree
from jobwarden.events import Event, parse_lines
from jobwarden.hashing import state_hash
from jobwarden.proof import verify
from jobwarden.sdk.stream import RunEmitter


def events_of(stream: io.StringIO) -> list[Event]:
    """The events written to ``stream`` so far."""
    return [e for e in parse_lines(stream.getvalue().splitlines()) if isinstance(e, Event)]


def records(stream: io.StringIO) -> list[dict[str, Any]]:
    """Every line written to ``stream`` so far, as JSON (the emitter tests' events are bare)."""
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def kinds(stream: io.StringIO) -> list[tuple[str, Any]]:
    """(kind, step) of every line written to ``stream`` so far."""
    return [(r["event"], r.get("step")) for r in records(stream)]


class TestEmitLater:
    """`RunEmitter.emit_later`: an event written once its fields are computed, in order."""

    def test_events_after_a_pending_one_wait_behind_it(self) -> None:
        """emit, emit_held and another thread's emit come out after the pending event."""
        stream, gate = io.StringIO(), threading.Event()
        emitter = RunEmitter(stream)

        def later() -> dict[str, Any]:
            gate.wait(10)
            return {"state_hash": "h2"}

        emitter.emit("progress", step=1, state_hash="h1")
        emitter.emit_later("progress", later, step=2, state_hash=None)
        emitter.emit_held("progress", step=3, state_hash=None)
        other = threading.Thread(target=lambda: emitter.emit("checkpoint", step=2))
        other.start()
        other.join()
        emitter.emit("ready", step=3)
        assert kinds(stream) == [("progress", 1)]
        gate.set()
        emitter.drain()
        emitter.release()
        emitter.stop()
        expected = [
            ("progress", 1),
            ("progress", 2),
            ("progress", 3),
            ("checkpoint", 2),
            ("ready", 3),
        ]
        assert expected == kinds(stream)
        assert records(stream)[1]["state_hash"] == "h2"

    def test_an_event_keeps_the_time_it_was_emitted(self) -> None:
        """The pending event's time is when emit_later was called, not when it was written."""
        stream, gate = io.StringIO(), threading.Event()
        emitter = RunEmitter(stream)
        emitter.emit_later("progress", lambda: gate.wait(10) and {}, step=1)
        emitter.emit("x")
        gate.set()
        emitter.stop()
        first, second = records(stream)
        assert first["time"] <= second["time"]

    def test_an_error_of_the_computation_is_raised_on_the_callers_thread(self) -> None:
        """A failing computation: its event is written without the fields, drain raises."""
        stream = io.StringIO()
        emitter = RunEmitter(stream)

        def later() -> dict[str, Any]:
            raise ValueError("no hash")

        emitter.emit_later("progress", later, step=1, state_hash=None)
        with pytest.raises(ValueError, match="no hash"):
            emitter.drain()
        emitter.stop()
        assert kinds(stream) == [("progress", 1)]
        assert records(stream)[0]["state_hash"] is None

    def test_a_loop_faster_than_its_hashes_waits_for_the_oldest(self) -> None:
        """With LATER_AT_MOST events waiting for their fields, the next emit_later waits."""
        from jobwarden.sdk.stream import LATER_AT_MOST

        stream, gate, entered = io.StringIO(), threading.Event(), threading.Event()
        emitter = RunEmitter(stream)
        for step in range(LATER_AT_MOST):
            emitter.emit_later("progress", lambda: gate.wait(10) and {}, step=step)

        def one_more() -> None:
            emitter.emit_later("progress", dict, step=LATER_AT_MOST)
            entered.set()

        other = threading.Thread(target=one_more)
        other.start()
        assert not entered.wait(0.2)
        gate.set()
        other.join(10)
        emitter.stop()
        assert [("progress", n) for n in range(LATER_AT_MOST + 1)] == kinds(stream)

    def test_stop_ends_the_thread(self) -> None:
        """After stop no thread of the emitter is left."""
        emitter = RunEmitter(io.StringIO())
        emitter.emit_later("progress", dict, step=1)
        emitter.stop()
        assert not [t for t in threading.enumerate() if t.name == "jobwarden-events"]


def attached_run(events: io.StringIO, steps: int, hash_every: int) -> Any:
    """A toy run with external checkpoints writing to ``events``."""
    return jw.attach(
        config={"lr": 0.1},
        data_hash="none",
        name="toy",
        steps=steps,
        hash_every=hash_every,
        checkpoints="external",
        events=events,
        argv=[],
        environ={},
    )


@pytest.fixture(params=["here", "thread"])
def hashed_where(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test twice: a small state hashed on the training thread (as it is), and every
    state hashed on the emitter's thread (as a state of `HASHED_HERE_BELOW` or more is)."""
    if request.param == "thread":
        monkeypatch.setattr("jobwarden.sdk.run.HASHED_HERE_BELOW", 0)
    return str(request.param)


@pytest.mark.usefixtures("hashed_where")
class TestHashedProgress:
    """A run's hashed progress events, their hashes computed on the training thread for a
    small state and on the emitter's thread for a large one."""

    def test_each_hash_is_the_hash_of_the_state_reported(self) -> None:
        """hash_every=2: every hashed event carries state_hash of that update's state, in
        order, even though the program changes its arrays and containers in place after."""
        events, reported = io.StringIO(), {}
        with attached_run(events, steps=9, hash_every=2) as run:
            state = {"params": np.zeros(3, np.float32), "extra": {"count": np.zeros(1)}}
            for step in run.steps(state):
                params = state["params"] + step
                state = {"params": params, "extra": {"count": np.full(1, float(step))}}
                run.progress(step, state, loss=float(step))
                reported[step] = state_hash(statetree.flatten(state), step)[0]
                params += 100  # the program's own array, changed in place
                state["extra"]["count"] = np.full(1, -1.0)  # and its container
        progress = [e for e in events_of(events) if e.kind == "progress"]
        assert list(range(1, 10)) == [e["step"] for e in progress]
        hashed = {e["step"]: e["state_hash"] for e in progress if e["state_hash"]}
        assert sorted(hashed) == [2, 4, 6, 8, 9]
        assert {step: reported[step] for step in hashed} == hashed

    def test_jax_state_hashes_equal_the_synchronous_hash(self) -> None:
        """A JAX state (with a typed key) hashed in the background: the synchronous hash."""
        import jax
        import jax.numpy as jnp

        events, reported = io.StringIO(), {}
        with attached_run(events, steps=5, hash_every=1) as run:
            state = {"w": jnp.zeros((4, 4)), "key": jax.random.key(0)}
            for step in run.steps(state):
                state = {"w": state["w"] + 1.0, "key": jax.random.split(state["key"])[0]}
                run.progress(step, state)
                reported[step] = state_hash(statetree.flatten(state), step)[0]
        hashed = {e["step"]: e["state_hash"] for e in events_of(events) if e.kind == "progress"}
        assert reported == hashed


CRASHING = textwrap.dedent(
    """
    import os, signal, sys, threading
    import numpy as np
    import jobwarden.sdk as jw
    from jobwarden.sdk import run as sdk_run, stream
    from jobwarden.sdk.leaves import Snapshot

    sdk_run.HASHED_HERE_BELOW = 0  # every hash on the emitter's thread, even this small one
    crash_at, events = int(sys.argv[1]), sys.argv[2]
    gate = threading.Event()
    with jw.attach(config={"lr": 0.1}, data_hash="none", name="toy", steps=6,
                   checkpoints="external", events=events, argv=[], environ={}) as run:
        state = {"params": np.zeros(2, np.float32)}
        for step in run.steps(state):
            state = {"params": state["params"] + step}
            if step == crash_at:  # this update's hash never finishes: the crash comes first
                run.emitter.drain()  # the earlier ones are out
                real = Snapshot.fields
                Snapshot.fields = lambda self, *args: (gate.wait(), real(self, *args))[1]
            run.progress(step, state, loss=float(step))
            if step == crash_at:
                os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_a_crash_before_a_hash_is_written_leaves_no_verification_point(tmp_path: Path) -> None:
    """SIGKILL while update 4's hash is pending: the log ends at update 3, and a replay of
    the updates from the start is still verified against an uninterrupted run.  (The
    program holds that one hash back itself: a thread's timing cannot be had otherwise.)"""
    script = tmp_path / "crashing.py"
    script.write_text(CRASHING)
    reference, crashed = tmp_path / "reference.jsonl", tmp_path / "crashed.jsonl"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, str(script), "0", str(reference)],
        env=env,
        capture_output=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    done = subprocess.run(
        [sys.executable, str(script), "4", str(crashed)],
        env=env,
        capture_output=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL
    lines = crashed.read_text().splitlines()
    progress = [e for e in parse_lines(lines) if isinstance(e, Event) and e.kind == "progress"]
    assert [e["step"] for e in progress] == [1, 2, 3]
    assert all(e["state_hash"] for e in progress)
    done = subprocess.run(
        [sys.executable, str(script), "0", str(crashed)],
        env=env,
        capture_output=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    report = verify.verify(verify.load_run(reference), verify.load_run(crashed))
    assert report.proven, verify.render(report)
