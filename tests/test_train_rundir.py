"""One writer per run directory, atomic small files, and a failed save in one line."""
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
from orbax.checkpoint._src.handlers import json_checkpoint_handler
import pytest

from avtext.train import checkpointing
from avtext.train import rundir
from tests.test_train_trainer import _EVAL_DRIVEN
from tests.test_train_trainer import _run_main
from tests.test_train_trainer import _saved_steps
from tests.test_train_trainer import REPO


def hold_lock(workdir):
  """A child process that takes the lock of `workdir`, says so, and sleeps."""
  code = ("import sys, time; from avtext.train import rundir\n"
          "with rundir.lock(sys.argv[1]):\n  print('locked', flush=True); time.sleep(600)")
  child = subprocess.Popen([sys.executable, "-c", code, str(workdir)], cwd=REPO,
                           stdout=subprocess.PIPE, text=True)
  assert child.stdout.readline().strip() == "locked"
  return child


def test_lock_names_the_live_owner_and_is_taken_over_from_a_dead_one(tmp_path, caplog):
  child = hold_lock(tmp_path)
  try:
    with pytest.raises(rundir.RunLockedError) as e:
      with rundir.lock(tmp_path):
        pass
    message = str(e.value)
    assert "\n" not in message
    assert f"{tmp_path} is in use by pid {child.pid} on {socket.gethostname()} since " in message
  finally:
    child.send_signal(signal.SIGKILL)  # no clean-up: its name stays in the lock file
    child.wait()
  assert json.loads((tmp_path / rundir.LOCK_FILE).read_text())["pid"] == child.pid
  with caplog.at_level("WARNING"):
    with rundir.lock(tmp_path):
      with rundir.lock(tmp_path):  # re-entrant in one process
        assert json.loads((tmp_path / rundir.LOCK_FILE).read_text())["pid"] == os.getpid()
      assert (tmp_path / rundir.LOCK_FILE).exists()
  assert f"taking over from pid {child.pid} on " in caplog.text
  assert not (tmp_path / rundir.LOCK_FILE).exists()  # released on exit


def test_small_files_are_replaced_whole_and_bad_ones_named(tmp_path, monkeypatch):
  path = tmp_path / "results.json"
  rundir.write_json(path, {"best": 1})

  def full_disk(fd):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(os, "fsync", full_disk)
  with pytest.raises(OSError, match=f"{path}: not written .No space left on device."):
    rundir.write_json(path, {"best": 2})
  monkeypatch.undo()
  assert json.loads(path.read_text()) == {"best": 1}
  assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temporary left
  path.write_text('{"best": {"step": ')  # what a killed non-atomic writer left
  with pytest.raises(rundir.RunFileError, match=f"{path}: not valid JSON .*; rebuild it"):
    rundir.read_json(path, fix="rebuild it")


@pytest.mark.slow  # `make test` budget: `make test-slow` (CI runs both)
def test_a_second_launch_exits_at_once_and_the_first_ends_as_a_solo_run(tmp_path):
  steps = 2
  solo = _run_main(tmp_path / "solo", steps, *_EVAL_DRIVEN)
  first = _run_main(tmp_path / "shared", steps, *_EVAL_DRIVEN)
  deadline = time.time() + 120
  while not (tmp_path / "shared" / rundir.LOCK_FILE).exists():
    assert time.time() < deadline and first.poll() is None, "the first launch never locked"
    time.sleep(0.05)
  start = time.time()
  second = _run_main(tmp_path / "shared", steps, *_EVAL_DRIVEN)
  out, _ = second.communicate(timeout=60)
  took = time.time() - start
  assert second.returncode != 0
  assert took < 10, f"the second launch took {took:.1f} s to give up"
  assert first.poll() is None, "the first launch ended before the second one was refused"
  assert out.strip().splitlines()[-1].startswith(
      f"error: {tmp_path / 'shared'} is in use by pid {first.pid} on {socket.gethostname()} since ")
  for run in (solo, first):
    log, _ = run.communicate(timeout=600)
    assert run.returncode == 0, log

  final = max(_saved_steps(tmp_path / "solo"))
  assert _saved_steps(tmp_path / "shared") == _saved_steps(tmp_path / "solo")
  a, _ = checkpointing.restore_raw(tmp_path / "solo", final)
  b, _ = checkpointing.restore_raw(tmp_path / "shared", final)
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(leaves_a) == len(leaves_b) > 10
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(x, y)

  def numbers(workdir):
    results = json.loads((workdir / "results.json").read_text())
    return {step: {k: v for k, v in r.items() if not k.endswith("eval_seconds")}
            if isinstance(r, dict) else r for step, r in results.items()}

  assert numbers(tmp_path / "shared") == numbers(tmp_path / "solo")
  assert numbers(tmp_path / "solo")["best"]["step"] == 2
  assert not (tmp_path / "shared" / rundir.LOCK_FILE).exists()


