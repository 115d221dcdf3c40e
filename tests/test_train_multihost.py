"""Multi-process training: the input pipeline's global batches and a 2-process run.

The 2-process run is two `python -m avtext.main --distributed` processes on
this machine (CPU, gloo collectives), each with 2 fake devices; it must train
like one process with 4 devices (to 1e-5), and its checkpoints must resume in one.

Preemption (docs/scale.md): SIGTERM to one process or to both apart, SIGINT during the
final evaluation, SIGKILL of one process. Each ends with both processes gone within a
bound, one agreed checkpoint on disk, and a relaunch (the compilation cache directory
shared by every pair) that finishes with the losses and parameters of a run never
stopped.
"""
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

import grain
import jax
import numpy as np
import pytest

from avtext import runs
from avtext.data import builders
from avtext.data import pipelines
from avtext.text import tokenizers

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from configs import videocc_avr  # pylint: disable=g-import-not-at-top,wrong-import-position

TIMEOUT_S = 600  # per run; generous because the test machine is shared


def _tiny_examples():
  config = videocc_avr.get_config("tiny")
  source = builders.get_source(config.dataset, "train")
  examples = pipelines.ClipExamples(
      pipelines.ClipReader(source), config.data,
      tokenizers.Tokenizer(max_len=config.data.max_text_len), train=True)
  return len(source), examples


def _pipeline_before_multihost(num_examples, example_fn, *, batch_size, seed):
  """`train_batches` as it was before global batches (process_count=1 case)."""
  ds = grain.MapDataset.range(num_examples)[0::1]
  ds = ds.seed(seed).shuffle().repeat()
  return ds.random_map(example_fn).batch(batch_size, drop_remainder=True)


def _assert_same_bytes(a: dict, b: dict):
  assert sorted(a) == sorted(b)
  for key in a:
    x, y = np.asarray(a[key]), np.asarray(b[key])
    assert (x.dtype, x.shape) == (y.dtype, y.shape), key
    assert x.tobytes() == y.tobytes(), key


def test_one_process_batches_are_unchanged():
  n, examples = _tiny_examples()
  old = _pipeline_before_multihost(n, examples, batch_size=8, seed=0)
  new = pipelines.train_batches(n, examples, batch_size=8, seed=0)
  for k in range(3):
    _assert_same_bytes(old[k], new[k])


@pytest.mark.parametrize("process_count", [2, 4])
def test_process_slices_concatenate_to_the_global_batch(process_count):
  n, examples = _tiny_examples()
  whole = pipelines.train_batches(n, examples, batch_size=8, seed=0)
  local = 8 // process_count
  parts = [pipelines.train_batches(n, examples, batch_size=local, seed=0, process_index=p,
                                   process_count=process_count) for p in range(process_count)]
  for k in (0, 1, 32):  # 32: the second epoch of 256 clips
    joined = {key: np.concatenate([part[k][key] for part in parts]) for key in whole[k]}
    _assert_same_bytes(whole[k], joined)


def test_iterator_state_is_the_global_batch_position():
  fn = lambda i, rng: {"i": np.int64(i), "r": rng.integers(1 << 30)}
  read = grain.ReadOptions(num_threads=1)
  whole = iter(pipelines.train_batches(40, fn, batch_size=4, seed=5).to_iter_dataset(read))
  for _ in range(3):
    next(whole)
  state = whole.get_state()
  # A checkpoint of a 1-process run resumes in 2 processes at the same global batch.
  halves = []
  for p in range(2):
    it = iter(pipelines.train_batches(40, fn, batch_size=2, seed=5, process_index=p,
                                      process_count=2).to_iter_dataset(read))
    it.set_state(state)
    halves.append(next(it))
  expected = next(whole)
  for key in expected:
    np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), expected[key])
  with pytest.raises(ValueError, match="fewer than one batch of 8 .2 process"):
    pipelines.train_batches(7, fn, batch_size=4, seed=0, process_index=1, process_count=2)


# ---- real processes --------------------------------------------------------


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _main_cmd(workdir, steps, *extra):
  return [sys.executable, "-m", "avtext.main", "--config=configs/videocc_avr.py:tiny",
          f"--workdir={workdir}", f"--config.train.num_steps={steps}",
          "--config.train.log_every_steps=1", "--config.train.batch_size=8", *extra]


