"""SIGINT (Ctrl-C) and SIGTERM (a scheduler's preemption) during training.

While `StopRequest.catching()` holds, the first of these signals only records itself:
the training loop asks `at_boundary(step)` after each step, saves that step's
checkpoint when it says stop, waits for it to be on disk (no `*.orbax-checkpoint-tmp`
left) and raises `errors.Interrupted`, one line with exit status 130 / 143.

Several processes (`jax.distributed`): the signal reaches the hosts seconds apart, or
only some of them, and a host that stops alone leaves the others waiting in the next
collective. The step to stop at is agreed through JAX's preemption sync manager (the
distributed runtime's coordination service, `multihost_utils.reached_preemption_sync_point`):
a SIGTERM to any process is its preemption notice (the runtime's own handler catches
it; this module leaves SIGTERM to it), a SIGINT is forwarded to that handler as one.
The runtime takes the furthest process's boundary count + 1 as the stop boundary and
`at_boundary` is True there on every process, so all save the same step together and
exit. Between two notices nothing crosses the network: the per-boundary check is a
mutex and a compare in the runtime (see benchmarks/scale/preemption.py).

A second SIGINT stops the process at once (KeyboardInterrupt), for a step or an
evaluation that takes too long; with several processes the others then see a lost
process (`avtext.train.hosts`).
"""
import contextlib
import os
import signal
import threading
from typing import Iterator

from absl import logging
import jax
from jax.experimental import multihost_utils

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
  """The signal received while catching (`signum`, None before any) and, after each
  `at_boundary`, whether the run stops there (`requested`)."""

  def __init__(self, *, shared: bool | None = None):
    # shared: the processes agree on the stop step (default: more than one process).
    self.shared = jax.process_count() > 1 if shared is None else shared
    self.signum: int | None = None
    self._agreed = False
    self._boundaries = 0

  @property
  def requested(self) -> bool:
    """One process: a signal came (checked live, so an evaluation that outlasts it
    is followed by the stop). Several: the last `at_boundary` said stop."""
    return self._agreed if self.shared else self.signum is not None

  def at_boundary(self, step: int) -> bool:
    """Whether to stop at this step boundary: called once at every boundary (the step
    training resumes from, then after each step), on every process alike."""
    if not self.shared:
      return self.requested
    self._boundaries += 1  # the runtime's counter: equal on every process at a boundary
    if not self._agreed and multihost_utils.reached_preemption_sync_point(self._boundaries):
      self._agreed = True
      logging.warning("every process stops at step %d, saving it: a preemption notice "
                      "(SIGTERM or SIGINT to one of the processes)", step)
    return self._agreed

  def note_finished(self) -> None:
    """The run finished, its last evaluations included: if a signal came meanwhile
    (during the final evaluation), says that it changed nothing."""
    if self.requested or self.signum is not None:
      logging.warning("%s received during the final evaluation: the run finished, its "
                      "results are written", signal.Signals(self.exit_signal()).name)

  def exit_signal(self) -> int:
    """The signal the exit status reports: this process's, else SIGTERM (a notice that
    reached another process)."""
    return self.signum if self.signum is not None else signal.SIGTERM

  def _handle(self, signum, frame) -> None:
    del frame
    if self.signum is not None:
      raise KeyboardInterrupt
    self.signum = signum
    name = signal.Signals(signum).name
    if self.shared:
      logging.warning("%s received: every process stops at the step they agree on, with "
                      "its checkpoint saved (SIGINT again to stop this process at once)", name)
      os.kill(os.getpid(), signal.SIGTERM)  # the runtime's preemption notice
    else:
      logging.warning("%s received: stopping after this step with its checkpoint saved "
                      "(again to stop at once)", name)

  @contextlib.contextmanager
  def catching(self) -> Iterator["StopRequest"]:
    """Handles SIGINT and SIGTERM (SIGINT only when shared) for the `with` block (the
    main thread only: Python delivers signals there; elsewhere the handlers stay as
    they are)."""
    if threading.current_thread() is not threading.main_thread():
      yield self
      return
    caught = (signal.SIGINT,) if self.shared else SIGNALS
    previous = {s: signal.signal(s, self._handle) for s in caught}
    try:
      yield self
    finally:
      for s, handler in previous.items():
        # None: a handler not installed from Python (the runtime's); the default then.
        signal.signal(s, signal.SIG_DFL if handler is None else handler)
