"""Tests for avtext.models.mbt (VideoCC §4.1 / MBT bottleneck fusion).

The main check is a float64 NumPy re-implementation of the whole forward pass
(patching by reshape + matmul, pre-LN ViT layers, the bottleneck-fusion loop
of MBT eq. 8-9, final LayerNorm, [CLS] mean) run on the module's own params.
The others probe behaviour: which inputs can influence which outputs.
"""
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special

from avtext.models import layers
from avtext.models import mbt as mbt_lib

TINY = dict(hidden_size=32, num_layers=3, num_heads=4, mlp_dim=64,
            rgb_patch_size=(2, 8, 8), audio_patch_size=(4, 4),
            n_bottlenecks=2, fusion_layer=1)


def _inputs(seed=0, batch=2):
  rng = np.random.default_rng(seed)
  return {
      "rgb": jnp.asarray(rng.normal(size=(batch, 4, 16, 16, 3)), jnp.float32),
      "audio": jnp.asarray(rng.normal(size=(batch, 16, 8)), jnp.float32),
  }


def _init(model, inputs, seed=0):
  """Random params of the model's shapes, drawn on the host.

  Every leaf is random (LayerNorm scales around 1), so biases, [CLS] tokens
  and the bottleneck all matter. Host-side draws avoid compiling the flax
  initializers, which dominates the run time of tiny models on CPU.
  """
  shapes = jax.eval_shape(
      lambda: model.init(jax.random.PRNGKey(0), inputs, train=False))["params"]
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    noise = 0.1 * rng.normal(size=leaf.shape)
    return jnp.asarray(noise + (path[-1].key == "scale"), jnp.float32)
  return jax.tree_util.tree_map_with_path(draw, shapes)


def _apply(model, params, inputs, train=False, rngs=None):
  # Eager on purpose: op-by-op kernels are cached across models of the same
  # widths, while each jitted variant would compile for seconds.
  with jax.default_matmul_precision("highest"):
    return model.apply({"params": params}, inputs, train=train, rngs=rngs)


# ---------------------------------------------------------------------------
# NumPy reference (float64).


def _np(tree):
  return jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), tree)


