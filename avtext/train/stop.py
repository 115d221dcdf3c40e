"""SIGINT (Ctrl-C) and SIGTERM (a scheduler's preemption) during training.

While `StopRequest.catching()` holds, the first of these signals only records itself:
the training loop checks `requested` at each step boundary, saves that step's
checkpoint, waits for it to be on disk (no `*.orbax-checkpoint-tmp` left) and raises
`errors.Interrupted`, one line with exit status 130 / 143. A second signal stops at
once (KeyboardInterrupt), for a step or an evaluation that takes too long.
"""
import contextlib
import signal
import threading
from typing import Iterator

from absl import logging

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
  """The signal received while catching (`signum`, None before any)."""

  def __init__(self):
    self.signum: int | None = None

  @property
  def requested(self) -> bool:
    return self.signum is not None

  def _handle(self, signum, frame) -> None:
    del frame
    if self.signum is not None:
      raise KeyboardInterrupt
    self.signum = signum
    logging.warning("%s received: stopping after this step with its checkpoint saved "
                    "(again to stop at once)", signal.Signals(signum).name)

  @contextlib.contextmanager
  def catching(self) -> Iterator["StopRequest"]:
    """Handles SIGINT and SIGTERM for the `with` block (the main thread only: Python
    delivers signals there; elsewhere the handlers stay as they are)."""
    if threading.current_thread() is not threading.main_thread():
      yield self
      return
    previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
    try:
      yield self
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)
