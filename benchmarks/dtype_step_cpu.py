r"""Train-step time of a config in float32 vs bfloat16 compute, alternated in one process.

    python benchmarks/dtype_step_cpu.py [--config=configs/videocc_avr.py:demo] [--steps=10]

Builds the trainer's own jitted step for each dtype (`config.model.dtype`; the config's
batch, its frozen parameters and optimizer), feeds both the same batch of the task's
example shapes (`Task.batch_spec`; random values: the time does not depend on them) and
times the steps alternately (float32, bfloat16, float32, ...) so that load on a shared
machine hits both alike. Prints the median step time and examples/s of each.
"""
import argparse
import importlib.util
import json
import pathlib
import sys
import tempfile
import time

import jax
import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from avtext.tasks import registry  # pylint: disable=wrong-import-position
from avtext.train import partitioning  # pylint: disable=wrong-import-position
from avtext.train import trainer as trainer_lib  # pylint: disable=wrong-import-position


def load_config(spec: str, dtype: str):
  """`configs/<x>.py[:variant]` with config.model.dtype set, on one device."""
  path, _, arg = spec.partition(":")
  loaded = importlib.util.spec_from_file_location("experiment_config", REPO / path)
  module = importlib.util.module_from_spec(loaded)
  loaded.loader.exec_module(module)
  config = module.get_config(arg or None)
  config.model.dtype = dtype
  config.num_devices = 1
  return config


def random_batch(spec: dict, rng: np.random.Generator) -> dict:
  out = {}
  for k, s in spec.items():
    if np.issubdtype(s.dtype, np.integer):
      out[k] = rng.integers(0, 100, s.shape).astype(s.dtype)
    elif s.dtype == np.bool_:
      out[k] = np.ones(s.shape, bool)
    else:
      out[k] = rng.normal(size=s.shape).astype(s.dtype)
  if "attention_mask" in out:
    out["attention_mask"] = np.ones_like(out["attention_mask"])
  return out


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--config", default="configs/videocc_avr.py:demo")
  parser.add_argument("--steps", type=int, default=10)
  args = parser.parse_args()
  steps = {}
  with tempfile.TemporaryDirectory() as tmp:
    for dtype in ("float32", "bfloat16"):
      config = load_config(args.config, dtype)
      task = registry.build_task(config)
      run = trainer_lib.Trainer(config, pathlib.Path(tmp) / dtype, task, evaluators={})
      run.total_steps, run.steps_per_epoch = 1000, 1000
      host = random_batch(task.batch_spec(config.train.batch_size, train=True),
                          np.random.default_rng(0))
      state, (tx, schedule) = run._init_state(host)  # pylint: disable=protected-access
      step = run.make_train_step(tx, schedule, run._state_sharding(state))  # pylint: disable=protected-access
      batch = partitioning.host_to_global(host, run.mesh)
      state, metrics = step(state, batch)  # compile
      jax.block_until_ready(metrics)
      steps[dtype] = [step, state, batch, [], config.train.batch_size]
  for _ in range(args.steps):
    for dtype, entry in steps.items():
      step, state, batch, times, _ = entry
      t0 = time.perf_counter()
      state, metrics = step(state, batch)
      jax.block_until_ready(metrics)
      times.append(time.perf_counter() - t0)
      entry[1] = state
  report = {dtype: {"median_step_s": float(np.median(e[3])),
                    "examples_per_s": e[4] / float(np.median(e[3]))}
            for dtype, e in steps.items()}
  print(json.dumps({"config": args.config, **report}, indent=1))


if __name__ == "__main__":
  main()
