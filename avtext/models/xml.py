"""XML: Cross-modal Moment Localization (TVR, Lei et al. 2020, sec. 4).

Inputs (per item; `avtext.tasks.xml` builds them):
  query      [Lq, Dq] token features (TVR: RoBERTa, 768-d), query_mask [Lq]
  video      [L, Dv] clip features (TVR: ResNet-152 + I3D, 3072-d), ctx_mask [L]
  sub        [L, Ds] subtitle features pooled on the same 1.5 s clip grid (768-d)
  (`context` = "video", "sub" or "video_sub" says which of video / sub exist)

Backbone (sec. 4.1; names of the official code, jayleicn/TVRetrieval
`crossmodal_moment_localization/model_xml.py`, in brackets):
  input projection  LN -> dropout -> Linear -> ReLU       [LinearLayer]
  positions         LN(x + P[pos]) -> dropout, one learned table per query and
                    one shared by the two context streams  [TrainablePositionalEncoding]
  Self-Encoder      one post-LN attention layer without feed-forward part:
                    LN(x + dropout(Linear(SelfAttention(x)))) (`SelfEncoder`, the
                    shared layer without its MLP)           [BertAttention]
  query             H_q = SelfEnc(E_q); modular attention a_m = softmax_r(w_m . h_r)
                    over the real tokens, q_m = sum_r a_mr h_r, m in {v, s}   (eq. 1)
  context           H^m_0 = SelfEnc_m(E_m); Cross-Encoder: LN(H^m_0 +
                    CrossAttn(H^m_0 -> H^other_0)) (no output Linear, no dropout on
                    the branch) then another Self-Encoder -> H^m_1
                                                            (cross_context_encoder)
  VR score          s_vr = mean_m max_l cos(H^m_0[l], q_m)  (eq. 4)
  query-clip        S = mean_m H^m_1 q_m                    (eq. 2)
  ConvSE            S_st = Conv1D_st(S), S_ed = Conv1D_ed(S): one input and one
                    output channel, kernel `conv_kernel_size` (5), 'same' padding,
                    no bias (eq. 3), over S as computed at every position, padded
                    clips included (official); P_st, P_ed = softmax over the real
                    clips.
  sliding windows    `span_head="sliding"`: TVR Fig. 6's baseline in place of ConvSE, the
                    clip logits S trained with BCE (inside / outside the moment) and
                    every span of the length prior scored by the mean of sigmoid(S)
  TEF               `tef=True` appends [l / n, (l + 1) / n] (n = real clips) to the
                    video and subtitle features, as the official option.

Choices where the paper and the official code differ (paper followed unless said):
- Eq. 2 uses q_m itself (the module's default); the official code first maps q_m
  through a Linear per stream (video_query_linear / sub_query_linear):
  `span_query_linear=True`, which configs/xml_tvr.py turns on: without it one of three
  demo seeds collapsed (BENCHMARKS.md, ConvSE vs the sliding window).
- The defaults compute the official function, so that official checkpoints import
  (`avtext.weights.official_xml`) and give the official outputs. Two choices of
  ours are named options (configs/xml_tvr.py variants `cross_linear`,
  `masked_convse`):
  `cross_output_linear=True`: the paper's Cross-Encoder has "a linear layer" after
    cross-attention (then dropout), the official one has none; ours keeps it.
  `masked_convse=True`: S is zeroed at padded clips before the convolution, so a
    video's logits do not depend on how far it was padded. Officially (default)
    the filters read S at padded positions, where the encoders' outputs are not
    zero: the last k//2 real clips' start/end logits depend on the padded length.
    The official cross mask (outer product of the two padding masks) also lets
    a padded position attend to every context position, padded ones included; the
    default reproduces that, since those positions reach the logits.
  Padded length: our pipeline always pads to max_ctx_len (fixed shapes), in
  training and in the corpus store, so under the official default a video's
  logits are still one function of the video (the official model padded to
  max_ctx_len); the corpus store keeps H_1 at padded clips for it
  (`vcmr.CorpusWriter(keep_padded_h1=True)`, set by the moments evaluator), so
  corpus encodings are stored once, VCMR over them equals a brute-force loop over
  videos (tests/test_tasks_xml.py) and scores the model's own span logits. The official
  code pads to the longest video of each batch (and its inference zero-fills the
  encodings beyond each encoding batch's longest), so its own logits vary with the
  batch.
- Single stream (context "video" or "sub"): the official model then has three
  self-encoders (<m>_encoder1..3, no cross-attention) and per-stream filters; ours
  has two (encoder0, encoder1) and the shared ConvSE, so the `video` / `sub` variants
  are not the official single-stream model and their checkpoints do not import.
- LayerNorm eps 1e-5 (PyTorch's default, which the official code uses); every
  Linear and embedding N(0, 0.02), biases 0; the ConvSE filters PyTorch's
  default U(-1/sqrt(k), 1/sqrt(k)).

Methods (all pure; `avtext.inference.vcmr` calls the last three on stored
encodings): `__call__` (training: VR scores of every query against every
video of the batch, and the start/end logits of each query on its own video),
`encode_query` -> q [B, M, D], `encode_context` -> (H_0, H_1) [B, M, L, D],
`span_logits(q, h1, mask)` -> start/end logits [..., L].

Precision and memory (`config.model.dtype` / `.remat` / `.attention`, `layers.Compute`):
the projections, encoders and Linears compute in `dtype`, as does eq. 2's product (with
float32 accumulation); parameters stay float32, LayerNorm statistics and every softmax
run in float32, and what the methods return (q, H_0, H_1, scores, logits) is float32.
ConvSE (two one-channel filters) stays float32. `remat` rematerializes each encoder layer.
"""
import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from avtext import ops
from avtext.losses import xml as xml_losses
from avtext.models import attention
from avtext.models import layers
from avtext.models import model_registry