def _run_all(jobs: list[tuple[list[str], int, pathlib.Path]]) -> list[str]:
  """Runs (cmd, fake device count, log file) jobs concurrently; their outputs.

  Every process is killed if any fails or times out, so none outlives the test.
  """
  procs = []
  try:
    for cmd, devices, log in jobs:
      env = dict(os.environ, JAX_PLATFORMS="cpu",
                 XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
      with open(log, "w") as out:
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out,
                                      stderr=subprocess.STDOUT))
    deadline = time.monotonic() + TIMEOUT_S
    # Polled together: a crashed process fails the test at once instead of
    # leaving its peers to wait for it until the timeout.
    while any(proc.poll() is None for proc in procs):
      for proc, (_, _, log) in zip(procs, jobs):
        assert proc.poll() in (None, 0), f"{log}:\n{log.read_text()[-6000:]}"
      assert time.monotonic() < deadline, f"still running after {TIMEOUT_S} s: {jobs}"
      time.sleep(0.5)
    for proc, (_, _, log) in zip(procs, jobs):
      assert proc.returncode == 0, f"{log}:\n{log.read_text()[-6000:]}"
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  return [log.read_text() for _, _, log in jobs]


def _logged(workdir: pathlib.Path, tag: str) -> dict[int, float]:
  """{step: value} of a scalar in the run's TensorBoard events (later files win)."""
  from tensorboard.backend.event_processing import event_file_loader  # pylint: disable=g-import-not-at-top
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
  values = {}
  for path in sorted(workdir.glob("events.out.tfevents.*")):
    for event in event_file_loader.EventFileLoader(str(path)).Load():
      for value in event.summary.value:
        if value.tag == tag:
          values[event.step] = (float(tensor_util.make_ndarray(value.tensor))
                                if value.HasField("tensor") else value.simple_value)
  return values


def _final_eval(workdir: pathlib.Path) -> dict:
  latest = json.loads((workdir / "results.json").read_text())["latest"]
  return {k: v for k, v in latest.items() if not k.endswith("eval_seconds")}


def _max_param_diff(a: pathlib.Path, b: pathlib.Path, step: int) -> float:
  """Largest |difference| of two runs' parameters, attention key biases excepted.

  Softmax ignores a shift shared by all keys, so a key bias's true gradient is
  0 and what the backward pass computes is rounding noise, which Adam scales
  up to steps of ~learning_rate: those leaves differ between any two meshes.
  """
  pa, pb = runs.load_run(a, step=step).params, runs.load_run(b, step=step).params
  assert jax.tree.structure(pa) == jax.tree.structure(pb)
  diffs = [float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
           for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(pa), jax.tree.leaves(pb))
           if not jax.tree_util.keystr(path).endswith("['key']['bias']")]
  assert len(diffs) > 10
  return max(diffs)


@pytest.fixture(scope="module")
def five_steps(tmp_path_factory):
  """Workdirs of 5 steps of the tiny AVR config: 2 processes x 2 devices, 1 x 4."""
  tmp = tmp_path_factory.mktemp("multihost")
  two, one = tmp / "two_processes", tmp / "one_process"
  address = f"--coordinator_address=localhost:{_free_port()}"
  cluster = [(_main_cmd(two, 5, "--distributed", address, "--num_processes=2",
                        f"--process_id={i}"), 2, tmp / f"two_{i}.log") for i in range(2)]
  _run_all(cluster + [(_main_cmd(one, 5), 4, tmp / "one.log")])
  return two, one


# ~150 s (three subprocess runs and two resumes): behind -m slow since the captioning tests
# came in, to keep the default run under 12 minutes.
@pytest.mark.slow
def test_two_processes_train_like_one_and_resume_in_one(five_steps, tmp_path):
  two, one = five_steps
  losses_two, losses_one = _logged(two, "loss"), _logged(one, "loss")
  assert sorted(losses_two) == sorted(losses_one) == [1, 2, 3, 4, 5]
  diff = max(abs(losses_two[s] - losses_one[s]) for s in losses_one)
  print(f"max |loss difference| 2 processes vs 1: {diff:.3g}")
  assert diff <= 1e-5, (losses_two, losses_one)
  # The final evaluation (embeddings gathered across processes) gives the same metrics.
  evals_two, evals_one = _final_eval(two), _final_eval(one)
  assert evals_two["step"] == 5 and len(evals_two) > 10
  assert evals_two == pytest.approx(evals_one, rel=1e-6)

  # The 2-process checkpoint (state and input position) resumes in 1 process
  # as the 1-process one does.
  resumed_two, resumed_one = tmp_path / "resumed_two", tmp_path / "resumed_one"
  shutil.copytree(two, resumed_two)
  shutil.copytree(one, resumed_one)
  outs = _run_all([(_main_cmd(resumed_two, 6), 4, tmp_path / "resumed_two.log"),
                   (_main_cmd(resumed_one, 6), 4, tmp_path / "resumed_one.log")])
  assert all("resumed from" in out for out in outs)
  step6_two, step6_one = _logged(resumed_two, "loss")[6], _logged(resumed_one, "loss")[6]
  print(f"step 6 after resuming in 1 process: |loss difference| {abs(step6_two - step6_one):.3g}")
  assert abs(step6_two - step6_one) <= 1e-5
  assert _max_param_diff(resumed_two, resumed_one, 6) <= 1e-5


