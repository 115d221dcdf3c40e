"""Classification losses on logits [B, C] and targets [B, C].

Both return a float32 scalar, the mean over the batch of the per-example sum
over classes, and upcast low-precision logits to float32 first.

- `sigmoid_cross_entropy`: multi-label, one independent logistic regression per
  class (the ImageNet-21k / JFT objective ViT checkpoints are pretrained with):
      L = 1/B sum_b sum_c -(y_bc log s(z_bc) + (1 - y_bc) log(1 - s(z_bc)))
- `softmax_cross_entropy`: single-label (rows of y sum to 1, e.g. one-hot):
      L = 1/B sum_b sum_c -y_bc log softmax(z_b)_c
- `group_softmax_cross_entropy`: classes partitioned into groups (attributes, e.g. the
  synthetic world's shape / colour / motion ...), one softmax per group over its classes,
  the targets of a group its positives in equal parts, a weight w_g per group and an
  optional focal factor (Lin et al. 2017) that shifts the loss to what is not learned yet:
      L = 1/B sum_b sum_g w_g sum_{c in g} -t_bc (1 - p_bc)^gamma log p_bc,
      p_b = softmax over g of z_b,   t_bc = y_bc / max(1, sum_{c' in g} y_bc')
  A group with no positive in an example adds nothing for it.
"""
from typing import Sequence

import jax
import jax.numpy as jnp


def _prepare(logits: jax.Array, labels: jax.Array, name: str) -> tuple[jax.Array, jax.Array]:
  if logits.ndim != 2 or logits.shape != labels.shape:
    raise ValueError(f"{name}: logits and labels must both be [B, C], got {logits.shape} and "
                     f"{labels.shape}")
  return logits.astype(jnp.float32), labels.astype(jnp.float32)


def sigmoid_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Multi-label logistic loss; labels in [0, 1] (multi-hot)."""
  logits, labels = _prepare(logits, labels, "sigmoid_cross_entropy")
  # -log s(z) = softplus(-z), -log(1 - s(z)) = softplus(z): stable for large |z|.
  per_class = labels * jax.nn.softplus(-logits) + (1.0 - labels) * jax.nn.softplus(logits)
  return jnp.mean(jnp.sum(per_class, axis=-1))


def softmax_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Single-label cross-entropy; each row of labels is a distribution (e.g. one-hot)."""
  logits, labels = _prepare(logits, labels, "softmax_cross_entropy")
  return jnp.mean(-jnp.sum(labels * jax.nn.log_softmax(logits, axis=-1), axis=-1))


def group_softmax_cross_entropy(logits: jax.Array, labels: jax.Array, *,
                                groups: Sequence[Sequence[int]],
                                weights: Sequence[float] | None = None,
                                focal_gamma: float = 0.0) -> jax.Array:
  """One softmax cross-entropy per group of classes, weighted, optionally focal.

  groups: the class indices of each group (disjoint; classes in no group are ignored).
  weights: w_g per group (default 1); focal_gamma: 0 is plain cross-entropy.
  """
  logits, labels = _prepare(logits, labels, "group_softmax_cross_entropy")
  weights = [1.0] * len(groups) if weights is None else list(weights)
  if len(weights) != len(groups):
    raise ValueError(f"group_softmax_cross_entropy: {len(groups)} groups but "
                     f"{len(weights)} weights")
  total = jnp.zeros(logits.shape[:1], jnp.float32)
  for cols, weight in zip(groups, weights):
    if not weight:
      continue
    cols = jnp.asarray(cols)
    y = labels[:, cols]
    target = y / jnp.maximum(jnp.sum(y, axis=-1, keepdims=True), 1.0)
    log_p = jax.nn.log_softmax(logits[:, cols], axis=-1)
    if focal_gamma:
      log_p = log_p * (1.0 - jnp.exp(log_p)) ** focal_gamma
    total = total - weight * jnp.sum(target * log_p, axis=-1)
  return jnp.mean(total)


LOSSES = {"sigmoid_xent": sigmoid_cross_entropy, "softmax_xent": softmax_cross_entropy,
          "group_softmax_xent": group_softmax_cross_entropy}
