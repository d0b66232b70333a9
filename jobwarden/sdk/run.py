"""The one step loop: restore, step, report each update's state hash, commit on cadence, stop.

A `Run` is what `jobwarden.sdk.attach` returns; the built-in worker drives one
too.  Entering and leaving it is `jobwarden.sdk.session.Session`'s part.
`Run.restore` selects the newest accepted compatible checkpoint (or
`Run.restored` reports one the program restored itself), `Run.steps` yields
the steps still to run and stops between updates on preemption or a vanished
reader, `Run.progress` reports an update and commits on cadence.  This module
and `jobwarden.statetree` decide what an update's result becomes, so their source
is hashed into every checkpoint's provenance.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from jobwarden import statetree as state_tree
from jobwarden import testfaults
from jobwarden.checkpoint.errors import StepOutOfRange
from jobwarden.checkpoint.format import Manifest, Provenance, leaf_specs
from jobwarden.checkpoint.validate import Expected
from jobwarden.errors import PreemptedExit, ResumePolicyError
from jobwarden.hashing import Leaves
from jobwarden.runtime import release_code_pages_once
from jobwarden.sdk.leaves import HASHED_HERE_BELOW, UsageError, finished, same_tree
from jobwarden.sdk.session import Session
from jobwarden.sdk.stream import HOLD_S
from jobwarden.shards.attach import Place, open_sharded
from jobwarden.shards.commit import ShardCommitter
from jobwarden.shards.hash import ShardedStateHasher, layout_of
from jobwarden.testfaults import Fault


class Run(Session):
    """One attempt of a program's training run; use it as a context manager."""

    _sharded: ShardCommitter | None = None
    """Set by `restore` in every member when the state is laid out over the members."""
    _reported_at = 0.0
    """when the last update was reported (`time.perf_counter`)"""

    # -- restoring ---------------------------------------------------------------------------

    def restore(self, init_state: Any, warmup: Callable[[Any], Any] | None = None) -> Any:
        """The newest accepted compatible checkpoint's state, else ``init_state`` itself.

        ``init_state`` is the complete initial state, any pytree; it fixes the
        tree, shapes and dtypes every checkpoint must have.  Damaged files are
        quarantined and passed over; an incompatible one (another config, data,
        source, runtime or tree) ends the run with its error, with no fallback.

        ``warmup``: called once with a state of the shapes the run starts from,
        to compile the update ahead of the first step (its values must not
        matter): in a spare, on ``init_state`` before the spare waits
        (`jobwarden.sdk.spare`); otherwise on the state restored.
        """
        warmed = self._spare is not None and warmup is not None
        if warmup is not None and warmed:
            warmup(state_tree.unflatten_like(init_state, dict(state_tree.flatten(init_state))))
        self._hand_off()
        state = self._restore(init_state)
        if warmup is not None and not warmed:
            warmup(state)
        return state

    def _restore(self, init_state: Any) -> Any:
        store = self._store
        if self.member.group and layout_of(self._leaves(init_state)):
            return self._restore_sharded(init_state)
        if store is None and self.member.group and not self.member.writes:
            self._before_start("run.restore()")
            return self._share_start(0, init_state, init_state)
        if store is None:
            raise UsageError(
                "run.restore() needs jobwarden's checkpoints; "
                "with checkpoints='external' call run.restored(step, state)"
            )
        self._before_start("run.restore()")
        leaves = self._leaves(init_state)
        self._key_impl = self._key_impl or state_tree.key_impl_of(init_state)
        expected = self.identity.expected(
            leaf_specs(leaves), self.runtime, self.settings.run.steps, self.generation or 0
        )
        self._expected = expected
        policy, directory = self.settings.run.resume, store.directory
        if policy == "never" and store.committed():
            raise ResumePolicyError(
                f"resume = 'never' but {directory} already holds "
                f"{len(store.committed())} checkpoint(s)",
                directory=str(directory),
            )
        selection = store.select(expected)
        self._quarantined = [s.as_record() for s in selection.skipped]
        restored = selection.checkpoint
        if restored is None:
            if policy == "require":
                raise ResumePolicyError(
                    f"resume = 'require' but {directory} holds no checkpoint",
                    directory=str(directory),
                )
            self._started_at(0, restored=False)
            return self._share_start(0, init_state, init_state)
        state = state_tree.unflatten_like(init_state, restored.arrays)
        if testfaults.active(Fault.ZERO_OPT_STATE_ON_RESTORE):
            state = state_tree.zero_opt_state(state)
        manifest = restored.manifest
        self.emit(
            "restored",
            step=manifest.step,
            file=str(restored.path),
            state_hash=manifest.state_hash,
            components=dict(manifest.components),
            checks=list(selection.checks),
            skipped=self._quarantined,
            checksum=restored.checksum,
            writer_generation=manifest.provenance.writer_generation,
        )
        self._started_at(manifest.step, restored=True)
        return self._share_start(manifest.step, state, init_state)

    def _restore_sharded(self, init_state: Any) -> Any:
        """Every member restores its own shards of the newest complete step (`jobwarden.shards`)."""
        self._before_start("run.restore()")
        directory, run = self.settings.checkpoint_dir, self.settings.run
        if directory is None or self.request.checkpoints == "external":
            raise UsageError("a state laid out over the members needs jobwarden's checkpoints")
        self._key_impl = self._key_impl or state_tree.key_impl_of(init_state)

        def expected(leaves: Leaves, generation: int) -> Expected:
            return self.identity.expected(leaf_specs(leaves), self.runtime, run.steps, generation)

        owned = (self._store, self._lock, self.emitter)  # member 0's
        place = Place(directory, self.member, *owned, run.keep_checkpoints, run.resume)
        opened = open_sharded(init_state, self._leaves, expected, place)
        self._state_hash, self._sharded = opened.hasher, opened.committer
        self._expected = opened.expected
        self._quarantined = [s.as_record() for s in opened.restored.skipped]
        if opened.state is not None and self.member.writes:
            self.emit("restored", **opened.event(self._quarantined))
        self._started_at(opened.restored.step, restored=opened.state is not None)
        return init_state if opened.state is None else opened.state

    def _hash_by_boxes(self, state: Any) -> None:
        """Hash a state laid out over the members by its boxes from now on (even external)."""
        if isinstance(self._state_hash, ShardedStateHasher) or not self.member.group:
            return
        if layout := layout_of(self._leaves(state)):
            self._state_hash = ShardedStateHasher(self.member.allgather, layout, self.member.index)

    def _share_start(self, step: int, state: Any, init_state: Any) -> Any:
        """Member 0's start (step and state) in every member of a multi-process job, exact."""
        if not self.member.group:
            return state
        leaves = self._leaves(state)
        shared_step, arrays = self.member.share_start(step, [value for _, value in leaves])
        if not self.member.writes:
            self._started_at(shared_step, restored=shared_step > 0)
        named = {path: array for (path, _), array in zip(leaves, arrays, strict=True)}
        return state_tree.unflatten_like(init_state, named)

    def restored(self, step: int, state: Any, source: str = "") -> None:
        """Report a state the program restored itself (its own checkpointer) at ``step``.

        Nothing is validated: the ``restored`` event says ``checks: []`` and
        ``checkpointer: external``; replay is still verified from the state hashes.
        """
        self._hand_off()
        if self._store is not None:
            raise UsageError("run.restored() is for checkpoints='external'; use run.restore()")
        self._before_start("run.restored()")
        total = self.settings.run.steps
        if not 0 <= step <= total:
            raise StepOutOfRange(
                source or "run.restored()",
                "step",
                step,
                total,
                message=f"restored step {step} is outside 0..{total} (the requested steps)",
            )
        self._hash_by_boxes(state)
        digest, components = self._state_hash(self._leaves(state), step)
        self.emit(
            "restored",
            step=step,
            file=source,
            state_hash=digest,
            components=components,
            checks=[],
            skipped=[],
            checksum=None,
            writer_generation=self.generation,
            checkpointer="external",
        )
        self._started_at(step, restored=True)

    # -- stepping ----------------------------------------------------------------------------

    def steps(self, state: Any) -> Iterator[int]:
        """Yield the steps to run, ``start_step + 1`` .. ``total_steps``; ``state`` is the start.

        Between updates it stops cleanly on SIGTERM or a vanished reader: the
        latest state is committed, ``preempted`` emitted, and leaving the run
        exits 75.  After the last step it emits ``completed``.  Each yielded
        step must be reported with `progress` before the next one is asked for.
        """
        self._hand_off()
        self._hash_by_boxes(state)
        self._begin(state)
        total = self.settings.run.steps
        while self._step < total:
            if self.preemption.requested or self.emitter.broken:
                self._preempt()
                return
            self.faults.before_update(self._step)
            # The update's input is the program's now: let it be freed as soon as the
            # program lets go of it (while the update runs), as a bare loop frees it.
            self._pending, self._state = self._step + 1, None
            self._yielded_at = time.perf_counter()
            yield self._pending
            if self._pending is not None:
                raise UsageError(
                    f"step {self._pending} ended without run.progress({self._pending}, state)"
                )
        self._complete()

    def progress(
        self,
        step: int,
        state: Any,
        loss: Any = None,
        *,
        examples: int = 0,
        metrics: Mapping[str, float] | None = None,
    ) -> None:
        """Report update ``step``, which produced ``state``; commit it when it is due.

        The event carries the state hash (every ``hash_every`` steps, at each commit and
        at the last), so a replay can be verified update by update.  In a fast loop (the
        last report under ``HOLD_S`` ago) the event's loss and hash are taken at the next
        report, while the next update runs (`RunEmitter.emit_next`); a state of
        `HASHED_HERE_BELOW` or more is hashed on the emitter's thread; at a commit, an
        agreement or the end, the hash is made here and the event written at once.  The
        first update lets go of the code pages (`release_code_pages_once`); drill faults
        fire here, after the update.
        """
        if self._pending != step:
            at = "no step" if self._pending is None else f"step {self._pending}"
            raise UsageError(f"run.progress({step}) but the loop yielded {at}")
        reported, self._reported_at = self._reported_at, time.perf_counter()
        elapsed = self._reported_at - self._yielded_at
        self._pending, self._state, self._step = None, state, step
        run = self.settings.run
        on_cadence = step % run.checkpoint_every == 0 or step == run.steps
        due = (self._store is not None or self._sharded is not None) and on_cadence
        agree = self.member.group and on_cadence  # every member proves the committed state
        now = due or agree or step == run.steps  # the hash is needed before this returns
        if isinstance(self._state_hash, ShardedStateHasher):  # a collective: every member, here
            now = now or step % run.hash_every == 0
        hashes = not now and step % run.hash_every == 0
        snapshot = self._named(state) if hashes else None
        later = snapshot is not None and snapshot.nbytes >= HASHED_HERE_BELOW
        fields: dict[str, Any] = {"state_hash": None}
        if metrics:
            fields["metrics"] = {name: float(value) for name, value in metrics.items()}
        event = {"step": step, "loss": None, "examples": examples, "update_s": elapsed}
        fast = not now and not later and self._reported_at - reported < HOLD_S
        if fast:
            self.emitter.finish_next()  # the last update's: was its state donated since?
        if fast and (self._flatten is None or not self._flatten.donations):
            # A fast loop: this update's loss and hash are taken at the next report, while
            # the next update runs, instead of waiting for this one to end.
            finish = functools.partial(finished, loss, snapshot, self._state_hash, step)
            self.emitter.emit_next("progress", finish, **event, **fields)
            self.faults.after_update(step)
            return
        leaves: Leaves | None = None
        hashed: tuple[str, dict[str, str]] | None = None
        if now:
            leaves = self._leaves(state)
            hashed = self._state_hash(leaves, step)
        elif snapshot is not None and not later:
            hashed = snapshot.hash(self._state_hash, step)
        if hashed is not None:
            fields = {**fields, "state_hash": hashed[0], "components": hashed[1]}
            self._hashed = (step, *hashed)
        if due:  # the supervisor watches the commit that follows as a phase of its own
            fields["commit"] = "background" if run.async_commit else "sync"
        event = {**event, "loss": None if loss is None else float(loss), **fields}
        if later and snapshot is not None:
            fields_later = functools.partial(snapshot.fields, self._state_hash, step)
            self.emitter.emit_later("progress", fields_later, **event)
        elif leaves is not None:  # evidence: written at once
            self.emitter.emit("progress", **event)
        else:  # may share a later write
            self.emitter.emit_held("progress", **event)
        if self.emitter.broken:
            return  # the loop commits this step and stops before the next update
        if agree:
            self.member.agree(step, self._hashed[1])
        if due:
            self._commit(step, leaves)
        if step == self.start_step + 1:  # what a crash's exit would have to free
            release_code_pages_once(wait=False)
        self.faults.after_update(step)

    # -- ending ------------------------------------------------------------------------------

    def _preempt(self) -> None:
        self.emitter.drain()  # the hashes still being computed are written, and then it is seen
        gone = self.emitter.broken
        self._settle()  # the commit in flight is durable before the last one is made
        sharded = self._sharded is not None  # a commit is a collective the others may not join
        if (
            self._store is not None
            and self._step > 0
            and self._committed != self._step
            and not sharded
        ):
            self._commit(self._step, None, report=not gone, now=True)
        if gone:
            self.stderr(f"jobwarden: stdout is gone; committed step {self._step} and exiting\n")
        else:
            self.emit("preempted", step=self._step, reason=self.preemption.reason)
        self._status = PreemptedExit.exit_status

    def _complete(self) -> None:
        self.emitter.drain()  # raises a background hash's error, if there was one
        self._settle()  # completed names the last durable file
        step = self._step
        if self._hashed[0] == step:
            _, digest, components = self._hashed
        else:
            digest, components = self._state_hash(self._leaves(self._state), step)
        committed = self._store.committed() if self._store is not None else []
        last = self._sharded.last_record if self._sharded is not None else None
        self.emit(
            "completed",
            step=step,
            state_hash=digest,
            components=components,
            file=str(last or (committed[-1][1] if committed else "")),
        )
        self.completed = True

    def _commit(
        self, step: int, leaves: Leaves | None, report: bool = True, now: bool = False
    ) -> None:
        """Commit the state at ``step`` (`jobwarden.sdk.commits`); ``now``: durable on return."""
        store, expected = self._store, self._expected
        if (store is None and self._sharded is None) or expected is None:
            raise UsageError("run.restore(init_state) must come before the first update")
        if leaves is None:
            leaves = self._leaves(self._state)
        if self._hashed[0] == step:  # hashed for the progress event: the same leaves
            _, digest, components = self._hashed
        else:
            digest, components = self._state_hash(leaves, step)
        specs = leaf_specs(leaves)
        same_tree(specs, expected)
        manifest = Manifest(
            task=expected.task,
            job_id=self.identity.job_id,
            step=step,
            key_impl=self._key_impl,
            leaves=specs,
            train=expected.train,
            provenance=Provenance(
                config_hash=expected.config_hash,
                data_hash=expected.data_hash,
                source_hash=expected.source_hash,
                runtime=expected.runtime,
                writer_generation=expected.generation,
            ),
            state_hash=digest,
            components=components,
            created=time.time(),
        )
        if self._sharded is not None:  # every member its own shards, member 0 the record
            self._sharded.commit(
                step, manifest, leaves, self.faults.commit_hook(step), report=report
            )
            self._committed = step
            return
        committer = self._committer
        if committer is None:
            raise UsageError("run.restore(init_state) must come before the first update")
        hook = self.faults.commit_hook(step)
        committer.commit(step, manifest, leaves, hook, report=report, now=now)
        if now or committer.background is None:
            self._committed = step