def _ref_patchify(x, kernel, bias):
  """Non-overlapping patches by reshape; kernel [*patch, C, D] -> [B, N, D]."""
  patch = kernel.shape[:-2]
  b, c = x.shape[0], x.shape[-1]
  grid = [s // p for s, p in zip(x.shape[1:-1], patch)]
  split = [b]
  for g, p in zip(grid, patch):
    split += [g, p]
  x = x.reshape(split + [c])
  nd = len(patch)
  order = [0] + [1 + 2 * i for i in range(nd)] + [2 + 2 * i for i in range(nd)]
  x = x.transpose(order + [1 + 2 * nd])
  x = x.reshape(b, int(np.prod(grid)), -1)
  return x @ kernel.reshape(-1, kernel.shape[-1]) + bias


def _ref_layer_norm(x, p, eps=1e-6):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _ref_attention(x, p):
  q, k, v = (np.einsum("bld,dhk->blhk", x, p[n]["kernel"]) + p[n]["bias"]
             for n in ("query", "key", "value"))
  logits = np.einsum("bqhk,bphk->bhqp", q, k) / np.sqrt(q.shape[-1])
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  o = np.einsum("bhqp,bphk->bqhk", w, v)
  return np.einsum("bqhk,hkd->bqd", o, p["out"]["kernel"]) + p["out"]["bias"]


def _ref_gelu_tanh(x):
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _ref_block(x, p):
  """Pre-LN ViT layer."""
  x = x + _ref_attention(_ref_layer_norm(x, p["attention_norm"]),
                         p["attention"])
  h = _ref_layer_norm(x, p["mlp_norm"])
  h = _ref_gelu_tanh(h @ p["mlp"]["dense_in"]["kernel"] +
                     p["mlp"]["dense_in"]["bias"])
  return x + h @ p["mlp"]["dense_out"]["kernel"] + p["mlp"]["dense_out"]["bias"]


def _ref_conv_stride2_same(x, kernel, bias):
  """3x3 conv of stride 2 with TF/XLA 'SAME' padding, by loops: out = ceil(in / 2), the
  total padding max((out - 1) * 2 + 3 - in, 0), its smaller half before. x [N, H, W, C]."""
  n, h, w, _ = x.shape
  out_h, out_w = -(-h // 2), -(-w // 2)
  pad_h, pad_w = max((out_h - 1) * 2 + 3 - h, 0), max((out_w - 1) * 2 + 3 - w, 0)
  padded = np.pad(x, ((0, 0), (pad_h // 2, pad_h - pad_h // 2),
                      (pad_w // 2, pad_w - pad_w // 2), (0, 0)))
  y = np.zeros((n, out_h, out_w, kernel.shape[-1]))
  for i in range(out_h):
    for j in range(out_w):
      window = padded[:, 2 * i:2 * i + 3, 2 * j:2 * j + 3, :]  # [N, 3, 3, C]
      y[:, i, j] = np.einsum("nhwc,hwcd->nd", window, kernel)
  return y + bias


def _ref_stem(x, p):
  """Hybrid stem per frame: (conv 3x3 / 2 -> LayerNorm -> exact GELU) per layer."""
  lead = x.shape[:-3]
  x = x.reshape((-1,) + x.shape[-3:])
  for i in range(len(p) // 2):
    x = _ref_conv_stride2_same(x, p[f"conv_{i}"]["kernel"], p[f"conv_{i}"]["bias"])
    x = _ref_layer_norm(x, p[f"norm_{i}"])
    x = 0.5 * x * (1 + scipy.special.erf(x / np.sqrt(2)))
  return x.reshape(lead + x.shape[1:])


def _ref_mbt(params, inputs, modalities, num_layers, fusion_layer):
  p, inputs = _np(params), _np(inputs)
  x = {}
  for m in modalities:
    raw = inputs[m] if m == "rgb" else inputs[m][..., None]
    if "stem" in p[m]:
      raw = _ref_stem(raw, p[m]["stem"])
    tok = _ref_patchify(raw, p[m]["patch_embedding"]["kernel"],
                        p[m]["patch_embedding"]["bias"])
    cls = np.repeat(p[m]["cls"], tok.shape[0], axis=0)
    x[m] = np.concatenate([cls, tok], 1) + p[m]["posembed"]["pos_embedding"]
  z = None
  if "bottleneck" in p:
    z = np.repeat(p["bottleneck"], x[modalities[0]].shape[0], axis=0)
  for i in range(num_layers):
    if i < fusion_layer or len(modalities) == 1:
      x = {m: _ref_block(x[m], p[m][f"encoderblock_{i}"]) for m in modalities}
    else:
      zs = []
      for m in modalities:
        n = x[m].shape[1]
        y = _ref_block(np.concatenate([x[m], z], 1), p[m][f"encoderblock_{i}"])
        x[m], _ = y[:, :n], zs.append(y[:, n:])
      z = sum(zs) / len(zs)
  cls = {m: _ref_layer_norm(x[m], p[m]["encoder_norm"])[:, 0]
         for m in modalities}
  return cls, z


# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fused():
  model = mbt_lib.MBT(**TINY)
  inputs = _inputs()
  return model, _init(model, inputs), inputs


def _check_fused_against_reference(model, params, inputs):
  """Both towers' [CLS] and the bottleneck against the numpy reference; the output."""
  out = _apply(model, params, inputs)
  cls, z = _ref_mbt(params, inputs, ("rgb", "audio"), TINY["num_layers"],
                    TINY["fusion_layer"])
  for m in ("rgb", "audio"):
    np.testing.assert_allclose(out["cls"][m], cls[m], atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(out["bottleneck"], z, atol=1e-5, rtol=1e-5)
  return out, cls


def test_matches_numpy_reference_with_bottleneck_fusion(fused):
  out, cls = _check_fused_against_reference(*fused)
  np.testing.assert_allclose(out["embedding"], (cls["rgb"] + cls["audio"]) / 2,
                             atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("modalities", ["rgb", "audio"])
def test_single_modality_matches_numpy_reference(modalities):
  model = mbt_lib.MBT(**{**TINY, "modalities": modalities})
  inputs = _inputs()
  params = _init(model, inputs)
  assert set(params) == {modalities}  # No bottleneck, no other tower.
  out = _apply(model, params, inputs)
  cls, _ = _ref_mbt(params, inputs, (modalities,), TINY["num_layers"],
                    TINY["fusion_layer"])
  np.testing.assert_allclose(out["cls"][modalities], cls[modalities],
                             atol=1e-5, rtol=1e-5)
  np.testing.assert_array_equal(out["embedding"], out["cls"][modalities])
  assert "bottleneck" not in out


def test_embedding_is_mean_of_modality_cls(fused):
  model, params, inputs = fused
  out = _apply(model, params, inputs)
  np.testing.assert_allclose(
      out["embedding"], (out["cls"]["rgb"] + out["cls"]["audio"]) / 2,
      atol=1e-7)
  for m in ("rgb", "audio"):
    np.testing.assert_array_equal(out["cls"][m], out["tokens"][m][:, 0])


def test_patch_embedding_equals_reshape_matmul():
  # With no layers the outputs are LN(patch tokens + positions): this isolates
  # the tokenizer, including the row-major (t, h, w) order of the tokens.
  model = mbt_lib.MBT(**{**TINY, "num_layers": 0})
  inputs = _inputs()
  params = _init(model, inputs)
  out = _apply(model, params, inputs)
  p = _np(params)
  for m in ("rgb", "audio"):
    raw = np.asarray(inputs[m], np.float64)
    raw = raw if m == "rgb" else raw[..., None]
    tok = _ref_patchify(raw, p[m]["patch_embedding"]["kernel"],
                        p[m]["patch_embedding"]["bias"])
    want = _ref_layer_norm(tok + p[m]["posembed"]["pos_embedding"][1:],
                           p[m]["encoder_norm"])
    assert tok.shape[1] == 8  # (4/2)*(16/8)*(16/8) tubelets; (16/4)*(8/4).
    np.testing.assert_allclose(out["tokens"][m][:, 1:], want, atol=1e-5)


def test_rgb_conv_stem_matches_numpy_reference():
  """The hybrid stem (rgb_stem): its convolutions, norms and GELUs by loops, then the
  patch embedding on the [H/4, W/4] feature map, through fusion, against the reference."""
  model = mbt_lib.MBT(**TINY, demo=mbt_lib.DemoOptions(rgb_stem=(4, 6)))
  inputs = _inputs()
  _check_fused_against_reference(model, _init(model, inputs), inputs)


def test_rgb_conv_stem_parameters_and_token_grid():
  """The stem adds rgb/stem/{conv,norm}_<i>, the tubelet kernel covers the same pixels on
  the stem's map, the token grid (and so the position table) is the pure model's; the
  audio tower has no stem."""
  inputs = _inputs()
  plain = jax.eval_shape(lambda: mbt_lib.MBT(**TINY).init(
      jax.random.PRNGKey(0), inputs, train=False))["params"]
  hybrid = jax.eval_shape(lambda: mbt_lib.MBT(
      **TINY, demo=mbt_lib.DemoOptions(rgb_stem=(4, 6))).init(
      jax.random.PRNGKey(0), inputs, train=False))["params"]
  shapes = lambda tree: {"/".join(k.key for k in path): leaf.shape  # noqa: E731
                         for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}
  plain, hybrid = shapes(plain), shapes(hybrid)
  assert {k: v for k, v in hybrid.items() if "/stem/" in k} == {
      "rgb/stem/conv_0/kernel": (3, 3, 3, 4), "rgb/stem/conv_0/bias": (4,),
      "rgb/stem/norm_0/scale": (4,), "rgb/stem/norm_0/bias": (4,),
      "rgb/stem/conv_1/kernel": (3, 3, 4, 6), "rgb/stem/conv_1/bias": (6,),
      "rgb/stem/norm_1/scale": (6,), "rgb/stem/norm_1/bias": (6,)}
  assert hybrid.pop("rgb/patch_embedding/kernel") == (2, 2, 2, 6, 32)  # (2, 8/4, 8/4)
  assert plain.pop("rgb/patch_embedding/kernel") == (2, 8, 8, 3, 32)
  assert {k: v for k, v in hybrid.items() if "/stem/" not in k} == plain


def test_rgb_stem_needs_patches_divisible_by_its_strides():
  model = mbt_lib.MBT(**{**TINY, "modalities": "rgb"},
                      demo=mbt_lib.DemoOptions(rgb_stem=(4, 4, 4, 4)))
  with pytest.raises(ValueError, match=r"4-layer rgb_stem .* multiples of 16"):
    model.init(jax.random.PRNGKey(0), _inputs(), train=False)


@pytest.mark.parametrize("modalities", ["rgb", "rgb+audio", "audio"])
def test_rgb_max_pool_replaces_the_rgb_cls_in_the_embedding(fused, modalities):
  """rgb_pool="max": the same parameters and tokens; the RGB tower enters the embedding as
  the channel-wise max over its patch tokens (the [CLS] row excluded)."""
  _, params, inputs = fused
  cfg = {**TINY, "modalities": modalities}
  params = {k: v for k, v in params.items() if k in modalities or k == "bottleneck"}
  if modalities != "rgb+audio":
    params.pop("bottleneck")
  base = _apply(mbt_lib.MBT(**cfg), params, inputs)
  out = _apply(mbt_lib.MBT(**cfg, demo=mbt_lib.DemoOptions(rgb_pool="max")), params, inputs)
  jax.tree.map(np.testing.assert_array_equal, out["tokens"], base["tokens"])
  tokens = {m: np.asarray(t) for m, t in base["tokens"].items()}
  parts = [tokens[m][:, 0] if m == "audio" else
           np.stack([tokens["rgb"][b, 1:].max(axis=0) for b in range(2)])
           for m in modalities.split("+")]
  np.testing.assert_allclose(out["embedding"], np.mean(parts, axis=0), rtol=1e-6, atol=1e-7)
  with pytest.raises(ValueError, match="rgb_pool must be 'cls' or 'max', got 'mean'"):
    mbt_lib.DemoOptions(rgb_pool="mean")  # checked when built


def _perturbed(inputs, key):
  out = dict(inputs)
  out[key] = inputs[key] + 1.0
  return out


def test_no_cross_modal_flow_without_fusion_layers():
  # fusion_layer >= num_layers: two independent towers (late fusion).
  model = mbt_lib.MBT(**{**TINY, "fusion_layer": TINY["num_layers"]})
  inputs = _inputs()
  params = _init(model, inputs)
  assert "bottleneck" not in params
  base = _apply(model, params, inputs)
  for changed, other in (("audio", "rgb"), ("rgb", "audio")):
    out = _apply(model, params, _perturbed(inputs, changed))
    np.testing.assert_array_equal(out["cls"][other], base["cls"][other])
    assert np.abs(out["cls"][changed] - base["cls"][changed]).max() > 1e-3


def test_cross_modal_flow_only_through_bottlenecks(fused):
  model, params, inputs = fused
  base = _apply(model, params, inputs)
  for changed, other in (("audio", "rgb"), ("rgb", "audio")):
    out = _apply(model, params, _perturbed(inputs, changed))
    assert np.abs(out["cls"][other] - base["cls"][other]).max() > 1e-4

  # Ablation: with zero bottleneck tokens the fusion layers see only their own
  # modality, so even early fusion (fusion_layer=0) carries no information.
  ablated = mbt_lib.MBT(**{**TINY, "n_bottlenecks": 0, "fusion_layer": 0})
  params0 = _init(ablated, inputs)
  base0 = _apply(ablated, params0, inputs)
  out0 = _apply(ablated, params0, _perturbed(inputs, "audio"))
  np.testing.assert_array_equal(out0["cls"]["rgb"], base0["cls"]["rgb"])


def test_bottleneck_param_used_only_when_fusing(fused):
  model, params, inputs = fused
  # A random change: a constant shift of a token is undone by LayerNorm.
  noise = jax.random.normal(jax.random.PRNGKey(3), params["bottleneck"].shape)
  shifted = dict(params, bottleneck=params["bottleneck"] + noise)
  base, out = _apply(model, params, inputs), _apply(model, shifted, inputs)
  for m in ("rgb", "audio"):
    assert np.abs(out["cls"][m] - base["cls"][m]).max() > 1e-4


def test_unused_modality_input_is_ignored():
  model = mbt_lib.MBT(**{**TINY, "modalities": "rgb"})
  inputs = _inputs()
  params = _init(model, inputs)
  with_audio = _apply(model, params, inputs)
  without = _apply(model, params, {"rgb": inputs["rgb"]})
  garbage = _apply(model, params, {"rgb": inputs["rgb"],
                                   "audio": jnp.zeros((7, 3))})
  np.testing.assert_array_equal(with_audio["embedding"], without["embedding"])
  np.testing.assert_array_equal(garbage["embedding"], without["embedding"])
  assert set(with_audio["cls"]) == {"rgb"}


@pytest.mark.parametrize("spec,want", [
    ("rgb", ("rgb",)), ("audio", ("audio",)), ("rgb+audio", ("rgb", "audio")),
    (("audio", "rgb"), ("audio", "rgb")), (["rgb"], ("rgb",)),
])
def test_parse_modalities(spec, want):
  assert mbt_lib.parse_modalities(spec) == want


@pytest.mark.parametrize("spec", ["", "rgb+rgb", "video", ("rgb", "text")])
def test_parse_modalities_rejects(spec):
  with pytest.raises(ValueError, match="modalities"):
    mbt_lib.parse_modalities(spec)


def test_input_errors_are_specific(fused):
  model, params, inputs = fused
  with pytest.raises(KeyError, match="audio"):
    _apply(model, params, {"rgb": inputs["rgb"]})
  with pytest.raises(ValueError, match="not divisible"):
    _apply(model, params, dict(inputs, rgb=inputs["rgb"][:, :3]))
  with pytest.raises(flax.errors.ScopeParamShapeError, match="pos_embedding"):
    _apply(model, params, dict(inputs, rgb=jnp.concatenate(
        [inputs["rgb"]] * 2, axis=1)))


@pytest.mark.slow  # `make test-slow` (CI runs it): the default run's 12-minute budget
def test_jit_and_grad_are_finite():
  model = mbt_lib.MBT(**{**TINY, "num_layers": 2})  # One fusion layer.
  inputs = _inputs()
  params = _init(model, inputs)

  def loss(params):
    out = model.apply({"params": params}, inputs, train=False)
    return jnp.sum(out["embedding"] ** 2)

  value, grads = jax.jit(jax.value_and_grad(loss))(params)
  flat = flax.traverse_util.flatten_dict(grads)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in flat.values())
  # The bottleneck and both towers' first layers receive gradient.
  assert float(jnp.abs(grads["bottleneck"]).max()) > 0
  for m in ("rgb", "audio"):
    assert float(jnp.abs(grads[m]["patch_embedding"]["kernel"]).max()) > 0
  # Directional derivative against central finite differences.
  rng = np.random.default_rng(1)
  direction = jax.tree_util.tree_map(
      lambda g: jnp.asarray(rng.normal(size=g.shape), jnp.float32), grads)
  eps = 1e-3
  shift = lambda s: jax.tree_util.tree_map(lambda p, d: p + s * eps * d,
                                           params, direction)
  with jax.default_matmul_precision("highest"):
    numeric = (loss(shift(1.0)) - loss(shift(-1.0))) / (2 * eps)
    np.testing.assert_allclose(value, loss(params), rtol=1e-5)
  analytic = sum(jnp.vdot(g, d) for g, d in zip(
      jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(direction)))
  np.testing.assert_allclose(numeric, analytic, rtol=2e-2)


def test_dropout_only_in_train_mode():
  cfg = {**TINY, "modalities": "rgb", "num_layers": 2}
  model = mbt_lib.MBT(**cfg, dropout=layers.Dropout(0.3, 0.3))
  inputs = _inputs()
  params = _init(model, inputs)
  eval_out = _apply(model, params, inputs)
  # Evaluation is deterministic and needs no rng.
  np.testing.assert_array_equal(_apply(model, params, inputs)["embedding"],
                                eval_out["embedding"])
  with pytest.raises(flax.errors.InvalidRngError):
    _apply(model, params, inputs, train=True)
  a = _apply(model, params, inputs, train=True,
             rngs={"dropout": jax.random.PRNGKey(1)})
  b = _apply(model, params, inputs, train=True,
             rngs={"dropout": jax.random.PRNGKey(2)})
  assert np.abs(a["embedding"] - eval_out["embedding"]).max() > 1e-3
  assert np.abs(a["embedding"] - b["embedding"]).max() > 1e-3

  # With all rates at zero, train mode is the eval computation.
  plain = mbt_lib.MBT(**cfg)
  np.testing.assert_allclose(_apply(plain, params, inputs, train=True)
                             ["embedding"],
                             _apply(plain, params, inputs)["embedding"],
                             atol=1e-6)


def test_stochastic_depth_schedule_is_linear_in_depth():
  # Rates grow 0 -> stochastic_depth over the layers: with 2 layers and
  # rate 1.0 the first layer always runs and the last one is always skipped,
  # so training equals a 1-layer model with the same first layer.
  cfg = {**TINY, "modalities": "rgb", "num_layers": 2,
         "dropout": layers.Dropout(stochastic_depth=1.0)}
  model = mbt_lib.MBT(**cfg)
  inputs = _inputs()
  params = _init(model, inputs)
  out = _apply(model, params, inputs, train=True,
               rngs={"dropout": jax.random.PRNGKey(0)})
  one = mbt_lib.MBT(**{**cfg, "num_layers": 1})
  params1 = {"rgb": {k: v for k, v in params["rgb"].items()
                     if k != "encoderblock_1"}}
  want = _apply(one, params1, inputs)
  np.testing.assert_allclose(out["embedding"], want["embedding"], atol=1e-6)
  # At eval every layer runs.
  assert np.abs(_apply(model, params, inputs)["embedding"] -
                want["embedding"]).max() > 1e-3


def test_bfloat16_compute_keeps_float32_params(fused):
  _, params, inputs = fused
  model = mbt_lib.MBT(**TINY, compute=layers.Compute(dtype=jnp.bfloat16))
  out = jax.jit(lambda p, x: model.apply({"params": p}, x, train=False))(
      params, inputs)
  assert out["embedding"].dtype == jnp.bfloat16
  shapes = jax.eval_shape(
      lambda: model.init(jax.random.PRNGKey(0), inputs, train=False))
  assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(shapes))
  ref = _apply(mbt_lib.MBT(**TINY), params, inputs)["embedding"]
  np.testing.assert_allclose(np.asarray(out["embedding"], np.float32), ref,
                             atol=0.1)
