r"""Train-step time of a config in float32 vs bfloat16 compute, and its share of the CPU's
float32 GEMM peak, alternated in one process.

    python benchmarks/dtype_step_cpu.py [--config=configs/videocc_avr.py:demo] [--steps=10]
        [--dtypes=float32,bfloat16]

Builds the trainer's own jitted step for each dtype (`config.model.dtype`; the config's
batch, its frozen parameters and optimizer), feeds both the same batch of the task's
example shapes (`Task.batch_spec`; random values: the time does not depend on them) and
times the steps alternately (float32, bfloat16, GEMM, float32, ...) so that load on a
shared machine hits all alike. The GEMM is a float32 4096 x 4096 x 4096 matmul, in numpy
and in a jitted jax.numpy call; the peak is the faster of the two medians. Prints, for
each dtype, the step's FLOPs (XLA's cost analysis of the compiled step), the median step
time and examples/s, the FLOP rate and its fraction of the GEMM peak.
"""
import argparse
import importlib.util
import json
import pathlib
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
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


GEMM_SIZE = 4096


def gemm_timers():
  """{name: f() -> seconds of one float32 GEMM_SIZE^3 matmul} for numpy and jax."""
  a = np.random.default_rng(0).normal(size=(GEMM_SIZE, GEMM_SIZE)).astype(np.float32)
  b = a.T.copy()
  ja, jb = jax.device_put(a), jax.device_put(b)
  matmul = jax.jit(jnp.matmul)
  jax.block_until_ready(matmul(ja, jb))

  def timed(fn):
    def run():
      t0 = time.perf_counter()
      jax.block_until_ready(fn())
      return time.perf_counter() - t0
    return run
  return {"numpy": timed(lambda: a @ b), "jax": timed(lambda: matmul(ja, jb))}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--config", default="configs/videocc_avr.py:demo")
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--dtypes", default="float32,bfloat16")
  args = parser.parse_args()
  steps = {}
  with tempfile.TemporaryDirectory() as tmp:
    for dtype in args.dtypes.split(","):
      config = load_config(args.config, dtype)
      task = registry.build_task(config)
      run = trainer_lib.Trainer(config, pathlib.Path(tmp) / dtype, task, evaluators={})
      run.total_steps, run.steps_per_epoch = 1000, 1000
      host = random_batch(task.batch_spec(config.train.batch_size, train=True),
                          np.random.default_rng(0))
      state, (tx, schedule) = run._init_state(host)  # pylint: disable=protected-access
      step = run.make_train_step(tx, schedule, run._state_sharding(state))  # pylint: disable=protected-access
      batch = partitioning.host_to_global(host, run.mesh)
      compiled = step.lower(state, batch).compile()
      cost = compiled.cost_analysis()
      flops = (cost[0] if isinstance(cost, list) else cost)["flops"]
      state, metrics = compiled(state, batch)  # first run
      jax.block_until_ready(metrics)
      steps[dtype] = [compiled, state, batch, [], config.train.batch_size, flops]
  gemms = gemm_timers()
  gemm_times = {name: [] for name in gemms}
  for _ in range(args.steps):
    for dtype, entry in steps.items():
      step, state, batch, times, _, _ = entry
      t0 = time.perf_counter()
      state, metrics = step(state, batch)
      jax.block_until_ready(metrics)
      times.append(time.perf_counter() - t0)
      entry[1] = state
    for name, run_gemm in gemms.items():
      gemm_times[name].append(run_gemm())
  gemm = {name: 2 * GEMM_SIZE ** 3 / float(np.median(t)) / 1e9 for name, t in gemm_times.items()}
  peak = max(gemm.values())
  report = {}
  for dtype, e in steps.items():
    median = float(np.median(e[3]))
    report[dtype] = {"step_gflop": e[5] / 1e9, "median_step_s": median,
                     "examples_per_s": e[4] / median, "gflop_per_s": e[5] / 1e9 / median,
                     "fraction_of_gemm_peak": e[5] / 1e9 / median / peak}
  print(json.dumps({"config": args.config, **report,
                    "gemm_float32_gflop_per_s": {**gemm, "peak": peak}}, indent=1))


if __name__ == "__main__":
  main()
