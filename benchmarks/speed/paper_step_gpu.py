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
import jax.numpy as jnp
import numpy as np
import optax

from avtext.losses import contrastive
from avtext.models import registry
from benchmarks import common

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


def build(setting: dict, abstract=False):
  """(init, tx, batch, step) of the paper model at `setting` (batch, dtype, remat,
  attention)."""
  config = common.load_config("configs/videocc_avr.py")
  config.model.dtype, config.model.remat, config.model.attention = (
      setting["dtype"], setting["remat"], setting["attention"])
  model = registry.build_model(config.model)
  d = config.data
  b = setting["batch"]
  batch = abstract_batch(config, b) if abstract else {
      "rgb": jnp.asarray(np.random.default_rng(0).normal(
          size=(b, d.num_frames, d.image_size, d.image_size, 3)), jnp.float32),
      "audio": jnp.asarray(np.random.default_rng(1).normal(
          size=(b, d.spec_segments * d.spec_segment_frames, d.num_mel_bins)), jnp.float32),
      "input_ids": jnp.asarray(np.random.default_rng(2).integers(
          0, config.model.text.vocab_size, (b, d.max_text_len)), jnp.int32),
      "attention_mask": jnp.ones((b, d.max_text_len), jnp.int32),
  }
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1, momentum=0.9))

  def loss_fn(params, batch, rng):
    video, text = model.apply({"params": params}, {"rgb": batch["rgb"], "audio": batch["audio"]},
                              batch["input_ids"], batch["attention_mask"], train=True,
                              rngs={"dropout": rng})
    sim = text.astype(jnp.float32) @ video.astype(jnp.float32).T
    return contrastive.nce(sim, temperature=config.loss.temperature)

  def step(params, opt_state, batch, rng):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, rng)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  one = {k: jnp.zeros((1,) + v.shape[1:], v.dtype) for k, v in batch.items()}

  def init(rng):
    return model.init(rng, {"rgb": one["rgb"], "audio": one["audio"]},
                      one["input_ids"], one["attention_mask"])["params"]
  return init, tx, batch, step


def random_params(shapes):
  """Parameters of the given shapes, N(0, 0.02) (scales 1, biases 0), made leaf by leaf:
  a step's time does not depend on the values, and a jitted `model.init` of ViT-B MBT +
  BERT-base (a whole forward pass) took 101 s to compile on an H100."""
  leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  out = []
  for i, (path, leaf) in enumerate(leaves):
    name = str(path[-1])
    if "scale" in name:
      value = jnp.ones(leaf.shape, leaf.dtype)
    elif "bias" in name:
      value = jnp.zeros(leaf.shape, leaf.dtype)
    else:
      value = 0.02 * jax.random.normal(jax.random.PRNGKey(i), leaf.shape, leaf.dtype)
    out.append(value)
  return jax.tree_util.tree_unflatten(treedef, out)


def abstract_batch(config, b):
  d = config.data
  f32, i32 = jnp.float32, jnp.int32
  return {"rgb": jax.ShapeDtypeStruct((b, d.num_frames, d.image_size, d.image_size, 3), f32),
          "audio": jax.ShapeDtypeStruct((b, d.spec_segments * d.spec_segment_frames,
                                         d.num_mel_bins), f32),
          "input_ids": jax.ShapeDtypeStruct((b, d.max_text_len), i32),
          "attention_mask": jax.ShapeDtypeStruct((b, d.max_text_len), i32)}


def model_flops(setting: dict) -> float:
  """FLOPs of one step counted once: the step without remat, lowered from abstract
  inputs (tracing only), XLA's cost analysis before optimization."""
  plain = {**setting, "remat": "none", "attention": "xla"}
  init, tx, batch, step = build(plain, abstract=True)
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
  init, tx, batch, step = build(setting)
  t0 = time.perf_counter()
  params = random_params(jax.eval_shape(init, jax.random.PRNGKey(0)))
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
