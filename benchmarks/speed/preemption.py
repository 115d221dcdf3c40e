r"""Preemption of a multi-process run: what the stop agreement costs and how fast it ends.

    python -m benchmarks.speed.preemption [--calls=20000] [--out=workdirs/bench/preemption]

Two `python -m avtext.main --distributed` processes on this machine (CPU, gloo, 2 fake
devices each), as tests/test_train_multihost.py launches them:

  agreement  two processes joined by jax.distributed call
             multihost_utils.reached_preemption_sync_point --calls times, as the training
             loop does once per step boundary (avtext.train.stop): microseconds per call
  sigterm    configs/videocc_avr.py:tiny, SIGTERM to process 1 once step 3 is logged:
             seconds from the signal to the last exit (both save the agreed step)
  sigkill    the same run, SIGKILL to process 1 at step 3: seconds to process 0's exit
             (one line naming process 1)
  startup    seconds from launch to step 1 of the 2-process run, with a warm compilation
             cache directory and with AVTEXT_COMPILATION_CACHE=off: a multi-process CPU run
             compiles without the cache (avtext.train.hosts), so the two are alike

--quick: 2,000 calls and the agreement only.
"""
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

from absl import flags

from benchmarks import common

_CALLS = flags.DEFINE_integer("calls", 20000, "agreement calls timed per process")
_WORKER = flags.DEFINE_integer("worker", None, "internal: the agreement worker's process id")
_PORT = flags.DEFINE_integer("port", None, "internal: the coordinator's port")
SYSTEM = "Paper configs at scale"
TABLE = "Preemption of a 2-process CPU run (tiny AVR config, 2 fake devices per process)"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _cpu_env(cache: str) -> dict:
  return dict(os.environ, JAX_PLATFORMS="cpu", AVTEXT_COMPILATION_CACHE=cache,
              XLA_FLAGS="--xla_force_host_platform_device_count=2")


def _agreement_worker() -> None:
  """One of the two processes: microseconds per reached_preemption_sync_point call."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  jax.distributed.initialize(coordinator_address=f"localhost:{_PORT.value}",
                             num_processes=2, process_id=_WORKER.value)
  calls = _CALLS.value
  start = time.perf_counter()
  for k in range(1, calls + 1):
    assert not multihost_utils.reached_preemption_sync_point(k)
  print(f"us_per_call={(time.perf_counter() - start) / calls * 1e6:.3f}", flush=True)


def agreement_us(calls: int) -> float:
  port = _free_port()
  procs = [subprocess.Popen(common.child(f"--worker={i}", f"--port={port}",
                                         f"--calls={calls}", "--results="),
                            cwd=common.REPO, env=_cpu_env("off"), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
           for i in range(2)]
  outs = [proc.communicate(timeout=300)[0] for proc in procs]
  values = [float(line.split("=")[1]) for out in outs for line in out.splitlines()
            if line.startswith("us_per_call=")]
  assert len(values) == 2, outs
  return max(values)


class _Pair:
  """Two processes of the tiny AVR config; logs in `out`."""

  def __init__(self, workdir: pathlib.Path, cache: str, *extra: str):
    address = f"--coordinator_address=localhost:{_free_port()}"
    self.logs = [workdir.parent / f"{workdir.name}_{i}.log" for i in range(2)]
    self.start = time.monotonic()
    self.procs = []
    for i, log in enumerate(self.logs):
      cmd = [sys.executable, "-m", "avtext.main", "--config=configs/videocc_avr.py:tiny",
             f"--workdir={workdir}", "--config.train.num_steps=8",
             "--config.train.log_every_steps=1", "--config.train.batch_size=8",
             "--config.train.checkpoint_every_steps=2", "--distributed", address,
             "--num_processes=2", f"--process_id={i}", "--heartbeat_timeout_seconds=10",
             *extra]
      with open(log, "w") as out:
        self.procs.append(subprocess.Popen(cmd, cwd=common.REPO, env=_cpu_env(cache),
                                           stdout=out, stderr=subprocess.STDOUT))

  def at_step(self, step: int) -> float:
    """Seconds from launch until process 0 logged `step`."""
    while f"] [{step}] " not in self.logs[0].read_text():
      if any(p.poll() is not None for p in self.procs):
        raise RuntimeError(self.logs[0].read_text()[-3000:])
      time.sleep(0.05)
    return time.monotonic() - self.start

  def exited(self, procs, timeout_s: float = 300) -> float:
    """Seconds until the last of `procs` exited."""
    for proc in procs:
      proc.wait(timeout=timeout_s)
    return time.monotonic()

  def kill(self) -> None:
    for proc in self.procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()


def stop_seconds(out: pathlib.Path, cache: str, how: str) -> float:
  pair = _Pair(out / how, cache)
  try:
    pair.at_step(3)
    sent = time.monotonic()
    if how == "sigterm":
      pair.procs[1].send_signal(signal.SIGTERM)
      return pair.exited(pair.procs) - sent
    pair.procs[1].kill()
    return pair.exited(pair.procs[:1]) - sent
  finally:
    pair.kill()


def startup_seconds(out: pathlib.Path, cache: str, name: str) -> float:
  pair = _Pair(out / name, cache)
  try:
    return pair.at_step(1)
  finally:
    pair.kill()


def main(argv):
  del argv
  if _WORKER.value is not None:
    _agreement_worker()
    return
  out = common.out_dir().absolute()
  calls = 2000 if common.quick() else _CALLS.value
  rows = {"agreement per step boundary": (agreement_us(calls), "us")}
  if not common.quick():
    cache = str(out / "jax_cache")
    for name in ("sigterm", "sigkill"):
      subprocess.run(["rm", "-rf", str(out / name)], check=True)
    rows["SIGTERM to process 1 -> last exit"] = (stop_seconds(out, cache, "sigterm"), "s")
    rows["SIGKILL of process 1 -> exit of process 0"] = (
        stop_seconds(out, cache, "sigkill"), "s")
    starts = {}
    for name, cache_dir in (("warm cache", cache), ("cache off", "off")):
      subprocess.run(["rm", "-rf", str(out / name.replace(" ", "_"))], check=True)
      starts[name] = startup_seconds(out, cache_dir, name.replace(" ", "_"))
      rows[f"launch -> step 1, {name}"] = (starts[name], "s")
  for metric, (value, unit) in rows.items():
    print(f"{metric}: {value:.3g} {unit}", flush=True)
    common.record(SYSTEM, metric, value, unit=unit, table=TABLE, digits=3)


if __name__ == "__main__":
  common.main(main)
