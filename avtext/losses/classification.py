"""Classification losses on logits [B, C] and targets [B, C].

Both return a float32 scalar, the mean over the batch of the per-example sum
over classes, and upcast low-precision logits to float32 first.

- `sigmoid_cross_entropy`: multi-label, one independent logistic regression per
  class (the ImageNet-21k / JFT objective ViT checkpoints are pretrained with):
      L = 1/B sum_b sum_c -(y_bc log s(z_bc) + (1 - y_bc) log(1 - s(z_bc)))
- `softmax_cross_entropy`: single-label (rows of y sum to 1, e.g. one-hot):
      L = 1/B sum_b sum_c -y_bc log softmax(z_b)_c
"""
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


LOSSES = {"sigmoid_xent": sigmoid_cross_entropy, "softmax_xent": softmax_cross_entropy}
