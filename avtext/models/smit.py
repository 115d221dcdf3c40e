"""Spoken Moments (S-MiT, Monfort et al. 2021) caption models: word pooling.

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
import jax
import jax.numpy as jnp

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
  keys = jnp.where(word_mask, jax.random.uniform(k_perm, word_mask.shape), -1.0)
  without = jax.lax.top_k(keys, num)[1]  # a uniform random subset, in random order
  logits = jnp.where(word_mask, 0.0, -jnp.inf)
  logits = jnp.where(n > 0, logits, 0.0)  # no words: any position, masked later
  with_replacement = jax.random.categorical(k_draw, logits[:, None, :],
                                            shape=(word_mask.shape[0], num))
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
