"""The train step's fast paths compute the same function as the plain ones.

`Attention` projects queries, keys and values with one matmul over the three kernels and
divides by the softmax's sum after the values (`attention._fused_projection`,
`attention._attention_normalized_last`); the reference is flax's own
`nn.MultiHeadDotProductAttention` on the same parameters. `EncoderBlock(query_positions=n)`
and `Bert(cls_only=True)` compute the first positions only; the reference is the full
layer / tower sliced. `layers.LayerNorm` writes out nn.LayerNorm's gradient; the reference
is nn.LayerNorm. Outputs and gradients (parameters and inputs) agree within float32
rounding. While decoding, `Attention` projects with one matmul per kernel instead; the
reference is the full-sequence layer.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avtext.models import attention as attention_lib
from avtext.models import layers
from avtext.models.bert import Bert

WIDTH, HEADS = 16, 4


def _normal(shape, seed, scale=1.0):
  return jnp.asarray(scale * np.random.default_rng(seed).normal(size=shape), jnp.float32)


def _params(module, *args, seed=0, **kwargs):
  shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), *args, **kwargs))
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    return jnp.asarray(0.3 * rng.normal(size=leaf.shape) + (path[-1].key == "scale"),
                       jnp.float32)
  return jax.tree_util.tree_map_with_path(draw, shapes["params"])


def _close(a, b, tol=2e-5):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


# A padding mask, a causal mask, and a mask with a fully masked query row (uniform
# weights in the softmax, so in both paths).
_MASKS = {
    "none": None,
    "padding": attention_lib.make_padding_mask(jnp.array([[1, 1, 1, 0, 0, 0],
                                                          [1, 1, 1, 1, 1, 1]])),
    "causal": attention_lib.make_causal_mask(6),
    "empty_row": jnp.ones((1, 1, 6, 6), bool).at[..., 2, :].set(False),
}


@pytest.mark.parametrize("mask", sorted(_MASKS))
@pytest.mark.parametrize("cross", [False, True])
def test_attention_equals_flax_multi_head_attention_with_gradients(mask, cross):
  ours = attention_lib.Attention(num_heads=HEADS)
  flax_mha = nn.MultiHeadDotProductAttention(num_heads=HEADS)
  x = _normal((2, 6, WIDTH), 1)
  context = _normal((2, 6, 8), 2) if cross else None
  kv = () if context is None else (context,)
  params = _params(ours, x, *kv, deterministic=True)
  m = _MASKS[mask]

  def run(module, params, x, context):
    kv = () if context is None else (context,)
    out = module.apply({"params": params}, x, *kv, mask=m, deterministic=True)
    return jnp.sum(jnp.sin(out)), out

  def grads(module):
    return jax.jit(jax.value_and_grad(run, argnums=(1, 2, 3), has_aux=True, allow_int=True),
                   static_argnums=0)(module, params, x, context)

  with jax.default_matmul_precision("highest"):
    (_, a), ga = grads(ours)
    (_, b), gb = grads(flax_mha)
  _close(a, b)
  _close(ga, gb)


def test_fast_attention_is_only_used_where_flax_semantics_need_nothing_else():
  # With attention dropout the weights come from flax's own function (the same masks
  # for the same rng as nn.MultiHeadDotProductAttention).
  ours = attention_lib.Attention(num_heads=HEADS, dropout_rate=0.3)
  flax_mha = nn.MultiHeadDotProductAttention(num_heads=HEADS, dropout_rate=0.3,
                                             broadcast_dropout=False)
  x = _normal((2, 5, WIDTH), 3)
  params = _params(ours, x, deterministic=True)
  rngs = {"dropout": jax.random.PRNGKey(7)}
  a = ours.apply({"params": params}, x, deterministic=False, rngs=rngs)
  b = flax_mha.apply({"params": params}, x, deterministic=False, rngs=rngs)
  _close(a, b, 1e-6)


@pytest.mark.parametrize("pre_norm", [True, False])
def test_block_query_positions_equal_the_full_layer(pre_norm):
  full = layers.EncoderBlock(num_heads=HEADS, mlp_dim=32, pre_norm=pre_norm)
  first = layers.EncoderBlock(num_heads=HEADS, mlp_dim=32, pre_norm=pre_norm,
                              query_positions=2)
  x = _normal((3, 7, WIDTH), 4)
  padding = jnp.array([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])
  params = _params(full, x, padding, deterministic=True)

  def loss(module, params, x, n):
    out = module.apply({"params": params}, x, padding, deterministic=True)[:, :n]
    return jnp.sum(jnp.sin(out)), out

  with jax.default_matmul_precision("highest"):
    value_and_grad = jax.jit(jax.value_and_grad(loss, argnums=(1, 2), has_aux=True),
                             static_argnums=(0, 3))
    (_, a), ga = value_and_grad(first, params, x, 2)
    (_, b), gb = value_and_grad(full, params, x, 2)
  assert a.shape == (3, 2, WIDTH)
  _close(a, b)
  _close(ga, gb)


def test_block_query_positions_refuses_causal_and_cross_attention():
  x = _normal((1, 4, WIDTH), 5)
  with pytest.raises(ValueError, match="query_positions"):
    layers.EncoderBlock(num_heads=HEADS, mlp_dim=8, causal=True, query_positions=1).init(
        jax.random.PRNGKey(0), x, deterministic=True)
  with pytest.raises(ValueError, match="query_positions"):
    layers.EncoderBlock(num_heads=HEADS, mlp_dim=8, cross_attention=True,
                        query_positions=1).init(jax.random.PRNGKey(0), x, context=x,
                                                deterministic=True)


@pytest.mark.parametrize("dropout", [0.0, pytest.param(0.2, marks=pytest.mark.slow)])
def test_bert_cls_only_equals_the_full_tower_with_gradients(dropout):
  bert = Bert(vocab_size=50, hidden_size=WIDTH, num_layers=2, num_heads=HEADS, mlp_dim=32,
              max_position_embeddings=16, dropout=layers.Dropout(dropout, dropout))
  ids = jnp.asarray(np.random.default_rng(6).integers(1, 50, (3, 9)), jnp.int32)
  mask = jnp.array([[1] * 9, [1] * 5 + [0] * 4, [1] + [0] * 8], jnp.int32)
  params = _params(bert, ids, mask)
  rngs = {"dropout": jax.random.PRNGKey(3)}

  def loss(params, cls_only):
    out = bert.apply({"params": params}, ids, mask, train=True, cls_only=cls_only, rngs=rngs)
    return jnp.sum(jnp.sin(out["cls"])), out

  with jax.default_matmul_precision("highest"):
    value_and_grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
    (_, a), ga = value_and_grad(params, True)
    (_, b), gb = value_and_grad(params, False)
  assert set(a) == ({"cls"} if not dropout else {"cls", "sequence"})
  _close(a["cls"], b["cls"])
  _close(ga, gb)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_layer_norm_equals_flax_layer_norm_with_gradients(dtype):
  x = _normal((3, 5, WIDTH), 8, scale=2.0) + 1.5
  x = x.at[0, 0].set(0.7)  # a constant row: zero variance
  params = {"scale": _normal((WIDTH,), 9) + 1.0, "bias": _normal((WIDTH,), 10)}
  ours = layers.LayerNorm(epsilon=1e-6, dtype=dtype)
  ref = nn.LayerNorm(epsilon=1e-6, dtype=dtype)

  def loss(module, params, x):
    out = module.apply({"params": params}, x)
    return jnp.sum(jnp.sin(out.astype(jnp.float32) * jnp.arange(WIDTH))), out

  (_, a), ga = jax.value_and_grad(loss, argnums=(1, 2), has_aux=True)(ours, params, x)
  (_, b), gb = jax.value_and_grad(loss, argnums=(1, 2), has_aux=True)(ref, params, x)
  assert a.dtype == b.dtype == dtype
  np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
  _close(ga, gb, 2e-5 if dtype == jnp.float32 else 2e-2)


def test_attention_in_bfloat16_equals_flax_multi_head_attention():
  ours = attention_lib.Attention(num_heads=HEADS, dtype=jnp.bfloat16)
  flax_mha = nn.MultiHeadDotProductAttention(num_heads=HEADS, dtype=jnp.bfloat16,
                                             force_fp32_for_softmax=True)
  x = _normal((2, 6, WIDTH), 12)
  params = _params(ours, x, deterministic=True)
  a = ours.apply({"params": params}, x, mask=_MASKS["padding"], deterministic=True)
  b = flax_mha.apply({"params": params}, x, mask=_MASKS["padding"], deterministic=True)
  assert a.dtype == b.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                             rtol=2e-2, atol=2e-2)


def test_decoding_projects_per_kernel_and_equals_the_full_sequence():
  """Decoding (`decode=True`) projects with one matmul per kernel instead of the stacked
  [D, 3, H, D/H] kernel (a new buffer on every call): a prefill and single-token steps
  through the cache give the full-sequence attention's outputs, and only the
  full-sequence program stacks the kernels."""
  attn = attention_lib.Attention(num_heads=HEADS)
  x = _normal((2, 6, WIDTH), 13)
  params = _params(attn, x, deterministic=True)
  mask = attention_lib.make_causal_mask(6)
  full_fn = jax.jit(lambda p, x: attn.apply({"params": p}, x, mask=mask, deterministic=True))
  cache = attention_lib.empty_cache(lambda: attn.apply(
      {"params": params}, x, mask=mask, decode=True, deterministic=True, mutable=["cache"]))

  @jax.jit
  def decode(p, cache, x):
    out, mutated = attn.apply({"params": p, "cache": cache}, x, mask=mask, decode=True,
                              deterministic=True, mutable=["cache"])
    return out, mutated["cache"]
  outs = []
  for lo, hi in [(0, 3), (3, 4), (4, 5), (5, 6)]:
    out, cache = decode(params, cache, x[:, lo:hi])
    outs.append(out)
  _close(jnp.concatenate(outs, axis=1), full_fn(params, x))
  stacked = f"f32[{WIDTH},3,{HEADS},{WIDTH // HEADS}]"
  assert stacked in full_fn.lower(params, x).compile().as_text()
  assert stacked not in decode.lower(params, cache, x[:, :1]).compile().as_text()
