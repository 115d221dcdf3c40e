r"""Train-step time of a config in float32 vs bfloat16 compute, and its share of the CPU's
float32 GEMM peak, alternated in one process.

    python -m benchmarks.speed.dtype_step_cpu [--config=configs/videocc_avr.py:demo] \
        [--steps=10] [--dtypes=float32,bfloat16] [--dot_bound] [--traffic] [--quick]

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

    python -m benchmarks.speed.dtype_step_cpu --config=configs/videocc_avr.py --dtypes=float32 \
        --steps=4 --set=train.batch_size=1 --set=model.video.init_from_vit.path= \
        --set=model.remat=none --set=model.attention=xla --set=model.scan_layers=False \
        --set=partitioning.fsdp=False

Rows: each dtype's step FLOPs, median step time, examples/s and share of the GEMM peak,
the peak itself, and the --dot_bound / --traffic figures. --quick: float32 only, 2 steps.
"""
import collections
import pathlib
import tempfile
import time

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from avtext.tasks import task_registry
from avtext.train import partitioning
from avtext.train import trainer as trainer_lib
from benchmarks import common
from benchmarks.common import hlo

_CONFIG = flags.DEFINE_string("config", "configs/videocc_avr.py:demo", "config[:variant]")
_STEPS = flags.DEFINE_integer("steps", 10, "timed rounds (one step of each dtype + GEMMs)")
_DTYPES = flags.DEFINE_list("dtypes", ["float32", "bfloat16"], "compute dtypes")
_DOT_BOUND = flags.DEFINE_bool("dot_bound", False, "also time the float32 step's products "
                               "alone (module docstring)")
_DOT_REPEATS = flags.DEFINE_integer("dot_repeats", 7, "timed calls of each product")
_TRAFFIC = flags.DEFINE_bool("traffic", False, "also count the bytes the float32 step's "
                             "non-product kernels move and the machine's streaming "
                             "bandwidth (module docstring)")
_SET = flags.DEFINE_multi_string("set", [], "a config override KEY=VALUE, e.g. "
                                 "--set=train.batch_size=1 (repeatable)")
SYSTEM = "VideoCC AVR"


def load_config(spec: str, dtype: str, overrides: tuple[str, ...] = ()):
  """`common.load_config` with config.model.dtype set, on one device."""
  config = common.load_config(spec, overrides)
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
    out[name] = moved / float(np.median(common.timed(run, repeats))) / 1e9
  return out


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
    if abs(xla_flops - hlo.dot_flops(lhs, rhs, dnums)) > 1e-6 * xla_flops:
      raise AssertionError(f"dot {lhs} x {rhs} {dnums}: {hlo.dot_flops(lhs, rhs, dnums)} FLOPs "
                           f"counted, XLA counts {xla_flops}")
    jax.block_until_ready(fn(a, b))
    times = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      jax.block_until_ready(fn(a, b))
      times.append(time.perf_counter() - t0)
    flops += count * hlo.dot_flops(lhs, rhs, dnums)
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


