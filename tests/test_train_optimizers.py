"""optax from config: schedules, update rules and frozen parameters, by hand."""
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from avtext.train import optimizers


def opt_config(**kw):
  base = dict(name="sgd", momentum=0.9, learning_rate=0.4, schedule="cosine",
              warmup_epochs=1.5, warmup_steps=None, grad_clip_norm=None, frozen=())
  base.update(kw)
  return ml_collections.ConfigDict(base)


def test_cosine_with_epoch_warmup_matches_formula():
  # VideoCC §5.2: cosine schedule with a 1.5-epoch warmup; 10 steps per epoch.
  sched = optimizers.learning_rate_schedule(opt_config(), total_steps=100, steps_per_epoch=10)
  assert float(sched(0)) == 0.0
  assert float(sched(5)) == pytest.approx(0.4 * 5 / 15)
  assert float(sched(15)) == pytest.approx(0.4)
  t = (60 - 15) / (100 - 15)
  assert float(sched(60)) == pytest.approx(0.4 * 0.5 * (1 + math.cos(math.pi * t)), rel=1e-5)
  assert float(sched(100)) == pytest.approx(0.0, abs=1e-7)


def test_constant_schedule_and_bad_names():
  sched = optimizers.learning_rate_schedule(
      opt_config(schedule="constant", warmup_epochs=None, warmup_steps=4), 50, 10)
  assert [float(sched(s)) for s in (0, 2, 4, 40)] == pytest.approx([0.0, 0.2, 0.4, 0.4])
  with pytest.raises(ValueError, match="config.optimizer.schedule='step'"):
    optimizers.learning_rate_schedule(opt_config(schedule="step"), 10, 1)
  with pytest.raises(ValueError, match="config.optimizer.name='lamb'"):
    optimizers.make_optimizer(opt_config(name="lamb"), total_steps=10, steps_per_epoch=1)


def test_sgd_momentum_updates_by_hand():
  config = opt_config(schedule="constant", warmup_epochs=None, learning_rate=0.1)
  tx, _ = optimizers.make_optimizer(config, total_steps=10, steps_per_epoch=1)
  p = {"w": jnp.array([1.0, -2.0])}
  state = tx.init(p)
  g = {"w": jnp.array([0.5, 1.0])}
  u1, state = tx.update(g, state, p)
  u2, state = tx.update(g, state, p)
  # v1 = g, v2 = 0.9 v1 + g; update = -lr v
  np.testing.assert_allclose(u1["w"], -0.1 * np.array([0.5, 1.0]), rtol=1e-6)
  np.testing.assert_allclose(u2["w"], -0.1 * 1.9 * np.array([0.5, 1.0]), rtol=1e-6)


def test_grad_clipping():
  config = opt_config(name="sgd", momentum=0.0, schedule="constant", warmup_epochs=None,
                      learning_rate=1.0, grad_clip_norm=1.0)
  tx, _ = optimizers.make_optimizer(config, total_steps=10, steps_per_epoch=1)
  p = {"w": jnp.zeros(2)}
  u, _ = tx.update({"w": jnp.array([3.0, 4.0])}, tx.init(p), p)
  np.testing.assert_allclose(u["w"], [-0.6, -0.8], rtol=1e-6)


def test_lr_multipliers_scale_adamw_steps_per_path_by_hand():
  """First matching regex wins; the decoupled decay is scaled with the step (per-group lr)."""
  config = opt_config(name="adamw", schedule="constant", warmup_epochs=None,
                      learning_rate=0.1, weight_decay=0.5,
                      lr_multipliers=((r"^video/", 10.0), (r"^video/|^text/", 0.25)))
  tx, _ = optimizers.make_optimizer(config, total_steps=10, steps_per_epoch=1)
  p = {"video": {"w": jnp.array([2.0])}, "text": {"w": jnp.array([2.0])},
       "proj": {"w": jnp.array([2.0])}}
  g = jax.tree.map(lambda x: jnp.array([0.3]), p)
  u, _ = tx.update(g, tx.init(p), p)
  # Adam's first step is lr * g/|g| = lr (bias-corrected, eps ~ 0); decay adds lr * wd * p.
  base = -0.1 * (1.0 + 0.5 * 2.0)
  np.testing.assert_allclose(u["video"]["w"], [10.0 * base], rtol=1e-5)
  np.testing.assert_allclose(u["text"]["w"], [0.25 * base], rtol=1e-5)
  np.testing.assert_allclose(u["proj"]["w"], [base], rtol=1e-5)
  with pytest.raises(ValueError, match="matches no trainable parameter"):
    bad = opt_config(lr_multipliers=((r"^audio/", 2.0),))
    optimizers.make_optimizer(bad, total_steps=10, steps_per_epoch=1)[0].init(p)
  with pytest.raises(ValueError, match="pairs"):
    optimizers.make_optimizer(opt_config(lr_multipliers=((r"^video/",),)), total_steps=10,
                              steps_per_epoch=1)


