"""The AVR paper model's train step as the speed benchmarks build it: the step of
configs/videocc_avr.py's paper model (value_and_grad of its NCE loss, a clipped SGD
update) on inputs of the paper's shapes, concrete or abstract, without the input
pipeline (`benchmarks.speed.paper_step_gpu` times it on an accelerator,
`benchmarks.speed.paper_step_predicted` compiles it for one and predicts it)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from avtext.losses import contrastive
from avtext.models import model_registry
from benchmarks import common


def build(setting: dict, abstract=False):
  """(init, tx, batch, step) of the paper model at `setting` (batch, dtype, remat,
  attention; optionally the backend it is traced for)."""
  config = common.load_config("configs/videocc_avr.py")
  config.model.dtype, config.model.remat, config.model.attention = (
      setting["dtype"], setting["remat"], setting["attention"])
  config.model.backend = setting.get("backend")
  model = model_registry.build_model(config.model)
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