Array = jax.Array
CONTEXTS = ("video", "sub", "video_sub")
NEG_INF = -1e10  # the official mask_logits value


def modalities(context: str) -> tuple[str, ...]:
  """The context streams, in the order of the M axis: ('video', 'sub') for video_sub."""
  if context not in CONTEXTS:
    raise ValueError(f"XML context={context!r}; expected one of {CONTEXTS}")
  return tuple(m for m in ("video", "sub") if m in context.split("_"))


def masked_logits(x: Array, mask: Array) -> Array:
  return jnp.where(mask.astype(bool), x, NEG_INF)


def tef(mask: Array) -> Array:
  """[..., L, 2] temporal endpoint features [l / n, (l + 1) / n], 0 at padding."""
  n = jnp.maximum(jnp.sum(mask, axis=-1, keepdims=True), 1).astype(jnp.float32)
  pos = jnp.arange(mask.shape[-1], dtype=jnp.float32)
  out = jnp.stack([pos / n, (pos + 1) / n], axis=-1)
  return out * mask[..., None]


class _Sublayer(nn.Module):
  """What the input projection and the position table share: dropout and its masks,
  the LayerNorm epsilon, the compute dtype, the backend traced for (`ops.platform`)."""
  dropout_rate: float
  layer_norm_eps: float
  dropout_masks: str = "jax"
  dtype: Any = jnp.float32
  backend: str | None = None

  def norm(self, x: Array) -> Array:
    return nn.LayerNorm(epsilon=self.layer_norm_eps, dtype=self.dtype, name="norm")(x)

  def drop(self, x: Array, deterministic: bool) -> Array:
    return attention.dropout(x, self.dropout_rate, deterministic=deterministic,
                             masks=self.dropout_masks)


class _InputProjection(_Sublayer, kw_only=True):
  """LN -> dropout -> Linear -> ReLU (the official LinearLayer); the Linear's kernel
  gradient in the faster orientation (`ops.dense_matmul`)."""
  features: int

  @nn.compact
  def __call__(self, x: Array, *, deterministic: bool) -> Array:
    x = self.drop(self.norm(x), deterministic)
    return nn.relu(nn.Dense(self.features, kernel_init=nn.initializers.normal(0.02),
                            dtype=self.dtype,
                            dot_general=functools.partial(ops.dense_dot_general,
                                                          backend=self.backend),
                            name="dense")(x))


class _Positions(_Sublayer, kw_only=True):
  """LN(x + P[:L]) -> dropout, P learned [max_len, D] (its gradient, the sum over the
  batch, a product with ones: `ops.broadcast_leading`)."""
  max_len: int

  @nn.compact
  def __call__(self, x: Array, *, deterministic: bool) -> Array:
    if x.shape[-2] > self.max_len:
      raise ValueError(f"XML positions: {x.shape[-2]} steps exceed the table's {self.max_len} "
                       "(config.model.max_ctx_len / max_query_len)")
    table = self.param("embedding", nn.initializers.normal(0.02),
                       (self.max_len, x.shape[-1]), jnp.float32)
    rows = ops.broadcast_leading(table[:x.shape[-2]].astype(x.dtype), x.shape[:-2],
                                backend=self.backend)
    return self.drop(self.norm(x + rows), deterministic)


