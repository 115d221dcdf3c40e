"""Precision and memory options of the shared layers (`layers.Compute`): the attention
implementations compute the same function, remat leaves gradients unchanged, and a
bfloat16 model stays within a stated tolerance of its float32 twin.

The references are independent: a naive softmax attention written here in numpy, and the
float32 / no-remat path of the same parameters.
"""
import contextlib
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from avtext.models import attention
from avtext.models import fused_attention
from avtext.models import layers
from avtext.models import model_registry


def _numpy_attention(q, k, v, mask):
  """softmax(q k^T / sqrt(d), masked) v for [B, L, H, d] inputs, in float64."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  if mask is not None:
    logits = np.where(np.broadcast_to(mask, logits.shape), logits, -1e30)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  return np.einsum("bhqk,bkhd->bqhd", w, v)


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal", "prefix"])
def test_blocked_attention_equals_materialized(monkeypatch, mask_kind):
  monkeypatch.setattr(attention, "ATTENTION_BLOCK", 4)  # 11 queries -> 3 blocks, one padded
  rng = np.random.default_rng(0)
  b, length, h, d = 2, 11, 3, 8
  q, k, v = (jnp.asarray(rng.normal(size=(b, length, h, d)), jnp.float32) for _ in range(3))
  mask = {
      "none": None,
      "padding": attention.make_padding_mask(jnp.asarray([[1] * 11, [1] * 7 + [0] * 4])),
      "causal": attention.make_causal_mask(length),
      "prefix": attention.make_prefix_lm_mask(jnp.asarray([3, 6]), length),
  }[mask_kind]
  want = _numpy_attention(q, k, v, mask)
  # Per-query masks are beyond the TPU kernel: they take the blocked path (which runs
  # here, on a CPU, where the kernel cannot).
  fused = ("flash_tpu",) if mask_kind in ("causal", "prefix") else ()
  for impl in ("xla", "blocked") + fused:
    got = attention.attention_core(q, k, v, mask, implementation=impl)
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-6, err_msg=impl)

  def loss(impl, q, k, v):
    return jnp.sum(jnp.sin(attention.attention_core(q, k, v, mask, implementation=impl)))
  grads = {impl: jax.grad(lambda *a, i=impl: loss(i, *a), argnums=(0, 1, 2))(q, k, v)
           for impl in ("xla", "blocked")}
  for a, b_ in zip(grads["xla"], grads["blocked"]):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b_), atol=1e-6)


def test_unknown_choices_are_errors():
  with pytest.raises(ValueError, match="config.model.remat='sometimes'"):
    layers.Compute(remat="sometimes")
  with pytest.raises(ValueError, match="config.model.attention='magic'"):
    layers.Compute(attention="magic")
  with pytest.raises(ValueError, match="config.model.dtype='float16'"):
    model_registry.compute_from_config(ml_collections.ConfigDict({"dtype": "float16"}))


class _Stack(nn.Module):
  remat: str
  causal: bool = False

  @nn.compact
  def __call__(self, x, padding_mask, train):
    for i in range(3):
      x = layers.EncoderBlock(num_heads=2, mlp_dim=32, dropout=layers.Dropout(0.1, 0.1),
                              causal=self.causal, compute=layers.Compute(remat=self.remat),
                              name=f"encoderblock_{i}")(
                                  x, padding_mask, deterministic=not train)
    return x


# "full" (~14 s) runs with -m slow; the named-policy case checks the same by default.
@pytest.mark.parametrize("policy", [pytest.param("full", marks=pytest.mark.slow),
                                    "dots_with_no_batch_dims_saveable",
                                    "save_attention_kernel", *layers.REMAT_POLICIES])
def test_remat_gradients_equal_plain(policy):
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(2, 6, 16)), jnp.float32)
  pm = jnp.asarray([[1] * 6, [1] * 4 + [0] * 2])
  variables = _Stack("none").init(jax.random.PRNGKey(0), x, pm, False)

  def grads(remat):
    def loss(v):  # dropout on: both passes must draw the same masks
      y = _Stack(remat).apply(v, x, pm, True, rngs={"dropout": jax.random.PRNGKey(3)})
      return jnp.sum(y ** 2)
    return jax.value_and_grad(loss)(variables)

  (l0, g0), (l1, g1) = grads("none"), grads(policy)
  assert float(l0) == pytest.approx(float(l1), rel=1e-6)
  # Same parameter names with and without remat (checkpoints are interchangeable).
  assert jax.tree.structure(g0) == jax.tree.structure(g1)
  assert relative_difference(g1, g0) <= 1e-6


def _dots_in_gradient(remat: str) -> int:
  """dot_general equations the gradient program runs (recomputed ones included)."""
  x = jnp.ones((2, 6, 16))
  pm = jnp.ones((2, 6))
  variables = _Stack("none").init(jax.random.PRNGKey(0), x, pm, False)
  jaxpr = jax.make_jaxpr(jax.grad(
      lambda v: jnp.sum(_Stack(remat).apply(v, x, pm, False) ** 2)))(variables)

  def count(j):
    n = 0
    for eqn in j.eqns:
      n += eqn.primitive.name == "dot_general"
      for sub in jax.core.jaxprs_in_params(eqn.params):
        n += count(sub)
    return n
  return count(jaxpr.jaxpr)


def test_named_remat_policies_keep_their_products():
  """Each named policy recomputes fewer products than "full" and more than none."""
  dots = {name: _dots_in_gradient(name) for name in ("none", "full", *layers.REMAT_POLICIES)}
  assert dots["none"] < dots["save_qkv_attention_mlp"] < dots["save_qkv_attention"] \
      < dots["full"], dots


class _FlashStack(nn.Module):
  """A block on the TPU path, traced for a TPU: the Pallas flash kernel (interpret mode
  on a CPU)."""
  remat: str
  attention: str = "flash_tpu"

  @nn.compact
  def __call__(self, x, padding_mask):
    return layers.EncoderBlock(num_heads=2, mlp_dim=32,
                               compute=layers.Compute(remat=self.remat,
                                                      attention=self.attention, backend="tpu"),
                               name="encoderblock_0")(
                                   x, padding_mask, deterministic=True)


def test_save_attention_kernel_keeps_the_flash_forward_and_the_gradients():
  """remat="save_attention_kernel" on the Pallas kernel: the backward pass runs the
  block's flash forward once (its output and softmax statistics kept; compiled for a
  TPU) where "full" runs it twice. The kernel with its residuals named has the gradients of
  `pallas_flash.flash_attention` called as before (interpret mode, float32, within
  1e-6; Pallas' interpret mode cannot run under remat, whose gradients the CPU-path
  `test_remat_gradients_equal_plain` checks for this policy)."""
  from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas.ops.tpu import flash_attention as pallas_flash  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(5)
  x = jnp.asarray(rng.normal(size=(2, 6, 16)), jnp.float32)
  pm = jnp.asarray([[1] * 6, [1] * 4 + [0] * 2])
  # The same parameters on every attention path: initialized on the CPU's.
  variables = _FlashStack("none", "xla").init(jax.random.PRNGKey(0), x, pm)

  def loss(remat):
    return lambda v: jnp.sum(_FlashStack(remat).apply(v, x, pm) ** 2)

  def kernels(remat) -> int:
    """Pallas kernels in the gradient program compiled for a v5e TensorCore: JAX keeps
    an unused pallas_call in the jaxpr, the compiler drops it."""
    from avtext.aot import programs  # pylint: disable=g-import-not-at-top
    device = programs.topology_devices("v5e:2x2")[0]
    on_tpu = jax.sharding.SingleDeviceSharding(device)
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=on_tpu),
                            variables)
    compiled = jax.jit(jax.grad(loss(remat))).lower(abstract).compile()
    return compiled.as_text().count('custom_call_target="tpu_custom_call"')

  # The forward, the dK/dV and the dQ kernels; "full" adds the forward again.
  assert kernels("save_attention_kernel") == 3 and kernels("full") == 4

  def previous(q, k, v, q_ids, kv_ids, sm_scale, blocks):
    return pallas_flash.flash_attention(
        q, k, v, segment_ids=pallas_flash.SegmentIds(q=q_ids, kv=kv_ids),
        sm_scale=sm_scale, block_sizes=blocks)

  with pltpu.force_tpu_interpret_mode():
    named = jax.grad(loss("none"))(variables)
    kept = fused_attention._pallas_flash  # pylint: disable=protected-access
    fused_attention._pallas_flash = previous  # pylint: disable=protected-access
    try:
      before = jax.grad(loss("none"))(variables)
    finally:
      fused_attention._pallas_flash = kept  # pylint: disable=protected-access
  assert relative_difference(named, before) <= 1e-6


def test_heads_first_projections_equal_the_sliced_and_transposed_path():
  """The TPU path's projections written in the kernels' [B, H, L, d] layout
  (`attention.FLASH_HEADS_FIRST`) against the fused projection sliced, transposed and
  padded per head, as before: self-attention with a key padding mask, cross-attention
  to a longer sequence with the heads concatenated (no output Linear), and a prefix LM
  over the first 7 positions (the splash kernel's own prefix-LM mask, against the
  kernel's prefix rows beside the materialized rows after them); outputs and
  gradients within 1e-6 (float32, the splash kernel in Pallas' interpreter: the TPU
  interpret mode's callbacks can deadlock eager dispatch on 2 cores)."""
  rng = np.random.default_rng(6)
  x = jnp.asarray(rng.normal(size=(2, 11, 16)), jnp.float32)
  y = jnp.asarray(rng.normal(size=(2, 19, 16)), jnp.float32)
  keys = attention.make_padding_mask(jnp.asarray([[1] * 11, [1] * 7 + [0] * 4]))
  splash = attention.Attention(num_heads=2, implementation="splash_tpu", backend="tpu")
  cases = [(splash, (x,), keys, 0),
           (splash.clone(output_projection=False), (x, y), None, 0),
           (splash, (x,), attention.make_padding_mask(jnp.asarray([[1] * 11, [1] * 9 + [0] * 2])),
            7)]
  for module, inputs, mask, prefix_lm in cases:
    # The same parameters on every path: initialized on the CPU's.
    variables = module.clone(implementation="xla", backend=None).init(
        jax.random.PRNGKey(0), *inputs, mask=mask, deterministic=True)

    def run(v, *inputs, module=module, mask=mask, prefix_lm=prefix_lm):
      return module.apply(v, *inputs, mask=mask, deterministic=True, prefix_lm=prefix_lm)

    def loss(v, *inputs, run=run):
      return jnp.sum(jnp.sin(run(v, *inputs)))
    results, calls = {}, []
    original = attention._flash_heads_first  # pylint: disable=protected-access
    def spy(*args):
      calls.append(attention.FLASH_HEADS_FIRST)
      return original(*args)
    for heads_first in (True, False):
      attention.FLASH_HEADS_FIRST, attention._flash_heads_first = heads_first, spy  # pylint: disable=protected-access
      try:
        with _splash_interpreted():
          results[heads_first] = (run(variables, *inputs),
                                  jax.grad(loss, argnums=(0, 1))(variables, *inputs))
      finally:
        attention.FLASH_HEADS_FIRST, attention._flash_heads_first = True, original  # pylint: disable=protected-access
    assert calls and all(calls)  # the lever's path ran, and only with the lever on
    (out, grads), (before, grads_before) = results[True], results[False]
    assert out.shape == before.shape
    assert relative_difference(out, before) <= 1e-6
    assert relative_difference(grads, grads_before) <= 1e-6


@contextlib.contextmanager
def _splash_interpreted():
  """The splash kernel in Pallas' interpreter (this CPU), for programs traced for a TPU
  (`backend="tpu"`)."""
  fused_attention.SPLASH_INTERPRET = True
  try:
    yield
  finally:
    fused_attention.SPLASH_INTERPRET = False


def test_splash_kernel_equals_the_materialized_softmax():
  """attention="splash_tpu" (the splash kernel, fused backward; Pallas' interpreter)
  against the materialized softmax on sequences padded from 11 to 128 with a key padding
  mask, through `attention_core` and through a self-attention module's
  heads-first path: outputs and gradients within 1e-6 (float32)."""
  rng = np.random.default_rng(7)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 11, 2, 8)), jnp.float32) for _ in range(3))
  x = jnp.asarray(rng.normal(size=(2, 11, 16)), jnp.float32)
  mask = attention.make_padding_mask(jnp.asarray([[1] * 11, [1] * 7 + [0] * 4]))
  module = attention.Attention(num_heads=2)
  variables = module.init(jax.random.PRNGKey(0), x, mask=mask, deterministic=True)

  def run(impl):
    core = lambda q, k, v: attention.attention_core(q, k, v, mask, implementation=impl)
    backend = "tpu" if impl == "splash_tpu" else None
    block = lambda v, x: module.clone(implementation=impl, backend=backend).apply(
        v, x, mask=mask, deterministic=True)
    return (core(q, k, v), jax.grad(lambda *a: jnp.sum(jnp.sin(core(*a))), (0, 1, 2))(q, k, v),
            block(variables, x), jax.grad(lambda *a: jnp.sum(jnp.sin(block(*a))), (0, 1))(
                variables, x))
  with _splash_interpreted():
    splash = run("splash_tpu")
  plain = run("xla")
  for a, b in zip(splash, plain):
    assert relative_difference(a, b) <= 1e-6