def test_frozen_parameters_get_no_gradient_no_state_no_update():
  params = {"text": {"encoderblock_0": {"k": jnp.ones(3)}, "encoderblock_1": {"k": jnp.ones(3)}},
            "video": {"k": jnp.ones(2)}}
  mask = optimizers.frozen_mask(params, (r"^text/encoderblock_0/",))
  assert mask == {"text": {"encoderblock_0": {"k": True}, "encoderblock_1": {"k": False}},
                  "video": {"k": False}}
  trainable, frozen = optimizers.split_frozen(params, mask)
  assert trainable["text"]["encoderblock_0"]["k"] is None
  assert frozen["video"]["k"] is None
  merged = optimizers.merge_frozen(trainable, frozen)
  assert jax.tree.structure(merged) == jax.tree.structure(params)

  tx = optax.adamw(0.1, weight_decay=0.5)
  state = tx.init(trainable)
  assert len(jax.tree.leaves(state)) == 1 + 2 * 2  # count + mu, nu of the 2 trainable leaves

  calls = []

  def loss(tr, fr):
    p = optimizers.merge_frozen(tr, fr)
    calls.append(1)
    return sum(jnp.sum(x ** 2) for x in jax.tree.leaves(p))

  grads = jax.grad(loss)(trainable, frozen)
  assert grads["text"]["encoderblock_0"]["k"] is None
  updates, _ = tx.update(grads, state, trainable)
  new = optimizers.merge_frozen(optax.apply_updates(trainable, updates), frozen)
  np.testing.assert_array_equal(new["text"]["encoderblock_0"]["k"], jnp.ones(3))
  assert float(new["video"]["k"][0]) < 1.0
  with pytest.raises(ValueError, match="'nomatch' matches no parameter"):
    optimizers.frozen_mask(params, ("nomatch",))


def test_frozen_layers_cost_no_backward_pass():
  """Differentiating only trainable leaves drops the frozen branch from the gradient graph."""
  w_frozen, w_top = jnp.ones((64, 64)), jnp.ones((64, 1))

  def f(top, frozen, x):
    return jnp.sum(jnp.tanh(x @ frozen) @ top)

  x = jnp.ones((8, 64))
  jaxpr = jax.make_jaxpr(jax.grad(f))(w_top, w_frozen, x)
  both = jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(w_top, w_frozen, x)
  count = lambda j: sum(e.primitive.name == "dot_general" for e in j.jaxpr.eqns)
  assert count(jaxpr) < count(both)


def test_coupled_weight_decay_matches_torch_adam_by_hand():
  """Adam's weight_decay is L2 on the gradient (torch.optim.Adam): g' = g + wd * p.

  Two steps worked by hand: step 1 moves every coordinate by lr (m/sqrt(v) = 1 after
  bias correction); step 2 uses the new parameter in g'.
  """
  lr, wd, b1, b2 = 0.1, 0.5, 0.9, 0.999
  config = opt_config(name="adam", schedule="constant", warmup_epochs=None,
                      learning_rate=lr, weight_decay=wd)
  tx, _ = optimizers.make_optimizer(config, total_steps=10, steps_per_epoch=1)
  p = {"w": jnp.array([2.0])}
  g = {"w": jnp.array([0.3])}
  state = tx.init(p)
  u, state = tx.update(g, state, p)
  np.testing.assert_allclose(u["w"], [-lr], rtol=1e-5)
  p1 = 2.0 - lr
  p = {"w": jnp.array([p1])}
  u, state = tx.update(g, state, p)
  g1, g2 = 0.3 + wd * 2.0, 0.3 + wd * p1
  m = ((1 - b1) * b1 * g1 + (1 - b1) * g2) / (1 - b1 ** 2)
  v = ((1 - b2) * b2 * g1 ** 2 + (1 - b2) * g2 ** 2) / (1 - b2 ** 2)
  # float32 moments: ~1e-5 relative; without the decay the step would be -0.1 (1e-3 away).
  np.testing.assert_allclose(u["w"], [-lr * m / (np.sqrt(v) + 1e-8)], rtol=5e-5)