def main(argv):
  del argv
  dtypes = ["float32"] if common.quick() else _DTYPES.value
  rounds = 2 if common.quick() else _STEPS.value
  overrides = tuple(_SET.value)
  steps = {}
  with tempfile.TemporaryDirectory() as tmp:
    for dtype in dtypes:
      config = load_config(_CONFIG.value, dtype, overrides)
      task = task_registry.build_task(config)
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
      if _DOT_BOUND.value and dtype == "float32":
        dots = hlo.hlo_dots(compiled.as_text())
      if _TRAFFIC.value and dtype == "float32":
        traffic = hlo.hlo_traffic(compiled.as_text())
  if (_DOT_BOUND.value or _TRAFFIC.value) and "float32" not in steps:
    raise ValueError("--dot_bound and --traffic need float32 in --dtypes")
  gemms = gemm_timers()
  gemm_times = {name: [] for name in gemms}
  for _ in range(rounds):
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
  table = _CONFIG.value + (" with the command's --set overrides" if overrides else "")
  demo = _CONFIG.value == "configs/videocc_avr.py:demo" and not overrides

  def record(metric, value, unit="", **kw):
    common.record(SYSTEM, metric, value, unit=unit, table=table, **kw)

  for dtype, e in steps.items():
    median = float(np.median(e[3]))
    share = e[5] / 1e9 / median / peak
    print(f"{dtype}: {e[5] / 1e9:.2f} GFLOP a step, median {median:.3f} s, "
          f"{e[4] / median:.1f} examples/s, {e[5] / 1e9 / median:.1f} GFLOP/s = "
          f"{100 * share:.1f} % of the GEMM peak", flush=True)
    record(f"{dtype} step (XLA's FLOP count)", e[5] / 1e9, "GFLOP")
    record(f"{dtype} step, median of {rounds}", median, "s")
    record(f"{dtype} examples/s", e[4] / median)
    record(f"{dtype} train step, share of the GEMM peak", 100 * share, "%",
           headline="speed" if demo and dtype == "float32" else None,
           peer=65.0 if demo and dtype == "float32" else None,
           peer_name="target" if demo and dtype == "float32" else None, digits=3)
  print(f"float32 {GEMM_SIZE}^3 GEMM: " + ", ".join(f"{k} {v:.1f}" for k, v in gemm.items())
        + " GFLOP/s")
  record(f"float32 {GEMM_SIZE}^3 GEMM peak, same run", peak, "GFLOP/s")
  if _DOT_BOUND.value:
    # Between two GEMM peaks, so a load change shows as peaks that disagree.
    dflops, dseconds = time_dots(dots, _DOT_REPEATS.value)
    after = max(2 * GEMM_SIZE ** 3 / float(np.median([run_gemm() for _ in range(3)])) / 1e9
                for run_gemm in gemms.values())
    print(f"{sum(dots.values())} products ({len(dots)} distinct), {dflops / 1e9:.2f} GFLOP, "
          f"alone {dseconds:.3f} s = {100 * dflops / 1e9 / dseconds / peak:.1f} % of the peak "
          f"(GEMM peak after them {after:.1f} GFLOP/s)")
    record(f"its {sum(dots.values())} products, each timed alone", dseconds, "s")
    record("the products alone, share of the GEMM peak",
           100 * dflops / 1e9 / dseconds / peak, "%", digits=3)
  if _TRAFFIC.value:
    bandwidth = stream_bandwidth()
    fastest = max(bandwidth.values())
    step_s = float(np.median(steps["float32"][3]))
    print(f"non-product kernels: {traffic[1]}, {traffic[0] / 1e9:.2f} GB a step; streaming "
          + ", ".join(f"{k} {v:.1f}" for k, v in bandwidth.items()) + " GB/s")
    record(f"bytes its {traffic[1]} non-product kernels read and write", traffic[0] / 1e9, "GB")
    record("streaming bandwidth, same run (multiply-add / sum)",
           f"{bandwidth['read_write']:.1f} / {bandwidth['read']:.1f}", "GB/s")
    if _DOT_BOUND.value:
      floor = dseconds + traffic[0] / 1e9 / fastest
      print(f"non-product time measured {step_s - dseconds:.3f} s "
            f"({traffic[0] / 1e9 / (step_s - dseconds):.1f} GB/s); bound {floor:.3f} s = "
            f"{100 * steps['float32'][5] / 1e9 / floor / peak:.1f} % of the peak")
      record("its non-product kernels, measured (step less products)", step_s - dseconds, "s")
      record("their rate", traffic[0] / 1e9 / (step_s - dseconds), "GB/s", digits=3)
      record("bound: products alone + those bytes at the streaming bandwidth", floor, "s")
      record("the bound, share of the GEMM peak",
             100 * steps["float32"][5] / 1e9 / floor / peak, "%", digits=3)


if __name__ == "__main__":
  common.main(main)
