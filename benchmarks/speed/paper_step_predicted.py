r"""The cost model against the measured H100 steps: each measured setting compiled here.

    python -m benchmarks.speed.paper_step_predicted [--rows=32:full:cudnn,...]

For every setting BENCHMARKS "AVR paper model on one H100" measured
(`benchmarks.speed.paper_step_gpu`: batch 16 / 32 / 64, remat none / full, attention
cudnn / xla / blocked), the same step (`benchmarks.common.avr_step.build`, abstract inputs) is
compiled for one H100 by the CUDA plugin on this CPU (`avtext.aot.programs.
gpu_topology_devices`, no GPU), read kernel by kernel (`avtext.aot.hlo_cost`) and timed
by `avtext.aot.cost_model.predict` with the H100's figures of `avtext.aot.chips` (one
set, never fitted). Rows: predicted step, measured step (the store's latest
paper_step_gpu row of that setting), predicted / measured, the predicted time by op
class, kernel runs, HBM the program needs against what JAX's allocator has (75 % of the
GPU's memory by default: a program over it fails to allocate, as the measured batch-32
no-remat step did), and the global bound for comparison.

Each setting compiles in its own process with XLA's GEMMs as cuBLAS calls
(--xla_gpu_enable_triton_gemm=false): the GPU compiler cannot autotune without a GPU,
and its untuned Triton tiling fails on the xla and blocked attention programs ("Couldn't
find output tile sizes"); the measured run's autotuner chose per GEMM. --keep_hlo keeps
each program in <out>/<setting>.hlo.
--quick: the batch-16 full-remat cuDNN setting only (rows printed, not stored).
"""
import json
import os
import subprocess
import sys

from absl import flags

from benchmarks import common

MEASURED_TABLE = ("configs/videocc_avr.py's paper model on one NVIDIA H100 80GB HBM3, "
                  "median of 5 steps")
SETTINGS = ("16:none:cudnn", "16:full:cudnn", "32:full:cudnn", "32:none:cudnn",
            "64:full:cudnn", "32:full:xla", "32:full:blocked")
# The model FLOPs of a batch-32 step, `paper_step_gpu --flops_only`: the figure the
# measured rows' MFU used (--model_flops=94.9e12 x batch / 32).
MODEL_FLOPS_B32 = 94.9e12
ALLOCATOR_FRACTION = 0.75  # XLA_PYTHON_CLIENT_MEM_FRACTION's default (JAX GPU docs)
SYSTEM = "Paper configs at scale"
TABLE = ("the AVR paper step on one H100: predicted by the per-kernel model (compiled on "
         "this CPU) against measured")

_ROWS = flags.DEFINE_list("rows", list(SETTINGS), "settings batch:remat:attention")
_ONE = flags.DEFINE_string("one", None, "(internal) compile one setting and print its JSON")
_KEEP_HLO = flags.DEFINE_bool("keep_hlo", False, "keep each compiled program's HLO in --out")


def metric(batch: int, remat: str, attention: str) -> str:
  """paper_step_gpu's row name of a setting."""
  return f"batch {batch}, remat {remat}, attention {attention}, bfloat16"


def measured() -> dict[str, float | str]:
  """{metric: measured step in seconds, or the failure text} from the results store."""
  out = {}
  for row in common.stored_rows():
    if row.get("table") == MEASURED_TABLE and row.get("column") == "step":
      out[row["metric"]] = row["value"]
  return out


def compile_one(setting: str, hlo_path: str | None) -> dict:
  """One setting compiled for one H100 and read: its costs, memory and prediction."""
  import jax  # pylint: disable=g-import-not-at-top
  from avtext.aot import chips  # pylint: disable=g-import-not-at-top
  from avtext.aot import cost_model  # pylint: disable=g-import-not-at-top
  from avtext.aot import hlo_cost  # pylint: disable=g-import-not-at-top
  from avtext.aot import programs  # pylint: disable=g-import-not-at-top
  from benchmarks.common import avr_step  # pylint: disable=g-import-not-at-top
  batch, remat, attention = setting.split(":")
  s = {"batch": int(batch), "dtype": "bfloat16", "remat": remat, "attention": attention,
       "backend": "gpu"}
  [device] = programs.topology_devices("h100:1x1")
  init, tx, inputs, step = avr_step.build(s, abstract=True)
  sharding = jax.sharding.SingleDeviceSharding(device)
  placed = lambda tree: jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)
  params = jax.eval_shape(init, jax.random.PRNGKey(0))
  args = (placed(params), placed(jax.eval_shape(tx.init, params)), placed(inputs),
          placed(jax.eval_shape(lambda: jax.random.PRNGKey(1))))
  compiled = jax.jit(step, donate_argnums=(0, 1)).lower(*args).compile()
  text = compiled.as_text()
  if hlo_path:
    with open(hlo_path, "w") as f:
      f.write(text)
  chip = chips.CHIPS["h100"]
  model_flops = MODEL_FLOPS_B32 * s["batch"] / 32
  cost = hlo_cost.analyze_hlo(text)
  needed = programs.memory(compiled)
  return {"setting": setting, "model_flops": model_flops, "flops": cost.flops,
          "bytes": cost.bytes, "hbm_needed_gib": programs.hbm_needed(needed) / 2 ** 30,
          "bound": cost_model.bound(cost, chip, model_flops),
          "predicted": cost_model.predict(cost, chip, model_flops)}


