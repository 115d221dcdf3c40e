"""Tests for avtext.models.layers: masks, Attention, EncoderBlock, KV cache.

The cache tests decode a tiny pre-LN decoder (built here) token by token and
compare with one full-sequence forward pass; the attention tests compare with
flax's nn.MultiHeadDotProductAttention and a NumPy softmax(QK^T/sqrt(d))V on
the module's own parameters.
"""
import functools

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import scipy.special

from avtext.models import attention as attention_lib
from avtext.models import layers
from avtext.models import mbt
from avtext.models import mmt
from avtext.models import xml

VOCAB, WIDTH, HEADS, DEPTH, MAX_LEN, BATCH = 11, 16, 2, 2, 8, 2


def _random_params(module, *args, seed=0, **kwargs):
  """Random params of the module's shapes (LayerNorm scales around 1).

  Drawn on the host: compiling flax's initializers dominates tiny tests.
  """
  shapes = jax.eval_shape(
      lambda: module.init(jax.random.PRNGKey(0), *args, **kwargs))["params"]
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    noise = 0.3 * rng.normal(size=leaf.shape)
    return jnp.asarray(noise + (path[-1].key == "scale"), jnp.float32)
  return jax.tree_util.tree_map_with_path(draw, shapes)


def _normal(shape, seed):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape),
                     jnp.float32)


# ---------------------------------------------------------------------------
# Masks, against literal arrays.


def test_padding_mask_masks_keys_only():
  got = attention_lib.make_padding_mask(jnp.array([[1, 1, 0], [1, 0, 0]]), 3)
  want = np.array([[1, 1, 0], [1, 0, 0]], bool)[:, None, None, :]
  assert got.dtype == jnp.bool_
  np.testing.assert_array_equal(got, want)
  with pytest.raises(ValueError, match=r"\[batch, 4\]"):
    attention_lib.make_padding_mask(jnp.ones((2, 3)), 4)


def test_causal_mask():
  want = np.array([[1, 0, 0, 0],
                   [1, 1, 0, 0],
                   [1, 1, 1, 0],
                   [1, 1, 1, 1]], bool)
  np.testing.assert_array_equal(attention_lib.make_causal_mask(4), want[None, None])


def test_prefix_lm_mask():
  got = attention_lib.make_prefix_lm_mask(jnp.array([2, 3, 0]), 4)
  want = np.array([
      [[1, 1, 0, 0],
       [1, 1, 0, 0],
       [1, 1, 1, 0],
       [1, 1, 1, 1]],
      [[1, 1, 1, 0],
       [1, 1, 1, 0],
       [1, 1, 1, 0],
       [1, 1, 1, 1]],
      [[1, 0, 0, 0],  # No prefix: causal.
       [1, 1, 0, 0],
       [1, 1, 1, 0],
       [1, 1, 1, 1]],
  ], bool)
  assert got.shape == (3, 1, 4, 4)
  np.testing.assert_array_equal(got, want[:, None])


def test_combine_masks():
  padding = attention_lib.make_padding_mask(jnp.array([[1, 1, 1], [0, 1, 1]]))
  got = attention_lib.combine_masks(None, padding, attention_lib.make_causal_mask(3))
  want = np.array([
      [[1, 0, 0],
       [1, 1, 0],
       [1, 1, 1]],
      [[0, 0, 0],
       [0, 1, 0],
       [0, 1, 1]],
  ], bool)
  np.testing.assert_array_equal(got, want[:, None])
  assert attention_lib.combine_masks(None, None) is None


# ---------------------------------------------------------------------------
# Attention.


def _ref_attention(q_in, kv_in, p, mask=None):
  """float64 softmax(QK^T / sqrt(d)) V and output projection."""
  p = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), p)
  q_in, kv_in = np.asarray(q_in, np.float64), np.asarray(kv_in, np.float64)
  project = lambda x, n: (np.einsum("bld,dhk->blhk", x, p[n]["kernel"]) +
                          p[n]["bias"])
  q, k, v = (project(q_in, "query"), project(kv_in, "key"),
             project(kv_in, "value"))
  logits = np.einsum("bqhk,bphk->bhqp", q, k) / np.sqrt(q.shape[-1])
  if mask is not None:
    logits = np.where(mask, logits, -np.inf)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  o = np.einsum("bhqp,bphk->bqhk", w, v)
  return np.einsum("bqhk,hkd->bqd", o, p["out"]["kernel"]) + p["out"]["bias"]


