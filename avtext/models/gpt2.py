"""GPT-2 and VideoCC's video captioner (VideoCC §4.2).

`GPT2` is the GPT-2 language model (Radford et al. 2019) on the shared
`layers.EncoderBlock` (pre-LN, tanh GELU, LayerNorm eps 1e-5, init N(0, 0.02))
with learned positions and the output projection tied to the token embedding.
It can take a *prefix* of already-embedded vectors before the tokens:

  x = [prefix_1 .. prefix_P ; wte(y_0) + wpe(0) .. wte(y_{n-1}) + wpe(n-1)]

Prefix vectors get no GPT-2 position embedding (they carry their own), text
positions start at 0 after them, and logits are returned for the text
positions only. The mask is the caller's (`attention.make_prefix_lm_mask` for a
prefix LM); without one, attention is causal.

`VideoCaptioner` is VideoCC's captioner: "given video features C as context
... we encode the context C and the previous embedded tokens H_i using a
single transformer ... We then predict the next token y_i from h~_{i-1} using
a linear projection" (§4.2). C is every output token of the MBT video encoder
(each modality's [CLS] + patch tokens, then the fusion bottleneck), projected
to the decoder width (`context_groups` averages the patch tokens into fewer); the mask is the prefix-LM mask (full attention over C,
causal over H); Phi is the tied embedding matrix.

Decoding with the KV cache (`layers` module docstring): `start` runs the
encoder and a prefill of [C ; BOS] into a cache of P + max_text_len
positions and returns the logits of the first word; `step` feeds one token
per call at text position t. Both keep shapes fixed, so
`avtext.inference.generate` jits the whole loop.

Parameters (GPT-2; `avtext.weights.gpt2` maps HF checkpoints onto them):
  wte {embedding [V, D]}, wpe {embedding [N_pos, D]},
  h_<i> (EncoderBlock), ln_f {scale, bias}.

Precision and memory (`config.model.dtype` / `.remat` / `.attention`, read for the
captioner's node and inherited by its `video` and `decoder` nodes; `layers.Compute`):
the blocks, the video projection and the tied output projection compute in `dtype`
(the KV cache too); parameters stay float32, the token and position embeddings are
summed in float32, and the logits are returned in float32.
"""
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from avtext.models import attention
from avtext.models import layers
from avtext.models import model_registry
from avtext.text import tokenizers

Array = jax.Array


CONTEXT_POOLS = ("mean", "max")  # config.model.context_pool of the video captioner


