"""MMT: TVR's MultiModal Transformer captioner for TVC (Lei et al. 2020, app. D.2).

A transformer encoder-decoder over video clip features and subtitle words
(config names of the official TVCaption code, `baselines/multimodal_transformer`,
in brackets):

Context (the encoder input), `max_v_len + max_sub_len` positions (20 + 30):
    ids    [CLS] [VID] x n [SEP] [PAD].. | [BOS] subtitle words [EOS] [PAD]..
    video  0      f_1 .. f_n  0    0      | 0 ..
    type   0 (the first max_v_len positions) | 1 (the rest)
  x = word_fc(E[ids]) + video_fc(video) + T[type] + PE, then LayerNorm and
  dropout, where E is the 300-d word embedding [word_vec_size], word_fc =
  LN -> dropout -> Linear(300 -> D) -> ReLU -> LN, video_fc the same from the
  clip-feature width, T the learned token-type embedding and PE the fixed
  sinusoidal position encoding over the whole context (subtitle positions
  are 20..49 whatever the video length). The paper concatenates the projected
  video and subtitle embeddings, E_ctx = [E_v; E_s]; the official code sums
  the two streams at every position with the other stream's input zero,
  which is that concatenation plus the constant video_fc(0) / word embedding
  of the special tokens; this module does what the official code does.
Encoder: `num_layers` post-LN BERT layers (`layers.EncoderBlock`,
  pre_norm=False, erf GELU, MLP width `intermediate_size` [768], LayerNorm
  eps 1e-12), bidirectional over the real context positions.
Decoder input: word_fc(E[caption ids]) + PE (the embedding shared with the
  encoder), no token type.
Decoder: `num_layers` decoder layers, the shared `layers.EncoderBlock(causal=True,
  cross_attention=True, pre_norm=False)` or its official form (`OfficialDecoderLayer`):
  causal self-attention, cross-attention to
  the encoder output over the real context positions, a feed-forward part, each
  sublayer LN(x + f(x)). `decoder_layer` picks its form:
  "official" (default): the official BertDecoderLayerNoMemoryUntied. Neither
    attention has an output Linear (the concatenated heads go straight into the
    residual, no dropout on that branch; attention-probability dropout stays) and
    the feed-forward part is one Linear(D -> D) without activation, with dropout
    (BertOutput on the cross-attention output): `OfficialDecoderLayer`.
    `intermediate_size` is unused here (the official code needs it equal to
    hidden_size, its BertOutput being Linear(intermediate -> hidden) applied to a
    hidden-wide input). This is what imports the released
    weights (avtext/weights/official_mmt.py).
  "standard": the paper's "standard design [40]" (TVR app. D.2), the transformer
    decoder layer every other avtext model shares: an output Linear + dropout after
    each attention and a GELU MLP of width `intermediate_size`. Kept as an
    option (configs/mmt_tvc.py:standard_decoder) because it is the layer the paper
    describes and the block every avtext transformer shares, and because the
    official feed-forward part has no nonlinearity (only the LayerNorms separate
    the decoder's Linears); it costs 2 D^2 + 2 D * intermediate parameters more per
    layer. Which one captions TVC better has not been measured here. Runs written
    before this option existed (no model.decoder_layer in their config.json) used
    it, so `mmt_from_config` builds it when the field is absent.
  The self-attention keys are the causal ones, intersected with `caption_mask`
  when given (the official decoder masks padded caption keys too; for the real
  positions, which precede every pad, this changes nothing, so training and
  decoding leave it out).
Output: Dense(D) -> GELU -> LN, then Linear(D -> V) with bias, not tied to
  the word embedding [share_wd_cls_weight=False].
Init: N(0, 0.02) for every kernel and embedding, zero biases [init_bert_weights].

Decoding with the KV cache: `encode` once, `decode_step(tokens, position)`
feeds one caption token per call; `captioner_decoding_fns` wraps them for
`avtext.inference.generate` (greedy by default, as the paper).

Parameters: word_embeddings {embedding [V, 300]}, word_fc, video_fc
{norm_in, dense, norm_out}, token_type_embeddings {embedding [2, D]},
embedding_norm, encoder_<i>, decoder_<i> (EncoderBlock; "official": attention /
cross_attention {query, key, value}, mlp {kernel, bias} and the three norms),
head_transform, head_norm, head_output {kernel [D, V], bias [V]}.

Precision and memory (`config.model.dtype` / `.remat` / `.attention`,
`layers.Compute`): every Dense, LayerNorm output, embedding sum and block (the KV cache
too) is in `dtype`; parameters stay float32, LayerNorm statistics and the softmax run in
float32, and the logits are float32.
"""
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from avtext import errors
from avtext.models import attention
from avtext.models import layers
from avtext.models import model_registry
from avtext.text import vocab