def test_attention_equals_numpy_softmax_attention():
  attention = attention_lib.Attention(num_heads=HEADS)
  x, context = _normal((2, 5, WIDTH), 1), _normal((2, 3, 6), 2)
  p_self = _random_params(attention, x, deterministic=True)
  p_cross = _random_params(attention, x, context, deterministic=True)
  assert p_cross["key"]["kernel"].shape == (6, HEADS, WIDTH // HEADS)
  with jax.default_matmul_precision("highest"):
    out = attention.apply({"params": p_self}, x, deterministic=True)
    cross = attention.apply({"params": p_cross}, x, context,
                            deterministic=True)
  np.testing.assert_allclose(out, _ref_attention(x, x, p_self), atol=1e-5)
  np.testing.assert_allclose(cross, _ref_attention(x, context, p_cross),
                             atol=1e-5)


def test_attention_matches_flax_multi_head_attention_with_dropout():
  # Same parameter tree, same outputs, and the same dropout masks for the same
  # rng: flax checkpoints and training runs carry over.
  ours = attention_lib.Attention(num_heads=HEADS, dropout_rate=0.3)
  flax_mha = nn.MultiHeadDotProductAttention(
      num_heads=HEADS, dropout_rate=0.3, broadcast_dropout=False)
  x = _normal((2, 5, WIDTH), 3)
  params = _random_params(ours, x, deterministic=True)
  flax_shapes = jax.eval_shape(lambda: flax_mha.init(
      jax.random.PRNGKey(0), x, deterministic=True))["params"]
  assert (jax.tree_util.tree_map(jnp.shape, flax_shapes) ==
          jax.tree_util.tree_map(jnp.shape, params))
  mask = attention_lib.make_causal_mask(5)
  rngs = {"dropout": jax.random.PRNGKey(7)}
  a = ours.apply({"params": params}, x, mask=mask, deterministic=False,
                 rngs=rngs)
  b = flax_mha.apply({"params": params}, x, mask=mask, deterministic=False,
                     rngs=rngs)
  np.testing.assert_allclose(a, b, atol=1e-6)
  assert np.abs(a - _ref_attention(x, x, params, mask)).max() > 1e-2


def test_cross_attention_gives_padded_context_zero_weight():
  attention = attention_lib.Attention(num_heads=HEADS)
  x, context = _normal((2, 4, WIDTH), 4), _normal((2, 5, 6), 5)
  context_mask = jnp.array([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
  params = _random_params(attention, x, context, deterministic=True)
  _, state = attention.apply(
      {"params": params}, x, context,
      mask=attention_lib.make_padding_mask(context_mask), deterministic=True,
      sow_weights=True, mutable=["intermediates"])
  (weights,) = state["intermediates"]["attention_weights"]  # [B, H, Lq, Lc]
  padded = np.broadcast_to((context_mask == 0)[:, None, None, :],
                           weights.shape)
  assert np.all(np.asarray(weights)[padded] == 0.0)
  np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)


def test_block_ignores_padded_context():
  block = layers.EncoderBlock(num_heads=HEADS, mlp_dim=2 * WIDTH,
                              cross_attention=True)
  x, context = _normal((2, 4, WIDTH), 6), _normal((2, 5, 6), 7)
  context_mask = jnp.array([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
  params = _random_params(block, x, context=context, deterministic=True)
  assert set(params) == {"attention", "attention_norm", "cross_attention",
                         "cross_attention_norm", "mlp", "mlp_norm"}
  garbage = jnp.where(context_mask[..., None] > 0, context,
                      100 * _normal(context.shape, 8))
  run = lambda c: block.apply({"params": params}, x, context=c,
                              context_mask=context_mask, deterministic=True)
  np.testing.assert_allclose(run(garbage), run(context), atol=1e-6)
  # Real context positions do matter.
  changed = context.at[:, 0].add(1.0)
  assert np.abs(run(changed) - run(context)).max() > 1e-3


def test_block_causal_attribute_is_the_causal_mask():
  x = _normal((2, 5, WIDTH), 9)
  causal = layers.EncoderBlock(num_heads=HEADS, mlp_dim=32, causal=True)
  plain = layers.EncoderBlock(num_heads=HEADS, mlp_dim=32)
  params = _random_params(plain, x, deterministic=True)
  padding = jnp.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
  np.testing.assert_array_equal(
      causal.apply({"params": params}, x, padding, deterministic=True),
      plain.apply({"params": params}, x, padding,
                  mask=attention_lib.make_causal_mask(5), deterministic=True))


def test_block_context_errors():
  block = layers.EncoderBlock(num_heads=HEADS, mlp_dim=32)
  x = _normal((1, 3, WIDTH), 0)
  with pytest.raises(ValueError, match="cross_attention=False.*with a context"):
    block.init(jax.random.PRNGKey(0), x, context=x, deterministic=True)
  cross = layers.EncoderBlock(num_heads=HEADS, mlp_dim=32,
                              cross_attention=True)
  with pytest.raises(ValueError, match="without a context"):
    cross.init(jax.random.PRNGKey(0), x, deterministic=True)


# ---------------------------------------------------------------------------
# Autoregressive cache: token-by-token decoding equals a full recompute.


class _Decoder(nn.Module):
  """Token + learned position embedding, pre-LN blocks, LN, vocab logits."""
  causal: bool = True
  cross_attention: bool = False

  @nn.compact
  def __call__(self, tokens, positions, padding_mask=None, mask=None,
               context=None, context_mask=None, *, decode=False):
    x = (nn.Embed(VOCAB, WIDTH)(tokens) +
         nn.Embed(MAX_LEN, WIDTH)(positions))
    for _ in range(DEPTH):
      x = layers.EncoderBlock(
          num_heads=HEADS, mlp_dim=2 * WIDTH, causal=self.causal,
          cross_attention=self.cross_attention)(
              x, padding_mask, mask=mask, context=context,
              context_mask=context_mask, deterministic=True, decode=decode)
    return nn.Dense(VOCAB)(nn.LayerNorm()(x))


TRACES = {"step": 0}


# Flax modules are frozen dataclasses, so jit can take the model as static.
@functools.partial(jax.jit, static_argnums=0)
def _full(model, params, tokens, inputs):
  return model.apply({"params": params}, tokens,
                     jnp.broadcast_to(jnp.arange(MAX_LEN), tokens.shape),
                     **inputs)


@functools.partial(jax.jit, static_argnums=0)
def _decode_step(model, variables, tokens, start, inputs):
  """Next T positions [B, T] from position `start`; -> (logits, cache)."""
  TRACES["step"] += 1  # Runs only while tracing.
  positions = start + jnp.arange(tokens.shape[1])[None]
  logits, state = model.apply(variables, tokens, positions, **inputs,
                              decode=True, mutable=["cache"])
  return logits, state["cache"]


def _empty_cache(model, params, inputs):
  """The cache a decode=True call on a [B, MAX_LEN] input creates: zeros.

  test_one_token_step_compiles_once makes that call; tracing it for its
  shapes avoids compiling one more function per case.
  """
  dummy = jnp.zeros((BATCH, MAX_LEN), jnp.int32)
  shapes = jax.eval_shape(lambda: model.apply(
      {"params": params}, dummy, dummy, **inputs, decode=True,
      mutable=["cache"])[1]["cache"])
  return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _decode(model, params, tokens, prefill, inputs):
  """Prefills `prefill` positions, then feeds one token per call.

  Returns the logits [B, MAX_LEN, VOCAB] and the trace count of the steps
  after the first one-token call.
  """
  cache = _empty_cache(model, params, inputs)
  logits, cache = _decode_step(model, {"params": params, "cache": cache},
                               tokens[:, :prefill], 0, inputs)
  outputs, retraced = [logits], 0
  for t in range(prefill, MAX_LEN):
    before = TRACES["step"]
    logits, cache = _decode_step(model, {"params": params, "cache": cache},
                                 tokens[:, t:t + 1], t, inputs)
    retraced += TRACES["step"] - before if t > prefill else 0
    outputs.append(logits)
  index = [v for k, v in flax.traverse_util.flatten_dict(cache).items()
           if k[-1] == "cache_index"]
  assert len(index) == DEPTH and all(int(i) == MAX_LEN for i in index)
  return np.asarray(jnp.concatenate(outputs, axis=1)), retraced


def _case(name):
  """(model, inputs, real positions [B, MAX_LEN]) of a decoding scenario."""
  rng = np.random.default_rng(11)
  everything = np.ones((BATCH, MAX_LEN), np.int32)
  # A left-padded prompt with a padded hole after it.
  padding = np.array([[1, 1, 1, 1, 1, 1, 1, 1],
                      [0, 1, 1, 1, 1, 0, 1, 1]], np.int32)
  if name == "causal":
    return _Decoder(), {}, everything
  if name == "causal_padded":
    # The explicit mask, shaped like the prefix-LM one: the two cases share
    # their compiled functions.
    mask = jnp.broadcast_to(attention_lib.make_causal_mask(MAX_LEN),
                            (BATCH, 1, MAX_LEN, MAX_LEN))
    return (_Decoder(causal=False),
            {"padding_mask": jnp.asarray(padding), "mask": mask}, padding)
  if name == "prefix_lm_padded":
    mask = attention_lib.make_prefix_lm_mask(jnp.array([3, 5]), MAX_LEN)
    return (_Decoder(causal=False),
            {"padding_mask": jnp.asarray(padding), "mask": mask}, padding)
  if name == "cross_attention":
    context = jnp.asarray(rng.normal(size=(BATCH, 4, 6)), jnp.float32)
    context_mask = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0]])
    return (_Decoder(cross_attention=True),
            {"context": context, "context_mask": context_mask}, everything)
  raise ValueError(name)


@pytest.mark.parametrize("name,prefills", [
    ("causal", (1, 3)),
    ("causal_padded", (4,)),
    ("prefix_lm_padded", (5,)),  # The prefill holds the longest prefix.
    ("cross_attention", (2,)),
])
def test_cached_decoding_equals_full_recompute(name, prefills):
  model, inputs, real = _case(name)
  tokens = jnp.asarray(
      np.random.default_rng(12).integers(0, VOCAB, (BATCH, MAX_LEN)),
      jnp.int32)
  params = _random_params(model, tokens, jnp.zeros_like(tokens), **inputs)
  full = np.asarray(_full(model, params, tokens, inputs))
  real = np.asarray(real, bool)[..., None]
  for prefill in prefills:
    cached, retraced = _decode(model, params, tokens, prefill, inputs)
    np.testing.assert_allclose(np.where(real, cached, 0),
                               np.where(real, full, 0), atol=1e-5,
                               err_msg=f"prefill={prefill}")
    assert retraced == 0


def test_prefix_lm_case_is_not_causal():
  # Guards the test above: in its prefix-LM case an earlier output depends on
  # a later prefix token, so decoding that equals the full recompute has a
  # bidirectional prefill.
  model, inputs, _ = _case("prefix_lm_padded")
  tokens = jnp.zeros((BATCH, MAX_LEN), jnp.int32)
  params = _random_params(model, tokens, tokens, **inputs)
  a = np.asarray(_full(model, params, tokens, inputs))
  b = np.asarray(_full(model, params, tokens.at[:, 4].set(3), inputs))
  assert np.abs(a[1, 2] - b[1, 2]).max() > 1e-3  # Prefix 5: 2 sees 4.
  np.testing.assert_array_equal(a[0, :4], b[0, :4])  # Prefix 3: causal.


def test_one_token_step_compiles_once():
  model = _Decoder()
  traces = []

  @jax.jit
  def step(variables, token, position):
    traces.append(1)
    out, state = model.apply(variables, token, position, decode=True,
                             mutable=["cache"])
    return out, state["cache"]

  tokens = jnp.ones((BATCH, MAX_LEN), jnp.int32)
  params = _random_params(model, tokens, tokens)
  _, state = model.apply({"params": params}, tokens, tokens, decode=True,
                         mutable=["cache"])
  cache = state["cache"]
  key = cache["EncoderBlock_0"]["attention"]["cached_key"]
  assert key.shape == (BATCH, HEADS, MAX_LEN, WIDTH // HEADS)
  for t in range(MAX_LEN):
    _, cache = step({"params": params, "cache": cache}, tokens[:, t:t + 1],
                    jnp.full((BATCH, 1), t))
  assert len(traces) == 1
  assert int(cache["EncoderBlock_1"]["attention"]["cache_index"]) == MAX_LEN


def test_decode_rejects_masks_not_covering_the_cache():
  model = _Decoder()
  tokens = jnp.ones((BATCH, MAX_LEN), jnp.int32)
  params = _random_params(model, tokens, tokens)
  variables = {"params": params, "cache": _empty_cache(model, params, {})}
  with pytest.raises(ValueError, match="whole sequence"):
    jax.eval_shape(lambda: model.apply(
        variables, tokens[:, :3], tokens[:, :3],
        mask=attention_lib.make_causal_mask(3)[..., :1], decode=True,
        mutable=["cache"]))


# ---- ops.dense_matmul: the kernel gradient in the faster orientation ---------


@pytest.mark.parametrize("d_in,d_out", [(48, 8), (8, 24), (8, 8)])
def test_dense_matmul_is_the_product_and_its_gradients(d_in, d_out):
  """Values and both gradients against jnp's own product, x with two leading axes; the
  wide-input kernel's gradient is computed as (dy^T x)^T (a [d_out, d_in] dot)."""
  from avtext import ops  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(3, 5, d_in)), jnp.float32)
  kernel = jnp.asarray(rng.normal(size=(d_in, d_out)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(3, 5, d_out)), jnp.float32)
  ours = jax.value_and_grad(lambda x, k: jnp.sum(ops.dense_matmul(x, k) * w), (0, 1))
  plain = jax.value_and_grad(lambda x, k: jnp.sum((x @ k) * w), (0, 1))
  (v1, (dx1, dk1)), (v0, (dx0, dk0)) = ours(x, kernel), plain(x, kernel)
  np.testing.assert_allclose(v1, v0, rtol=1e-6)
  np.testing.assert_allclose(dx1, dx0, rtol=1e-5, atol=1e-5)
  # By hand: dk = sum over the 15 rows of x_r^T w_r.
  np.testing.assert_allclose(dk1, np.einsum("abi,abo->io", x, w), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dk1, dk0, rtol=1e-5, atol=1e-5)
  # The kernel gradient's dot has the smaller dimension first, behind a barrier (so that
  # XLA keeps that orientation).
  jaxpr = jax.make_jaxpr(jax.grad(lambda k: jnp.sum(ops.dense_matmul(x, k) * w)))(kernel)
  eqns = jaxpr.jaxpr.eqns
  barriers = [e.outvars[0].aval.shape for e in eqns if e.primitive.name == "optimization_barrier"]
  assert barriers == [(d_out, d_in) if d_in > d_out else (d_in, d_out)]
  # nn.Dense(dot_general=ops.dense_dot_general): the same function and parameters.
  dense = nn.Dense(d_out, dot_general=ops.dense_dot_general)
  params = nn.Dense(d_out).init(jax.random.PRNGKey(0), x)
  np.testing.assert_allclose(dense.apply(params, x), nn.Dense(d_out).apply(params, x),
                             rtol=1e-6, atol=1e-6)


