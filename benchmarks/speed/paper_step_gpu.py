r"""The AVR paper model's train step on one accelerator: step time and MFU.

    python -m benchmarks.speed.paper_step_gpu --batch=32 --steps=5 [--dtype=bfloat16] \
        [--remat=full] [--attention=cudnn] [--model_flops=94.9e12]

configs/videocc_avr.py's paper model (MBT ViT-B/16 on 32 frames of 224^2 + an 800 x 128
log-mel spectrogram, BERT-base on 32 tokens, D = 256, NCE at sigma 0.05, SGD with
momentum) on random inputs of the paper's shapes at a per-device batch that fits one
chip; the step is the same computation as the trainer's (value_and_grad of the task's
loss, clipped SGD update), without the input pipeline. MFU = model FLOPs of the step
(XLA's cost analysis of the same step without remat, counted before optimization) /
(measured step time x the chip's dense bf16 peak, --peak_tflops).

Needs only jax, flax, optax and ml_collections (no data, no weights, no tokenizer files),
so it runs on an accelerator machine's own JAX. --quick: batch 2, one timed step. Rows:
step time, clips/s, MFU, temporaries and compile time of the setting.
"""
import json
import sys
import time

from absl import flags
import jax
import numpy as np

from benchmarks import common
from benchmarks.common import avr_step

_BATCH = flags.DEFINE_integer("batch", 32, "clips a step")
_STEPS = flags.DEFINE_integer("steps", 5, "timed steps")
_DTYPE = flags.DEFINE_string("dtype", "bfloat16", "compute dtype")
_REMAT = flags.DEFINE_string("remat", "full", "config.model.remat")
_ATTENTION = flags.DEFINE_string("attention", "cudnn", "config.model.attention")
_PEAK = flags.DEFINE_float("peak_tflops", 989.0, "dense bf16 peak of the chip (H100 SXM: 989)")
_MODEL_FLOPS = flags.DEFINE_float("model_flops", None, "model FLOPs per step if already "
                                  "counted (skips the lowering)")
_FLOPS_ONLY = flags.DEFINE_bool("flops_only", False, "print the model FLOPs per step and stop "
                                "(any machine)")


def model_flops(setting: dict) -> float:
  """FLOPs of one step counted once: the step without remat, lowered from abstract
  inputs (tracing only), XLA's cost analysis before optimization."""
  plain = {**setting, "remat": "none", "attention": "xla"}
  init, tx, batch, step = avr_step.build(plain, abstract=True)
  params = jax.eval_shape(init, jax.random.PRNGKey(0))
  cost = jax.jit(step).lower(params, jax.eval_shape(tx.init, params), batch,
                             jax.random.PRNGKey(1)).cost_analysis()
  return float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])


def main(argv):
  del argv
  setting = {"batch": 2 if common.quick() else _BATCH.value, "dtype": _DTYPE.value,
             "remat": _REMAT.value, "attention": _ATTENTION.value}
  steps = 1 if common.quick() else _STEPS.value
  if _FLOPS_ONLY.value:
    print(json.dumps({"batch": setting["batch"], "model_flops_per_step": model_flops(setting)}))
    return
  init, tx, batch, step = avr_step.build(setting)
  t0 = time.perf_counter()
  params = avr_step.random_params(jax.eval_shape(init, jax.random.PRNGKey(0)))
  opt_state = jax.jit(tx.init)(params)
  print(f"initialized in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
  rng = jax.random.PRNGKey(1)
  jitted = jax.jit(step, donate_argnums=(0, 1))
  t0 = time.perf_counter()
  compiled = jitted.lower(params, opt_state, batch, rng).compile()
  compile_s = time.perf_counter() - t0
  print(f"compiled in {compile_s:.0f} s", file=sys.stderr, flush=True)
  mem = compiled.memory_analysis()
  flops = _MODEL_FLOPS.value or model_flops(setting)
  for _ in range(2):  # warm-up
    params, opt_state, loss = compiled(params, opt_state, batch, rng)
  loss.block_until_ready()
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    params, opt_state, loss = compiled(params, opt_state, batch, rng)
    loss.block_until_ready()
    times.append(time.perf_counter() - t0)
  step_s = float(np.median(times))
  mfu = flops / (step_s * _PEAK.value * 1e12)
  temp_gib = getattr(mem, "temp_size_in_bytes", 0) / 2 ** 30
  device = jax.devices()[0].device_kind
  print(json.dumps({
      "device": device, "jax": jax.__version__, **setting,
      "compile_s": round(compile_s, 1), "step_s_median": step_s,
      "step_s_all": [round(t, 4) for t in times], "clips_per_s": setting["batch"] / step_s,
      "model_tflop_per_step": flops / 1e12, "mfu": mfu, "temp_gib": temp_gib,
      "args_gib": getattr(mem, "argument_size_in_bytes", 0) / 2 ** 30,
      "loss": float(loss)}))
  table = f"configs/videocc_avr.py's paper model on one {device}, median of {steps} steps"
  metric = (f"batch {setting['batch']}, remat {setting['remat']}, attention "
            f"{setting['attention']}, {setting['dtype']}")
  for column, value, unit in (("step", step_s, "s"), ("clips/s", setting["batch"] / step_s, ""),
                              ("MFU", 100 * mfu, "%"), ("temporaries", temp_gib, "GiB"),
                              ("compile", round(compile_s), "s")):
    common.record("Paper configs at scale", metric, value, unit=unit, table=table, column=column,
                  digits=3)


if __name__ == "__main__":
  common.main(main)
