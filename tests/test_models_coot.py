"""COOT model: Attention-FA, the Contextual Transformer and the official global mean by hand,
padding invariance of the masked_pool option."""
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avtext.models import coot


def _gelu(x):
  from scipy.special import erf
  return 0.5 * x * (1 + erf(x / np.sqrt(2)))


def test_attention_fa_matches_eq4_by_hand():
  """2 heads, D = 4, hidden 4: per head a = W2 GELU(W1 x + b1) + b2, softmax over time per feature."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(1, 3, 4)).astype(np.float32)
  mask = np.array([[True, True, False]])
  module = coot.AttentionFA(hidden=4, num_heads=2)
  params = module.init(jax.random.PRNGKey(0), x, mask, deterministic=True)["params"]
  params = jax.tree.map(lambda p: rng.normal(size=p.shape).astype(np.float32), params)
  got = module.apply({"params": params}, x, mask, deterministic=True)
  expected = np.zeros(4)
  for h in range(2):
    a = _gelu(x[0, :2] @ params["w1"][h] + params["b1"][h]) @ params["w2"][h] + params["b2"][h]
    w = np.exp(a - a.max(0)) / np.exp(a - a.max(0)).sum(0)  # [2 real steps, 2 features]
    expected[2 * h:2 * h + 2] = (w * x[0, :2, 2 * h:2 * h + 2]).sum(0)
  np.testing.assert_allclose(got[0], expected, rtol=1e-5, atol=1e-6)


def test_coot_layer_norm_and_sincos_formulas():
  x = np.array([[1.0, 2.0, 4.0, 7.0]], np.float32)
  norm = coot.CootLayerNorm()
  y = norm.apply(norm.init(jax.random.PRNGKey(0), x), x)
  np.testing.assert_allclose(y, (x - 3.5) / (np.std(x, ddof=1) + 1e-6), rtol=1e-6)
  table = coot.sincos_table(3, 4)
  # column i uses 10000 ** (2 i / d) with its own i (official), sin on even, cos on odd
  np.testing.assert_allclose(table[2], [np.sin(2.0), np.cos(2 / 10000 ** 0.5),
                                        np.sin(2 / 10000 ** 1.0), np.cos(2 / 10000 ** 1.5)],
                             rtol=1e-6)


def test_contextual_transformer_layer_by_hand():
  """Cross-attention-only post-norm layer: LN(q + Att(q, h)), then LN(y + MLP(y))."""
  rng = np.random.default_rng(1)
  q = rng.normal(size=(1, 1, 4)).astype(np.float32)
  h = rng.normal(size=(1, 3, 4)).astype(np.float32)
  ctx_mask = np.array([[True, False, True]])
  block = coot.ContextBlock(num_heads=1, mlp_dim=4, pre_norm=False, cross_attention=True)
  params = block.init(jax.random.PRNGKey(0), q, context=h, deterministic=True)["params"]
  assert "attention" not in params and "cross_attention" in params
  params = jax.tree.map(lambda p: rng.normal(size=p.shape).astype(np.float32) * 0.5, params)
  got = block.apply({"params": params}, q, context=h, context_mask=ctx_mask, deterministic=True)
  a = params["cross_attention"]
  lin = lambda x, p: np.einsum("ld,dhk->lhk", x, p["kernel"]) + p["bias"]
  qq, kk, vv = lin(q[0], a["query"]), lin(h[0], a["key"]), lin(h[0], a["value"])
  logits = np.einsum("qhk,thk->hqt", qq, kk) / 2.0  # sqrt(4)
  logits[:, :, 1] = -np.inf
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  att = np.einsum("hqt,thk->qhk", w, vv)
  att = np.einsum("qhk,hkd->qd", att, a["out"]["kernel"]) + a["out"]["bias"]
  ln = lambda x, p: p["scale"] * (x - x.mean(-1, keepdims=True)) / (
      x.std(-1, ddof=1, keepdims=True) + 1e-6) + p["bias"]
  y = ln(q[0] + att, params["cross_attention_norm"])
  m = params["mlp"]
  z = _gelu(y @ m["dense_in"]["kernel"] + m["dense_in"]["bias"]) @ m["dense_out"]["kernel"] + \
      m["dense_out"]["bias"]
  np.testing.assert_allclose(got[0], ln(y + z, params["mlp_norm"]), rtol=1e-4, atol=1e-5)


def test_official_global_mean_sums_padded_slots_up_to_the_batch_longest():
  """avg_special (official default): sum of the transformer outputs over the positions below
  the batch's longest real sequence, padded ones included, / the row's real length; any
  further padding of ours changes nothing. masked_pool=True: the mean of the real ones."""
  rng = np.random.default_rng(3)
  lengths = np.array([2, 4, 0])
  x = np.zeros((3, 7, 8), np.float32)
  for b, n in enumerate(lengths):
    x[b, :n] = rng.normal(size=(n, 8))
  mask = np.arange(7)[None] < lengths[:, None]
  net = coot.TTransformer(hidden_size=8, num_heads=2, mlp_dim=8, input_fc=False,
                          pooling=coot.Pooling("avg"))
  variables = net.init(jax.random.PRNGKey(0), x, mask, deterministic=True)
  pooled, seq = net.apply(variables, x, mask, deterministic=True)
  seq = np.asarray(seq)
  assert np.abs(seq[0, 2:4]).min() > 0  # padded slots hold transformer outputs, not zeros
  np.testing.assert_allclose(pooled[0], seq[0, :4].sum(0) / 2, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(pooled[1], seq[1, :4].sum(0) / 4, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(pooled[2], 0.0)  # an empty row (eval padding) gives 0
  shorter, _ = net.apply(variables, x[:, :4], mask[:, :4], deterministic=True)
  np.testing.assert_allclose(shorter, pooled, rtol=1e-5, atol=1e-6)  # official padding: 4
  masked = net.clone(masked_pool=True)
  pooled_m, _ = masked.apply(variables, x, mask, deterministic=True)
  np.testing.assert_allclose(pooled_m[0], seq[0, :2].mean(0), rtol=1e-5, atol=1e-6)


# The Attention-FA (~17 s) and max (~14 s) cases run with -m slow: masked_pool is our
# option, not the default, and the avg case checks the same padding invariance by default.
@pytest.mark.parametrize("pooler", [pytest.param("atn", marks=pytest.mark.slow),
                                    pytest.param("max", marks=pytest.mark.slow), "avg"])
def test_masked_pool_padding_never_changes_embeddings(pooler):
  rng = np.random.default_rng(2)
  model = coot.COOT(max_clips=4, hidden_size=16, num_heads=2, mlp_dim=16,
                    local_pooling=coot.Pooling(pooler, hidden=16, heads=2), masked_pool=True)
  def batch(extra_frames, extra_clips, extra_videos):
    video = rng_v[:, :6]
    v = np.zeros((1 + extra_videos, 6 + extra_frames, 8), np.float32)
    v[0, :6] = video[0]
    vm = np.zeros(v.shape[:2], bool)
    vm[0, :6] = True
    vm[1:, :3] = True
    c = np.zeros((3 + extra_clips, 5 + extra_frames, 8), np.float32)
    c[:3, :5] = rng_c
    cm = np.zeros(c.shape[:2], bool)
    cm[:3, :5] = True
    cm[:3, 4] = [True, False, True]
    slot = np.full(len(c), -1, np.int32)
    slot[:3] = [0, 1, 2]
    p = np.zeros((1 + extra_videos, 7 + extra_frames, 6), np.float32)
    p[0, :7] = rng_p
    pm = np.zeros(p.shape[:2], bool)
    pm[0, :7] = True
    pm[1:, :2] = True
    s = np.zeros((3 + extra_clips, 4 + extra_frames, 6), np.float32)
    s[:3, :4] = rng_s
    sm = np.zeros(s.shape[:2], bool)
    sm[:3, :3] = True
    return v, vm, c, cm, slot, p, pm, s, sm, slot
  rng_v = rng.normal(size=(1, 6, 8)).astype(np.float32)
  rng_c = rng.normal(size=(3, 5, 8)).astype(np.float32)
  rng_p = rng.normal(size=(7, 6)).astype(np.float32)
  rng_s = rng.normal(size=(3, 4, 6)).astype(np.float32)
  small = batch(0, 0, 0)
  variables = jax.jit(model.init)(jax.random.PRNGKey(0), *small)
  ref_v, ref_t = jax.jit(model.apply)(variables, *small)
  big_v, big_t = jax.jit(model.apply)(variables, *batch(5, 4, 2))
  for name in ("video_emb", "video_context", "clip_emb"):
    np.testing.assert_allclose(big_v[name][0], ref_v[name][0], rtol=1e-5, atol=1e-5)
  for name in ("paragraph_emb", "sentence_emb"):
    np.testing.assert_allclose(big_t[name][0], ref_t[name][0], rtol=1e-5, atol=1e-5)
  assert ref_v["video_emb"].shape == (1, 32) and ref_v["clip_mask"][0].tolist() == [1, 1, 1, 0]


@pytest.mark.slow  # `make test-slow` (CI runs it): the default run's 12-minute budget
def test_ablation_switches_and_official_parameter_count():
  small = coot.COOT(max_clips=2, hidden_size=8, num_heads=2, mlp_dim=8,
                    local_pooling=coot.Pooling(hidden=8), use_context=False)
  args = (np.ones((1, 3, 4)), np.ones((1, 3), bool), np.ones((2, 2, 4)), np.ones((2, 2), bool),
          np.array([0, 1]), np.ones((1, 3, 5)), np.ones((1, 3), bool), np.ones((2, 2, 5)),
          np.ones((2, 2), bool), np.array([0, 1]))
  v, _ = small.apply(small.init(jax.random.PRNGKey(0), *args), *args)
  assert v["video_emb"].shape == (1, 8)  # no Contextual Transformer: the pooled 8 only
  # The official ActivityNet COOT (AF + CoT) has 7.6 M parameters (COOT Table 1).
  full = coot.COOT(max_clips=2)
  shapes = jax.eval_shape(full.init, jax.random.PRNGKey(0),
                          jnp.ones((1, 3, 2048)), jnp.ones((1, 3), bool), jnp.ones((2, 2, 2048)),
                          jnp.ones((2, 2), bool), jnp.array([0, 1]), jnp.ones((1, 3, 1536)),
                          jnp.ones((1, 3), bool), jnp.ones((2, 2, 1536)), jnp.ones((2, 2), bool),
                          jnp.array([0, 1]))
  count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
  assert round(count / 1e6, 1) == 7.6


def test_configs_default_to_the_official_pool_and_name_the_masked_variant():
  import sys  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "configs"))
  import coot_activitynet  # pylint: disable=g-import-not-at-top
  import coot_youcook2  # pylint: disable=g-import-not-at-top
  for module in (coot_activitynet, coot_youcook2):
    for variant in ("", "demo", "tiny"):
      assert module.get_config(variant).model.masked_pool is False
    config = module.get_config("demo,masked_pool")
    assert config.model.masked_pool is True and config.model.hidden_size == 128
    assert coot.coot_from_config(config.model).masked_pool
    with pytest.raises(ValueError, match="unknown variant.*masked"):
      module.get_config("masked")