def relative_difference(a, b) -> float:
  """||a - b|| / ||b|| over whole gradient trees (float32 recomputation reorders sums:
  single entries whose true value is 0, e.g. attention key biases, are pure rounding)."""
  a, b = jax.device_get((a, b))  # trees on different meshes compare on the host
  diff = np.sqrt(sum(np.sum((np.asarray(x, np.float64) - y) ** 2)
                     for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))))
  return float(diff / np.sqrt(sum(np.sum(np.asarray(y, np.float64) ** 2)
                                  for y in jax.tree.leaves(b))))


def test_sub_models_inherit_compute_fields():
  from avtext.models import dual_encoder  # pylint: disable=unused-import
  cfg = ml_collections.ConfigDict(dict(
      name="dual_encoder", embed_dim=8, dtype="bfloat16", remat="full", attention="blocked",
      video=dict(name="mbt", modalities="rgb", hidden_size=16, num_layers=1, num_heads=2,
                 mlp_dim=16, rgb_patch=(2, 8, 8), audio_patch=(8, 8), n_bottlenecks=1,
                 fusion_layer=1, dropout_rate=0.0, attention_dropout_rate=0.0,
                 remat="none"),
      text=dict(name="bert", weights=None, vocab_size=50, hidden_size=16, num_layers=1,
                num_heads=2, intermediate_size=16, max_position_embeddings=16,
                dropout_rate=0.0)))
  model = model_registry.build_model(cfg)
  video, text = model.video.compute, model.text.compute
  assert video.dtype == jnp.bfloat16 and video.attention == "blocked"
  assert video.remat == "none"  # its own setting wins
  assert text.dtype == jnp.bfloat16 and text.remat == "full"


