"""Spoken Moments (S-MiT, Monfort et al. 2021): video, language-caption and spoken-caption
models, each ending in the shared projection head (`heads.GatedEmbedding`).

Video model (sec. 4.1): an image backbone over a few frames (paper: ResNet-152 on 3
frames at 1 fps) and a temporal backbone (paper: TSM-R50 on 8 frames, ~3 fps), each
max-pooled over time to a vector, concatenated, then the head. A backbone is any
avtext vision model named in config that returns {'embedding'}:

  "frames"  an image model on each frame ([B*T, H, W, 3], e.g. `resnet`), max-pooled;
  "still"   a video model (e.g. the `mbt` RGB tower) on each frame repeated into a
            still clip of `still_frames` frames (as an inflated 3D net sees an
            image), max-pooled;
  "clip"    a video model on windows of `window` consecutive frames ({'rgb':
            [B*T/window, window, H, W, 3]}; None = the whole clip), max-pooled over
            the windows (each window's embedding already pools its frames).

`train_backbones=False` (phase 1) runs them in eval mode under stop_gradient, so
BatchNorm statistics stay as loaded; their outputs can then be precomputed once
(`avtext.features.smit`) and fed as 'image_embedding' / 'temporal_embedding',
which skips the backbone and gives the same vector.

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

Precision (`config.model.dtype` / `.remat` / `.attention`, `avtext.models.layers.Compute`):
every tower (backbones, text, speech) inherits the node's fields unless its own node
sets them, and the heads compute in `dtype`. What leaves a tower is float32: the pooled
backbone embeddings, the frozen encoder's word features and both models' outputs.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp

from avtext.models import heads
from avtext.models import model_registry

NUM_SAMPLED_WORDS = 10


def word_features(tokens: jax.Array, word_index: jax.Array, num_words: int
                  ) -> tuple[jax.Array, jax.Array]:
  """(words [B, W, D], word_mask [B, W]): the mean of each word's token features.

  Args:
    tokens: [B, T, D] the encoder's token outputs.
    word_index: int [B, T], each token's word number (0..W-1), -1 for special tokens
      and padding (`tokenizers.Tokenizer(..., with_words=True)`).
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
  """S-MiT's video model (module docstring); `__call__(inputs)` -> [B, features].

  inputs: 'image_frames' [B, 3, H, W, 3] / 'temporal_frames' [B, 8, H, W, 3] (float,
  normalized), or the backbones' precomputed outputs 'image_embedding' [B, D_i] /
  'temporal_embedding' [B, D_t] (what `backbone_embeddings` returns).
  """
  image: nn.Module | None
  temporal: nn.Module | None
  head: nn.Module
  image_mode: str = "frames"
  temporal_mode: str = "clip"
  train_backbones: bool = True
  still_frames: int = 2  # "still" mode: frames per still clip (MBT's tubelet length)
  window: int | None = None  # "clip" mode: frames per window (None: the whole clip)

  def _backbone(self, module, mode, frames, train):
    train = train and self.train_backbones
    b, t = frames.shape[:2]
    if mode == "frames":
      emb = module(frames.reshape((b * t,) + frames.shape[2:]), train=train)["embedding"]
      emb = emb.reshape(b, t, -1).max(axis=1)
    elif mode == "still":
      flat = frames.reshape((b * t, 1) + frames.shape[2:])
      still = jnp.broadcast_to(flat, (b * t, self.still_frames) + frames.shape[2:])
      emb = module({"rgb": still}, train=train)["embedding"].reshape(b, t, -1).max(axis=1)
    elif mode == "clip":
      w = self.window or t
      if t % w:
        raise ValueError(f"VideoModel: {t} temporal frames do not split into windows of {w}")
      windows = frames.reshape((b * (t // w), w) + frames.shape[2:])
      emb = module({"rgb": windows}, train=train)["embedding"]
      emb = emb.reshape(b, t // w, -1).max(axis=1)
    else:
      raise ValueError(f"VideoModel: backbone mode must be 'frames', 'still' or 'clip', "
                       f"got {mode!r}")
    emb = emb.astype(jnp.float32)
    return emb if self.train_backbones else jax.lax.stop_gradient(emb)

  def backbone_embeddings(self, inputs: dict[str, jax.Array], *, train: bool = False
                          ) -> dict[str, jax.Array]:
    """{'image_embedding', 'temporal_embedding'}: the pooled backbone outputs (those the
    model has), taken from `inputs` when precomputed there."""
    out = {}
    for name, module, mode in (("image", self.image, self.image_mode),
                               ("temporal", self.temporal, self.temporal_mode)):
      if module is None:
        continue
      key = f"{name}_embedding"
      if key in inputs:
        out[key] = inputs[key]
      elif f"{name}_frames" in inputs:
        out[key] = self._backbone(module, mode, inputs[f"{name}_frames"], train)
      else:
        raise KeyError(f"VideoModel: needs '{name}_frames' or '{key}' in the batch; got "
                       f"{sorted(inputs)}")
    if not out:
      raise ValueError("VideoModel: needs an image or a temporal backbone")
    return out

  def __call__(self, inputs: dict[str, jax.Array], *, train: bool = False) -> jax.Array:
    parts = self.backbone_embeddings(inputs, train=train)
    return self.head(jnp.concatenate([parts[k] for k in sorted(parts)], axis=-1))


class LanguageCaptionModel(nn.Module):
  """Frozen text encoder -> words -> 10 sampled (train) or all (test) -> mean -> head."""
  text: nn.Module
  head: nn.Module
  max_words: int = 32
  num_sampled: int = NUM_SAMPLED_WORDS

  def words(self, input_ids, attention_mask, word_index) -> tuple[jax.Array, jax.Array]:
    """(words [B, W, D], mask [B, W]) of the frozen encoder: what phase 1 may precompute."""
    tokens = jax.lax.stop_gradient(self.text(input_ids, attention_mask, train=False)["sequence"])
    return word_features(tokens.astype(jnp.float32), word_index, self.max_words)

  def __call__(self, input_ids=None, attention_mask=None, word_index=None, *,
               words=None, word_mask=None, train: bool = False,
               sample_rng: jax.Array | None = None) -> jax.Array:
    """From tokens, or from precomputed `words` [B, W, D] + `word_mask` [B, W]."""
    if words is None:
      words, word_mask = self.words(input_ids, attention_mask, word_index)
    positions = None
    if train:
      if sample_rng is None:
        sample_rng = self.make_rng("sample")
      positions = sample_words(sample_rng, word_mask, self.num_sampled)
    return self.head(pool_words(words, word_mask, positions))


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


class SMiTModel(nn.Module):
  """Video model + caption model ('language' or 'spoken'), one batch dict in.

  `__call__(batch)` -> (video [B, D], caption [B, D]); similarity = caption @ video.T.
  Batch keys: the video model's (`VideoModel`), and for the caption
  'input_ids' / 'attention_mask' / 'word_index' or precomputed 'words' / 'word_mask'
  (language), 'log_mel' [B, T, 40] / 'log_mel_mask' [B, T] (spoken).
  """
  video: VideoModel
  caption: nn.Module
  caption_kind: str = "language"

  def encode_video(self, batch: dict, *, train: bool = False) -> jax.Array:
    return self.video(batch, train=train)

  def encode_caption(self, batch: dict, *, train: bool = False) -> jax.Array:
    if self.caption_kind == "language":
      if "words" in batch:
        return self.caption(words=batch["words"], word_mask=batch["word_mask"], train=train)
      return self.caption(batch["input_ids"], batch["attention_mask"], batch["word_index"],
                          train=train)
    return self.caption(batch["log_mel"], batch.get("log_mel_mask"), train=train)

  def backbone_embeddings(self, batch: dict) -> dict:
    return self.video.backbone_embeddings(batch, train=False)

  def caption_words(self, batch: dict) -> tuple[jax.Array, jax.Array]:
    return self.caption.words(batch["input_ids"], batch["attention_mask"], batch["word_index"])

  def __call__(self, batch: dict, *, train: bool = False) -> tuple[jax.Array, jax.Array]:
    return self.encode_video(batch, train=train), self.encode_caption(batch, train=train)


@model_registry.register_model("smit")
def smit_from_config(cfg) -> SMiTModel:
  """`config.model` (name="smit"), see configs/smit_language_amm.py:

    embed_dim, normalize      the projection head (`heads.GatedEmbedding`), shared design
    video.image / .temporal   backbone model nodes (any registered vision model) or None
    video.image_mode / .temporal_mode / .still_frames / .window / .train_backbones
    caption                   'language' (text: a `bert` node, max_words) or 'spoken'
                              (speech: a `resnet` node with in_channels=1, or `resdavenet`)
  """
  dtype = model_registry.compute_from_config(cfg).dtype

  def head():
    return heads.GatedEmbedding(features=cfg.embed_dim, normalize=cfg.get("normalize", True),
                                dtype=dtype)

  v = cfg.video
  backbones = {k: model_registry.build_model(v[k], where=f"config.model.video.{k}", parent=cfg)
               if v.get(k) else None for k in ("image", "temporal")}
  video = VideoModel(image=backbones["image"], temporal=backbones["temporal"], head=head(),
                     image_mode=v.get("image_mode", "frames"),
                     temporal_mode=v.get("temporal_mode", "clip"),
                     train_backbones=v.get("train_backbones", True),
                     still_frames=v.get("still_frames", 2), window=v.get("window"))
  kind = cfg.get("caption", "language")
  if kind == "language":
    caption = LanguageCaptionModel(
        text=model_registry.build_model(cfg.text, where="config.model.text", parent=cfg),
        head=head(),
        max_words=cfg.get("max_words", 32), num_sampled=cfg.get("num_sampled_words",
                                                                NUM_SAMPLED_WORDS))
  elif kind == "spoken":
    name = cfg.speech.get("name")
    caption = SpokenCaptionModel(
        encoder=model_registry.build_model(cfg.speech, where="config.model.speech", parent=cfg),
        head=head(),
        image_like=name != "resdavenet")
  else:
    raise ValueError(f"config.model.caption={kind!r}; expected 'language' or 'spoken'")
  return SMiTModel(video=video, caption=caption, caption_kind=kind)
