"""Training is never lost: not to an evaluator that raises, not to Ctrl-C or SIGTERM.

In-process: a tiny AVR run whose stand-in evaluator raises at the last step keeps the
final checkpoint, and its re-run evaluates it without building a train step. As
processes: `python -m avtext.main` stopped by SIGINT / SIGTERM says where in one line
and exits 130 / 143, leaving the step's checkpoint and no temporary directory.
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from avtext import errors
from avtext.train import trainer as trainer_lib
from tests.test_train_run_faults import _steps
from tests.test_train_run_faults import _trainer
from tests.test_train_trainer import REPO
from tests.test_train_trainer import tiny_config


class _FailingAt:
  """Scores the step; raises at `step` while `broken`."""

  def __init__(self, step):
    self.step, self.broken, self.calls = step, True, []

  def every(self, steps_per_epoch):
    del steps_per_epoch
    return 2

  def run(self, variables, *, mesh, step):
    del variables, mesh
    self.calls.append(step)
    if self.broken and step == self.step:
      raise KeyError("no such caption file")
    return {"score": float(step)}


@pytest.mark.slow  # trains and compiles a tiny AVR twice: ~100 s on 2 cores
def test_an_evaluator_failing_at_the_last_step_keeps_the_final_checkpoint(tmp_path,
                                                                          monkeypatch):
  # test_train_run_faults' schedule: its train step comes from the compilation cache.
  config = tiny_config(**{"train.num_steps": 4, "train.checkpoint_every_steps": 2,
                          "eval.select": ("broken/score", "max")})
  broken, other = _FailingAt(4), _FailingAt(None)
  with pytest.raises(errors.EvaluationFailed) as failed:
    _trainer(config, tmp_path, {"broken": broken, "other": other}).train()
  message = str(failed.value)
  assert "\n" not in message
  assert "evaluator 'broken' failed at step 4: KeyError" in message
  assert "checkpoint 4 is on disk" in message and "re-run" in message
  assert _steps(tmp_path / "checkpoints") == [2, 4]
  assert not list(tmp_path.rglob("*.orbax-checkpoint-tmp*"))
  assert other.calls == [2, 4]  # the other evaluator still ran at step 4

  # The re-run trains nothing: it evaluates step 4 with the evaluator that failed.
  def no_training(*args, **kwargs):
    raise AssertionError("the re-run built a train step")
  monkeypatch.setattr(trainer_lib.Trainer, "make_train_step", no_training)
  fixed, other = _FailingAt(None), _FailingAt(None)
  state = _trainer(config, tmp_path, {"broken": fixed, "other": other}).train()
  assert int(state.step) == 4 and fixed.calls == [4] and other.calls == []
  results = json.loads((tmp_path / "results.json").read_text())
  assert results["4"]["broken/score"] == 4.0 and results["best"]["step"] == 4
  assert _steps(tmp_path / "best_checkpoints") == [4]


def _main(workdir, *overrides):
  """`main` on the tiny AVR config, its stderr in workdir.stderr (a pipe nobody reads
  while it trains would fill up and stop it)."""
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1",
             PYTHONPATH=str(REPO))
  cmd = [sys.executable, "-m", "avtext.main", "--config=configs/videocc_avr.py:tiny",
         f"--workdir={workdir}", *overrides]
  with open(f"{workdir}.stderr", "w") as err:
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err)


@pytest.mark.slow  # two training processes: ~2 min on 2 cores
def test_sigint_and_sigterm_save_the_step_and_exit_in_one_line(tmp_path):
  """Two runs side by side (one compile each on the 2 cores): Ctrl-C one, SIGTERM the
  other, once each has a checkpoint on disk."""
  runs_ = {signal.SIGINT: 130, signal.SIGTERM: 143}
  workdirs = {signum: tmp_path / signal.Signals(signum).name for signum in runs_}
  procs = {signum: _main(workdirs[signum], "--config.train.num_steps=100000",
                         "--config.evals.test.every_steps=0",
                         "--config.train.log_every_steps=1000") for signum in runs_}
  stderr = lambda signum: pathlib.Path(f"{workdirs[signum]}.stderr").read_text()
  try:
    deadline = time.time() + 240
    waiting = set(procs)
    while waiting and time.time() < deadline:
      for signum in list(waiting):
        assert procs[signum].poll() is None, stderr(signum)[-3000:]
        checkpoints = workdirs[signum] / "checkpoints"
        if checkpoints.is_dir() and _steps(checkpoints):
          procs[signum].send_signal(signum)
          waiting.discard(signum)
      time.sleep(0.1)
    assert not waiting, "no checkpoint within 240 s"
  finally:  # a failed wait leaves no run behind
    for proc in procs.values():
      if proc.poll() is None and waiting:
        proc.kill()
        proc.wait()
  for signum, status in runs_.items():
    procs[signum].wait(timeout=240)
    err = stderr(signum)
    lines = err.strip().splitlines()
    assert procs[signum].returncode == status, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    checkpoints = workdirs[signum] / "checkpoints"
    step = max(_steps(checkpoints))
    assert lines[-1] == f"interrupted at step {step}; checkpoint {step} kept; re-run to resume"
    assert (checkpoints / str(step) / "checksums.json").is_file()  # sealed: complete
    assert not list(workdirs[signum].rglob("*.orbax-checkpoint-tmp*"))


def test_a_run_stopped_short_is_one_line_with_its_exit_status(capsys):
  """What `main` prints of the two (cli.run): the message, no traceback; 1 or 128 + signal."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from avtext import cli  # pylint: disable=g-import-not-at-top
  stops = [(errors.EvaluationFailed("evaluator 'test' failed at step 4: KeyError: 'x'"), 1,
            "error: evaluator 'test' failed at step 4: KeyError: 'x'"),
           (errors.Interrupted("interrupted at step 3; checkpoint 3 kept; re-run to resume",
                               signal.SIGTERM), 143,
            "interrupted at step 3; checkpoint 3 kept; re-run to resume"),
           (KeyboardInterrupt(), 130, "interrupted")]
  for stop, status, line in stops:
    def main(argv, stop=stop):
      del argv
      raise stop
    with pytest.raises(SystemExit) as done:
      cli.run(main, flags.FlagValues(), ["prog"], doc="")
    assert done.value.code == status
    assert capsys.readouterr().err == line + "\n"