def run_child(setting: str) -> dict:
  hlo = str(common.out_dir() / f"{setting.replace(':', '_')}.hlo") if _KEEP_HLO.value else ""
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") +
                       " --xla_gpu_enable_triton_gemm=false").strip()}
  out = subprocess.run([sys.executable, "-m", "benchmarks.speed.paper_step_predicted",
                        f"--one={setting}", f"--out={common.out_dir()}", "--results=",
                        *(["--keep_hlo"] if hlo else [])],
                       cwd=common.REPO, env=env, capture_output=True, text=True)
  if out.returncode:
    raise RuntimeError(f"{setting}: compile failed:\n" + out.stderr[-3000:])
  return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv):
  del argv
  if _ONE.value:
    hlo = (str(common.out_dir() / f"{_ONE.value.replace(':', '_')}.hlo")
           if _KEEP_HLO.value else None)
    print(json.dumps(compile_one(_ONE.value, hlo)))
    return
  from avtext.aot import chips  # pylint: disable=g-import-not-at-top
  usable = ALLOCATOR_FRACTION * chips.CHIPS["h100"].hbm_gib
  steps = measured()
  lines = ["| setting | predicted | measured | predicted / measured | by op class (ms) | "
           "kernel runs | HBM needed / usable | global bound |", "|---|---|---|---|---|---|---|---|"]
  for setting in (["16:full:cudnn"] if common.quick() else _ROWS.value):
    print(f"compiling {setting} for one H100 ...", file=sys.stderr, flush=True)
    r = run_child(setting)
    batch, remat, attention = setting.split(":")
    name = metric(int(batch), remat, attention)
    p = r["predicted"]
    real = steps.get(name)
    fits = r["hbm_needed_gib"] <= usable
    classes = ", ".join(f"{c} {1e3 * v['time_s']:.0f}" for c, v in p["by_class"].items()
                        if v["time_s"] >= 5e-4)

    def row(column, value, unit="", **kw):
      common.record(SYSTEM, name, value, unit=unit, table=TABLE, column=column, **kw)

    row("predicted step", 1e3 * p["step_s"], "ms", digits=4)
    row("predicted MFU", 100 * p["mfu"], "%", digits=3)
    if isinstance(real, (int, float)):
      row("measured step", 1e3 * real, "ms", digits=4)
      row("predicted / measured", p["step_s"] / real, digits=3)
    else:
      row("measured step", "out of memory" if not fits else "not measured")
    row("by op class (ms)", classes)
    row("kernel runs", p["launches"])
    row("HBM needed / usable", f"{r['hbm_needed_gib']:.1f} / {usable:.1f} GiB"
        + ("" if fits else " (does not fit)"))
    row("global bound", 1e3 * r["bound"]["step_time_lower_bound_s"], "ms", digits=4)
    ratio = f"{p['step_s'] / real:.2f}" if isinstance(real, (int, float)) else "-"
    lines.append(f"| {name} | {1e3 * p['step_s']:.0f} ms ({100 * p['mfu']:.1f} %) | "
                 f"{f'{1e3 * real:.0f} ms' if isinstance(real, (int, float)) else '-'} | "
                 f"{ratio} | {classes} | {p['launches']} | {r['hbm_needed_gib']:.1f} / "
                 f"{usable:.1f} GiB | {1e3 * r['bound']['step_time_lower_bound_s']:.0f} ms |")
    print(lines[-1], flush=True)
  print("\n".join(lines))


if __name__ == "__main__":
  common.main(main)
