"""Task heads on top of encoders."""
import flax.linen as nn
import jax


class VideoClassifier(nn.Module):
  """Linear classifier on a video encoder's pooled embedding.

  `video` is any module returning {'embedding': [B, d]} (MBT). The head is
  zero-initialized, as ViT/MBT heads are, so training starts from uniform
  predictions; its parameters live under 'head', the encoder's under 'video',
  which is what `config.init_from` hands to a downstream task.
  """
  video: nn.Module
  num_classes: int

  @nn.compact
  def __call__(self, inputs: dict[str, jax.Array], *, train: bool = False) -> jax.Array:
    embedding = self.video(inputs, train=train)["embedding"]
    return nn.Dense(self.num_classes, name="head")(embedding)