class GPT2(nn.Module):
  """GPT-2 LM with an optional embedded prefix (see the module docstring).

  Attributes (HF GPT2Config names in brackets; defaults are GPT-2 117M):
    vocab_size [vocab_size], max_positions [n_positions], hidden_size
    [n_embd], num_layers [n_layer], num_heads [n_head], mlp_dim [n_inner,
    default 4 * n_embd], layer_norm_eps [layer_norm_epsilon].
    dropout_rate: embedding and residual dropout [embd_pdrop, resid_pdrop].
    attention_dropout_rate: [attn_pdrop].
    dropout_masks: "jax" or "hash" (attention.dropout).
    compute: dtype, remat, attention, scan_layers, backend: see `layers.Compute`
      (scan_layers runs the layers as one `layers.scan_layers` in full-sequence
      calls; decoding with the cache runs them one by one; same parameters).
  """
  vocab_size: int = 50257
  max_positions: int = 1024
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  mlp_dim: int = 3072
  layer_norm_eps: float = 1e-5
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  dropout_masks: str = "jax"
  compute: layers.Compute = layers.Compute()

  def setup(self):
    init = nn.initializers.normal(0.02)
    self.wte = nn.Embed(self.vocab_size, self.hidden_size, embedding_init=init, name="wte")
    self.wpe = nn.Embed(self.max_positions, self.hidden_size, embedding_init=init,
                        name="wpe")
    self.blocks = [layers.EncoderBlock(**self._block_kwargs(), name=f"h_{i}")
                   for i in range(self.num_layers)]
    self.ln_f = nn.LayerNorm(epsilon=self.layer_norm_eps, dtype=self.compute.dtype,
                             name="ln_f")
    if self.dropout_masks not in attention.DROPOUT_MASKS:
      raise ValueError(f"dropout_masks must be one of {attention.DROPOUT_MASKS}, got "
                       f"{self.dropout_masks!r}")
    self.embedding_dropout = (attention.HashDropout(self.dropout_rate)
                              if self.dropout_masks == "hash" else nn.Dropout(self.dropout_rate))

  def _block_kwargs(self) -> dict[str, Any]:
    return dict(
        num_heads=self.num_heads, mlp_dim=self.mlp_dim, pre_norm=True,
        activation="gelu_tanh", layer_norm_eps=self.layer_norm_eps,
        dropout=layers.Dropout(self.dropout_rate, self.attention_dropout_rate,
                               masks=self.dropout_masks),
        kernel_init=nn.initializers.normal(0.02), compute=self.compute)

  def __call__(self, input_ids: Array, *, positions: Array | None = None,
               prefix: Array | None = None, mask: Array | None = None,
               padding_mask: Array | None = None, decode: bool = False,
               train: bool = False, last_only: bool = False,
               prefix_lm: bool = False) -> Array:
    """Next-token logits.

    Args:
      input_ids: int [B, L] token ids (while decoding: the next T tokens).
      positions: int [B, L] or [L] text positions; default 0..L-1 (required
        while decoding past the prefill).
      prefix: [B, P, D] embedded vectors before the tokens, or None.
      mask: bool self-attention mask over the whole sequence (prefix +
        tokens; while decoding, the whole cache), broadcastable to
        [B, H, S, S]; None: causal (required while decoding).
      padding_mask: [B, S] (while decoding [B, cache length]), nonzero for
        real positions; masks keys.
      decode: read and extend the KV cache (layers module docstring).
      train: enables dropout (needs the 'dropout' rng).
      last_only: the logits of the last position only (a decoding prefill needs no
        others, and the [L, vocab] projection of the rest costs as much as the layers).
      prefix_lm: the prefix attends to itself in both directions and the tokens
        causally (`attention.make_prefix_lm_mask`'s function) without a mask argument
        (not while decoding): the fused attention kernels take the prefix's rows.

    Returns:
      float32 [B, L, vocab_size] (last_only: [B, 1, vocab_size]): logits of the token
      after each text position.
    """
    if positions is None:
      positions = jnp.arange(input_ids.shape[1])
    if input_ids.shape[1] and jnp.ndim(positions) == 1:
      positions = jnp.broadcast_to(positions, input_ids.shape)
    x = self.wte(input_ids) + self.wpe(positions)
    num_prefix = 0
    if prefix is not None:
      if prefix.shape[-1] != self.hidden_size:
        raise ValueError(f"prefix width {prefix.shape[-1]} != GPT-2 hidden_size "
                         f"{self.hidden_size}; project it first")
      num_prefix = prefix.shape[1]
      x = jnp.concatenate([prefix.astype(x.dtype), x], axis=1)
    dtype = self.compute.dtype
    x = layers.shard_batch(x.astype(dtype))
    if prefix_lm and (decode or mask is not None or not num_prefix):
      raise ValueError("GPT2(prefix_lm=True) needs a prefix and takes no mask or "
                       "decode=True (decode with a make_prefix_lm_mask mask)")
    block_prefix = num_prefix if prefix_lm else 0  # the blocks' prefix_lm argument
    if mask is None and not prefix_lm:
      if decode:
        raise ValueError("GPT2(decode=True) needs the whole cache's mask, e.g. "
                         "attention.make_causal_mask(cache length)")
      mask = attention.make_causal_mask(x.shape[1])
    x = self.embedding_dropout(x, deterministic=not train)
    if self.compute.scan_layers and not decode and not self.is_initializing():
      block = layers.EncoderBlock(**self._block_kwargs(), parent=None)

      def step(h, params, rng):
        return block.apply({"params": params}, h, padding_mask, mask=mask,
                           deterministic=not train, prefix_lm=block_prefix,
                           rngs=None if rng is None else {"dropout": rng})

      x = layers.scan_layers(
          self.variables["params"], [f"h_{i}" for i in range(self.num_layers)], step, x,
          rng=layers.dropout_rng(self, not train, self.dropout_rate,
                                 self.attention_dropout_rate))
    else:
      for block in self.blocks:
        x = block(x, padding_mask, mask=mask, deterministic=not train, decode=decode,
                  prefix_lm=block_prefix)
    x = self.ln_f(x[:, -1:] if last_only else x[:, num_prefix:])
    # The tied projection (`wte.attend`) in the compute dtype; float32 logits for the softmax.
    embedding = self.wte.embedding.astype(dtype)
    return jnp.dot(x.astype(dtype), embedding.T).astype(jnp.float32)