def _conv_init(key, shape, dtype=jnp.float32):
  bound = 1.0 / jnp.sqrt(shape[0] * shape[1])  # PyTorch Conv1d default, fan_in = k * 1
  return jax.random.uniform(key, shape, dtype, -bound, bound)


class SelfEncoder(layers.EncoderBlock):
  """The Self-Encoder: the shared post-LN layer without its feed-forward part (`mlp_dim`
  unused), LN(x + dropout(Linear(SelfAttention(x)))) (TVR sec. 4.1)."""

  def _feed_forward(self, width: int) -> None:
    del width
    return None


class CrossEncoder(SelfEncoder):
  """The official Cross-Encoder: LN(x + CrossAttn(x, c)), cross-attention only, the
  concatenated heads straight into the residual (no output Linear, no dropout on the
  branch; attention-probability dropout stays).

  additive_mask: True, the official cross mask (1 - m_q m_k) * -10000 added to the
  logits in float32 (m_q: the call's padding_mask, m_k: its context_mask): real rows
  as a key-padding mask up to float rounding, while a padded query row attends to every
  context position, padded ones included (their outputs reach ConvSE); always the
  materialized "xla" attention. False: a key-padding mask (any attention implementation).
  """
  additive_mask: bool = True
  SELF_ATTENTION = False
  OUTPUT_LINEAR = False

  def _attention(self, name: str, *, output_projection: bool = True) -> attention.Attention:
    del output_projection
    return super()._attention(name, output_projection=self.OUTPUT_LINEAR)

  def _cross_bias(self, padding_mask: Array | None, context_mask: Array | None
                  ) -> tuple[Array | None, Array | None]:
    if not self.additive_mask:
      return None, context_mask
    if padding_mask is None or context_mask is None:
      raise ValueError("XML's CrossEncoder(additive_mask=True) needs padding_mask and "
                       "context_mask (the official cross mask is their outer product)")
    m_q = padding_mask.astype(jnp.float32)[:, None, :, None]
    m_k = context_mask.astype(jnp.float32)[:, None, None, :]
    return (1.0 - m_q * m_k) * -10000.0, None  # the bias masks the keys


class LinearCrossEncoder(CrossEncoder):
  """Ours (`cross_output_linear`): the paper's Cross-Encoder, "a linear layer" after
  cross-attention, then dropout on the branch."""
  OUTPUT_LINEAR = True


@dataclasses.dataclass(frozen=True)
class Dropout:
  """XML's dropout: `hidden` on the encoders' branches and attention probabilities
  [drop], `input` on the input projections and positions [input_drop]; masks "jax" or
  "hash" (same distribution, cheaper on CPUs: `attention.dropout`)."""
  hidden: float = 0.1
  input: float = 0.1
  masks: str = "jax"


@dataclasses.dataclass(frozen=True)
class Variants:
  """The forms beside the official model (module docstring): cross_output_linear (ours:
  the paper's Linear after cross-attention), span_head ("convse", or "sliding": TVR
  Fig. 6's sliding-window baseline), use_tef (the official TEF option)."""
  cross_output_linear: bool = False
  span_head: str = "convse"
  use_tef: bool = False

  def __post_init__(self):
    if self.span_head not in ("convse", "sliding"):
      raise ValueError(f"XML span_head={self.span_head!r}; expected 'convse' or 'sliding'")


class ConvSE(nn.Module):
  """Start and end filters over the query-clip similarity S [..., L] (TVR eq. 3).

  Parameters: start_kernel, end_kernel [k, 1, 1] (flax Conv layout). S is
  read as given at every position ('same' zero padding beyond the ends; with
  XML(masked_convse=True) the caller zeroes padded clips first); the outputs are
  logits before the masked softmax.
  """
  kernel_size: int = 5

  @nn.compact
  def __call__(self, similarity: Array) -> tuple[Array, Array]:
    if self.kernel_size % 2 != 1:
      raise ValueError(f"ConvSE kernel_size must be odd ('same' padding), got {self.kernel_size}")
    lead = similarity.shape[:-1]
    x = similarity.reshape(-1, similarity.shape[-1], 1)
    conv = dict(features=1, kernel_size=(self.kernel_size,), padding="SAME", use_bias=False,
                kernel_init=_conv_init)
    start = nn.Conv(**conv, name="start")(x)[..., 0]
    end = nn.Conv(**conv, name="end")(x)[..., 0]
    return start.reshape(*lead, -1), end.reshape(*lead, -1)


