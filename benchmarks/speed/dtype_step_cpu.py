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

With --traffic, it also counts the bytes that the float32 step's other kernels (XLA's
fusions, copies and reductions: every top-level op of the optimized HLO that is not a
product) read and write, measures this machine's streaming bandwidth in the same run (a
jitted sum and an in-place multiply-add over 1 GiB), and prints the time those bytes take
at that bandwidth; with --dot_bound as well, the measured non-product time (the step less
its products alone), its effective GB/s, and the step bound "products alone + non-product
bytes at the streaming bandwidth": what XLA's fusion plan allows if every kernel ran at
the memory's speed.

--set dotted.key=value overrides a config field (repeatable), e.g. the paper config at a
batch that fits a CPU:

    python benchmarks/dtype_step_cpu.py --config=configs/videocc_avr.py --dtypes=float32 \
        --steps=4 --set train.batch_size=1 --set model.video.init_from_vit.path= \
        --set model.remat=none --set model.attention=xla --set model.scan_layers=False \
        --set partitioning.fsdp=False
"""
import argparse
import ast
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


def load_config(spec: str, dtype: str, overrides: tuple[str, ...] = ()):
  """`configs/<x>.py[:variant]` with config.model.dtype set, on one device, and each
  "dotted.key=value" of `overrides` applied (the value read as a Python literal, else as
  a string; "key=" is the empty string), as --config.dotted.key=value would."""
  path, _, arg = spec.partition(":")
  loaded = importlib.util.spec_from_file_location("experiment_config", REPO / path)
  module = importlib.util.module_from_spec(loaded)
  loaded.loader.exec_module(module)
  config = module.get_config(arg or None)
  for item in overrides:
    key, eq, text = item.partition("=")
    if not eq:
      raise ValueError(f"--set {item!r}: expected dotted.key=value")
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text
    *parents, leaf = key.split(".")
    node = config
    for name in parents:
      node = node[name]
    if leaf not in node:
      raise KeyError(f"--set {item!r}: the config has no field {key!r}")
    node[leaf] = value
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


_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s64": 8, "u64": 8, "f64": 8,
          "pred": 1, "s8": 1, "u8": 1}
_SHAPE = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([\d,]*)\]")
_ENTRY_OP = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = (.*?) ([\w\-]+)\((.*)$")
_NOT_KERNELS = ("parameter", "get-tuple-element", "tuple", "constant", "bitcast")


def _shape_bytes(text: str) -> int:
  return sum(_BYTES[dtype] * int(np.prod([int(d) for d in dims.split(",") if d]))
             for dtype, dims in _SHAPE.findall(text))


def hlo_traffic(hlo_text: str) -> tuple[int, int]:
  """(bytes, kernels) of the entry computation's kernels that are not products: for each
  top-level instruction other than a dot, a convolution or a fusion holding one (and other
  than parameters, tuples, constants and bitcasts, which move nothing), the bytes of its
  operands and of its result. What XLA's fusion plan reads and writes outside the
  products, each operand counted once per kernel that reads it."""
  if " while(" in hlo_text:
    raise ValueError("hlo_traffic: the module has a loop; its trip counts are unknown")
  bodies, name = {}, None
  for line in hlo_text.splitlines():
    head = re.match(r"^(ENTRY )?%([\w.\-]+) ", line)
    if head and line.rstrip().endswith("{"):
      name = "ENTRY" if head.group(1) else head.group(2)
      bodies[name] = []
    elif name is not None:
      bodies[name].append(line)
  sizes, total, kernels = {}, 0, 0
  for line in bodies["ENTRY"]:
    m = _ENTRY_OP.match(line)
    if not m:
      continue
    name, result, op, rest = m.groups()
    sizes[name] = _shape_bytes(result)
    if op in _NOT_KERNELS:
      continue
    calls = re.search(r"calls=%([\w.\-]+)", rest)
    body = "\n".join(bodies.get(calls.group(1), [])) if calls else ""
    if op in ("dot", "convolution") or " dot(" in body or " convolution(" in body:
      continue
    operands = re.findall(r"%([\w.\-]+)", rest.split("), ")[0])
    total += sizes[name] + sum(sizes.get(o, 0) for o in operands)
    kernels += 1
  return total, kernels


def stream_bandwidth(nbytes: int = 1 << 30, repeats: int = 10) -> dict:
  """GB/s of two jitted streaming kernels over a float32 buffer far larger than the caches
  (median of `repeats`, after a warm-up): "read" sums it, "read_write" updates it in place
  (x * a + b on the donated buffer; its bytes read and written both count)."""
  buffer = [jnp.ones((nbytes // 4,), jnp.float32)]
  total = jax.jit(jnp.sum)
  update = jax.jit(lambda v: v * 1.0000001 + 1e-7, donate_argnums=0)

  def read():
    jax.block_until_ready(total(buffer[0]))

  def read_write():
    buffer[0] = jax.block_until_ready(update(buffer[0]))

  out = {}
  for name, run, moved in (("read", read, nbytes), ("read_write", read_write, 2 * nbytes)):
    run()
    times = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      run()
      times.append(time.perf_counter() - t0)
    out[name] = moved / float(np.median(times)) / 1e9
  return out


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
  parser.add_argument("--traffic", action="store_true",
                      help="also count the bytes the float32 step's non-product kernels move "
                           "and the machine's streaming bandwidth (module docstring)")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="a config override, e.g. --set train.batch_size=1 (repeatable)")
  args = parser.parse_args()
  steps = {}
  with tempfile.TemporaryDirectory() as tmp:
    for dtype in args.dtypes.split(","):
      config = load_config(args.config, dtype, tuple(args.set))
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
      if args.traffic and dtype == "float32":
        traffic = hlo_traffic(compiled.as_text())
  if (args.dot_bound or args.traffic) and "float32" not in steps:
    raise ValueError("--dot_bound and --traffic need float32 in --dtypes")
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
  if args.traffic:
    bandwidth = stream_bandwidth()
    fastest = max(bandwidth.values())
    step_s = float(np.median(steps["float32"][3]))
    report["traffic"] = {
        "non_product_kernels": traffic[1], "non_product_gb": traffic[0] / 1e9,
        "stream_gb_per_s": bandwidth,
        "non_product_s_at_stream_bandwidth": traffic[0] / 1e9 / fastest}
    if args.dot_bound:
      floor = dseconds + traffic[0] / 1e9 / fastest
      report["traffic"].update({
          "non_product_s_measured": step_s - dseconds,
          "non_product_gb_per_s_measured": traffic[0] / 1e9 / (step_s - dseconds),
          "step_bound_s": floor,
          "step_bound_fraction_of_gemm_peak": steps["float32"][5] / 1e9 / floor / peak})
  for dtype, e in steps.items():
    median = float(np.median(e[3]))
    report[dtype] = {"step_gflop": e[5] / 1e9, "median_step_s": median,
                     "examples_per_s": e[4] / median, "gflop_per_s": e[5] / 1e9 / median,
                     "fraction_of_gemm_peak": e[5] / 1e9 / median / peak}
  print(json.dumps({"config": args.config, "overrides": args.set, **report,
                    "gemm_float32_gflop_per_s": {**gemm, "peak": peak}}, indent=1))


if __name__ == "__main__":
  main()
