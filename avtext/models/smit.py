"""Spoken Moments (S-MiT, Monfort et al. 2021): video, language-caption and spoken-caption
models, each ending in the shared projection head (`heads.GatedEmbedding`).

Video model (sec. 4.1): an image backbone over a few frames (paper: ResNet-152 on 3
frames at 1 fps) and a temporal backbone (paper: TSM-R50 on 8 frames, ~3 fps), each
max-pooled over time to a vector, concatenated, then the head. A backbone is any
avtext vision model named in config that returns {'embedding'}: "frames" mode runs
it on each frame ([B*T, H, W, 3], e.g. `resnet`) and max-pools; "clip" mode runs it
on the whole clip ({'rgb': [B, T, H, W, 3]}, e.g. the `mbt` RGB tower), whose
embedding already pools time. `train_backbones=False` (phase 1) runs them in eval
mode under stop_gradient, so BatchNorm statistics stay as loaded.

Spoken caption model (sec. 4.2.2): a speech encoder (`resnet` with in_channels=1 over
[B, T, 40, 1], or `resdavenet` over [B, T, 40]) on the log-mel spectrogram, then the
head; trained from scratch in both phases.

Language caption model (sec. 4.2.1): a frozen pretrained text encoder runs over
the whole ASR transcript; its token outputs are pooled into words (the mean of
a word's WordPieces: `word_features`), and the caption is the mean of

  - in training, 10 words sampled per caption *after* the encoder, without
    replacement when the caption has at least 10 words and with replacement
    when it has fewer ("words [may] be sampled multiple times"): `sample_words`;
  - at test time, all of its words.

Every function is pure and jittable; shapes are static (W = the most words a
caption can have, at most the token count).
"""
import flax.linen as nn
import jax
import jax.numpy as jnp

from avtext.models import heads
from avtext.models import registry

NUM_SAMPLED_WORDS = 10


def word_features(tokens: jax.Array, word_index: jax.Array, num_words: int
                  ) -> tuple[jax.Array, jax.Array]:
  """(words [B, W, D], word_mask [B, W]): the mean of each word's token features.

  Args:
    tokens: [B, T, D] the encoder's token outputs.
    word_index: int [B, T], each token's word number (0..W-1), -1 for special tokens
      and padding (`preprocessing.Tokenizer(..., with_words=True)`).
    num_words: W; words numbered W or more are dropped.
  """
  onehot = (word_index[..., None] == jnp.arange(num_words)).astype(tokens.dtype)  # [B, T, W]
  counts = onehot.sum(axis=1)  # [B, W]
  sums = jnp.einsum("btw,btd->bwd", onehot, tokens)
  return sums / jnp.maximum(counts, 1.0)[..., None], counts > 0


def sample_words(rng: jax.Array, word_mask: jax.Array, num: int = NUM_SAMPLED_WORDS
                 ) -> jax.Array:
  """int [B, num] word positions per caption: `num` distinct real words where the caption
  has at least `num`, else `num` draws with replacement from its words (uniform). A
  caption without words gets position 0 (masked by `pool_words`)."""
  n = word_mask.sum(axis=-1, keepdims=True)
  k_perm, k_draw = jax.random.split(rng)
  logits = jnp.where(word_mask, 0.0, -jnp.inf)
  logits = jnp.where(n > 0, logits, 0.0)  # no words: any position, masked later
  with_replacement = jax.random.categorical(k_draw, logits[:, None, :],
                                            shape=(word_mask.shape[0], num))
  if word_mask.shape[-1] < num:  # no caption can have `num` words
    return with_replacement
  keys = jnp.where(word_mask, jax.random.uniform(k_perm, word_mask.shape), -1.0)
  without = jax.lax.top_k(keys, num)[1]  # a uniform random subset, in random order
  return jnp.where(n >= num, without, with_replacement)


def pool_words(words: jax.Array, word_mask: jax.Array, positions: jax.Array | None = None
               ) -> jax.Array:
  """[B, D] caption vectors: the mean of the words at `positions` [B, K] (repeats count
  as often as drawn), or of all real words when `positions` is None. Captions without
  words give 0."""
  if positions is None:
    w = word_mask.astype(words.dtype)
  else:
    w = jax.vmap(lambda p, m: jnp.zeros(m.shape, words.dtype).at[p].add(1.0) * m)(
        positions, word_mask.astype(words.dtype))
  return jnp.einsum("bw,bwd->bd", w, words) / jnp.maximum(w.sum(-1, keepdims=True), 1.0)


class VideoModel(nn.Module):
  """S-MiT's video model (module docstring); `__call__(inputs)` -> [B, features]."""
  image: nn.Module | None
  temporal: nn.Module | None
  head: nn.Module
  image_mode: str = "frames"
  temporal_mode: str = "clip"
  train_backbones: bool = True

  def _backbone(self, module, mode, frames, train):
    train = train and self.train_backbones
    if mode == "frames":
      b, t = frames.shape[:2]
      emb = module(frames.reshape((b * t,) + frames.shape[2:]), train=train)["embedding"]
      emb = emb.reshape(b, t, -1).max(axis=1)
    elif mode == "clip":
      emb = module({"rgb": frames}, train=train)["embedding"]
    else:
      raise ValueError(f"VideoModel: backbone mode must be 'frames' or 'clip', got {mode!r}")
    return emb if self.train_backbones else jax.lax.stop_gradient(emb)

  def __call__(self, inputs: dict[str, jax.Array], *, train: bool = False) -> jax.Array:
    parts = []
    if self.image is not None:
      parts.append(self._backbone(self.image, self.image_mode, inputs["image_frames"], train))
    if self.temporal is not None:
      parts.append(self._backbone(self.temporal, self.temporal_mode,
                                  inputs["temporal_frames"], train))
    if not parts:
      raise ValueError("VideoModel: needs an image or a temporal backbone")
    return self.head(jnp.concatenate(parts, axis=-1))


class LanguageCaptionModel(nn.Module):
  """Frozen text encoder -> words -> 10 sampled (train) or all (test) -> mean -> head."""
  text: nn.Module
  head: nn.Module
  max_words: int = 32
  num_sampled: int = NUM_SAMPLED_WORDS

  def __call__(self, input_ids, attention_mask, word_index, *, train: bool = False,
               sample_rng: jax.Array | None = None) -> jax.Array:
    tokens = jax.lax.stop_gradient(self.text(input_ids, attention_mask, train=False)["sequence"])
    words, mask = word_features(tokens, word_index, self.max_words)
    positions = None
    if train:
      if sample_rng is None:
        sample_rng = self.make_rng("sample")
      positions = sample_words(sample_rng, mask, self.num_sampled)
    return self.head(pool_words(words, mask, positions))


class SpokenCaptionModel(nn.Module):
  """Speech encoder on the log-mel spectrogram [B, T, F] (mask [B, T]) -> head."""
  encoder: nn.Module
  head: nn.Module
  image_like: bool = True  # a ResNet: [B, T, F, 1]; ResDAVEnet takes [B, T, F] and the mask

  def __call__(self, spectrogram, mask=None, *, train: bool = False) -> jax.Array:
    if self.image_like:
      emb = self.encoder(spectrogram[..., None], train=train)["embedding"]
    else:
      emb = self.encoder(spectrogram, mask, train=train)["embedding"]
    return self.head(emb)