@pytest.mark.parametrize("shape,patch", [((2, 4, 32, 32, 3), (2, 8, 8)), ((2, 64, 32, 1), (8, 16))])
def test_patch_matmul_is_the_strided_conv(shape, patch):
  x = jnp.asarray(np.random.default_rng(0).normal(size=shape), jnp.float32)
  conv = nn.Conv(16, kernel_size=patch, strides=patch, padding="VALID")
  variables = conv.init(jax.random.PRNGKey(0), x)
  mm = layers.PatchMatmul(16, kernel_size=patch, strides=patch, padding="VALID")
  assert jax.tree.map(jnp.shape, mm.init(jax.random.PRNGKey(0), x)) == jax.tree.map(
      jnp.shape, variables)  # same parameters: checkpoints and ViT imports load unchanged
  np.testing.assert_allclose(np.asarray(mm.apply(variables, x)),
                             np.asarray(conv.apply(variables, x)), atol=1e-5)


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal"])
def test_cudnn_path_pads_and_masks_to_the_same_function(monkeypatch, mask_kind):
  """The cuDNN path's padding to `FUSED_PAD` (sequence lengths when there is no mask, a
  padded boolean mask otherwise), run here through jax's XLA implementation of the same
  `jax.nn.dot_product_attention` call, since this CPU has no cuDNN."""
  xla_dpa = jax.nn.dot_product_attention
  calls = []

  def on_cpu(*args, implementation=None, **kwargs):
    calls.append((implementation, sorted(kwargs)))
    return xla_dpa(*args, implementation=None, **kwargs)
  monkeypatch.setattr(attention.jax.nn, "dot_product_attention", on_cpu)
  monkeypatch.setattr(fused_attention, "FUSED_PAD", 8)  # 11 -> 16: five padded positions
  rng = np.random.default_rng(1)
  b, length, h, d = 2, 11, 3, 8
  q, k, v = (jnp.asarray(rng.normal(size=(b, length, h, d)), jnp.float32) for _ in range(3))
  mask = {"none": None,
          "padding": attention.make_padding_mask(jnp.asarray([[1] * 11, [1] * 7 + [0] * 4])),
          "causal": attention.make_causal_mask(length)}[mask_kind]
  got = attention.attention_core(q, k, v, mask, implementation="cudnn", dtype=jnp.float32)
  np.testing.assert_allclose(np.asarray(got), _numpy_attention(q, k, v, mask), atol=2e-6)
  assert calls and calls[0][0] == "cudnn"
  assert ("key_value_seq_lengths" in calls[0][1]) == (mask is None)