Array = jax.Array

# Special word ids of the official vocabulary (TVCaption build_vocab.py); the same as
# `avtext.text.vocab.WordVocab`'s, which tests/test_tasks_mmt.py checks.
PAD, CLS, SEP, VID, BOS, EOS, UNK = range(7)

DECODER_LAYERS = ("official", "standard")
TYPE_VOCAB_SIZE = 2  # token types: video (0), subtitles (1) [type_vocab_size]


def sinusoidal_positions(length: int, width: int) -> np.ndarray:
  """float32 [length, width]: sin at even, cos at odd dims, 10000^(-2i/width) frequencies."""
  pos = np.arange(length, dtype=np.float64)[:, None]
  div = np.exp(np.arange(0, width, 2, dtype=np.float64) * -(np.log(10000.0) / width))
  pe = np.zeros((length, width), np.float64)
  pe[:, 0::2] = np.sin(pos * div)
  pe[:, 1::2] = np.cos(pos * div)[:, :width // 2]
  return pe.astype(np.float32)


class _Projection(nn.Module):
  """LN -> dropout -> Linear -> ReLU -> LN (the official word_fc / video_embeddings)."""
  features: int
  dropout_rate: float
  layer_norm_eps: float
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array, *, deterministic: bool) -> Array:
    init = nn.initializers.normal(0.02)
    x = nn.LayerNorm(epsilon=self.layer_norm_eps, dtype=self.dtype, name="norm_in")(x)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    x = nn.relu(nn.Dense(self.features, kernel_init=init, dtype=self.dtype, name="dense")(x))
    return nn.LayerNorm(epsilon=self.layer_norm_eps, dtype=self.dtype, name="norm_out")(x)


class OfficialDecoderLayer(layers.EncoderBlock):
  """The official decoder layer (BertDecoderLayerNoMemoryUntied, module docstring): no
  output Linear after either attention (no dropout on those branches) and a
  feed-forward part of one Linear(D -> D) without activation, then dropout
  (`mlp_dim` unused)."""

  def _attention(self, name: str, *, output_projection: bool = True) -> attention.Attention:
    del output_projection
    return super()._attention(name, output_projection=False)

  def _feed_forward(self, width: int) -> nn.Module:
    return nn.Dense(width, kernel_init=self.kernel_init, dtype=self.compute.dtype,
                    name="mlp")


