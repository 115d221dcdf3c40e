"""The generic trainer on the tiny AVR config: sharding, resume, failure modes."""
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avtext import experiment
from avtext import runs
from avtext.train import checkpointing
from avtext.train import partitioning
from avtext.train import trainer as trainer_lib

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from configs import videocc_avr  # pylint: disable=g-import-not-at-top,wrong-import-position


def make_trainer(config, workdir):
  return experiment.build(config, workdir)


def with_overrides(config, **overrides):
  """`config` with each dotted field of `overrides` set (as --config.<field>= would)."""
  for key, value in overrides.items():
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return config


def tiny_config(**overrides):
  return with_overrides(videocc_avr.get_config("tiny"), **overrides)


def _losses(config, workdir, steps):
  """Per-step losses of the trainer's own jitted step on its own data."""
  run = make_trainer(config, workdir)
  state, (tx, schedule), data_iter = run.restore_or_init()
  step_fn = run.make_train_step(tx, schedule, run._state_sharding(state))  # pylint: disable=protected-access
  out = []
  for _ in range(steps):
    batch = partitioning.host_to_global(next(data_iter), run.mesh)
    state, metrics = step_fn(state, batch)
    out.append(float(metrics["loss"]))
  return np.array(out), state


@pytest.mark.slow  # default-run budget (BENCHMARKS.md, "Default test run"); `make test-slow`
def test_one_vs_eight_devices_same_losses(tmp_path):
  assert jax.device_count() == 8, "tests/conftest.py must configure 8 fake devices"
  l1, s1 = _losses(tiny_config(num_devices=1), tmp_path / "one", 5)
  l8, s8 = _losses(tiny_config(num_devices=8), tmp_path / "eight", 5)
  assert l8[0] > 0 and np.all(np.isfinite(l8))
  np.testing.assert_allclose(l1, l8, atol=1e-5, rtol=0)
  assert len(s8.params["video_projection"]["kernel"].sharding.device_set) == 8
  # The NCE negatives span the global batch: with 8 devices each holds one pair,
  # so a per-device loss would be log(1) = 0 for both directions.
  assert l8[0] > 1.0


def test_train_writes_checkpoints_results_and_restores(tmp_path):
  config = tiny_config()
  state = make_trainer(config, tmp_path).train()
  assert int(state.step) == config.train.num_steps
  steps = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
  assert steps == [5, 10]
  results = json.loads((tmp_path / "results.json").read_text())
  latest = results["latest"]
  assert latest["step"] == 10
  for key in ("t2v_R@1", "t2v_R@5", "t2v_R@10", "t2v_MdR", "v2t_R@1", "oracle_t2v_r1",
              "chance_r1", "t2v_mAP"):
    assert f"test/{key}" in latest
  assert latest["test/chance_r1"] == pytest.approx(100.0 / config.dataset.num_eval)
  assert list(tmp_path.glob("events.out.tfevents.*")), "no TensorBoard events written"

  # --mode=eval: the latest checkpoint evaluates to the same numbers.
  again = make_trainer(config, tmp_path).evaluate()
  assert again["test/t2v_R@1"] == latest["test/t2v_R@1"]
  assert again["test/v2t_MnR"] == latest["test/v2t_MnR"]
  # Re-running a finished run trains nothing and evaluates it again.
  rerun = make_trainer(config, tmp_path).train()
  assert int(rerun.step) == 10
  relatest = json.loads((tmp_path / "results.json").read_text())["latest"]
  timing = "test/eval_seconds"
  assert {k: v for k, v in relatest.items() if k != timing} == {
      k: v for k, v in latest.items() if k != timing}

  run = runs.load_run(tmp_path)
  assert run.step == 10
  for a, b in zip(jax.tree.leaves(run.params), jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  earlier = runs.load_run(tmp_path, step=5)
  assert earlier.step == 5
  with pytest.raises(FileNotFoundError, match="step 7"):
    runs.load_run(tmp_path, step=7)


@pytest.mark.slow  # `make test` budget: `make test-slow` (CI runs both)
def test_loss_decreases_on_repeated_batches(tmp_path):
  # 8 clips, batch 8: every step sees the same pairs, which the model must fit.
  config = tiny_config(**{"dataset.num_train": 8, "train.num_steps": 40, "optimizer.frozen": (),
                          "optimizer.learning_rate": 1e-3, "optimizer.warmup_steps": 0,
                          "optimizer.schedule": "constant"})
  losses, _ = _losses(config, tmp_path, 40)
  assert losses[-5:].mean() < 0.5 * losses[:3].mean(), losses


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
  config = tiny_config(**{"train.num_steps": 10, "train.checkpoint_every_steps": 2})
  run = make_trainer(config, tmp_path)
  # NaN frames from the 6th batch on: a detectable, deterministic blow-up that leaves the
  # compiled train step as it is (the one every tiny run shares).
  counter = {"n": 0}
  real_next = run._data  # pylint: disable=protected-access

  def data_with_poison():
    dataset, it = real_next()

    class Poison:
      def __next__(self):
        counter["n"] += 1
        batch = next(it)
        if counter["n"] >= 6:
          batch = dict(batch, rgb=np.full_like(batch["rgb"], np.nan))
        return batch

      def get_state(self):
        return it.get_state()

      def set_state(self, s):
        it.set_state(s)
    return dataset, Poison()

  run._data = data_with_poison  # pylint: disable=protected-access
  with pytest.raises(trainer_lib.NonFiniteError, match="at step 6.*checkpoints/4, is kept"):
    run.train()
  steps = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
  assert steps and max(steps) == 4


def _run_main(workdir, steps, *extra, **popen):
  cmd = [sys.executable, "-m", "avtext.main", "--config=configs/videocc_avr.py:tiny",
         f"--workdir={workdir}", f"--config.train.num_steps={steps}",
         "--config.train.checkpoint_every_steps=2", "--config.train.keep_checkpoints=100",
         "--config.dataset.num_eval=8", *extra]
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
  return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, **popen)


