"""A fast loop's progress event is finished at the next report, while the next update runs
(`RunEmitter.emit_next`): its loss and hash taken once the update has ended, its time kept."""

from __future__ import annotations

import io
import time
from typing import Any

import numpy as np
import pytest

import jobwarden.sdk as jw
from jobwarden import statetree
from jobwarden.hashing import state_hash
from jobwarden.sdk.stream import HOLD_S, RunEmitter
from tests.test_background_hash import attached_run, records


class TestEmitNext:
    """`RunEmitter.emit_next`: one event left unfinished until the next is emitted."""

    def test_the_event_is_finished_when_the_next_is_emitted(self) -> None:
        """Its fields are made at the next emit (not before), and it goes out first."""
        stream, calls = io.StringIO(), []
        emitter = RunEmitter(stream)

        def finish() -> dict[str, Any]:
            calls.append(len(records(stream)))
            return {"loss": 0.5}

        emitter.emit_next("progress", finish, step=1, loss=None)
        assert calls == []
        emitter.emit("checkpoint", step=1)
        emitter.stop()
        assert calls == [0]
        assert [(r["event"], r.get("loss")) for r in records(stream)] == [
            ("progress", 0.5),
            ("checkpoint", None),
        ]

    def test_the_event_keeps_the_time_it_was_emitted(self) -> None:
        """Finished later, it carries the time of its emit_next call."""
        stream = io.StringIO()
        emitter = RunEmitter(stream)
        emitter.emit_next("progress", dict, step=1)
        before_next = time.time()
        time.sleep(0.01)
        emitter.emit("x")
        emitter.stop()
        first, _ = records(stream)
        assert first["time"] < before_next

    @pytest.mark.parametrize("settle", ["drain", "release", "stop"])
    def test_drain_release_and_stop_write_it(self, settle: str) -> None:
        """What writes the held events writes the one left, finished."""
        stream = io.StringIO()
        emitter = RunEmitter(stream)
        emitter.emit_next("progress", lambda: {"loss": 1.0}, step=1, loss=None)
        getattr(emitter, settle)()
        emitter.release()
        assert [(r["event"], r["loss"]) for r in records(stream)] == [("progress", 1.0)]
        emitter.stop()

    def test_an_error_of_finish_is_raised_on_the_next_emit_next(self) -> None:
        """A failing finish: its event is written without the fields; the next report raises."""
        stream = io.StringIO()
        emitter = RunEmitter(stream)

        def finish() -> dict[str, Any]:
            raise ValueError("no loss")

        emitter.emit_next("progress", finish, step=1, loss=None)
        with pytest.raises(ValueError, match="no loss"):
            emitter.emit_next("progress", dict, step=2, loss=None)
        emitter.release()
        emitter.stop()
        assert [(r["step"], r["loss"]) for r in records(stream)] == [(1, None), (2, None)]


class TestDeferredProgress:
    """A run's progress events in a fast loop and in a slow one."""

    def test_a_fast_loop_reports_each_update_finished_at_the_next(self) -> None:
        """Each update's loss is taken at the next report, and its hash is its own state's,
        though the program changes its arrays in place after reporting them."""
        events, reported, taken_at = io.StringIO(), {}, {}
        current = [0]

        class Loss:
            """A loss that notes at which report it was read."""

            def __init__(self, step: int) -> None:
                self.step = step

            def __float__(self) -> float:
                taken_at[self.step] = current[0]
                return self.step / 2

        with attached_run(events, steps=6, hash_every=1) as run:
            state = {"params": np.zeros(3, np.float32)}
            for step in run.steps(state):
                state = {"params": state["params"] + step}
                current[0] = step
                run.progress(step, state, loss=Loss(step))
                reported[step] = state_hash(statetree.flatten(state), step)[0]
                state["params"] += 100  # the program's own array, changed in place
        progress = [r for r in records(events) if r["event"] == "progress"]
        assert [r["step"] for r in progress] == [1, 2, 3, 4, 5, 6]
        assert {r["step"]: r["state_hash"] for r in progress} == reported
        assert [r["loss"] for r in progress] == [step / 2 for step in range(1, 7)]
        # Update 1 is finished at once (no report came before it); 2..5 at the next report;
        # the last at once, as the end needs its hash.
        assert taken_at == {1: 1, 2: 3, 3: 4, 4: 5, 5: 6, 6: 6}

    def test_a_slow_loop_reports_each_update_at_once(self) -> None:
        """Reports further apart than HOLD_S: no event waits for the next update."""
        events = io.StringIO()
        with attached_run(events, steps=3, hash_every=1) as run:
            state = {"params": np.zeros(2, np.float32)}
            written = []
            for step in run.steps(state):
                time.sleep(HOLD_S * 1.2)
                state = {"params": state["params"] + step}
                run.progress(step, state, loss=float(step))
                run.emitter.release()
                written.append(max(r.get("step", 0) for r in records(events)))
        assert written == [1, 2, 3]

    def test_a_donated_state_is_no_verification_point_and_later_ones_are(self) -> None:
        """An update that donates its input deletes the state reported before it could be
        hashed: that event has no hash, and from then on states are hashed when reported."""
        import jax
        import jax.numpy as jnp

        update = jax.jit(lambda state: {"w": state["w"] + 1.0}, donate_argnums=0)
        events = io.StringIO()
        with attached_run(events, steps=5, hash_every=1) as run:
            state = {"w": jnp.zeros(1024)}
            for step in run.steps(state):
                state = update(state)
                run.progress(step, state)
        progress = [r for r in records(events) if r["event"] == "progress"]
        assert [r["step"] for r in progress] == [1, 2, 3, 4, 5]
        unhashed = [r["step"] for r in progress if r["state_hash"] is None]
        assert unhashed == [2]

    def test_a_preemption_writes_the_last_update_before_preempted(self) -> None:
        """Stopped between updates (as SIGTERM does), the update left unfinished is written,
        with its hash, before ``preempted`` names it."""
        events = io.StringIO()

        def preempted_at_4() -> None:
            with attached_run(events, steps=10, hash_every=1) as run:
                state = {"params": np.zeros(2, np.float32)}
                for step in run.steps(state):
                    state = {"params": state["params"] + step}
                    run.progress(step, state, loss=float(step))
                    if step == 4:
                        run.preemption.request("test")

        with pytest.raises(jw.RunEnded):
            preempted_at_4()
        written = [(r["event"], r.get("step")) for r in records(events)]
        progress = [r for r in records(events) if r["event"] == "progress"]
        assert written[-2:] == [("progress", 4), ("preempted", 4)]
        assert [r["step"] for r in progress] == [1, 2, 3, 4]
        assert all(r["state_hash"] for r in progress)
