"""COOT: Cooperative Hierarchical Transformer (Ging et al. 2020, §3).

Four T-Transformers (`TTransformer`), as the official `RetrievalModelManager`:

  video_local   frame features of the whole video -> video context g_v (pooled)
                frame features of each clip       -> clip embeddings theta_i
  video_global  clip embeddings (+ cross-attention to g_v) -> video embedding theta
  text_local / text_global    the same for paragraph tokens / sentences

A local T-Transformer is: COOT layer norm of the input features, Dense to the
hidden size + GELU (official `input_fc`), sin-cos positions, one post-norm
transformer layer (`CootBlock`: the shared `layers.EncoderBlock` with COOT's layer norm),
then a pooler: Attention-FA (eq. 4, official `GenPool`), or max / mean for
the ablation. A global one has no input FC; its Contextual Transformer
(eq. 5) is one cross-attention-only `CootBlock` (`ContextBlock`) with the local context as
the single query over the clip sequence, whose output is concatenated to the
mean of the clip sequence (official `avg_special`, below): theta =
[mean_i h_i, CoT(g, h)]
(768 = 384 + 384 with the official sizes).

Defaults are the official ActivityNet config (`config/retrieval/paper2020/
anet_coot.yaml`) and compute the official function (tests/test_parity_coot.py:
every intermediate and the loss within 1e-4 of the official code on padded
batches), including the official global mean, `avg_special`
(`nntrainer/models/poolers.py` TemporalAvgPool): the sum over every position of
the batch's padded clip axis divided by the video's real clip count. The
padded slots hold the global transformer's outputs at those positions (the
zero-filled slots go through the input layer norm, which maps them to its
bias, the sin-cos positions and the transformer layer, whose self-attention
reads the real clips only), so a video's embedding depends on the longest
video of its batch. `official_avg_pool` reproduces it: the official collate
pads to the batch's longest, so the positions below the batch's largest real
count are summed, whatever our own padding (`max_clips` slots, static shapes).

Named option kept (our improvement, `masked_pool=True`, config variant
`:masked_pool` of configs/coot_activitynet.py and coot_youcook2.py): every
mean pooler (the global one and the `local_pooler=avg` ablation) averages the
real positions only, so padding and batch composition never change an
embedding; retrieval embeddings are then a function of the video alone.

Deliberate differences from the official code that remain (training only; the
imported function and the eval-mode loss are the official ones):
- biases start at zero (official: truncated normal like the weights);
- dropout sits after each sublayer branch (`EncoderBlock`), the official layer
  also drops inside the feed-forward and after the first sublayer's norm.

Batches pack the clips of all videos in one array (`avtext/tasks/coot.py`);
`clip_slot[c] = video_row * max_clips + position` (-1: padding) scatters clip
embeddings back into [B, max_clips, D].
A local input may also come as packed rows (`packing=`, a `Packing` per input:
several sequences to a row, `avtext.data.array_store.pack`): the local T-Transformer then
masks attention to each sequence, restarts the sin-cos positions per sequence, computes
Attention-FA's projections on the rows and its softmax and sum per sequence, and
returns the per-sequence outputs: the padded layout's function up to float rounding
(tests/test_tasks_coot.py), with less padding computed.

Precision and memory (`config.model.dtype` / `.remat` / `.attention`,
`layers.Compute`): the input FC, the transformer layers and Attention-FA's two
projections compute in `dtype`; parameters stay float32, COOT's layer norm computes in
float32, Attention-FA's softmax and weighted sum run in float32, and every embedding
the model returns is float32. `remat` rematerializes each transformer layer.
"""
import dataclasses
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from avtext.models import attention as attention_lib
from avtext.models import layers
from avtext.models import model_registry

Array = jax.Array
POOLERS = ("atn", "max", "avg")
PACKED = ("video", "clips", "paragraph", "sentences")  # the local T-Transformers' inputs


class Packing(NamedTuple):
  """Packed rows of N sequences (`avtext.data.array_store.pack`): segment and position
  [R, L] (the sequence of the row a position belongs to, -1 = padding; its position in
  that sequence), unpack [N, L] (flat index r * L + t of each sequence's positions,
  -1 = padding)."""
  segment: Array
  position: Array
  unpack: Array


