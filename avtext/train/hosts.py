"""Several processes (`--distributed`): joining the job, and a process that is lost.

`initialize` joins the job through `jax.distributed.initialize` (the coordination
service of process 0) with the service's heartbeat timeout, and keeps the persistent
compilation cache from mixing programs on the CPU backend (below).

A process that dies (SIGKILL, an out-of-memory kill, a lost machine) leaves its peers
in their next collective. On the CPU (gloo) that collective fails as soon as the dead
process's connections close; `lost(error)` turns the failure into `errors.ProcessLost`,
one line naming the processes that did not answer, and `avtext.cli.run` exits at once,
without JAX's shutdown barrier (which would wait for the dead process until the
heartbeat timeout and then abort every survivor with a stack). Where a collective
hangs instead of failing (accelerators), the service's heartbeat timeout ends the
survivors: JAX's own fatal error, naming the unhealthy task, within
`--heartbeat_timeout_seconds`.

The compilation cache on the CPU: the key of a multi-process CPU program includes the
process's own device topology, so process k > 0 never finds an entry (and JAX writes
entries from process 0 only); a relaunch then runs process 0's cached executables
against programs the other processes compile afresh, and the two disagree in their
collectives (gloo: "Received data size doesn't match expected size"). A multi-process
CPU run therefore compiles without the persistent cache: every process compiles anyway
(process 0 was only ever waiting for the others), see BENCHMARKS.md.
"""
import re
import time

from absl import logging
import jax

from avtext import errors

JAX_HEARTBEAT_TIMEOUT_S = 100  # jax.distributed.initialize's default
ANSWER_WAIT_S = 5  # how long the survivors of a failed collective wait for each other
_ALIVE_KEY = "avtext/alive/"
# What a collective or the distributed runtime says when a peer went away (gloo's TCP
# pairs, gRPC to the coordination service).
PEER_FAILURE = re.compile(r"closed by peer|reset by peer|Broken pipe|Socket closed|"
                          r"heartbeat|UNAVAILABLE|Connection refused", re.IGNORECASE)


def initialize(*, coordinator_address: str | None, num_processes: int | None,
               process_id: int | None, local_device_ids: list[int] | None,
               heartbeat_timeout_s: int | None = None) -> None:
  """jax.distributed.initialize; the cluster's arguments left None are read from its
  environment (TPU VM, SLURM, Open MPI); heartbeat_timeout_s None: JAX's default."""
  # Cross-process collectives on the CPU backend (fake-device tests, CPU clusters);
  # accelerator backends ignore this setting.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(
      coordinator_address=coordinator_address, num_processes=num_processes,
      process_id=process_id, local_device_ids=local_device_ids,
      heartbeat_timeout_seconds=heartbeat_timeout_s or JAX_HEARTBEAT_TIMEOUT_S)
  if jax.process_count() > 1 and jax.default_backend() == "cpu":
    jax.config.update("jax_enable_compilation_cache", False)
    logging.info("several CPU processes: the persistent compilation cache is off "
                 "(avtext.train.hosts)")


def _client():
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  return distributed.global_state.client


def answering_processes(wait_s: float = ANSWER_WAIT_S) -> list[int]:
  """The processes that say they are alive within `wait_s` (each survivor of a failed
  collective calls this), through the coordination service's key-value store; [] when
  the service itself is gone (process 0, which runs it, was lost)."""
  client, count = _client(), jax.process_count()
  try:
    client.key_value_set(f"{_ALIVE_KEY}{jax.process_index()}", "1")
    deadline = time.monotonic() + wait_s
    while True:
      alive = sorted(int(key.rsplit("/", 1)[1])
                     for key, _ in client.key_value_dir_get(_ALIVE_KEY))
      if len(alive) == count or time.monotonic() > deadline:
        return alive
      time.sleep(0.2)
  except Exception:  # pylint: disable=broad-except
    return []


def lost(error: Exception, *, kept: str) -> errors.ProcessLost | None:
  """`error` (raised by a collective, or by an evaluator that met one) as a ProcessLost
  naming the processes that do not answer; None with one process, for an error that is
  no peer's failure, or when every process answers (then it is raised as it is)."""
  count = jax.process_count()
  if count == 1 or not PEER_FAILURE.search(str(error)):
    return None  # e.g. this process ran out of memory: its own error, as it is
  logging.warning("a collective failed (%s); waiting %d s for the other processes to "
                  "answer", " ".join(str(error).split())[:200], ANSWER_WAIT_S)
  alive = answering_processes()
  if len(alive) == count:
    _client().key_value_delete(f"{_ALIVE_KEY}{jax.process_index()}")
    return None
  gone = [p for p in range(count) if p not in alive] if alive else [0]
  names = ", ".join(f"process {p}" + (" (the coordinator)" if p == 0 else "")
                    for p in gone)
  return errors.ProcessLost(
      f"{names} of {count} {'was' if len(gone) == 1 else 'were'} lost (killed, or its "
      f"machine went away); {kept}: relaunch the same command on every host to resume")