class VideoCaptioner(nn.Module):
  """VideoCC §4.2: MBT video encoder -> C, GPT-2 prefix LM over [C ; H]."""
  video: nn.Module
  decoder: GPT2
  context_groups: int | None = None
  context_pool: str = "mean"
  dtype: Any = jnp.float32  # of the video projection; the towers carry their own

  def setup(self):
    self.video_projection = nn.Dense(self.decoder.hidden_size, dtype=self.dtype,
                                     name="video_projection")

  def encode(self, video_inputs: dict[str, Array], *, train: bool = False) -> Array:
    """C: [B, P, D_decoder], the MBT output tokens, projected.

    context_groups=None: every token (VideoCC). N: per modality its [CLS] and
    its patch tokens pooled in N contiguous groups of their (time-major)
    sequence, then the bottleneck: a shorter prefix for a cheaper decoder.
    context_pool: how a group is pooled, "mean" or "max" (per channel; for a tower
    whose embedding is the max over its tokens, MBT's rgb_pool="max", where a small
    object's evidence sits in few tokens and a mean dilutes it).
    """
    if self.context_pool not in CONTEXT_POOLS:
      raise ValueError(f"config.model.context_pool={self.context_pool!r}: expected one of "
                       f"{CONTEXT_POOLS}")
    pool = jnp.mean if self.context_pool == "mean" else jnp.max
    out = self.video(video_inputs, train=train)
    tokens = []
    for m in sorted(out["tokens"]):
      x = out["tokens"][m]
      if self.context_groups:
        n = x.shape[1] - 1
        if n % self.context_groups:
          raise ValueError(f"context_groups={self.context_groups} does not divide the "
                           f"{n} {m} patch tokens")
        patches = x[:, 1:].reshape(x.shape[0], self.context_groups, -1, x.shape[-1])
        x = jnp.concatenate([x[:, :1], pool(patches, axis=2)], axis=1)
      tokens.append(x)
    if "bottleneck" in out:
      tokens.append(out["bottleneck"])
    tokens = layers.shard_batch(jnp.concatenate(tokens, axis=1))
    return layers.shard_batch(self.video_projection(tokens))

  def _mask(self, batch: int, num_prefix: int, length: int) -> Array:
    # Every example has the same prefix: one [1, 1, S, S] mask broadcast over the batch
    # (a [B, 1, S, S] one is B times the memory, and unsharded under a mesh).
    del batch
    return attention.make_prefix_lm_mask(jnp.full((1,), num_prefix), num_prefix + length)

  def __call__(self, video_inputs: dict[str, Array], input_ids: Array, *,
               train: bool = False) -> Array:
    """Teacher forcing: logits [B, L, V]; position i predicts token i + 1 (target i)."""
    context = self.encode(video_inputs, train=train)
    return self.decoder(input_ids, prefix=context, train=train, prefix_lm=True)

  def start(self, video_inputs: dict[str, Array], bos: Array, max_len: int) -> Array:
    """Prefill: encodes the video, runs [C ; BOS] into the cache; first-word logits [B, V].

    Call with mutable=["cache"] on variables holding an empty cache made by
    `init_cache` (P + max_len positions).
    """
    context = self.encode(video_inputs)
    b, p = context.shape[:2]
    logits = self.decoder(bos[:, None], prefix=context, decode=True,
                          mask=self._mask(b, p, max_len))
    return logits[:, -1]

  def step(self, tokens: Array, position: Array, num_prefix: int, max_len: int) -> Array:
    """Feeds `tokens` [B] at text position `position`; logits of the next token [B, V]."""
    b = tokens.shape[0]
    logits = self.decoder(tokens[:, None], positions=jnp.full((b, 1), position),
                          decode=True, mask=self._mask(b, num_prefix, max_len))
    return logits[:, 0]

  def init_cache(self, video_inputs: dict[str, Array], max_len: int) -> Array:
    """Creates the cache (flax's way: a decode call on the whole sequence)."""
    context = self.encode(video_inputs)
    b, p = context.shape[:2]
    ids = jnp.zeros((b, max_len), jnp.int32)
    return self.decoder(ids, prefix=context, decode=True, mask=self._mask(b, p, max_len))