class MMT(nn.Module):
  """TVC's MMT (see the module docstring). Defaults: the official TVCaption ones."""
  vocab_size: int
  video_dim: int = 3072
  hidden_size: int = 768
  num_layers: int = 2
  num_heads: int = 12
  intermediate_size: int = 768
  word_dim: int = 300
  max_positions: int = 50  # max(max_v_len + max_sub_len, max_cap_len)
  dropout: layers.Dropout = layers.Dropout(0.1, 0.1)  # rate: hidden [hidden_dropout_prob]
  layer_norm_eps: float = 1e-12
  decoder_layer: str = "official"  # or "standard" (module docstring)
  compute: layers.Compute = layers.Compute()  # dtype, remat, attention, backend

  def __post_init__(self):
    if self.decoder_layer not in DECODER_LAYERS:
      raise ValueError(f"MMT decoder_layer={self.decoder_layer!r} (config.model.decoder_layer); "
                       f"expected one of {DECODER_LAYERS}")
    super().__post_init__()

  def setup(self):
    init = nn.initializers.normal(0.02)
    dtype = self.compute.dtype
    self.word_embeddings = nn.Embed(self.vocab_size, self.word_dim, embedding_init=init,
                                    dtype=dtype)
    proj = dict(features=self.hidden_size, dropout_rate=self.dropout.rate,
                layer_norm_eps=self.layer_norm_eps, dtype=dtype)
    self.word_fc = _Projection(**proj)
    self.video_fc = _Projection(**proj)
    self.token_type_embeddings = nn.Embed(TYPE_VOCAB_SIZE, self.hidden_size,
                                          embedding_init=init, dtype=dtype)
    self.embedding_norm = nn.LayerNorm(epsilon=self.layer_norm_eps, dtype=dtype)
    self.embedding_dropout = nn.Dropout(self.dropout.rate)
    block = dict(num_heads=self.num_heads, mlp_dim=self.intermediate_size, pre_norm=False,
                 activation="gelu", layer_norm_eps=self.layer_norm_eps,
                 dropout=self.dropout, kernel_init=init, compute=self.compute)
    self.encoder = [layers.EncoderBlock(**block, name=f"encoder_{i}")
                    for i in range(self.num_layers)]
    decoder = (OfficialDecoderLayer if self.decoder_layer == "official" else
               layers.EncoderBlock)
    self.decoder = [decoder(**block, causal=True, cross_attention=True, name=f"decoder_{i}")
                    for i in range(self.num_layers)]
    self.head_transform = nn.Dense(self.hidden_size, kernel_init=init, dtype=dtype,
                                   name="head_transform")
    self.head_norm = nn.LayerNorm(epsilon=self.layer_norm_eps, dtype=dtype, name="head_norm")
    self.head_output = nn.Dense(self.vocab_size, kernel_init=init, dtype=dtype,
                                name="head_output")

  def _positions(self, start: Array | int, length: int) -> Array:
    table = jnp.asarray(sinusoidal_positions(self.max_positions, self.hidden_size))
    return jax.lax.dynamic_slice_in_dim(table, start, length, axis=0).astype(self.compute.dtype)

  def encode(self, ctx_ids: Array, video: Array, ctx_mask: Array, token_type_ids: Array, *,
             train: bool = False) -> Array:
    """Encoder output [B, L_ctx, D] (`ctx_*` as in the module docstring)."""
    if ctx_ids.shape[1] > self.max_positions:
      raise ValueError(f"context of {ctx_ids.shape[1]} positions > max_positions="
                       f"{self.max_positions}")
    det = not train
    x = (self.word_fc(self.word_embeddings(ctx_ids), deterministic=det)
         + self.video_fc(video.astype(jnp.float32), deterministic=det)
         + self.token_type_embeddings(token_type_ids)
         + self._positions(0, ctx_ids.shape[1])[None])
    x = self.embedding_dropout(self.embedding_norm(x), deterministic=det)
    for block in self.encoder:
      x = block(x, ctx_mask, deterministic=det)
    return x

  def decode(self, caption_ids: Array, memory: Array, ctx_mask: Array, *,
             start: Array | int = 0, train: bool = False,
             cache_len: int | None = None, caption_mask: Array | None = None) -> Array:
    """Logits [B, T, V] of the token after each caption position start .. start + T - 1.

    cache_len: decode with the self-attention KV cache of that many positions
    (created by a call on cache_len positions, see `init_cache`).
    caption_mask: [B, T], nonzero for real caption tokens; masks padded caption keys
    in self-attention as the official decoder does (module docstring: it changes
    only the ignored outputs at padded positions). Not with cache_len.
    """
    if caption_mask is not None and cache_len is not None:
      raise ValueError("MMT.decode: caption_mask is for teacher forcing, not cached decoding")
    det = not train
    x = (self.word_fc(self.word_embeddings(caption_ids), deterministic=det)
         + self._positions(start, caption_ids.shape[1])[None])
    decode = cache_len is not None
    mask = attention.make_causal_mask(cache_len) if decode else None
    for block in self.decoder:
      x = block(x, caption_mask, mask=mask, context=memory, context_mask=ctx_mask,
                deterministic=det, decode=decode)
    h = self.head_norm(nn.gelu(self.head_transform(x), approximate=False))
    return self.head_output(h).astype(jnp.float32)

  def __call__(self, ctx_ids: Array, video: Array, ctx_mask: Array, token_type_ids: Array,
               caption_ids: Array, *, train: bool = False,
               caption_mask: Array | None = None) -> Array:
    """Teacher forcing: logits [B, L_cap, V]; position i predicts caption token i + 1
    (caption_mask: see `decode`)."""
    memory = self.encode(ctx_ids, video, ctx_mask, token_type_ids, train=train)
    return self.decode(caption_ids, memory, ctx_mask, train=train, caption_mask=caption_mask)

  def init_cache(self, memory: Array, ctx_mask: Array, max_len: int) -> Array:
    """Creates the decoder cache (flax's way: a decode call over max_len positions)."""
    ids = jnp.zeros((memory.shape[0], max_len), jnp.int32)
    return self.decode(ids, memory, ctx_mask, cache_len=max_len)

  def decode_step(self, tokens: Array, position: Array, memory: Array, ctx_mask: Array,
                  max_len: int) -> Array:
    """Feeds tokens [B] at caption position `position`; next-token logits [B, V]."""
    return self.decode(tokens[:, None], memory, ctx_mask, start=position,
                       cache_len=max_len)[:, 0]