class XML(nn.Module):
  """XML (module docstring). Defaults: the official TVR ones."""
  context: str = "video_sub"
  hidden_size: int = 256
  num_heads: int = 4
  max_ctx_len: int = 100
  max_query_len: int = 30
  conv_kernel_size: int = 5
  span_query_linear: bool = False
  masked_convse: bool = False  # ours: S zeroed at padded clips before ConvSE
  layer_norm_eps: float = 1e-5
  dropout: Dropout = Dropout()
  variants: Variants = Variants()
  compute: layers.Compute = layers.Compute()  # dtype, remat, attention, backend

  def setup(self):
    self.streams = modalities(self.context)
    init = nn.initializers.normal(0.02)
    dtype, backend, drop = self.compute.dtype, self.compute.backend, self.dropout
    proj = dict(features=self.hidden_size, dropout_rate=drop.input,
                layer_norm_eps=self.layer_norm_eps, dropout_masks=drop.masks,
                dtype=dtype, backend=backend)
    pos = dict(dropout_rate=drop.input, layer_norm_eps=self.layer_norm_eps,
               dropout_masks=drop.masks, dtype=dtype, backend=backend)
    block = dict(num_heads=self.num_heads, mlp_dim=0, pre_norm=False,
                 layer_norm_eps=self.layer_norm_eps,
                 dropout=layers.Dropout(drop.hidden, drop.hidden, masks=drop.masks),
                 kernel_init=init, compute=self.compute)
    self.query_proj = _InputProjection(**proj)
    self.query_pos = _Positions(max_len=self.max_query_len, **pos)
    self.query_encoder = SelfEncoder(**block)
    self.modular = nn.Dense(len(self.streams), use_bias=False, kernel_init=init, dtype=dtype)
    self.ctx_pos = _Positions(max_len=self.max_ctx_len, **pos)  # shared by the streams (official)
    self.ctx_proj = {m: _InputProjection(**proj, name=f"{m}_proj") for m in self.streams}
    self.encoder0 = {m: SelfEncoder(**block, name=f"{m}_encoder0") for m in self.streams}
    if len(self.streams) == 2:
      # Official: `CrossEncoder`, with the official additive cross mask (a padded row
      # attends to every context position, to the float; its outputs reach ConvSE).
      # Ours: cross_output_linear, the paper's Linear + dropout (`LinearCrossEncoder`);
      # masked_convse: padded rows never reach an output, so a key-padding mask.
      cross = LinearCrossEncoder if self.variants.cross_output_linear else CrossEncoder
      self.cross = {m: cross(**block, cross_attention=True,
                             additive_mask=not self.masked_convse, name=f"{m}_cross")
                    for m in self.streams}
    self.encoder1 = {m: SelfEncoder(**block, name=f"{m}_encoder1") for m in self.streams}
    if self.span_query_linear:
      self.span_query = {m: nn.Dense(self.hidden_size, kernel_init=init, dtype=dtype,
                                     name=f"{m}_span_query") for m in self.streams}
    if self.variants.span_head == "convse":
      self.convse = ConvSE(self.conv_kernel_size)

  # ------------------------------------------------------------ encoders
  def encode_query(self, query: Array, query_mask: Array, *, train: bool = False) -> Array:
    """Modular query vectors q [B, M, D] (eq. 1); M follows `modalities(context)`."""
    det = not train
    x = self.query_pos(self.query_proj(query, deterministic=det), deterministic=det)
    h = self.query_encoder(x, query_mask, deterministic=det)  # [B, Lq, D]
    h = h.astype(jnp.float32)  # the softmax and its weighted sum (small) in float32
    scores = masked_logits(self.modular(h).astype(jnp.float32),
                           query_mask[..., None])  # [B, Lq, M]
    attn = jax.nn.softmax(scores, axis=-2)
    return jnp.einsum("blm,bld->bmd", attn, h)

  def encode_context(self, ctx: dict, ctx_mask: Array, *, train: bool = False
                     ) -> tuple[Array, Array]:
    """(H_0, H_1), each [B, M, L, D]: the Self- and Cross-Encoder outputs of every stream."""
    det = not train
    h0 = {}
    for m in self.streams:
      x = ctx[m]
      if self.variants.use_tef:
        x = jnp.concatenate([x, tef(ctx_mask).astype(x.dtype)], axis=-1)
      x = self.ctx_pos(self.ctx_proj[m](x, deterministic=det), deterministic=det)
      h0[m] = self.encoder0[m](x, ctx_mask, deterministic=det)
    h1 = {}
    for m in self.streams:
      x = h0[m]
      if len(self.streams) == 2:
        other = h0["sub" if m == "video" else "video"]
        x = self.cross[m](x, ctx_mask, context=other, context_mask=ctx_mask,
                          deterministic=det)
      h1[m] = self.encoder1[m](x, ctx_mask, deterministic=det)
    stack = lambda h: jnp.stack([h[m] for m in self.streams], axis=1).astype(  # noqa: E731
        jnp.float32)
    return stack(h0), stack(h1)

  def span_logits(self, q: Array, h1: Array, ctx_mask: Array) -> dict[str, Array]:
    """Span logits of queries q [..., M, D] on contexts h1 [..., M, L, D]: ConvSE's
    {"start", "end"} [..., L], or with span_head="sliding" {"clip"}: the clip logits S
    (eq. 2) whose sigmoid the sliding windows average.

    Leading dims broadcast (q [Q, 1, M, D] against h1 [Q, V, M, L, D] scores Q
    queries on V videos each). Padded clips get NEG_INF.
    """
    if self.span_query_linear:
      q = jnp.stack([self.span_query[m](q[..., i, :]) for i, m in enumerate(self.streams)],
                    axis=-2)
    dtype = self.compute.dtype
    if dtype == jnp.float32:
      sim = jnp.einsum("...md,...mld->...ml", q, h1)
    else:  # in the compute dtype, accumulated and returned in float32
      sim = jnp.einsum("...md,...mld->...ml", q.astype(dtype), h1.astype(dtype),
                       preferred_element_type=jnp.float32)
    sim = jnp.mean(sim, axis=-2)  # eq. 2
    if self.variants.span_head == "sliding":
      return {"clip": masked_logits(sim, ctx_mask)}
    if self.masked_convse:
      sim = sim * ctx_mask.astype(sim.dtype)
    start, end = self.convse(sim)
    return {"start": masked_logits(start, ctx_mask), "end": masked_logits(end, ctx_mask)}

  # ------------------------------------------------------------ training
  def __call__(self, query: Array, query_mask: Array, ctx: dict, ctx_mask: Array, *,
               train: bool = False) -> dict[str, Array]:
    """Batch of B (query, own video) pairs -> {"vr_scores" [B, B] (query i vs video j),
    "query" [B, M, D], and `span_logits` of query i on video i [B, L] ("start", "end"
    or "clip")}."""
    q = self.encode_query(query, query_mask, train=train)
    h0, h1 = self.encode_context(ctx, ctx_mask, train=train)
    vr = xml_losses.video_retrieval_scores(q, h0, ctx_mask)
    return {"vr_scores": vr, "query": q, **self.span_logits(q, h1, ctx_mask)}