@pytest.mark.parametrize("platform,dtype,want", [
    ("tpu", jnp.bfloat16, "splash_tpu"), ("tpu", jnp.float32, "splash_tpu"),
    ("gpu", jnp.bfloat16, "cudnn"), ("gpu", jnp.float32, "xla"),
    ("cpu", jnp.bfloat16, "xla"), ("cpu", jnp.float32, "xla")])
def test_auto_attention_resolves_to_the_platform_kernel(platform, dtype, want):
  assert attention.resolve_implementation("auto", dtype, platform) == want
  # None: JAX's default backend, this CPU
  assert attention.resolve_implementation("auto", dtype) == "xla"
  assert attention.resolve_implementation("blocked", dtype, platform) == "blocked"


def test_auto_attention_on_a_gpu_target_calls_cudnn(monkeypatch):
  """Traced for a GPU (as `avtext.aot` traces for its target), "auto" takes cuDNN's
  kernel: the call is recorded and answered by jax's XLA implementation on this CPU."""
  calls = []
  xla_dpa = jax.nn.dot_product_attention

  def on_cpu(*args, implementation=None, **kwargs):
    calls.append(implementation)
    return xla_dpa(*args, implementation=None, **kwargs)
  monkeypatch.setattr(attention.jax.nn, "dot_product_attention", on_cpu)
  q = jnp.ones((1, 5, 2, 8), jnp.bfloat16)
  attention.attention_core(q, q, q, None, implementation="auto", dtype=jnp.bfloat16,
                           backend="gpu")
  assert calls == ["cudnn"]