def test_broadcast_leading_gradient_is_the_sum_over_the_leading_axes():
  from avtext import ops  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  table = jnp.asarray(rng.normal(size=(5, 3)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(4, 2, 5, 3)), jnp.float32)
  y = ops.broadcast_leading(table, (4, 2))
  np.testing.assert_array_equal(y, np.broadcast_to(table, (4, 2, 5, 3)))
  grad = jax.grad(lambda t: jnp.sum(ops.broadcast_leading(t, (4, 2)) ** 2 * w))(table)
  np.testing.assert_allclose(grad, np.sum(2 * np.asarray(table) * np.asarray(w), (0, 1)),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(ops.broadcast_leading(table, ()), table)


def test_cpu_rewrites_follow_the_backend_passed():
  """A TPU or GPU backend (as `avtext.aot` builds a model for its target on a CPU host)
  drops both CPU-only rewrites: the gradients' jaxprs have no barrier, as plain jnp's;
  traced for the CPU, named or the default backend (None, this CPU), one each."""
  from avtext import ops  # pylint: disable=g-import-not-at-top
  x, k = jnp.ones((3, 8), jnp.float32), jnp.ones((8, 4), jnp.float32)
  table = jnp.ones((5, 3), jnp.float32)

  def barriers(backend):
    jaxprs = [jax.make_jaxpr(jax.grad(lambda k: jnp.sum(
                  ops.dense_matmul(x, k, backend=backend))))(k),
              jax.make_jaxpr(jax.grad(lambda t: jnp.sum(
                  ops.broadcast_leading(t, (2,), backend=backend))))(table)]
    return [sum(e.primitive.name == "optimization_barrier" for e in j.jaxpr.eqns)
            for j in jaxprs]

  assert jax.default_backend() == "cpu"
  assert barriers(None) == barriers("cpu") == [1, 1]
  assert barriers("tpu") == barriers("gpu") == [0, 0]
  assert not any(hasattr(ops, name) for name in ("lowering_for", "lowering_platform"))


def test_the_backend_comes_from_the_config_and_is_written_into_it(tmp_path):
  """`config.model.backend` reaches every attention of the model the registry builds (the
  fused projections' CPU gradient goes with it); unset, the task writes JAX's default
  backend into the config, so the run's config.json says what the program was traced
  for; `avtext.aot` builds for its target's platform without a wrapper."""
  from avtext.aot import programs  # pylint: disable=g-import-not-at-top
  from avtext.models import model_registry  # pylint: disable=g-import-not-at-top
  from avtext.tasks import task_registry  # pylint: disable=g-import-not-at-top
  from tests.test_train_trainer import tiny_config  # pylint: disable=g-import-not-at-top
  config = tiny_config()
  assert config.model.get("backend") is None
  x = jnp.ones((2, 4, 8), jnp.float32)

  def barriers(backend):
    block = layers.EncoderBlock(num_heads=2, mlp_dim=8, compute=layers.Compute(backend=backend))
    params = block.init(jax.random.PRNGKey(0), x, deterministic=True)
    grad = jax.make_jaxpr(jax.grad(lambda p: jnp.sum(block.apply(p, x, deterministic=True))))
    return sum(e.primitive.name == "optimization_barrier" for e in grad(params).jaxpr.eqns)
  assert barriers("cpu") > 0 and barriers("tpu") == 0
  on_tpu = ml_collections.ConfigDict(config.model.to_dict())
  on_tpu.backend = "tpu"
  assert model_registry.compute_from_config(on_tpu).backend == "tpu"
  model = model_registry.build_model(on_tpu)
  # inherited by the towers
  assert model.video.compute.backend == model.text.compute.backend == "tpu"
  task = task_registry.build_task(config)
  assert config.model.backend == "cpu" and task.model.video.compute.backend == "cpu"
  assert '"backend": "cpu"' in config.to_json_best_effort()
  from avtext.train import rundir  # pylint: disable=g-import-not-at-top
  assert "model.backend" not in rundir.identity(config)  # the run resumes on a GPU too
  devices = programs.topology_devices("v5e:2x2")
  assert programs.for_target(config, devices).model.backend == "tpu"
  assert config.model.backend == "cpu"  # the caller's config is left as it was


# ---- hash dropout masks (ops.hash_bernoulli, dropout_masks="hash") ----------


@pytest.mark.parametrize("p", [0.025, 0.3, 0.975])
def test_hash_bernoulli_rate_and_pairwise_independence(p):
  from avtext import ops  # pylint: disable=g-import-not-at-top
  m = np.asarray(ops.hash_bernoulli(jax.random.PRNGKey(3), p, (1000, 2000)))
  n = m.size
  sigma = np.sqrt(p * (1 - p) / n)
  assert abs(m.mean() - p) < 5 * sigma
  # Neighbours along either axis are independent: P(both) = p^2.
  for both in (m[:, 1:] & m[:, :-1], m[1:] & m[:-1]):
    assert abs(both.mean() - p * p) < 5 * np.sqrt(p * p * (1 - p * p) / both.size)
  # Another key gives an unrelated mask: P(agree) = p^2 + (1-p)^2.
  other = np.asarray(ops.hash_bernoulli(jax.random.PRNGKey(4), p, (1000, 2000)))
  agree = p * p + (1 - p) ** 2
  assert abs((m == other).mean() - agree) < 5 * np.sqrt(agree * (1 - agree) / n)
  np.testing.assert_array_equal(
      m, ops.hash_bernoulli(jax.random.PRNGKey(3), p, (1000, 2000)))


def test_hash_bernoulli_edges():
  from avtext import ops  # pylint: disable=g-import-not-at-top
  key = jax.random.PRNGKey(0)
  assert not np.asarray(ops.hash_bernoulli(key, 0.0, (64, 64))).any()
  assert np.asarray(ops.hash_bernoulli(key, 1.0, (64, 64))).all()
  assert ops.hash_bernoulli(key, 0.5, (0, 3)).shape == (0, 3)
  with pytest.raises(ValueError, match="2\\^32"):
    ops.hash_bernoulli(key, 0.5, (2**16, 2**16))


def test_hash_dropout_rate_scale_and_broadcast():
  class Drop(nn.Module):
    broadcast_dims: tuple = ()

    @nn.compact
    def __call__(self, x, deterministic):
      return attention_lib.dropout(x, 0.25, deterministic=deterministic, masks="hash",
                                   broadcast_dims=self.broadcast_dims)

  x = jnp.ones((4, 500, 100))
  rngs = {"dropout": jax.random.PRNGKey(1)}
  y = np.asarray(Drop().apply({}, x, False, rngs=rngs))
  np.testing.assert_allclose(np.unique(y), [0.0, 4.0 / 3.0])  # kept: scaled by 1/(1 - rate)
  assert abs((y == 0).mean() - 0.25) < 0.005
  np.testing.assert_array_equal(Drop().apply({}, x, True), x)
  z = np.asarray(Drop(broadcast_dims=(1, 2)).apply({}, x, False, rngs=rngs))
  assert all(len(np.unique(z[i])) == 1 for i in range(4))  # one decision per example
  with pytest.raises(ValueError, match="dropout masks"):
    attention_lib.dropout(x, 0.1, deterministic=False, masks="philox")


def test_hash_attention_dropout_is_unbiased_and_eval_unchanged():
  x = _normal((2, 5, WIDTH), 3)
  jax_attention = attention_lib.Attention(num_heads=HEADS, dropout_rate=0.3)
  hash_attention = attention_lib.Attention(num_heads=HEADS, dropout_rate=0.3, dropout_masks="hash")
  params = _random_params(jax_attention, x, deterministic=True)
  mask = attention_lib.make_causal_mask(5)
  det = hash_attention.apply({"params": params}, x, mask=mask, deterministic=True)
  np.testing.assert_array_equal(
      det, jax_attention.apply({"params": params}, x, mask=mask, deterministic=True))

  @jax.jit
  def sample(key):
    return hash_attention.apply({"params": params}, x, mask=mask, deterministic=False,
                                rngs={"dropout": key})
  draws = jax.vmap(sample)(jax.random.split(jax.random.PRNGKey(0), 4000))
  assert np.abs(draws[0] - det).max() > 1e-2  # dropout acts
  # The output is linear in the dropped probabilities: its mean is the eval output.
  stderr = np.asarray(draws.std(0)) / np.sqrt(len(draws))
  assert (np.abs(np.asarray(draws.mean(0)) - det) < 5 * stderr + 1e-6).mean() > 0.999


def _np_layer_norm(x, scale, bias, eps):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * scale + bias


def _np_heads(x, p, heads):  # DenseGeneral [D, H, Dh] applied -> [B, L, H, Dh]
  return np.einsum("bld,dhk->blhk", x, np.asarray(p["kernel"])) + np.asarray(p["bias"])


def _np_attention(q_in, kv_in, p, heads, kv_mask):
  q, k, v = (_np_heads(a, p[n], heads) for a, n in
             ((q_in, "query"), (kv_in, "key"), (kv_in, "value")))
  logits = np.einsum("bqhd,bkhd->bhqk", q / np.sqrt(q.shape[-1]), k)
  logits = np.where(kv_mask[:, None, None, :] > 0, logits, np.finfo(np.float32).min)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  return np.einsum("bhqk,bkhd->bqhd", w, v).reshape(q_in.shape)


def test_block_without_attention_output_and_with_linear_feed_forward_matches_numpy():
  """`mmt.OfficialDecoderLayer` is the official TVC decoder layer: LN1(x + SelfAttn(x)),
  LN2(h + CrossAttn(h, c)), LN3(h + Linear(h)) (no output Linear)."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 5, 8)).astype(np.float32)
  ctx = rng.standard_normal((2, 7, 8)).astype(np.float32)
  ctx_mask = np.array([[1] * 7, [1] * 4 + [0] * 3], np.float32)
  block = mmt.OfficialDecoderLayer(num_heads=2, mlp_dim=0, pre_norm=False,
                                   cross_attention=True, layer_norm_eps=1e-12,
                                   dropout=layers.Dropout(0.1))
  variables = block.init(jax.random.PRNGKey(0), x, context=ctx, context_mask=ctx_mask,
                         deterministic=True)
  p = jax.tree.map(np.asarray, variables["params"])
  assert "out" not in p["attention"] and "out" not in p["cross_attention"]
  assert set(p["mlp"]) == {"kernel", "bias"} and p["mlp"]["kernel"].shape == (8, 8)
  got = block.apply(variables, x, context=ctx, context_mask=ctx_mask, deterministic=True)
  ln = lambda y, n: _np_layer_norm(y, p[n]["scale"], p[n]["bias"], 1e-12)  # noqa: E731
  h = ln(x + _np_attention(x, x, p["attention"], 2, np.ones((2, 5))), "attention_norm")
  h = ln(h + _np_attention(h, ctx, p["cross_attention"], 2, ctx_mask), "cross_attention_norm")
  want = ln(h + h @ p["mlp"]["kernel"] + p["mlp"]["bias"], "mlp_norm")
  np.testing.assert_allclose(np.asarray(got), want, atol=2e-5)
  # Training: no hidden dropout on an unprojected attention branch (XML's official
  # cross-encoder), so without attention-probability dropout it equals eval.
  cross = xml.CrossEncoder(num_heads=2, mlp_dim=0, pre_norm=False, cross_attention=True,
                           additive_mask=False, dropout=layers.Dropout(0.5))
  cv = cross.init(jax.random.PRNGKey(2), x, context=ctx, deterministic=True)
  train = cross.apply(cv, x, context=ctx, deterministic=False,
                      rngs={"dropout": jax.random.PRNGKey(1)})
  np.testing.assert_array_equal(np.asarray(train),
                                np.asarray(cross.apply(cv, x, context=ctx, deterministic=True)))
  # A cross-attention-only layer without cross-attention fails when built, not when called.
  with pytest.raises(ValueError, match="CrossEncoder has no self-attention"):
    xml.CrossEncoder(num_heads=2, mlp_dim=0)


def test_layer_scale_multiplies_each_pre_norm_branch_by_its_learned_vector():
  """CaiT eq. 3 (`mbt.LayerScaleBlock`): x1 = x + s_a * Attn(LN(x)), out = x1 + s_m *
  MLP(LN(x1)), s_a and s_m per-channel vectors starting at layer_scale."""
  rng = np.random.default_rng(0)
  x = rng.standard_normal((2, 5, 8)).astype(np.float32)
  block = mbt.LayerScaleBlock(num_heads=2, mlp_dim=16, layer_scale=0.1)
  params = jax.tree.map(np.asarray, block.init(jax.random.PRNGKey(0), x,
                                               deterministic=True)["params"])
  for name in ("attention_scale", "mlp_scale"):
    np.testing.assert_array_equal(params[name], np.full(8, 0.1, np.float32))
    params[name] = rng.standard_normal(8).astype(np.float32)
  got = block.apply({"params": params}, x, deterministic=True)
  p = params
  ln = lambda y, n: _np_layer_norm(y, p[n]["scale"], p[n]["bias"], 1e-6)  # noqa: E731
  att = _np_attention(ln(x, "attention_norm"), ln(x, "attention_norm"), p["attention"], 2,
                      np.ones((2, 5)))
  att = np.einsum("blhk,hkd->bld", att.reshape(2, 5, 2, 4), p["attention"]["out"]["kernel"])
  x1 = x + p["attention_scale"] * (att + p["attention"]["out"]["bias"])
  h = ln(x1, "mlp_norm") @ p["mlp"]["dense_in"]["kernel"] + p["mlp"]["dense_in"]["bias"]
  h = 0.5 * h * (1 + scipy.special.erf(h / np.sqrt(2)))  # the default exact GELU
  want = x1 + p["mlp_scale"] * (h @ p["mlp"]["dense_out"]["kernel"] + p["mlp"]["dense_out"]["bias"])
  np.testing.assert_allclose(np.asarray(got), want, atol=2e-5)


# ---- the size of a model's block --------------------------------------------------


def test_every_model_module_takes_at_most_twelve_fields():
  """Each flax module of avtext.models takes at most 12 dataclass fields (flax's parent and
  name aside): a paper's variant of a shared block is a subclass in that paper's module,
  and options travel in small frozen groups (`layers.Compute`, `layers.Dropout`, ...)."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  import importlib  # pylint: disable=g-import-not-at-top
  import inspect  # pylint: disable=g-import-not-at-top
  import pkgutil  # pylint: disable=g-import-not-at-top
  import avtext.models  # pylint: disable=g-import-not-at-top
  fields = {}
  for info in pkgutil.iter_modules(avtext.models.__path__):
    module = importlib.import_module(f"avtext.models.{info.name}")
    for name, cls in vars(module).items():
      if (inspect.isclass(cls) and issubclass(cls, nn.Module) and
          cls.__module__ == module.__name__):
        fields[f"{info.name}.{name}"] = [f.name for f in dataclasses.fields(cls)
                                         if f.name not in ("parent", "name")]
  # the walk reaches the shared block, the paper variants and the models
  assert {"layers.EncoderBlock", "coot.CootBlock", "xml.CrossEncoder",
          "mmt.OfficialDecoderLayer", "mbt.LayerScaleBlock", "mbt.MBT", "bert.Bert"} <= set(fields)
  assert "num_heads" in fields["layers.EncoderBlock"]
  assert {k: len(v) for k, v in fields.items() if len(v) > 12} == {}


def test_shared_model_modules_name_no_paper_in_their_strings():
  """The shared modules' string constants (docstrings aside: they may cite a paper) name
  no paper: a mode that exists for one paper lives in that paper's module."""
  import ast  # pylint: disable=g-import-not-at-top
  import pathlib  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  paper = re.compile(r"\b(coot|xml|mmt|mbt|tvr|tvc|s-?mit|videocc)\b", re.IGNORECASE)
  root = pathlib.Path(layers.__file__).parent
  found = []
  for file in ("layers.py", "attention.py", "fused_attention.py"):
    tree = ast.parse((root / file).read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    found += [(file, node.lineno, node.value) for node in ast.walk(tree)
              if isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docstrings and paper.search(node.value)]
  assert not found
  assert paper.search("layer_norm must be 'standard' or 'coot'")  # what it would catch
