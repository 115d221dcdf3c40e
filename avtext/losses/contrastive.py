"""Contrastive losses on in-batch similarity matrices.

Every loss takes `sim  # [B, B]` with sim[i, j] = S(x_i, y_j) and the positive
pairs on the diagonal (sim[i, i] = S(x_i, y_i)); all other entries of a row or
column are that anchor's in-batch negatives. Rows are the anchors of the
direction L_xy (fix x_i, rank every y_j), columns the anchors of L_yx. With
S-MiT's naming and sim = S(video, caption), rows give L_vc and columns L_cv.

Each loss returns a float32 scalar: the sum over both directions of the mean
over anchors (S-MiT sec. 2.3.1, L = L_vc + L_cv), except `max_margin_ranking`,
which keeps COOT's own normalisation. The functions are pure jnp, jit-able, and
take a similarity matrix that may already be gathered (and sharded) across
devices; low-precision inputs (bfloat16, float16) are upcast to float32 first,
because bfloat16's ~3 significant digits are too coarse for a log-sum-exp over
thousands of logits scaled by 1 / 0.05.
"""
import math
from typing import Union

import jax
import jax.numpy as jnp

Scalar = Union[float, jax.Array]


def _prepare(sim: jax.Array, name: str, *, min_batch: int = 1) -> jax.Array:
  """Checks that `sim` is a square [B, B] matrix and upcasts it to >= float32."""
  sim = jnp.asarray(sim)
  if sim.ndim != 2 or sim.shape[0] != sim.shape[1]:
    raise ValueError(
        f"{name}: expected a square similarity matrix [B, B] with positives on"
        f" the diagonal, got shape {sim.shape}")
  if sim.shape[0] < min_batch:
    raise ValueError(
        f"{name}: needs a batch of at least {min_batch} pairs (every anchor"
        f" needs an in-batch negative), got B={sim.shape[0]}")
  return sim.astype(jnp.promote_types(sim.dtype, jnp.float32))


def _check_temperature(temperature: Scalar, name: str) -> None:
  # A traced temperature (e.g. a learned one) cannot be checked here.
  if isinstance(temperature, (int, float)) and temperature <= 0:
    raise ValueError(f"{name}: temperature must be > 0, got {temperature}")


def _xent_both_directions(logits: jax.Array, denominator: jax.Array) -> jax.Array:
  """Mean over anchors of logsumexp(denominator) - positive logit, rows + columns."""
  pos = jnp.diagonal(logits)
  loss_rows = jnp.mean(jax.nn.logsumexp(denominator, axis=1) - pos)
  loss_cols = jnp.mean(jax.nn.logsumexp(denominator, axis=0) - pos)
  return loss_rows + loss_cols


def _margin_softmax_both_directions(
    sim: jax.Array, margin_rows: jax.Array, margin_cols: jax.Array,
    temperature: Scalar) -> jax.Array:
  """S-MiT eq. 2 per direction, with a margin per anchor (shape [B] or [])."""
  batch = sim.shape[0]
  eye = jnp.eye(batch, dtype=bool)
  pos = jnp.diagonal(sim)

  def one_direction(sim_anchor_rows, margin):
    # Row i of `sim_anchor_rows` is anchor i: its positive gets the margin,
    # its negatives are left as they are.
    logits = jnp.where(eye, (pos - margin)[:, None], sim_anchor_rows)
    logits = logits / temperature
    return jnp.mean(jax.nn.logsumexp(logits, axis=1) - jnp.diagonal(logits))

  margin_rows = jnp.broadcast_to(margin_rows, (batch,))
  margin_cols = jnp.broadcast_to(margin_cols, (batch,))
  return one_direction(sim, margin_rows) + one_direction(sim.T, margin_cols)


def nce(sim: jax.Array, *, temperature: Scalar = 1.0,
        include_positive: bool = True) -> jax.Array:
  """Noise-contrastive (softmax cross-entropy) loss, summed over both directions.

  With logits s_ij = S(x_i, y_j) / temperature, each direction is

    L_xy = -1/B sum_i log( e^{s_ii} / sum_j D_ij e^{s_ij} )

  and the loss is L_xy + L_yx (columns as anchors for L_yx).

  include_positive=True: D_ij = 1, the standard InfoNCE; VideoCC sec. 4.1 uses
  it with sigma = 0.05, i.e. `temperature=0.05`.
  include_positive=False: D_ij = I_{i != j}, S-MiT eq. 1, where the denominator
  holds only the negatives (the loss can then be negative).

  Args:
    sim: [B, B] similarities, positives on the diagonal.
    temperature: sigma in VideoCC; logits are sim / temperature.
    include_positive: whether the positive pair is in the denominator.

  Returns:
    Scalar float32 loss.
  """
  _check_temperature(temperature, "nce")
  sim = _prepare(sim, "nce", min_batch=1 if include_positive else 2)
  logits = sim / temperature
  if include_positive:
    return _xent_both_directions(logits, logits)
  # S-MiT eq. 1: the indicator I_{i != j} drops the positive from the sum.
  negatives = jnp.where(jnp.eye(sim.shape[0], dtype=bool), -jnp.inf, logits)
  return _xent_both_directions(logits, negatives)