def test_tpu_kernel_with_padding_and_segment_ids_equals_reference():
  """The "auto" path on a TPU target (the splash kernel, in Pallas' interpreter on this
  CPU) and the flash kernel (in its interpret mode): sequences padded from 11 to 128
  (`FUSED_PAD`), padded keys and the padding mask's keys in segment 0; outputs and
  gradients against numpy's attention and the materialized path."""
  from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(2)
  b, length, h, d = 2, 11, 2, 8
  q, k, v = (jnp.asarray(rng.normal(size=(b, length, h, d)), jnp.float32) for _ in range(3))
  mask = attention.make_padding_mask(jnp.asarray([[1] * 11, [1] * 7 + [0] * 4]))

  def loss(impl, q, k, v):
    return jnp.sum(jnp.sin(attention.attention_core(q, k, v, mask, implementation=impl,
                                                    backend="tpu")))
  runs = {}
  with _splash_interpreted():
    runs["auto"] = (attention.attention_core(q, k, v, mask, implementation="auto",
                                             backend="tpu"),
                    jax.grad(functools.partial(loss, "auto"), argnums=(0, 1, 2))(q, k, v))
  with pltpu.force_tpu_interpret_mode():
    runs["flash_tpu"] = (
        attention.attention_core(q, k, v, mask, implementation="flash_tpu"),
        jax.grad(functools.partial(loss, "flash_tpu"), argnums=(0, 1, 2))(q, k, v))
  want = jax.grad(functools.partial(loss, "xla"), argnums=(0, 1, 2))(q, k, v)
  for got, grads in runs.values():
    np.testing.assert_allclose(np.asarray(got), _numpy_attention(q, k, v, mask), atol=2e-5)
    for a, b_ in zip(grads, want):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b_), atol=2e-5)