@model_registry.register_model("mmt")
def mmt_from_config(cfg) -> MMT:
  """`config.model` (name="mmt").

  vocab_size None: the size of the word vocabulary `cfg.vocab` (a word2idx
  JSON, `avtext.text.vocab.WordVocab`); video_dim: the clip-feature
  width (official resnet_i3d: 3072).
  """
  vocab_size = cfg.get("vocab_size")
  if not vocab_size:
    if not cfg.get("vocab"):
      raise errors.BadInput("config.model.vocab is not set: MMT's word vocabulary, a "
                            "word2idx JSON (TVCaption's tvc_word2idx.json, or python -m "
                            "avtext.tools.caption_vocab)")
    vocab_size = len(vocab.WordVocab.load(cfg.vocab))
  return MMT(vocab_size=int(vocab_size), video_dim=int(cfg.video_dim),
             hidden_size=cfg.hidden_size, num_layers=cfg.num_layers, num_heads=cfg.num_heads,
             intermediate_size=cfg.intermediate_size, word_dim=cfg.word_dim,
             max_positions=cfg.max_positions,
             dropout=layers.Dropout(cfg.dropout_rate, cfg.attention_dropout_rate),
             layer_norm_eps=cfg.get("layer_norm_eps", 1e-12),
             # Absent: a run from before the option, trained with the standard layer.
             decoder_layer=cfg.get("decoder_layer", "standard"),
             compute=model_registry.compute_from_config(cfg))


def captioner_decoding_fns(model: MMT, variables: Any, ctx: dict[str, Array],
                           max_new_tokens: int, *, bos_id: int = BOS,
                           banned_ids: tuple[int, ...] = (UNK,)):
  """(start_fn, step_fn) for `avtext.inference.generate`: captions of the contexts `ctx`.

  `ctx` holds ctx_ids, video, ctx_mask, token_type_ids. Caption position 0
  holds BOS; the cache holds max_new_tokens positions. `banned_ids` get
  -inf logits (the official greedy decoder bans [UNK]).
  """
  variables = {k: v for k, v in variables.items() if k != "cache"}
  memory = model.apply(variables, ctx["ctx_ids"], ctx["video"], ctx["ctx_mask"],
                       ctx["token_type_ids"], method=model.encode)
  mask = ctx["ctx_mask"]
  cache = attention.empty_cache(lambda: model.apply(variables, memory, mask, max_new_tokens,
                                           method=model.init_cache, mutable=["cache"]))
  banned = jnp.asarray(banned_ids, jnp.int32)

  def ban(logits):
    return logits.at[:, banned].set(-jnp.inf) if banned_ids else logits

  def start_fn():
    bos = jnp.full((memory.shape[0],), bos_id, jnp.int32)
    logits, mutated = model.apply({**variables, "cache": cache}, bos, 0, memory, mask,
                                  max_new_tokens, method=model.decode_step, mutable=["cache"])
    return ban(logits), mutated["cache"]

  def step_fn(state, tokens, t):
    logits, mutated = model.apply({**variables, "cache": state}, tokens, t, memory, mask,
                                  max_new_tokens, method=model.decode_step, mutable=["cache"])
    return ban(logits), mutated["cache"]

  return start_fn, step_fn
