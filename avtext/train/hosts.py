"""Several processes (`--distributed`): joining the job, and a process that is lost.

`initialize` joins the job through `jax.distributed.initialize` (the coordination
service of process 0) and starts the `Watchdog`.

A process that dies (SIGKILL, an out-of-memory kill, a lost machine) leaves its peers
waiting: in a collective (on the CPU, gloo's fails as soon as the dead process's
connections close), or in a barrier of the coordination service (orbax's, during a
checkpoint save), which waits until the service's heartbeat timeout and then aborts
every survivor with JAX's fatal error and a C++ stack. The runtime offers no way to
hear of the death first from Python (its missed-heartbeat callback cannot be set from
Python in this jaxlib), so each process's watchdog thread beats in the service's
key-value store every second and watches the others' beats: a process whose beat stops
for `stale_s` (a third of the heartbeat timeout, 5-30 s) is lost, and every survivor
prints one line naming it and exits at once (status 1), without JAX's
shutdown barrier, which would wait for the dead process. A collective that fails on a
peer (`lost`) waits for the watchdog's verdict. When process 0 is the one lost, the
service goes with it and JAX's own fatal error usually ends the others first (within a
second).

The compilation cache on the CPU: the key of a multi-process CPU program includes the
process's own device topology (the "accelerator_config" part of JAX's key differs
between processes for the same program), so process k > 0 never finds an entry, and JAX
writes entries from process 0 only; a relaunch then runs process 0's cached executables
beside programs the other processes compile afresh, and the two disagree in their
collectives (gloo: "Received data size doesn't match expected size"). A multi-process
CPU run therefore compiles without the persistent cache: every process compiles anyway,
and process 0 was only ever waiting for the others.
"""
import atexit
import re
import sys
import threading
import time
from typing import Callable

from absl import logging
import jax

JAX_HEARTBEAT_TIMEOUT_S = 100  # jax.distributed.initialize's default
BEAT_S = 1.0  # a watchdog's beat and look
_BEAT_KEY = "avtext/beat/"
_DONE = "done"  # a process leaving normally: never lost
# What a collective or the distributed runtime says when a peer went away (gloo's TCP
# pairs, gRPC to the coordination service).
PEER_FAILURE = re.compile(r"closed by peer|reset by peer|Broken pipe|Socket closed|"
                          r"heartbeat|UNAVAILABLE|Connection refused", re.IGNORECASE)


def initialize(*, coordinator_address: str | None, num_processes: int | None,
               process_id: int | None, local_device_ids: list[int] | None,
               heartbeat_timeout_s: int | None = None) -> None:
  """jax.distributed.initialize, then the watchdog; the cluster's arguments left None are
  read from its environment (TPU VM, SLURM, Open MPI); heartbeat_timeout_s None: JAX's
  default."""
  heartbeat_timeout_s = heartbeat_timeout_s or JAX_HEARTBEAT_TIMEOUT_S
  # Cross-process collectives on the CPU backend (fake-device tests, CPU clusters);
  # accelerator backends ignore this setting.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(
      coordinator_address=coordinator_address, num_processes=num_processes,
      process_id=process_id, local_device_ids=local_device_ids,
      heartbeat_timeout_seconds=heartbeat_timeout_s)
  if jax.process_count() > 1 and jax.default_backend() == "cpu":
    jax.config.update("jax_enable_compilation_cache", False)
  if jax.process_count() > 1:
    Watchdog(_client(), jax.process_index(), jax.process_count(),
             stale_s=min(30.0, max(5.0, heartbeat_timeout_s / 3))).start()


def _client():
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  return distributed.global_state.client


def _exit_lost(message: str) -> None:
  """One line on stderr and out with status 1, without atexit handlers."""
  from avtext import cli  # pylint: disable=g-import-not-at-top
  print(f"error: {message}", file=sys.stderr)
  cli.exit_now(1)


def watch_checkpoints(latest_step: Callable[[], int | None]) -> None:
  """The run's latest checkpoint step, for the lost-process line (no-op alone)."""
  if Watchdog.running is not None:
    Watchdog.running.last_checkpoint = latest_step


class Watchdog:
  """Beats in the coordination service's key-value store; a peer whose beat stops for
  `stale_s` is lost: prints `message(lost)` and exits the process (`exit_fn`)."""
  running: "Watchdog | None" = None  # this process's

  def __init__(self, client, index: int, count: int, *, stale_s: float,
               exit_fn: Callable[[str], None] = _exit_lost):
    self.client, self.index, self.count, self.stale_s = client, index, count, stale_s
    self.exit_fn = exit_fn
    self.last_checkpoint: Callable[[], int | None] = lambda: None  # the trainer's
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name="avtext-watchdog", daemon=True)

  def start(self) -> None:
    Watchdog.running = self
    self._thread.start()
    atexit.register(self.stop)  # before JAX's shutdown (atexit runs in reverse order)

  def stop(self) -> None:
    """A normal exit: the peers will not take this process for lost."""
    if not self._stop.is_set():
      self._stop.set()
      self._thread.join()
      try:
        self.client.key_value_set(f"{_BEAT_KEY}{self.index}", _DONE, allow_overwrite=True)
      except Exception:  # pylint: disable=broad-except
        pass

  def message(self, lost: list[int]) -> str:
    names = ", ".join(f"process {p}" + (" (the coordinator)" if p == 0 else "")
                      for p in lost)
    step = self.last_checkpoint()
    kept = (f"checkpoint {step} is the last on disk" if step is not None
            else "no checkpoint was written yet")
    return (f"{names} of {self.count} {'was' if len(lost) == 1 else 'were'} lost (killed, "
            f"or its machine went away); {kept}: relaunch the same command on every host "
            "to resume")

  def look(self, beat: int, seen: dict[int, tuple[str, float]], now: float) -> list[int]:
    """Beats once and reads the others' beats into `seen` ({process: (beat, when it
    changed)}); the lost processes ([0] when the service is gone)."""
    try:
      self.client.key_value_set(f"{_BEAT_KEY}{self.index}", str(beat), allow_overwrite=True)
      beats = dict(self.client.key_value_dir_get(_BEAT_KEY))
    except Exception:  # pylint: disable=broad-except
      return [] if self._stop.is_set() else [0]
    lost = []
    for p in range(self.count):
      value = beats.get(f"{_BEAT_KEY}{p}")
      if p == self.index or value == _DONE:
        continue
      if p not in seen or seen[p][0] != value:
        seen[p] = (value, now)
      elif now - seen[p][1] > self.stale_s:
        lost.append(p)
    return lost

  def _run(self) -> None:
    seen: dict[int, tuple[str, float]] = {}
    beat = 0
    while not self._stop.wait(BEAT_S):
      beat += 1
      lost = self.look(beat, seen, time.monotonic())
      if lost and not self._stop.is_set():
        self.exit_fn(self.message(lost))
        return


def lost(error: BaseException) -> None:
  """After `error` (a failed collective, or an evaluator that met one): when it says a
  peer went away, waits for the watchdog's verdict (which exits the process); returns
  when there is none (then `error` is raised as it is: e.g. this process's own
  out-of-memory)."""
  watchdog = Watchdog.running
  if watchdog is None or not PEER_FAILURE.search(str(error)):
    return
  logging.warning("a collective failed (%s); waiting up to %d s for the lost process to "
                  "be named", " ".join(str(error).split())[:200], watchdog.stale_s + 3)
  time.sleep(watchdog.stale_s + 3)