@pytest.mark.slow  # `make test-slow` (CI runs it): the default run's 12-minute budget
def test_prefix_lm_takes_the_tpu_kernel_for_the_prefix_and_equals_the_mask():
  """`prefix_lm=P` on the TPU path (the splash kernel in Pallas' interpreter): the P
  prefix rows go through the kernel unmasked, the rows after them through the masked
  path; outputs and gradients equal numpy's attention under `make_prefix_lm_mask` and
  the materialized path with that mask, with a padded key in the prefix."""
  rng = np.random.default_rng(3)
  b, length, h, d, p = 2, 13, 2, 8, 9
  q, k, v = (jnp.asarray(rng.normal(size=(b, length, h, d)), jnp.float32) for _ in range(3))
  keys = attention.make_padding_mask(jnp.asarray([[1] * 13, [1] * 8 + [0] + [1] * 4]))
  full = attention.combine_masks(keys, attention.make_prefix_lm_mask(jnp.full((1,), p), length))

  def loss(impl, mask, prefix_lm, q, k, v):
    return jnp.sum(jnp.sin(attention.attention_core(
        q, k, v, mask, implementation=impl, prefix_lm=prefix_lm, backend="tpu")))
  kernels = []
  original = fused_attention.fused_attention
  def spy(implementation, query, *args):
    kernels.append((implementation, query.shape[1]))
    return original(implementation, query, *args)
  with _splash_interpreted():
    fused_attention.fused_attention = spy
    try:
      got = attention.attention_core(q, k, v, keys, implementation="auto", prefix_lm=p,
                                     backend="tpu")
      grads = jax.grad(functools.partial(loss, "auto", keys, p), argnums=(0, 1, 2))(q, k, v)
    finally:
      fused_attention.fused_attention = original
  assert kernels and all(call == ("splash_tpu", p) for call in kernels)  # the prefix rows
  np.testing.assert_allclose(np.asarray(got), _numpy_attention(q, k, v, full), atol=2e-5)
  want = jax.grad(functools.partial(loss, "xla", full, 0), argnums=(0, 1, 2))(q, k, v)
  for a, b_ in zip(grads, want):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b_), atol=2e-5)
  # Every implementation takes prefix_lm; the CPU path materializes the same mask.
  np.testing.assert_allclose(
      np.asarray(attention.attention_core(q, k, v, keys, implementation="xla", prefix_lm=p)),
      _numpy_attention(q, k, v, full), atol=2e-5)
  with pytest.raises(ValueError, match="mask keys only"):
    attention.attention_core(q, k, v, full, prefix_lm=p)


