"""Dual encoder: a video tower and a text tower projected into one space.

VideoCC §4.1 (AVR): "Both text and video encodings are then projected to a
common dimension D = 256 via a single linear layer each. We then compute the
dot product similarity between the two projected embeddings after
normalisation." The towers are any modules returning {'embedding': [B, d]}
(video: MBT) and {'cls': [B, d]} (text: BERT, called with cls_only=True: the
embedding reads [CLS] alone, so its last layer computes that position only).
"""
import flax.linen as nn
import jax

from avtext.models import model_registry
from avtext.ops import l2_normalize


class DualEncoder(nn.Module):
  """Joint embedding of videos and captions (VideoCC §4.1)."""
  video: nn.Module
  text: nn.Module
  embed_dim: int = 256  # D, VideoCC §5.2

  def setup(self):
    self.video_projection = nn.Dense(self.embed_dim, name="video_projection")
    self.text_projection = nn.Dense(self.embed_dim, name="text_projection")

  def encode_video(self, inputs: dict[str, jax.Array], *, train: bool = False) -> jax.Array:
    """[B, D] unit-norm video embeddings (mean of the modalities' [CLS])."""
    return l2_normalize(self.video_projection(self.video(inputs, train=train)["embedding"]))

  def encode_text(self, input_ids: jax.Array, attention_mask: jax.Array, *,
                  train: bool = False) -> jax.Array:
    """[B, D] unit-norm caption embeddings (BERT's final-layer [CLS])."""
    out = self.text(input_ids, attention_mask, train=train, cls_only=True)
    return l2_normalize(self.text_projection(out["cls"]))

  def __call__(self, video_inputs, input_ids, attention_mask, *, train: bool = False):
    return (self.encode_video(video_inputs, train=train),
            self.encode_text(input_ids, attention_mask, train=train))


@model_registry.register_model("dual_encoder")
def dual_encoder_from_config(cfg) -> DualEncoder:
  """`config.model` with `video` and `text` sub-nodes, each naming its model."""
  return DualEncoder(
      video=model_registry.build_model(cfg.video, where="config.model.video", parent=cfg),
      text=model_registry.build_model(cfg.text, where="config.model.text", parent=cfg),
      embed_dim=cfg.embed_dim)