def mms(sim: jax.Array, *, margin: Scalar,
        temperature: Scalar = 1.0) -> jax.Array:
  """Masked margin softmax loss (MMS), S-MiT eq. 2, summed over both directions.

    L_xy = -1/B sum_i log( e^{S_ii - M} / (e^{S_ii - M} + sum_j I_{i!=j} e^{S_ij}) )

  The margin M is in similarity units and is subtracted before the division by
  `temperature` (S-MiT uses temperature 1). Schedule for M: `mms_margin`.

  Args:
    sim: [B, B] similarities, positives on the diagonal.
    margin: M, a scalar (may be a traced value from `mms_margin(step)`).
    temperature: logits are (S - M * I) / temperature.

  Returns:
    Scalar float32 loss.
  """
  _check_temperature(temperature, "mms")
  sim = _prepare(sim, "mms")
  margin = jnp.asarray(margin, sim.dtype)
  return _margin_softmax_both_directions(sim, margin, margin, temperature)


def mms_margin(step: Union[int, jax.Array], initial: float = 0.001,
               growth: float = 1.002, every: int = 1000) -> jax.Array:
  """MMS margin schedule (S-MiT sec. 2.3.1, after eq. 2).

  "M starts as 0.001 and is exponentially increased by a factor of 1.002 every
  1000 training steps": M(step) = initial * growth ** floor(step / every), a
  staircase, so M(999) = 0.001 and M(1000) = 0.001002.

  Args:
    step: global training step (>= 0), Python int or traced integer.
    initial: M at step 0.
    growth: factor applied once per `every` steps.
    every: number of steps between two increases.

  Returns:
    float32 scalar margin.
  """
  if every <= 0:
    raise ValueError(f"mms_margin: every must be a positive step count, got {every}")
  increases = jnp.floor_divide(jnp.asarray(step, jnp.int32), every)
  # exp(n log g) with log g taken in float64: float32(1.002) ** n would carry
  # float32(1.002)'s rounding error n times.
  log_growth = jnp.float32(math.log(growth))
  return jnp.float32(initial) * jnp.exp(increases.astype(jnp.float32) * log_growth)


def amm(sim: jax.Array, *, alpha: Scalar = 0.5, temperature: Scalar = 1.0,
        stop_gradient_margin: bool = False) -> jax.Array:
  """Adaptive mean margin loss (AMM), S-MiT eq. 2 with the margin of eq. 3.

  For each anchor, the margin is alpha times the gap between its positive and
  the mean of its B - 1 negatives (S-MiT eq. 3):

    M_xy(i) = alpha * ( S_ii - 1/(B-1) sum_j I_{i!=j} S_ij )

  computed over row i for L_xy and over column i for L_yx, then plugged into
  eq. 2 (see `mms`). alpha = 0.5 in S-MiT; alpha = 0 is MMS with M = 0, i.e.
  standard InfoNCE; alpha = 1 replaces the positive's logit by the mean
  negative similarity.

  Args:
    sim: [B, B] similarities, positives on the diagonal; B >= 2.
    alpha: dampening factor of eq. 3.
    temperature: logits are (S - M * I) / temperature (S-MiT: 1).
    stop_gradient_margin: if True the margin is treated as a constant in the
      backward pass; S-MiT does not say, so the default lets gradients flow
      through it as eq. 3 is written.

  Returns:
    Scalar float32 loss.
  """
  _check_temperature(temperature, "amm")
  sim = _prepare(sim, "amm", min_batch=2)
  batch = sim.shape[0]
  pos = jnp.diagonal(sim)
  mean_neg_rows = (jnp.sum(sim, axis=1) - pos) / (batch - 1)
  mean_neg_cols = (jnp.sum(sim, axis=0) - pos) / (batch - 1)
  margin_rows = alpha * (pos - mean_neg_rows)
  margin_cols = alpha * (pos - mean_neg_cols)
  if stop_gradient_margin:
    margin_rows = jax.lax.stop_gradient(margin_rows)
    margin_cols = jax.lax.stop_gradient(margin_cols)
  return _margin_softmax_both_directions(sim, margin_rows, margin_cols,
                                         temperature)


def _semi_hard_one_direction(sim: jax.Array, margin: Scalar) -> jax.Array:
  """Mean hinge over row anchors with the semi-hard negative of each row."""
  negative = ~jnp.eye(sim.shape[0], dtype=bool)
  pos = jnp.diagonal(sim)[:, None]
  semi_hard = negative & (sim < pos)
  hardest_semi = jnp.max(jnp.where(semi_hard, sim, -jnp.inf), axis=1)
  easiest = jnp.min(jnp.where(negative, sim, jnp.inf), axis=1)
  s_neg = jnp.where(jnp.any(semi_hard, axis=1), hardest_semi, easiest)
  return jnp.mean(jax.nn.relu(s_neg - pos[:, 0] + margin))


