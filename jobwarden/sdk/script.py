"""The run without a ``with`` block: entered at once, left by `ScriptRun.close` or at exit.

A script or notebook written top to bottom gets `jobwarden.sdk.start` instead of
re-indenting everything under ``with jw.attach(...)``.  What the block's end
does is done here at three other places, so the exit statuses stay those of
docs/worker.md:

* an error of the SDK's own (a ``fail_after`` drill, a refused checkpoint, a
  misuse) ends the run in the call that raised it: ``failed`` is emitted, the
  run is left, and `RunEnded` (a `SystemExit`) carries the status out of the
  script, so exit handlers run as usual;
* any other exception escaping the script is reported by a hook on
  `sys.excepthook`: its traceback on stderr, ``failed`` (``worker.internal``),
  and the process exits 70 (a `SystemExit` raised by the hook sets the status);
* `ScriptRun.close` (or, failing that, the exit handler) leaves the run as the
  end of the block would: 75 after a preemption, else the script's own status.
  An exit handler cannot change the status, so one that finds a preempted run
  ends the process with ``os._exit(75)`` after flushing stdout and stderr:
  call ``run.close()`` at the end to keep the other exit handlers.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any

from jobwarden.errors import JobwardenError
from jobwarden.sdk.run import Run
from jobwarden.sdk.session import Phase, RunEnded


class ScriptRun(Run):
    """A `Run` entered by `jobwarden.sdk.start`: no ``with`` block, closed by `close` or at exit."""

    _hooked: Any = None

    def open(self) -> ScriptRun:
        """Enter the run now (a refusal raises `RunEnded`) and arrange its end at exit."""
        self.__enter__()
        atexit.register(self._at_exit)
        self._hooked = sys.excepthook
        sys.excepthook = self._on_uncaught
        return self

    def close(self) -> None:
        """Leave the run as the end of a ``with`` block would; `RunEnded` unless it may end 0.

        Waits for a commit in flight (and a checkpointer given to
        `Run.checkpointer`); raises `RunEnded` with 75 after a preemption.
        Closing twice does nothing.
        """
        self._leave(None)

    def _leave(self, error: BaseException | None) -> None:
        if self._phase is Phase.CLOSED:
            return
        atexit.unregister(self._at_exit)
        if sys.excepthook == self._on_uncaught:
            sys.excepthook = self._hooked
        trace = None if error is None else error.__traceback__
        self.__exit__(None if error is None else type(error), error, trace)

    @contextlib.contextmanager
    def _ends_on_error(self) -> Iterator[None]:
        """An SDK error ends the run where it is raised, as leaving the block would."""
        try:
            yield
        except JobwardenError as error:
            self._leave(error)
            raise  # not reached: leaving with an SDK error raises RunEnded

    def restore(self, init_state: Any, warmup: Callable[[Any], Any] | None = None) -> Any:
        """`Run.restore`; a refusal ends the process with its status."""
        with self._ends_on_error():
            return super().restore(init_state, warmup)

    def restored(self, step: int, state: Any, source: str = "") -> None:
        """`Run.restored`; a refusal ends the process with its status."""
        with self._ends_on_error():
            super().restored(step, state, source)

    def steps(self, state: Any) -> Iterator[int]:
        """`Run.steps`; an SDK error between updates ends the process with its status."""
        loop = super().steps(state)
        while True:
            with self._ends_on_error():
                step = next(loop, None)
            if step is None:
                return
            yield step

    def progress(
        self,
        step: int,
        state: Any,
        loss: Any = None,
        *,
        examples: int = 0,
        metrics: Mapping[str, float] | None = None,
    ) -> None:
        """`Run.progress`; a drill's ``fail_after`` or a failed commit ends the process here."""
        with self._ends_on_error():
            super().progress(step, state, loss, examples=examples, metrics=metrics)

    def _on_uncaught(
        self, kind: type[BaseException], error: BaseException, trace: TracebackType | None
    ) -> None:
        """The script died of ``error``: the usual traceback, then ``failed`` and its status."""
        if isinstance(error, Exception):  # its traceback goes to stderr with the failed event
            self._leave(error.with_traceback(trace))  # raises RunEnded: Python exits with it
            return
        previous = self._hooked or sys.__excepthook__
        previous(kind, error, trace)  # KeyboardInterrupt: the program's own way out
        self._leave(error)

    def _at_exit(self) -> None:
        """The interpreter is exiting with the run still open (no `close`)."""
        try:
            self._leave(None)
        except RunEnded as ended:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(ended.exit_status)