class CootLayerNorm(nn.Module):
  """COOT's LayerNormalization: scale * (x - mean) / (std + eps) + bias.

  The standard deviation is the unbiased one (N - 1) and eps sits outside the
  square root (official `nntrainer/models/normalizations.py`, eps 1e-6), unlike
  `nn.LayerNorm`. Parameters are named like nn.LayerNorm's.
  """
  epsilon: float = 1e-6
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    scale, bias = layers.norm_params(self, x.shape[-1])
    y = x.astype(jnp.float32)
    mean = jnp.mean(y, axis=-1, keepdims=True)
    std = jnp.std(y, axis=-1, keepdims=True, ddof=1)
    return (scale * (y - mean) / (std + self.epsilon) + bias).astype(self.dtype)


class CootBlock(layers.EncoderBlock):
  """The official post-norm TransformerEncoderLayer: the shared layer with COOT's
  layer norm (`CootLayerNorm`)."""

  def _norm(self, name: str) -> nn.Module:
    return CootLayerNorm(epsilon=self.layer_norm_eps, dtype=self.compute.dtype, name=name)


class ContextBlock(CootBlock):
  """The Contextual Transformer (eq. 5, the official "TransformerDecoder"): cross-attention
  only, the global context as the query over the clips."""
  SELF_ATTENTION = False


@dataclasses.dataclass(frozen=True)
class Pooling:
  """A T-Transformer's pooler: `kind` one of POOLERS ("atn": Attention-FA with `hidden`
  units in `heads` heads, eq. 4; "max"; "avg": the official avg_special, or with
  masked_pool the mean of the real positions: ours, the module docstring)."""
  kind: str = "atn"
  hidden: int = 768
  heads: int = 2

  def __post_init__(self):
    if self.kind not in POOLERS:
      raise ValueError(f"pooler must be one of {POOLERS}, got {self.kind!r}")


def sincos_table(length: int, dim: int) -> np.ndarray:
  """Official PositionalEncodingSinCos: pe[p, i] = sin/cos(p / 10000 ** (2 i / d)).

  Even columns take sin, odd ones cos, each with its own column index i in the
  exponent (the official formula, not the 2 * floor(i / 2) of Vaswani et al.).
  """
  position = np.arange(length, dtype=np.float64)[:, None]
  div = 10000.0 ** (2.0 * np.arange(dim, dtype=np.float64) / dim)
  table = np.zeros((length, dim), np.float64)
  table[:, 0::2] = np.sin(position / div[0::2])
  table[:, 1::2] = np.cos(position / div[1::2])
  return table.astype(np.float32)


