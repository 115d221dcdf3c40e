"""Task heads on top of encoders.

`dtype` (from `config.model.dtype`, `avtext.models.layers.Compute`) is the computation
dtype of the heads' Dense layers; parameters stay float32 and the heads return float32
(logits for the losses, normalized embeddings).
"""
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from avtext.models import model_registry


class VideoClassifier(nn.Module):
  """Linear classifier on a video encoder's pooled embedding.

  `video` is any module returning {'embedding': [B, d]} (MBT). Its parameters
  live under 'video' and the head's under 'head', so `config.init_from` can
  hand the encoder to a downstream task. The head has flax's default (LeCun
  normal) init, not the zero init ViT uses when fine-tuning a pretrained
  encoder: training the demo's RGB tower from scratch with a zero head left
  motion at chance after 300 steps (loss 9.7 vs 7.1, see BENCHMARKS.md).
  """
  video: nn.Module
  num_classes: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, inputs: dict[str, jax.Array], *, train: bool = False) -> jax.Array:
    """float32 logits [B, num_classes]."""
    embedding = self.video(inputs, train=train)["embedding"]
    return nn.Dense(self.num_classes, dtype=self.dtype, name="head")(
        embedding).astype(jnp.float32)


@model_registry.register_model("video_classifier")
def video_classifier_from_config(cfg) -> VideoClassifier:
  """`config.model` with a `video` sub-node (which inherits dtype / remat / attention)
  and `num_classes`."""
  if not cfg.get("num_classes"):
    raise ValueError("config.model.num_classes must be set for the video_classifier")
  return VideoClassifier(
      video=model_registry.build_model(cfg.video, where="config.model.video", parent=cfg),
      num_classes=cfg.num_classes, dtype=model_registry.compute_from_config(cfg).dtype)


class GatedEmbedding(nn.Module):
  """S-MiT's projection head (Monfort et al. 2021, sec. 4): "two linear layers followed
  by gated linear units", read as the gated embedding unit of the AVLnet / Miech et
  al. line of work S-MiT builds on:

    h = W1 x + b1,    y = h * sigmoid(W2 h + b2)    (GLU of h with the gate W2 h + b2)

  then, with `normalize`, y / |y| (dot products become cosines, as in AVLnet; the paper
  only says "dot product", so this is the configurable choice). One module serves the
  video, language-caption and spoken-caption models. The two Dense layers compute in
  `dtype`; the output (and the normalization) is float32.
  """
  features: int = 4096
  normalize: bool = True
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    h = nn.Dense(self.features, dtype=self.dtype, name="linear1")(x)
    y = h * jax.nn.sigmoid(nn.Dense(self.features, dtype=self.dtype, name="linear2")(h))
    y = y.astype(jnp.float32)
    if self.normalize:
      y = y * jax.lax.rsqrt(jnp.maximum(jnp.sum(y * y, -1, keepdims=True), 1e-12))
    return y