def test_a_failed_save_raises_one_line_naming_the_directory_and_the_cause(tmp_path,
                                                                          monkeypatch):
  """A full disk while step 2 is written: the one line names the directory, the cause and
  step 2's partial directory, which is removed; step 1 stays as it was."""
  async def full_disk(self, x, directory):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  ckpt = checkpointing.Checkpointer(tmp_path / "checkpoints")
  ckpt.save(1, {"w": np.ones(3, np.float32)}, {"position": 1})
  ckpt.wait()
  step1 = {p: p.read_bytes() for p in (tmp_path / "checkpoints" / "1").rglob("*") if p.is_file()}
  monkeypatch.setattr(json_checkpoint_handler.JsonCheckpointHandler, "_save_fn", full_disk)
  with pytest.raises(checkpointing.CheckpointSaveError) as e:
    ckpt.save(2, {"w": np.full(3, 2, np.float32)}, {"position": 2})
    ckpt.wait()  # the write runs in orbax's background threads; its error surfaces here
  partial = tmp_path / "checkpoints" / "2.orbax-checkpoint-tmp"
  assert str(e.value) == (f"{tmp_path / 'checkpoints'}: writing a checkpoint failed: No space "
                          f"left on device; the partial checkpoint {partial} is removed; the "
                          "checkpoints already there are intact and re-running resumes from "
                          "the latest")
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["1"]
  assert {p: p.read_bytes() for p in (tmp_path / "checkpoints" / "1").rglob("*")
          if p.is_file()} == step1
  assert ckpt.all_steps() == [1]


@pytest.mark.slow  # ~40 s: a tiny run in a subprocess
def test_a_full_disk_is_one_line_and_a_non_zero_exit(tmp_path):
  """On a 7 MB filesystem: step 1's checkpoint (~4.7 MB) fits, step 2's does not."""
  if os.geteuid() != 0 or subprocess.run(["unshare", "-m", "true"]).returncode:
    pytest.skip("needs root with mount namespaces to mount a small tmpfs")
  workdir = tmp_path / "disk" / "run"
  workdir.parent.mkdir()
  # The tmpfs lives as long as the namespace: its checkpoints are listed inside it.
  cmd = ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=7M tmpfs "$0" || exit 9; "$@"; '
         'rc=$?; echo listing: $(ls "$0/run/checkpoints"); exit $rc',
         str(workdir.parent), sys.executable, "-m", "avtext.main",
         "--config=configs/videocc_avr.py:tiny", f"--workdir={workdir}",
         "--config.train.num_steps=4", "--config.train.checkpoint_every_steps=1",
         "--config.dataset.num_eval=8"]
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
  done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  out = done.stdout + done.stderr
  assert done.returncode == 2, out
  for noise in ("Traceback", "Event loop is closed", "never retrieved"):
    assert noise not in out, out
  failed = [line for line in out.splitlines() if "No space left on device" in line]
  partial = workdir / "checkpoints" / "2.orbax-checkpoint-tmp"
  assert failed == [f"error: {workdir / 'checkpoints'}: writing a checkpoint failed: No space left "
                    f"on device; the partial checkpoint {partial} is removed; the checkpoints "
                    "already there are intact and re-running resumes from the latest"], out
  assert "listing: 1\n" in done.stdout, out  # step 1 kept, step 2's partial directory gone


def test_the_newest_checkpoint_pruned_while_it_is_read_is_read_again(tmp_path, monkeypatch):
  """An evaluation reading a running trainer's newest checkpoint: the trainer saves the
  next one and prunes the one being read (keep=1); the read resolves the newest again.
  An explicit step that vanishes is one error saying so."""
  directory = tmp_path / "checkpoints"
  trainer = checkpointing.Checkpointer(directory, keep=1, async_save=False)
  for step in (1, 2, 3):
    trainer.save(step, {"w": np.full(3, step, np.float32)}, {"position": step})
  reader = checkpointing.Checkpointer(directory)
  real_restore = reader._manager.restore  # pylint: disable=protected-access
  read = []

  def restore_while_training(step, *args, **kwargs):
    read.append(step)
    if len(read) == 1:
      trainer.save(step + 1, {"w": np.full(3, step + 1, np.float32)}, {"position": step + 1})
      assert not (directory / str(step)).exists()  # pruned by the trainer
    return real_restore(step, *args, **kwargs)

  monkeypatch.setattr(reader._manager, "restore", restore_while_training)  # pylint: disable=protected-access
  state, step = reader.restore_raw()
  assert read == [3, 4] and step == 4
  np.testing.assert_array_equal(state["w"], np.full(3, 4.0, np.float32))

  read.clear()
  with pytest.raises(FileNotFoundError, match=r"/4: deleted while it was read"):
    reader.restore_raw(4)
  assert read == [4]