def semi_hard_triplet(sim: jax.Array, *, margin: Scalar = 1.0) -> jax.Array:
  """Triplet loss with semi-hard negative mining (SHN), S-MiT's baseline.

  S-MiT sec. 2.3.1: L_xy = max(S(x_i, y_j) - S(x_i, y_i) + M, 0) with M = 1,
  where y_j is a semi-hard negative: per anchor, the most similar negative
  among those strictly less similar than the positive (FaceNet's semi-hard
  choice). If an anchor has no such negative, the least similar negative is
  used (as in TF-Addons' triplet_semihard_loss). Mean over anchors, both
  directions summed. The selection is discrete, so gradients flow only
  through the chosen negative and the positive.

  Args:
    sim: [B, B] similarities, positives on the diagonal; B >= 2.
    margin: M.

  Returns:
    Scalar float32 loss.
  """
  sim = _prepare(sim, "semi_hard_triplet", min_batch=2)
  return (_semi_hard_one_direction(sim, margin)
          + _semi_hard_one_direction(sim.T, margin))


def max_margin_ranking(sim: jax.Array, *, margin: Scalar = 0.2,
                       max_violation: bool = False) -> jax.Array:
  """Bidirectional max-margin ranking loss, COOT eq. 1 over in-batch negatives.

  COOT eq. 1, L = max(0, a + D(x, y) - D(x', y)) + max(0, a + D(x, y) - D(x, y'))
  with D = 1 - S, applied to every negative of every anchor:

    cost_xy[i, j] = max(0, a + S_ij - S_ii),  cost_yx[i, j] = max(0, a + S_ij - S_jj)

  for i != j (row i and column j are the anchors). As in the official COOT
  ContrastiveLoss(norm=True), the result is
  (sum cost_xy + sum cost_yx) / B^2. With max_violation=True only the largest
  cost per anchor is kept (VSE++'s hardest negative) and, matching COOT, the
  sum is still divided by B^2 (not B), so it is 1/B of a mean over anchors.

  Args:
    sim: [B, B] similarities (cosine in COOT), positives on the diagonal.
    margin: a (COOT: 0.2).
    max_violation: keep only the hardest negative per anchor.

  Returns:
    Scalar float32 loss.
  """
  sim = _prepare(sim, "max_margin_ranking")
  batch = sim.shape[0]
  eye = jnp.eye(batch, dtype=bool)
  pos = jnp.diagonal(sim)
  cost_rows = jnp.where(eye, 0.0, jax.nn.relu(margin + sim - pos[:, None]))
  cost_cols = jnp.where(eye, 0.0, jax.nn.relu(margin + sim - pos[None, :]))
  if max_violation:
    cost_rows = jnp.max(cost_rows, axis=1)
    cost_cols = jnp.max(cost_cols, axis=0)
  return (jnp.sum(cost_rows) + jnp.sum(cost_cols)) / (batch * batch)


# ---------------------------------------------------------------- by config name
# S-MiT sec. 2.3.1's losses as `config.loss.name` selects them (configs/smit_*.py):
# (sim [B_caption, B_video], config.loss, step) -> scalar, with logits S / loss.temperature
# (1.0: the paper's dot product). Its "nce" is eq. 1, the positive left out of the
# denominator; VideoCC's InfoNCE (positive included) is `nce(sim, temperature=sigma)`.


def _amm_of_config(sim, cfg, step):
  del step
  return amm(sim, alpha=cfg.get("alpha", 0.5), temperature=cfg.get("temperature", 1.0))


def _mms_of_config(sim, cfg, step):
  margin = mms_margin(step, initial=cfg.get("margin_initial", 0.001),
                      growth=cfg.get("margin_growth", 1.002), every=cfg.get("margin_every", 1000))
  return mms(sim, margin=margin, temperature=cfg.get("temperature", 1.0))


def _nce_of_config(sim, cfg, step):
  del step
  return nce(sim, temperature=cfg.get("temperature", 1.0), include_positive=False)


def _semi_hard_triplet_of_config(sim, cfg, step):
  del step
  return semi_hard_triplet(sim, margin=cfg.get("margin", 1.0))


SMIT_LOSSES = {"amm": _amm_of_config, "mms": _mms_of_config, "nce": _nce_of_config,
               "semi_hard_triplet": _semi_hard_triplet_of_config}


def get_smit_loss(name: str):
  """`SMIT_LOSSES[name]`; `name` is `config.loss.name`."""
  if name not in SMIT_LOSSES:
    raise ValueError(f"config.loss.name={name!r}; expected one of {tuple(SMIT_LOSSES)}")
  return SMIT_LOSSES[name]


def smit_loss(sim: jax.Array, cfg, step) -> jax.Array:
  """The S-MiT loss `cfg.name` names of `sim` [B_caption, B_video] (`cfg`: config.loss)."""
  return get_smit_loss(cfg.name)(sim, cfg, step)
