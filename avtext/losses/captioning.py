"""Caption losses on teacher-forced logits [B, L, V], targets and mask [B, L].

`LOSSES` maps `config.loss.name` to `(logits, targets, mask, label_smoothing) ->
(loss, metrics)` (metrics: `token_accuracy` %, and `loss_per_word` where the loss is
a sum):

  "nll": the negative log-likelihood of the caption's tokens and EOS (VideoCC §4.2:
    "We minimise the negative log-likelihood of generating the ground-truth
    caption"), averaged over the batch's real target tokens; `label_smoothing`
    (0 for VideoCC) mixes the one-hot target with the uniform distribution, eps/V on
    every word (`sequence_nll`). The VideoCC captioner's loss, and MMT's with
    configs/mmt_tvc.py:mean_nll.
  "kl_sum" (MMT's default): the official TVCaption LabelSmoothingLoss
    (`tvc_label_smoothing_loss`): KL(q || p) with q = 1 - eps on the target word and
    eps / (V - 1) on each of the V - 1 others, SUMMED over the batch's real target
    tokens, as the official train.py optimizes it (its logged loss and perplexity
    are per word: the metric `loss_per_word`). With label_smoothing 0 the official
    code uses nn.CrossEntropyLoss, the mean over the real tokens, and so does this.
    Why ours ("nll") is kept: a mean does not scale the gradient with the batch's
    word count, so the learning rate and the gradient-clip norm (1.0) mean the same
    at any batch size; with the sum the official clip is active on nearly every
    step at batch 128.

Both upcast the logits to float32 first.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax


def sequence_nll(logits: jax.Array, targets: jax.Array, mask: jax.Array,
                 label_smoothing: float = 0.0) -> tuple[jax.Array, jax.Array]:
  """(mean NLL over the real target tokens, token accuracy %): [B, L, V], [B, L], [B, L]."""
  v = logits.shape[-1]
  labels = optax.smooth_labels(jax.nn.one_hot(targets, v), label_smoothing) \
      if label_smoothing else jax.nn.one_hot(targets, v)
  per_token = optax.softmax_cross_entropy(logits.astype(jnp.float32), labels)
  mask = mask.astype(jnp.float32)
  count = jnp.maximum(jnp.sum(mask), 1.0)
  hits = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
  return jnp.sum(per_token * mask) / count, 100.0 * jnp.sum(hits * mask) / count


def tvc_label_smoothing_loss(logits: jax.Array, targets: jax.Array, mask: jax.Array,
                             label_smoothing: float) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The official TVCaption caption loss (module docstring, "kl_sum"; TVR app. D.2).

  Args:
    logits: [B, L, V]; targets, mask: [B, L] (mask nonzero for real target tokens,
      the official labels other than -1).
    label_smoothing: eps in [0, 1].

  Returns:
    (loss, loss per real token, token accuracy %): with eps > 0 the loss is
    sum over real tokens of KL(q || softmax(logits)), q = 1 - eps on the target and
    eps / (V - 1) elsewhere (torch's F.kl_div(log_softmax, q, reduction="sum"), the
    entropy term of q included); with eps = 0 the mean cross-entropy
    (nn.CrossEntropyLoss(ignore_index=-1)).
  """
  if not 0.0 <= label_smoothing <= 1.0:
    raise ValueError(f"config.loss.label_smoothing={label_smoothing}; expected 0 <= eps <= 1")
  v = logits.shape[-1]
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  target_logp = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  mask = mask.astype(jnp.float32)
  count = jnp.maximum(jnp.sum(mask), 1.0)
  hits = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
  accuracy = 100.0 * jnp.sum(hits * mask) / count
  if not label_smoothing:
    loss = -jnp.sum(target_logp * mask) / count
    return loss, loss, accuracy
  eps = float(label_smoothing)
  other = eps / (v - 1)
  conf = 1.0 - eps
  # sum_w q_w log q_w (0 log 0 = 0, as torch's kl_div), then the cross term.
  entropy = (conf * np.log(conf) if conf > 0 else 0.0) + eps * np.log(other)
  cross = conf * target_logp + other * (jnp.sum(logp, -1) - target_logp)
  loss = jnp.sum((entropy - cross) * mask)
  return loss, loss / count, accuracy


def nll(logits, targets, mask, label_smoothing: float = 0.0) -> tuple[jax.Array, dict]:
  """`sequence_nll` as a `LOSSES` entry."""
  loss, accuracy = sequence_nll(logits, targets, mask, label_smoothing)
  return loss, {"token_accuracy": accuracy}


def kl_sum(logits, targets, mask, label_smoothing: float = 0.0) -> tuple[jax.Array, dict]:
  """`tvc_label_smoothing_loss` as a `LOSSES` entry."""
  loss, per_word, accuracy = tvc_label_smoothing_loss(logits, targets, mask, label_smoothing)
  return loss, {"token_accuracy": accuracy, "loss_per_word": per_word}


LOSSES = {"nll": nll, "kl_sum": kl_sum}


def get(name: str):
  """`LOSSES[name]`; `name` is `config.loss.name`."""
  if name not in LOSSES:
    raise ValueError(f"config.loss.name={name!r}; captioning expects one of {sorted(LOSSES)} "
                     "(avtext/losses/captioning.py)")
  return LOSSES[name]