# config.model keys that fill XML's groups: key -> (XML field, the group's field)
_GROUPED_KEYS = {"dropout_rate": ("dropout", "hidden"), "input_dropout_rate": ("dropout", "input"),
                 "dropout_masks": ("dropout", "masks"),
                 **{k: ("variants", k) for k in ("cross_output_linear", "span_head", "use_tef")}}


@model_registry.register_model("xml")
def xml_from_config(cfg: ml_collections.ConfigDict) -> XML:
  """config.model: context, hidden_size, num_heads, max_ctx_len, max_query_len,
  dropout_rate, input_dropout_rate, layer_norm_eps, conv_kernel_size,
  span_query_linear, cross_output_linear, masked_convse, use_tef, span_head, dropout_masks
  (XML's fields and those of its `Dropout` and `Variants`; defaults the official values);
  dtype, remat, attention (`model_registry.compute_from_config`)."""
  plain = [f for f in XML.__dataclass_fields__
           if f not in ("parent", "name", "compute", *{g for g, _ in _GROUPED_KEYS.values()})]
  keys = plain + list(_GROUPED_KEYS)
  unknown = sorted(set(cfg.keys()) - set(keys) - {"name", *model_registry.COMPUTE_FIELDS})
  if unknown:
    raise ValueError(f"config.model: unknown XML field(s) {unknown}; XML takes {keys}")
  kwargs: dict[str, Any] = {k: cfg[k] for k in plain if cfg.get(k) is not None}
  groups: dict[str, dict[str, Any]] = {"dropout": {}, "variants": {}}
  for key, (group, field) in _GROUPED_KEYS.items():
    if cfg.get(key) is not None:
      groups[group][field] = cfg[key]
  modalities(kwargs.get("context", "video_sub"))
  return XML(**kwargs, dropout=Dropout(**groups["dropout"]),
             variants=Variants(**groups["variants"]),
             compute=model_registry.compute_from_config(cfg))
