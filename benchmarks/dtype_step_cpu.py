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

With --dot_bound, it also reads every dot of the compiled float32 step's optimized HLO
(operand shapes and dimension numbers; the step has no loops, so each runs once), times
each distinct product alone as a jitted `lax.dot_general` (median of --dot_repeats, after
a warm-up), and prints their sum: the step cannot be faster than its products, so
step FLOPs / (sum of the products' times) / GEMM peak bounds the step's share of the peak
even if every other op were free. A product alone in a loop sees warm caches and picks
its own layouts, so the bound is generous.
"""
import argparse
import importlib.util
import collections
import json
import pathlib
import re
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

_INSTR = re.compile(r"%([\w.\-]+) = (\w+)\[([\d,]*)\]")
_DOT = re.compile(r"%[\w.\-]+ = \w+\[[\d,]*\]\{[\d,]*\} dot\(%([\w.\-]+), %([\w.\-]+)\)"
                  r"((?:, \w+_dims=\{[\d,]*\})*)")


def hlo_dots(hlo_text: str) -> collections.Counter:
  """Counter {(dtype, lhs shape, rhs shape, dimension numbers): count} of the dots."""
  if " while(" in hlo_text:
    raise ValueError("hlo_dots: the module has a loop; its dots' trip counts are unknown")
  shapes = {m.group(1): (m.group(2), tuple(int(x) for x in m.group(3).split(",") if x))
            for m in _INSTR.finditer(hlo_text)}
  dots = collections.Counter()
  for m in _DOT.finditer(hlo_text):
    (dtype, lhs), (_, rhs) = shapes[m.group(1)], shapes[m.group(2)]
    dims = dict(re.findall(r"(\w+)_dims=\{([\d,]*)\}", m.group(3)))
    parse = lambda k: tuple(int(x) for x in dims.get(k, "").split(",") if x)
    dnums = ((parse("lhs_contracting"), parse("rhs_contracting")),
             (parse("lhs_batch"), parse("rhs_batch")))
    dots[(dtype, lhs, rhs, dnums)] += 1
  return dots


def dot_flops(lhs, rhs, dnums) -> int:
  """2 x output elements x contracted length of one dot_general."""
  (lc, _), (lb, _) = dnums
  batch = int(np.prod([lhs[d] for d in lb]))
  contracted = int(np.prod([lhs[d] for d in lc]))
  free_l = int(np.prod(lhs)) // batch // contracted
  free_r = int(np.prod(rhs)) // batch // contracted
  return 2 * batch * free_l * free_r * contracted


def time_dots(dots: collections.Counter, repeats: int) -> tuple[float, float]:
  """(total FLOPs, total seconds) of the dots, each timed alone (median) x its count."""
  rng = np.random.default_rng(0)
  flops = seconds = 0.0
  for (dtype, lhs, rhs, dnums), count in dots.items():
    dtype = {"f32": jnp.float32, "bf16": jnp.bfloat16}[dtype]
    a = jax.device_put(jnp.asarray(rng.normal(size=lhs), dtype))
    b = jax.device_put(jnp.asarray(rng.normal(size=rhs), dtype))
    fn = jax.jit(lambda x, y, d=dnums: jax.lax.dot_general(x, y, d)).lower(a, b).compile()
    cost = fn.cost_analysis()
    xla_flops = (cost[0] if isinstance(cost, list) else cost)["flops"]
    if abs(xla_flops - dot_flops(lhs, rhs, dnums)) > 1e-6 * xla_flops:
      raise AssertionError(f"dot {lhs} x {rhs} {dnums}: {dot_flops(lhs, rhs, dnums)} FLOPs "
                           f"counted, XLA counts {xla_flops}")
    jax.block_until_ready(fn(a, b))
    times = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      jax.block_until_ready(fn(a, b))
      times.append(time.perf_counter() - t0)
    flops += count * dot_flops(lhs, rhs, dnums)
    seconds += count * float(np.median(times))
  return flops, seconds


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
  parser.add_argument("--dot_bound", action="store_true",
                      help="also time the float32 step's products alone (module docstring)")
  parser.add_argument("--dot_repeats", type=int, default=7)
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
      if args.dot_bound and dtype == "float32":
        dots = hlo_dots(compiled.as_text())
  if args.dot_bound and "float32" not in steps:
    raise ValueError("--dot_bound needs float32 in --dtypes")
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
  if args.dot_bound:
    # Between two GEMM peaks, so a load change shows as peaks that disagree.
    dflops, dseconds = time_dots(dots, args.dot_repeats)
    after = {name: 2 * GEMM_SIZE ** 3 / float(np.median([run_gemm() for _ in range(3)])) / 1e9
             for name, run_gemm in gemms.items()}
    step_flops = steps["float32"][5]
    report["dot_bound"] = {
        "distinct_products": len(dots), "products": sum(dots.values()),
        "products_gflop": dflops / 1e9, "share_of_step_flops": dflops / step_flops,
        "products_alone_s": dseconds,
        "products_gflop_per_s": dflops / 1e9 / dseconds,
        "products_fraction_of_gemm_peak": dflops / 1e9 / dseconds / peak,
        "step_bound_fraction_of_gemm_peak": step_flops / 1e9 / dseconds / peak,
        "gemm_peak_after_products": after}
  for dtype, e in steps.items():
    median = float(np.median(e[3]))
    report[dtype] = {"step_gflop": e[5] / 1e9, "median_step_s": median,
                     "examples_per_s": e[4] / median, "gflop_per_s": e[5] / 1e9 / median,
                     "fraction_of_gemm_peak": e[5] / 1e9 / median / peak}
  print(json.dumps({"config": args.config, **report,
                    "gemm_float32_gflop_per_s": {**gemm, "peak": peak}}, indent=1))


if __name__ == "__main__":
  main()