# Evaluation drives training: every 2 steps, v2t mAP is the selected metric;
# the plateau threshold makes every evaluation after the first a "bad" one, so
# the learning rate halves at each; early stopping ends the run after 3 stale
# evaluations. All of it must survive SIGKILL.
_EVAL_DRIVEN = ("--config.evals.test.every_steps=2",
                "--config.eval.select=('test/v2t_mAP', 'max')",
                "--config.eval.plateau.factor=0.5", "--config.eval.plateau.patience=0",
                "--config.eval.plateau.cooldown=0", "--config.eval.plateau.threshold=10.0",
                "--config.eval.early_stopping_patience=2")


def _saved_steps(workdir):
  ckpts = workdir / "checkpoints"
  return sorted(int(p.name) for p in ckpts.glob("*") if p.name.isdigit()) if ckpts.exists() else []


@pytest.mark.slow  # ~85 s, the longest test; resume bit-identity after faults stays in the
# default run (tests/test_train_run_faults.py), the real SIGKILL runs with `make test-slow`
def test_sigkill_then_rerun_is_bit_identical(tmp_path):
  steps = 16
  reference = _run_main(tmp_path / "ref", steps, *_EVAL_DRIVEN)
  out, _ = reference.communicate(timeout=600)
  assert reference.returncode == 0, out
  final = max(_saved_steps(tmp_path / "ref"))
  ref_state, _ = checkpointing.restore_raw(tmp_path / "ref", final)
  assert float(ref_state["control"]["lr_scale"]) < 1.0  # the plateau rule fired

  victim_dir = tmp_path / "killed"
  victim = _run_main(victim_dir, steps, *_EVAL_DRIVEN)
  target = random.Random(time.time()).choice([s for s in (2, 4, 6, 8) if s < final - 2])
  deadline = time.time() + 300
  while time.time() < deadline and victim.poll() is None:
    done = _saved_steps(victim_dir)
    if done and max(done) >= target:
      break
    time.sleep(0.05)
  time.sleep(random.uniform(0.0, 0.5))  # somewhere in the next steps or mid-save
  assert victim.poll() is None, "training finished before it could be killed"
  victim.send_signal(signal.SIGKILL)
  victim.wait()
  killed_at = max(_saved_steps(victim_dir))
  assert killed_at < final

  resumed = _run_main(victim_dir, steps, *_EVAL_DRIVEN)
  out, _ = resumed.communicate(timeout=600)
  assert resumed.returncode == 0, out
  assert "resumed from" in out
  assert max(_saved_steps(victim_dir)) == final  # early stopping at the same step

  a = runs.load_run(tmp_path / "ref", step=final)
  b = runs.load_run(victim_dir, step=final)
  leaves_a, leaves_b = jax.tree.leaves(a.params), jax.tree.leaves(b.params)
  assert len(leaves_a) == len(leaves_b) > 10
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  got_state, _ = checkpointing.restore_raw(victim_dir, final)
  for key, value in ref_state["control"].items():
    np.testing.assert_array_equal(got_state["control"][key], value, err_msg=key)
  best_a = runs.load_run(tmp_path / "ref", step="best")
  best_b = runs.load_run(victim_dir, step="best")
  assert best_a.step == best_b.step