def gpt2_from_config(cfg) -> GPT2:
  """`config.model.decoder` (name="gpt2") -> GPT2.

  vocab_size None: the size of `vocab_subset` (a `write_vocab_subset` file), else of
  GPT-2's whole vocabulary.
  """
  vocab_size = cfg.get("vocab_size")
  if not vocab_size:
    vocab_size = (len(tokenizers.read_vocab_subset(cfg.vocab_subset)) if cfg.get("vocab_subset")
                  else GPT2.vocab_size)
  return GPT2(
      vocab_size=vocab_size, max_positions=cfg.get("max_positions", 1024),
      hidden_size=cfg.hidden_size, num_layers=cfg.num_layers, num_heads=cfg.num_heads,
      mlp_dim=cfg.get("mlp_dim") or 4 * cfg.hidden_size,
      layer_norm_eps=cfg.get("layer_norm_eps", 1e-5),
      dropout_rate=cfg.get("dropout_rate", 0.1),
      attention_dropout_rate=cfg.get("attention_dropout_rate", 0.1),
      dropout_masks=cfg.get("dropout_masks", "jax"),
      compute=model_registry.compute_from_config(cfg))


model_registry.register_model("gpt2")(gpt2_from_config)


@model_registry.register_model("video_captioner")
def video_captioner_from_config(cfg) -> VideoCaptioner:
  """`config.model` with `video` (name "mbt") and `decoder` (name "gpt2") sub-nodes; both
  inherit the node's dtype / remat / attention unless they set their own."""
  return VideoCaptioner(
      video=model_registry.build_model(cfg.video, where="config.model.video", parent=cfg),
      decoder=model_registry.build_model(cfg.decoder, where="config.model.decoder", parent=cfg),
      context_groups=cfg.get("context_groups"), context_pool=cfg.get("context_pool") or "mean",
      dtype=model_registry.compute_from_config(cfg).dtype)


def lm_decoding_fns(model: GPT2, params: Any, prompt: Array, max_new_tokens: int):
  """(start_fn, step_fn) for `avtext.inference.generate`: GPT-2 continuing `prompt` [B, P].

  The cache holds P + max_new_tokens - 1 positions (the last generated token
  is never fed back).
  """
  b, p = prompt.shape
  length = p + max_new_tokens - 1
  if length > model.max_positions:
    raise ValueError(f"prompt {p} + {max_new_tokens} new tokens exceed GPT-2's "
                     f"{model.max_positions} positions")
  mask = attention.make_causal_mask(length)
  cache = attention.empty_cache(lambda: model.apply(
      {"params": params}, jnp.zeros((b, length), jnp.int32), mask=mask, decode=True,
      mutable=["cache"]))

  def start_fn():
    logits, mutated = model.apply({"params": params, "cache": cache}, prompt, mask=mask,
                                  decode=True, last_only=True, mutable=["cache"])
    return logits[:, -1], mutated["cache"]

  def step_fn(state, tokens, t):
    logits, mutated = model.apply(
        {"params": params, "cache": state}, tokens[:, None],
        positions=jnp.full((tokens.shape[0], 1), p + t - 1), mask=mask, decode=True,
        mutable=["cache"])
    return logits[:, 0], mutated["cache"]

  return start_fn, step_fn


def captioner_decoding_fns(model: VideoCaptioner, variables: Any,
                           video_inputs: dict[str, Array], max_new_tokens: int, bos_id: int):
  """(start_fn, step_fn) for `avtext.inference.generate`: captions of `video_inputs`.

  Text positions 0 .. max_new_tokens - 1 hold BOS and the fed-back tokens; the
  cache holds them after the P video tokens.
  """
  variables = {k: v for k, v in variables.items() if k != "cache"}
  b = next(iter(video_inputs.values())).shape[0]
  cache = attention.empty_cache(lambda: model.apply(variables, video_inputs, max_new_tokens,
                                           method=model.init_cache, mutable=["cache"]))
  # The number of video tokens P, from the cache's length.
  num_prefix = next(x.shape[2] for x in jax.tree.leaves(cache) if x.ndim == 4) - max_new_tokens

  def start_fn():
    bos = jnp.full((b,), bos_id, jnp.int32)
    logits, mutated = model.apply({**variables, "cache": cache}, video_inputs, bos,
                                  max_new_tokens, method=model.start, mutable=["cache"])
    return logits, mutated["cache"]

  def step_fn(state, tokens, t):
    logits, mutated = model.apply({**variables, "cache": state}, tokens, t, num_prefix,
                                  max_new_tokens, method=model.step, mutable=["cache"])
    return logits, mutated["cache"]

  return start_fn, step_fn
