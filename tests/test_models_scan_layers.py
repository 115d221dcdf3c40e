"""`config.model.scan_layers`: a stack of identical layers as one `lax.scan` computes the
same function as the unrolled layers, from the same parameter tree (so checkpoints and
weight importers are shared), for BERT, MBT (unimodal and fusion layers) and GPT-2.

The reference is the unscanned path of the same module and parameters; the equality is
exact up to float reassociation (1e-5 of each array's largest entry), in the outputs and in every parameter gradient.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avtext.models import bert as bert_lib
from avtext.models import gpt2 as gpt2_lib
from avtext.models import layers
from avtext.models import mbt as mbt_lib


def _assert_trees_close(a, b, atol, what):
  la, lb = jax.tree.leaves_with_path(a), jax.tree.leaves_with_path(b)
  assert [p for p, _ in la] == [p for p, _ in lb], what
  for (path, x), (_, y) in zip(la, lb):
    # Float reassociation: atol scales with the array's largest entry.
    scale = max(1.0, float(np.max(np.abs(np.asarray(y)))))
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol * scale, rtol=1e-5,
                               err_msg=f"{what} {jax.tree_util.keystr(path)}")


def _check(make, inputs, out_fn, **apply_kwargs):
  """Same params from both inits; outputs and gradients of sum(sin(out)) agree."""
  plain, scanned = make(False), make(True)
  init = lambda m: jax.jit(functools.partial(m.init, **apply_kwargs))  # jit: 3x op by op
  params = init(plain)(jax.random.key(0), *inputs)["params"]
  params_scanned = init(scanned)(jax.random.key(0), *inputs)["params"]
  _assert_trees_close(params, params_scanned, 0, "init")  # one tree, one layout

  def loss(model, p):
    out = out_fn(model.apply({"params": p}, *inputs, **apply_kwargs))
    return sum(jnp.sum(jnp.sin(x)) for x in jax.tree.leaves(out))

  value_and_grad = {m: jax.jit(jax.value_and_grad(lambda p, m=m: loss(m, p)))
                    for m in (plain, scanned)}
  (want, want_grad), (got, got_grad) = (value_and_grad[m](params) for m in (plain, scanned))
  assert np.isfinite(float(want))
  np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
  _assert_trees_close(got_grad, want_grad, 1e-5, "grad")
  # The scanned program holds one layer: a while loop in the lowered module.
  text = jax.jit(lambda p: loss(scanned, p)).lower(params).as_text()
  assert "stablehlo.while" in text


@pytest.mark.slow  # `make test-slow` (CI runs it): the default run's 12-minute budget
def test_bert_scan_equals_unrolled():
  ids = jnp.asarray(np.random.default_rng(0).integers(0, 50, (2, 7)))
  mask = jnp.asarray([[1] * 7, [1] * 4 + [0] * 3])
  make = lambda scan: bert_lib.Bert(
      vocab_size=50, hidden_size=16, num_layers=3, num_heads=2, mlp_dim=32,
      max_position_embeddings=16, compute=layers.Compute(scan_layers=scan))
  _check(make, (ids, mask), lambda o: (o["sequence"], o["hidden_states"]), hidden_states=True)


@pytest.mark.parametrize("fusion_layer", [
    # unimodal layers 0-1 and fusion layers 2-3: both scans (BERT's scan stays in the
    # default run; `make test-slow`, which CI runs, has MBT's)
    pytest.param(2, marks=pytest.mark.slow),
    pytest.param(0, marks=pytest.mark.slow),  # all fusion
    pytest.param(4, marks=pytest.mark.slow)])  # no fusion
def test_mbt_scan_equals_unrolled(fusion_layer):
  rng = np.random.default_rng(1)
  inputs = {"rgb": jnp.asarray(rng.normal(size=(2, 4, 8, 8, 3)), jnp.float32),
            "audio": jnp.asarray(rng.normal(size=(2, 8, 8)), jnp.float32)}
  make = lambda scan: mbt_lib.MBT(
      hidden_size=16, num_layers=4, num_heads=2, mlp_dim=32, rgb_patch_size=(2, 4, 4),
      audio_patch_size=(4, 4), n_bottlenecks=2, fusion_layer=fusion_layer,
      compute=layers.Compute(scan_layers=scan))
  _check(make, (inputs,), lambda o: (o["tokens"], o.get("bottleneck", 0.0)), train=False)


@pytest.mark.slow  # `make test-slow` (CI runs it): the default run's 12-minute budget
def test_gpt2_scan_equals_unrolled_and_decodes():
  ids = jnp.asarray(np.random.default_rng(2).integers(0, 40, (2, 6)))
  make = lambda scan: gpt2_lib.GPT2(
      vocab_size=40, max_positions=16, hidden_size=16, num_layers=3, num_heads=2,
      mlp_dim=32, dropout_rate=0.0, attention_dropout_rate=0.0,
      compute=layers.Compute(scan_layers=scan))
  _check(make, (ids,), lambda o: o)


@pytest.mark.slow  # `make test-slow` (CI runs it): the default run's 12-minute budget
def test_training_with_dropout_and_remat():
  """Dropout keys reach every scanned layer (the outputs differ from the deterministic
  ones and between keys); remat and bfloat16 compose with the scan."""
  ids = jnp.asarray(np.random.default_rng(3).integers(0, 50, (2, 7)))
  mask = jnp.ones((2, 7))
  model = bert_lib.Bert(vocab_size=50, hidden_size=16, num_layers=3, num_heads=2,
                        mlp_dim=32, max_position_embeddings=16,
                        compute=layers.Compute(jnp.bfloat16, remat="full", scan_layers=True))
  params = jax.jit(model.init)(jax.random.key(0), ids, mask)["params"]
  run = jax.jit(lambda key, train: model.apply(
      {"params": params}, ids, mask, train=train,
      rngs={"dropout": jax.random.key(key)})["sequence"], static_argnums=1)
  a, b, det = run(0, True), run(1, True), run(0, False)
  assert a.dtype == jnp.bfloat16
  assert not np.allclose(np.asarray(a, np.float32), np.asarray(det, np.float32))
  assert not np.allclose(np.asarray(a, np.float32), np.asarray(b, np.float32))
  grads = jax.jit(jax.grad(lambda p: jnp.sum(model.apply(
      {"params": p}, ids, mask, train=True,
      rngs={"dropout": jax.random.key(0)})["sequence"].astype(jnp.float32))))(params)
  norms = [float(jnp.linalg.norm(g)) for g in jax.tree.leaves(grads["encoderblock_2"])]
  assert all(np.isfinite(norms)) and max(norms) > 0


def test_mismatched_layers_and_stochastic_depth_are_errors():
  params = {"a": {"w": jnp.zeros((2, 3))}, "b": {"w": jnp.zeros((3, 3))}}
  with pytest.raises(ValueError, match="'b' differ"):
    layers.scan_layers(params, ["a", "b"], lambda c, p, k: c, 0.0)
  model = mbt_lib.MBT(modalities=("rgb",), hidden_size=16, num_layers=2, num_heads=2,
                      mlp_dim=32, rgb_patch_size=(2, 4, 4),
                      dropout=layers.Dropout(stochastic_depth=0.1),
                      compute=layers.Compute(scan_layers=True))
  x = {"rgb": jnp.zeros((1, 2, 8, 8, 3))}
  params = jax.eval_shape(functools.partial(model.init, train=False), jax.random.key(0), x)
  # evaluation ignores stochastic depth; training refuses it (both raised while tracing)
  jax.eval_shape(functools.partial(model.apply, train=False), params, x)
  with pytest.raises(ValueError, match="stochastic_depth"):
    jax.eval_shape(lambda p: model.apply(p, x, train=True, rngs={"dropout": jax.random.key(0)}),
                   params)