def test_bfloat16_layer_norm_and_softmax_keep_float32_statistics():
  """bf16 activations with float32 statistics: `layers.LayerNorm(dtype=bfloat16)` on
  bf16 rows whose mean (~N(0, 20)) dwarfs their spread (3) is within bf16's output
  rounding, 2^-8 (|y| + 1), of float64 LayerNorm of the same inputs (statistics taken in
  bf16 miss 80 % of the elements, by up to 3,900: E[x^2] ~ 400 rounds in steps of 2
  against a variance of 9),
  its input gradient within 0.5 % of the float32 layer's largest; the bf16 attention's
  softmax (logits in [-8, 8]) within 0.02 of float64 attention on the same bf16 inputs."""
  rng = np.random.default_rng(4)
  x = rng.normal(size=(4, 64, 768)) * 3 + rng.normal(size=(4, 64, 1)) * 20
  x = jnp.asarray(x, jnp.bfloat16)
  params = {"params": {"scale": jnp.asarray(1 + 0.1 * rng.normal(size=768), jnp.float32),
                       "bias": jnp.asarray(0.1 * rng.normal(size=768), jnp.float32)}}
  ln = lambda dtype: functools.partial(
      layers.LayerNorm(epsilon=1e-5, dtype=dtype).apply, params)
  y = ln(jnp.bfloat16)(x)
  assert y.dtype == jnp.bfloat16
  x64 = np.asarray(x.astype(jnp.float32), np.float64)
  want = ((x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
          * np.asarray(params["params"]["scale"]) + np.asarray(params["params"]["bias"]))
  err = np.abs(np.asarray(y.astype(jnp.float32)) - want)
  assert (err <= 2.0 ** -8 * (np.abs(want) + 1)).all(), err.max()
  dy = jnp.asarray(rng.normal(size=x.shape), jnp.bfloat16)
  grad = jax.vjp(ln(jnp.bfloat16), x)[1](dy)[0]
  grad32 = jax.vjp(ln(jnp.float32), x.astype(jnp.float32))[1](dy.astype(jnp.float32))[0]
  assert grad.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(grad.astype(jnp.float32)), np.asarray(grad32),
                             atol=5e-3 * float(jnp.max(jnp.abs(grad32))))
  b, length, h, d = 2, 256, 4, 64
  q, k, v = (jnp.asarray(rng.normal(size=(b, length, h, d)) * s, jnp.bfloat16)
             for s in (1.5, 1.0, 1.0))
  got = attention.attention_core(q, k, v, None, implementation="xla", dtype=jnp.bfloat16)
  logits = np.einsum("bqhd,bkhd->bhqk", *(np.asarray(a.astype(jnp.float32)) for a in (q, k)))
  assert 4 < np.abs(logits / np.sqrt(d)).max() < 8
  np.testing.assert_allclose(np.asarray(got.astype(jnp.float32)), _numpy_attention(
      *(a.astype(jnp.float32) for a in (q, k, v)), None), atol=0.02)


def _compile_flash_for_v5e(length: int, blocks) -> None:
  """The flash kernels' forward and backward compiled by libtpu for one v5e chip at the
  AVR paper step's per-chip shape, [16 clips, 12 heads, length, 64] (Mosaic checks each
  kernel's scoped VMEM; whether a block fits also depends on where XLA places the
  operands around the kernel, so the test uses the real size: at [1, 1, ...] the larger
  blocks fit too)."""
  import os  # pylint: disable=g-import-not-at-top
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas.ops.tpu import flash_attention as pallas_flash  # pylint: disable=g-import-not-at-top
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  device = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices[0]
  sharding = jax.sharding.SingleDeviceSharding(device)
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

  def grads(q, k, v, ids):
    def loss(q, k, v):
      return jnp.sum(pallas_flash.flash_attention(
          q, k, v, segment_ids=pallas_flash.SegmentIds(ids, ids), block_sizes=blocks,
          sm_scale=0.125).astype(jnp.float32))
    return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
  head = spec((16, 12, length, 64), jnp.bfloat16)
  jax.jit(grads).lower(head, head, head, spec((16, length), jnp.int32)).compile()


@pytest.mark.slow  # `make test-slow` (CI runs it): the default run's 12-minute budget
def test_flash_block_sizes_fit_a_v5e_and_larger_do_not():
  """`fused_attention.flash_block_sizes` at the AVR's 3,200 padded RGB tokens compiles for a
  v5e; the next larger forward query block (the whole 3,200) runs out of scoped VMEM,
  which is why `FLASH_MAX_BLOCK_Q` is 640."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  blocks = fused_attention.flash_block_sizes(3200, 3200)
  assert (blocks.block_q, blocks.block_k_major_dkv, blocks.block_q_dq) == (640, 3200, 640)
  _compile_flash_for_v5e(3200, blocks)
  with pytest.raises(Exception, match="Vmem"):
    _compile_flash_for_v5e(3200, dataclasses.replace(blocks, block_q=3200, block_q_dq=3200))
  # Short sequences: one block of the whole sequence.
  assert fused_attention.flash_block_sizes(512, 512).block_q == 512
  assert fused_attention.flash_block_sizes(128, 128).block_k_major_dkv == 128