@pytest.mark.slow
def test_inspect_loads_a_two_process_checkpoint(five_steps):
  two, one = five_steps
  assert _max_param_diff(two, one, 5) <= 1e-5


# ---- preemption: every process stops at one agreed step -----------------------------

STEPS = 8  # each preempted run: 8 steps, signalled once step 3 is logged
EXIT_BOUND_S = 60  # first signal -> last exit (4-6 s on a quiet machine, BENCHMARKS.md)
# A lost process is named by the survivors' watchdogs after a third of the heartbeat
# timeout (10 s), before the timeout itself aborts them with JAX's fatal error.
HEARTBEAT_S = 30


class _Pair:
  """Two `--distributed` processes of the tiny AVR config in one workdir, the persistent
  compilation cache in `cache` (shared by every pair of these tests, so each relaunch
  reads what an earlier, interrupted pair wrote)."""

  def __init__(self, workdir: pathlib.Path, cache: pathlib.Path, *extra: str):
    self.workdir = workdir
    address = f"--coordinator_address=localhost:{_free_port()}"
    self.logs = [workdir.parent / f"{workdir.name}_{i}.log" for i in range(2)]
    env = dict(os.environ, JAX_PLATFORMS="cpu", AVTEXT_COMPILATION_CACHE=str(cache),
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    self.procs = []
    for i, log in enumerate(self.logs):
      cmd = _main_cmd(workdir, STEPS, "--distributed", address, "--num_processes=2",
                      f"--process_id={i}", f"--heartbeat_timeout_seconds={HEARTBEAT_S}",
                      *extra)
      with open(log, "w") as out:
        self.procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out,
                                           stderr=subprocess.STDOUT))

  def text(self, i: int) -> str:
    return self.logs[i].read_text()

  def wait_for(self, done, what: str, timeout_s: float = TIMEOUT_S) -> None:
    """Until done() (both processes running meanwhile); kills both if not."""
    deadline = time.monotonic() + timeout_s
    try:
      while not done():
        assert all(p.poll() is None for p in self.procs), self.text(0)[-4000:]
        assert time.monotonic() < deadline, f"{what} not reached: {self.text(0)[-4000:]}"
        time.sleep(0.05)
    except AssertionError:
      self.kill()
      raise

  def wait_for_step(self, step: int) -> None:
    """Until process 0 has logged the training metrics of `step`."""
    self.wait_for(lambda: f"] [{step}] " in self.text(0), f"step {step}")

  def stopped_by(self, *signals: tuple[int, int], apart_s: float = 2) -> list[int]:
    """Sends each (process, signal), `apart_s` apart; the exit statuses, all within
    EXIT_BOUND_S of the first signal (the time to the last exit printed)."""
    try:
      first = time.monotonic()
      for k, (process, signum) in enumerate(signals):
        time.sleep(apart_s if k else 0)
        self.procs[process].send_signal(signum)
      statuses = self.wait(EXIT_BOUND_S)
      print(f"first signal -> last exit: {time.monotonic() - first:.1f} s")
      return statuses
    finally:
      self.kill()

  def wait(self, timeout_s: float = TIMEOUT_S) -> list[int]:
    """The exit statuses; kills both if either is still running after `timeout_s`."""
    try:
      for proc in self.procs:
        proc.wait(timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
      for proc in self.procs:
        proc.kill()
      raise AssertionError(f"still running after {timeout_s} s:\n" + "\n".join(
          self.text(i)[-3000:] for i in range(2))) from None
    return [proc.returncode for proc in self.procs]

  def kill(self) -> None:
    for proc in self.procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def preemption(tmp_path_factory):
  """(tmp dir, the shared compilation cache, a 1-process 4-device run of STEPS steps:
  the uninterrupted reference every resumed 2-process run must equal)."""
  tmp = tmp_path_factory.mktemp("preemption")
  reference = tmp / "reference"
  _run_all([(_main_cmd(reference, STEPS), 4, tmp / "reference.log")])
  return tmp, tmp / "jax_cache", reference


def _stderr_last_line(text: str) -> str:
  return text.strip().splitlines()[-1]


def _assert_resumes_like_reference(tmp, cache, workdir, reference, stopped_at):
  """A relaunch of the same 2-process command resumes from `stopped_at` and ends with
  the reference's losses (every step) and parameters."""
  relaunch = _Pair(workdir, cache)
  try:
    assert relaunch.wait() == [0, 0], relaunch.text(0)[-4000:]
  finally:
    relaunch.kill()
  if stopped_at < STEPS:
    assert f"at step {stopped_at}" in relaunch.text(0)  # "resumed from ... at step N"
  losses, expected = _logged(workdir, "loss"), _logged(reference, "loss")
  assert sorted(losses) == sorted(expected) == list(range(1, STEPS + 1))
  assert max(abs(losses[s] - expected[s]) for s in expected) <= 1e-5, (losses, expected)
  assert _max_param_diff(workdir, reference, STEPS) <= 1e-5


def _checkpoints(workdir: pathlib.Path) -> list[int]:
  folder = workdir / "checkpoints"
  return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


@pytest.mark.slow
@pytest.mark.parametrize("both", [False, True], ids=["one_process", "both_apart"])
def test_sigterm_stops_every_process_at_one_step(preemption, both):
  """SIGTERM to process 1 only, or to both 2 s apart: both save one agreed step and
  exit 143 within EXIT_BOUND_S of the first signal; the relaunch resumes from it."""
  tmp, cache, reference = preemption
  workdir = tmp / ("both" if both else "one")
  pair = _Pair(workdir, cache, "--config.train.checkpoint_every_steps=1000")
  pair.wait_for_step(3)
  statuses = pair.stopped_by((1, signal.SIGTERM), *[(0, signal.SIGTERM)] * both)
  assert statuses == [143, 143], pair.text(0)[-4000:]
  (stopped_at,) = _checkpoints(workdir)  # one step, saved by both together
  assert 3 < stopped_at < STEPS
  for i in range(2):
    assert _stderr_last_line(pair.text(i)) == (
        f"interrupted at step {stopped_at}; checkpoint {stopped_at} kept; re-run to resume")
    assert "Traceback" not in pair.text(i)
  _assert_resumes_like_reference(tmp, cache, workdir, reference, stopped_at)


@pytest.mark.slow
def test_sigint_during_the_final_evaluation_finishes_the_run(preemption):
  """Ctrl-C to process 1 once the last step is logged (its evaluation takes seconds):
  both finish the evaluation, write the results and exit 0; the relaunch finds the run
  complete."""
  tmp, cache, reference = preemption
  workdir = tmp / "final_eval"
  pair = _Pair(workdir, cache, "--config.train.checkpoint_every_steps=1000")
  pair.wait_for_step(STEPS)
  statuses = pair.stopped_by((1, signal.SIGINT))
  assert statuses == [0, 0], pair.text(1)[-4000:]
  assert "SIGINT received during the final evaluation: the run finished" in pair.text(1)
  assert _checkpoints(workdir) == [STEPS]
  assert _final_eval(workdir) == pytest.approx(_final_eval(reference), rel=1e-6)
  _assert_resumes_like_reference(tmp, cache, workdir, reference, STEPS)


@pytest.mark.slow
def test_a_killed_process_ends_the_other_in_one_line(preemption):
  """SIGKILL to process 1 once checkpoint 2 is on disk (checkpoints every 2 steps):
  process 0 exits within EXIT_BOUND_S with one line naming process 1 and the last
  checkpoint; the relaunch (same compilation cache) resumes from it."""
  tmp, cache, reference = preemption
  workdir = tmp / "killed"
  pair = _Pair(workdir, cache, "--config.train.checkpoint_every_steps=2")
  pair.wait_for_step(3)  # then checkpoint 2 committed (renamed from its tmp directory)
  pair.wait_for(lambda: (workdir / "checkpoints" / "2").is_dir(), "checkpoint 2")
  statuses = pair.stopped_by((1, signal.SIGKILL))
  assert statuses == [1, -signal.SIGKILL]
  last = max(_checkpoints(workdir))
  assert last >= 2
  assert _stderr_last_line(pair.text(0)) == (
      f"error: process 1 of 2 was lost (killed, or its machine went away); checkpoint "
      f"{last} is the last on disk: relaunch the same command on every host to resume")
  assert "Traceback" not in pair.text(0)
  _assert_resumes_like_reference(tmp, cache, workdir, reference, last)