class AttentionFA(nn.Module):
  """Attention-aware feature aggregation, COOT eq. 4 (official `GenPool`).

  Per head h (of `num_heads`, each owning a D/H slice of the features):
    a = W2_h GELU(W1_h x_t + b1_h) + b2_h           [T, D/H] logits
    w = softmax over the real positions t, per feature of the slice
    out[slice h] = sum_t w_t * x_t[slice h]
  W1_h: [D, hidden/H], W2_h: [hidden/H, D/H].
  """
  hidden: int = 768
  num_heads: int = 2
  dropout: float = 0.0
  init_std: float = 0.01
  dropout_masks: str = "jax"
  dtype: Any = jnp.float32  # of the two projections; the softmax and the sum are float32

  @nn.compact
  def __call__(self, x: Array, mask: Array, *, deterministic: bool,
               unpack: Array | None = None) -> Array:
    """x [B, T, D], mask [B, T] -> [B, D]; with `unpack` ([N, L], `Packing`) x and mask
    are packed rows: the logits are computed there, the softmax and the sum per
    sequence -> [N, D]."""
    d = x.shape[-1]
    h = self.num_heads
    if self.hidden % h or d % h:
      raise ValueError(f"AttentionFA: hidden {self.hidden} and width {d} must be divisible "
                       f"by num_heads={h}")
    init = nn.initializers.truncated_normal(self.init_std)
    w1 = self.param("w1", init, (h, d, self.hidden // h))
    b1 = self.param("b1", nn.initializers.zeros, (h, self.hidden // h))
    w2 = self.param("w2", init, (h, self.hidden // h, d // h))
    b2 = self.param("b2", nn.initializers.zeros, (h, d // h))
    w1, b1, w2, b2 = (p.astype(self.dtype) for p in (w1, b1, w2, b2))
    a = jnp.einsum("btd,hde->bthe", x.astype(self.dtype), w1) + b1
    drop = lambda y: attention_lib.dropout(y, self.dropout, deterministic=deterministic,
                                           masks=self.dropout_masks)
    a = nn.gelu(drop(a), approximate=False)
    a = jnp.einsum("bthe,hef->bthf", a, w2) + b2
    a = drop(a).astype(jnp.float32)
    if unpack is not None:
      a, x, mask = unpack_rows(a, unpack), unpack_rows(x, unpack), unpack >= 0
    a = jnp.where(mask[:, :, None, None], a, jnp.finfo(a.dtype).min)
    weights = jax.nn.softmax(a, axis=1)  # over time, per (head, feature)
    weights = jnp.where(mask[:, :, None, None], weights, 0.0)  # all-padding rows -> 0
    weights = drop(weights)
    weights = weights.reshape(weights.shape[0], weights.shape[1], d)
    return jnp.sum(x.astype(jnp.float32) * weights, axis=1)


def unpack_rows(packed: Array, unpack: Array) -> Array:
  """Packed rows [R, T, ...] -> sequences [N, L, ...] (`array_store.pack`'s `unpack` [N, L]:
  flat indices r * T + t, -1 = padding, which gets 0)."""
  flat = packed.reshape((-1,) + packed.shape[2:])
  out = flat[jnp.maximum(unpack, 0)]
  real = (unpack >= 0).reshape(unpack.shape + (1,) * (packed.ndim - 2))
  return jnp.where(real, out, jnp.zeros((), out.dtype))


def official_avg_pool(x: Array, mask: Array) -> Array:
  """Official `avg_special` (TemporalAvgPool): sum over the padded axis / real count.

  The official collate pads each batch to its longest sequence, and the pooler sums
  every position of that padded axis (padded ones included) before dividing by the
  row's real length. Here the axis may be padded further (slots, static shapes), so
  the positions below the batch's largest real length are summed: the same result
  for any padding of ours. Rows without real positions give 0 (the official code
  divides by zero there; such rows only pad our eval batches).
  """
  lengths = jnp.sum(mask, axis=1)
  summed = jnp.arange(x.shape[1])[None, :] < jnp.max(lengths)
  total = jnp.sum(jnp.where(summed[..., None], x, 0.0), axis=1)
  return jnp.where(lengths[:, None] > 0, total / jnp.maximum(lengths, 1)[:, None], 0.0)


def masked_pool(x: Array, mask: Array, kind: str) -> Array:
  """Masked mean or max over axis 1 (rows without real positions give 0)."""
  m = mask[..., None]
  if kind == "avg":
    return jnp.sum(jnp.where(m, x, 0.0), axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1)
  if kind == "max":
    return jnp.where(jnp.any(mask, axis=1)[:, None],
                     jnp.max(jnp.where(m, x, jnp.finfo(x.dtype).min), axis=1), 0.0)
  raise ValueError(f"pooler must be one of {POOLERS}, got {kind!r}")


class TTransformer(nn.Module):
  """One COOT T-Transformer (official `TransformerLegacy`). See the module docstring."""
  hidden_size: int = 384
  num_heads: int = 8
  mlp_dim: int = 384
  num_layers: int = 1
  # COOT's one rate: branch outputs, attention probabilities, Attention-FA
  dropout: layers.Dropout = layers.Dropout(0.025, 0.025)
  input_fc: bool = True
  pooling: Pooling = Pooling()
  masked_pool: bool = False  # "avg": masked mean (ours) instead of official avg_special
  use_context: bool = False
  init_std: float = 0.01
  max_positions: int = 1000
  compute: layers.Compute = layers.Compute()

  @nn.compact
  def __call__(self, x: Array, mask: Array, context: Array | None = None, *,
               deterministic: bool, packing: "Packing | None" = None) -> tuple[Array, Array]:
    """x [B, L, D_in], mask [B, L] (True = real) -> (pooled [B, D_out], sequence [B, L, H]),
    both float32.

    With `packing`, x [R, L, D_in] / mask are packed rows holding N sequences
    (`array_store.pack`): positions restart per sequence, attention stays within one, the
    pooler pools each; -> (pooled [N, D_out], sequence [N, L, H]), the function of the
    unpacked call on the N padded sequences (up to float rounding; dropout masks differ).
    Per-position work then follows the real lengths."""
    if x.shape[1] > self.max_positions:
      raise ValueError(f"sequence of {x.shape[1]} positions is longer than the sin-cos table "
                       f"(max_positions={self.max_positions})")
    init = nn.initializers.truncated_normal(self.init_std)
    mask = mask.astype(bool)
    dtype, pooling = self.compute.dtype, self.pooling
    x = CootLayerNorm(dtype=dtype, name="norm_input")(x)
    if self.input_fc:
      x = nn.gelu(nn.Dense(self.hidden_size, kernel_init=init, dtype=dtype,
                           name="input_fc")(x), approximate=False)
    elif x.shape[-1] != self.hidden_size:
      raise ValueError(f"input width {x.shape[-1]} != hidden_size {self.hidden_size} and "
                       "input_fc is off")
    table = jnp.asarray(sincos_table(x.shape[1], self.hidden_size), dtype)
    attention_mask = None
    if packing is None:
      x = x + table[None]
    else:
      x = x + table[packing.position]
      attention_mask = (packing.segment[:, :, None] == packing.segment[:, None, :])[:, None]
    block = dict(
        num_heads=self.num_heads, mlp_dim=self.mlp_dim, pre_norm=False, activation="gelu",
        layer_norm_eps=1e-6, dropout=self.dropout, kernel_init=init, compute=self.compute)
    for i in range(self.num_layers):
      x = CootBlock(**block, name=f"encoderblock_{i}")(x, mask, mask=attention_mask,
                                                        deterministic=deterministic)
    unpack = None if packing is None else packing.unpack
    if pooling.kind == "atn":
      pooled = AttentionFA(pooling.hidden, pooling.heads, self.dropout.rate, self.init_std,
                           self.dropout.masks, dtype=dtype,
                           name="pooler")(x, mask, deterministic=deterministic, unpack=unpack)
    if unpack is not None:  # the sequences, for the other poolers and the caller
      x, mask = unpack_rows(x, unpack), unpack >= 0
    if pooling.kind == "avg" and not self.masked_pool:
      pooled = official_avg_pool(x.astype(jnp.float32), mask)
    elif pooling.kind != "atn":
      pooled = masked_pool(x.astype(jnp.float32), mask, pooling.kind)
    if self.use_context:
      if context is None:
        raise ValueError("TTransformer(use_context=True) needs the context vector")
      ctx = ContextBlock(**block, cross_attention=True, name="context")(
          context[:, None, :].astype(dtype), context=x, context_mask=mask,
          deterministic=deterministic)
      pooled = jnp.concatenate([pooled, ctx[:, 0].astype(jnp.float32)], axis=-1)
    return pooled, x.astype(jnp.float32)


def _scatter(values: Array, slot: Array, rows: int, slots: int) -> tuple[Array, Array]:
  """[C, D] values by slot (row * slots + k, -1 = drop) -> ([rows, slots, D], mask)."""
  index = jnp.where(slot >= 0, slot, rows * slots)  # out of range: dropped
  out = jnp.zeros((rows * slots, values.shape[-1]), values.dtype).at[index].set(
      values, mode="drop")
  mask = jnp.zeros((rows * slots,), bool).at[index].set(True, mode="drop")
  return out.reshape(rows, slots, -1), mask.reshape(rows, slots)


class COOT(nn.Module):
  """The four COOT T-Transformers; see the module docstring."""
  max_clips: int
  hidden_size: int = 384
  num_heads: int = 8
  mlp_dim: int = 384
  num_layers: int = 1
  dropout: layers.Dropout = layers.Dropout(0.025, 0.025)  # as TTransformer's
  local_pooling: Pooling = Pooling()  # the local T-Transformers'; the global ones "avg"
  masked_pool: bool = False  # module docstring: False = official avg_special
  use_context: bool = True
  init_std: float = 0.01
  max_positions: int = 1000
  compute: layers.Compute = layers.Compute()  # dtype, remat, attention, backend

  def _net(self, name: str, *, local: bool) -> TTransformer:
    return TTransformer(
        hidden_size=self.hidden_size, num_heads=self.num_heads, mlp_dim=self.mlp_dim,
        num_layers=self.num_layers, dropout=self.dropout, input_fc=local,
        pooling=(self.local_pooling if local else
                 dataclasses.replace(self.local_pooling, kind="avg")),
        masked_pool=self.masked_pool, use_context=self.use_context and not local,
        init_std=self.init_std, max_positions=self.max_positions, compute=self.compute,
        name=name)

  def setup(self):
    self.video_local = self._net("video_local", local=True)
    self.video_global = self._net("video_global", local=False)
    self.text_local = self._net("text_local", local=True)
    self.text_global = self._net("text_global", local=False)

  def _encode(self, local, global_, full, full_mask, parts, parts_mask, slot, deterministic,
              packing):
    packing = packing or (None, None)
    context, _ = local(full, full_mask, deterministic=deterministic, packing=packing[0])
    part_emb, _ = local(parts, parts_mask, deterministic=deterministic, packing=packing[1])
    grouped, grouped_mask = _scatter(part_emb, slot, context.shape[0], self.max_clips)
    emb, _ = global_(grouped, grouped_mask, context if self.use_context else None,
                     deterministic=deterministic)
    return emb, context, grouped, grouped_mask

  def encode_video(self, video, video_mask, clips, clips_mask, clip_slot, *,
                   deterministic: bool = True,
                   packing: tuple[Packing | None, Packing | None] | None = None
                   ) -> dict[str, Array]:
    """-> video_emb [B, 768], video_context [B, 384], clip_emb [B, N, 384], clip_mask [B, N].

    packing: (of the videos, of the clips), each None or a `Packing` of packed rows
    (`TTransformer`): the same function up to float rounding, less padding computed."""
    emb, ctx, clip, mask = self._encode(self.video_local, self.video_global, video, video_mask,
                                        clips, clips_mask, clip_slot, deterministic, packing)
    return {"video_emb": emb, "video_context": ctx, "clip_emb": clip, "clip_mask": mask}

  def encode_text(self, paragraph, paragraph_mask, sentences, sentences_mask, sentence_slot, *,
                  deterministic: bool = True,
                  packing: tuple[Packing | None, Packing | None] | None = None
                  ) -> dict[str, Array]:
    """-> paragraph_emb, paragraph_context, sentence_emb [B, N, 384], sentence_mask [B, N];
    packing: (of the paragraphs, of the sentences), as `encode_video`."""
    emb, ctx, sent, mask = self._encode(self.text_local, self.text_global, paragraph,
                                        paragraph_mask, sentences, sentences_mask, sentence_slot,
                                        deterministic, packing)
    return {"paragraph_emb": emb, "paragraph_context": ctx, "sentence_emb": sent,
            "sentence_mask": mask}

  def __call__(self, video, video_mask, clips, clips_mask, clip_slot, paragraph,
               paragraph_mask, sentences, sentences_mask, sentence_slot, *,
               deterministic: bool = True,
               packing: dict[str, Packing] | None = None) -> tuple[dict, dict]:
    """packing: {input name of PACKED: its `Packing`} for the inputs given as packed rows."""
    packing = packing or {}
    return (self.encode_video(video, video_mask, clips, clips_mask, clip_slot,
                              deterministic=deterministic,
                              packing=(packing.get("video"), packing.get("clips"))),
            self.encode_text(paragraph, paragraph_mask, sentences, sentences_mask,
                             sentence_slot, deterministic=deterministic,
                             packing=(packing.get("paragraph"), packing.get("sentences"))))


@model_registry.register_model("coot")
def coot_from_config(cfg) -> COOT:
  return COOT(max_clips=int(cfg.max_clips), hidden_size=cfg.hidden_size,
              num_heads=cfg.num_heads, mlp_dim=cfg.mlp_dim, num_layers=cfg.num_layers,
              dropout=layers.Dropout(cfg.dropout, cfg.dropout,
                                     masks=cfg.get("dropout_masks", "jax")),
              local_pooling=Pooling(cfg.local_pooler, cfg.pool_hidden, cfg.pool_heads),
              masked_pool=bool(cfg.get("masked_pool", False)),
              use_context=cfg.use_context, init_std=cfg.init_std,
              max_positions=cfg.get("max_positions", 1000),
              compute=model_registry.compute_from_config(cfg))
