"""Multi-head dot-product attention, its masks, its autoregressive cache and kernels.

`Attention` has the parameters and numerics of flax's
`nn.MultiHeadDotProductAttention`, whose [D, H, D/H] query/key/value kernels are
the layout of ViT/scenic checkpoints, plus an autoregressive cache;
`attention_core` is the softmax(QK^T)V of every implementation
(`ATTENTION_IMPLEMENTATIONS`). `avtext.models.layers.EncoderBlock` composes it.

Masks are boolean, True where a query may attend to a key, and broadcastable
to the attention logits [B, heads, L_q, L_kv]. They are built only by
`make_padding_mask`, `make_causal_mask` and `make_prefix_lm_mask` and joined
by `combine_masks`; `EncoderBlock(causal=True)` is a shortcut for
`mask=make_causal_mask(L)`. A mask always describes the whole sequence, also
while decoding: the cache picks the rows of the positions being computed.

Autoregressive cache (`decode=True`, self-attention only). Each `Attention`
keeps, in the flax "cache" collection,
  cached_key, cached_value  [B, H, max_len, D/H]
  cache_index               int32 [], positions written so far.
The cache is created the flax way, by a decode=True call on a [B, max_len, D]
input while no cache exists: `block.init(rng, x, decode=True, ...)` or
`block.apply({"params": p}, x, decode=True, mutable=["cache"])`; that call
computes ordinary attention and leaves the cache empty (zeros, index 0; so
zeros shaped by `jax.eval_shape` of that call are the same cache). Every later
call with decode=True and mutable=["cache"] takes the next T positions (a
prefill of any length P, then T = 1 per generated token), writes their keys
and values at cache_index with `dynamic_update_slice`, and attends over the
whole max_len buffer, restricted to the positions written so far and to rows
[cache_index, cache_index + T) of the given masks ([.., max_len, max_len] or
broadcastable over queries; padding masks are [B, max_len]). Shapes never
change, so a jitted step compiles once per (B, T). Decoding reproduces the
full-sequence outputs when every mask row i allows no key j >= max(i + 1, P):
causal masks with any P, prefix-LM masks when the prefill holds the whole
prefix (P >= max prefix_length). Rows that allow no key at all (padded
queries) are meaningless either way and may differ. Writing past max_len
cannot be detected under jit (the slices clamp); callers stop at max_len.
Cross-attention keys and values are recomputed from `context` at every call.
"""
import functools
import math
from typing import Any, Callable

import flax.linen as nn
from flax.linen.dtypes import promote_dtype
import jax
from jax.ad_checkpoint import checkpoint_name
import jax.numpy as jnp

from avtext import ops
from avtext.models import fused_attention

Array = jax.Array
Initializer = Callable[..., Array]

# "xla": the materialized [B, H, L_q, L_kv] softmax (flax's dot_product_attention).
# "blocked": the same softmax over query blocks of `ATTENTION_BLOCK` rows, each block
#   rematerialized in the backward pass, so only one block's logits are ever live
#   (memory-efficient attention in plain JAX; any backend).
# "cudnn": `jax.nn.dot_product_attention(implementation="cudnn")`, the fused flash
#   kernel on NVIDIA GPUs (bfloat16/float16 only).
# "flash_tpu": the Pallas flash-attention kernel for TPUs
#   (jax.experimental.pallas.ops.tpu.flash_attention): logits never leave on-chip memory.
#   Masks must be key-padding masks ([B, 1, 1, L_kv]) or none.
# "splash_tpu": the Pallas splash-attention kernel for TPUs
#   (jax.experimental.pallas.ops.tpu.splash_attention), the same masks, its backward one
#   fused dQ/dK/dV kernel (`fused_attention.splash_block_sizes`).
# The fused kernels have no attention dropout and the TPU ones take no per-query masks
# (causal, prefix-LM; cuDNN takes any mask): those calls use "blocked", the same
# function in bounded memory.
# Both pad the sequences to a multiple of `fused_attention.FUSED_PAD` and mask the
#   padded keys (`fused_attention`).
# "auto": the fused kernel of the platform the program is traced for
#   (`ops.platform` of the module's `backend`, so `avtext.aot` picks its target's):
#   "splash_tpu" on a TPU
#   (its fused backward: 5 products where the flash kernel's two backward kernels run 7),
#   "cudnn" on a GPU (bfloat16 / float16 compute; "xla" for float32, which cuDNN's
#   kernel does not take), "xla" on a CPU (`resolve_implementation`).
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "blocked", "cudnn", "flash_tpu", "splash_tpu")
TPU_KERNELS = ("flash_tpu", "splash_tpu")
ATTENTION_BLOCK = 512


def make_padding_mask(padding_mask: Array, length: int | None = None) -> Array:
  """Key mask from per-token padding.

  Only keys are masked: queries at padded positions still attend to the real
  tokens, which keeps their (ignored) outputs finite and equal to HF BERT's.

  Args:
    padding_mask: [B, L_kv], nonzero for real tokens.
    length: expected L_kv, checked when given.

  Returns:
    bool [B, 1, 1, L_kv].
  """
  if padding_mask.ndim != 2 or (length is not None and
                                padding_mask.shape[1] != length):
    want = f"[batch, {length}]" if length is not None else "[batch, length]"
    raise ValueError(f"padding mask must be {want}, got {padding_mask.shape}")
  return (padding_mask > 0)[:, None, None, :]


def make_causal_mask(length: int) -> Array:
  """Autoregressive mask: position i attends to positions j <= i.

  Returns:
    bool [1, 1, L, L], lower triangular.
  """
  return jnp.tril(jnp.ones((length, length), jnp.bool_))[None, None]


def make_prefix_lm_mask(prefix_length: Array, length: int) -> Array:
  """Prefix-LM mask (UniLM, T5's prefix LM): bidirectional prefix, causal rest.

  The first p positions attend to each other in both directions; position
  i >= p attends to j <= i, so it sees the whole prefix. p = 0 is the causal
  mask, p = L full attention.

  Args:
    prefix_length: int [B], p per example.
    length: L.

  Returns:
    bool [B, 1, L, L].
  """
  prefix_length = jnp.asarray(prefix_length)
  if prefix_length.ndim != 1:
    raise ValueError(
        f"prefix_length must be [batch], got shape {prefix_length.shape}")
  in_prefix = jnp.arange(length)[None, :] < prefix_length[:, None]  # [B, L]
  return jnp.logical_or(make_causal_mask(length),
                        in_prefix[:, None, None, :])


def combine_masks(*masks: Array | None) -> Array | None:
  """Logical AND of masks broadcastable to each other; None entries skipped.

  Returns:
    The broadcast bool mask, or None when every mask is None.
  """
  present = [jnp.asarray(m, jnp.bool_) for m in masks if m is not None]
  if not present:
    return None
  return functools.reduce(jnp.logical_and, present)


def _rows(mask: Array | None, start: Array, length: int,
          max_len: int) -> Array | None:
  """Rows [start, start + length) of a whole-sequence mask [.., max_len, K]."""
  if mask is None:
    return None
  if mask.ndim < 2 or mask.shape[-1] not in (1, max_len):
    raise ValueError(
        f"with decode=True a mask must cover the whole cache, [..., max_len "
        f"or 1, {max_len} or 1], got {mask.shape}")
  if mask.shape[-2] == 1:
    return mask
  if mask.shape[-2] != max_len:
    raise ValueError(
        f"with decode=True the mask's query axis must be the whole sequence "
        f"({max_len}) or 1, got {mask.shape}; the cache selects the rows")
  return jax.lax.dynamic_slice_in_dim(mask, start, length, axis=mask.ndim - 2)


DROPOUT_MASKS = ("jax", "hash")


def dropout(x: Array, rate: float, *, deterministic: bool, masks: str = "jax",
            broadcast_dims: tuple[int, ...] = ()) -> Array:
  """`nn.Dropout(rate, broadcast_dims)(x)` inside the calling compact module.

  masks="jax" is flax's own layer (`jax.random.bernoulli`, the default PRNG);
  "hash" draws the keep-mask with `ops.hash_bernoulli` from the same "dropout"
  rng stream: the same distribution at a fraction of the cost on CPUs, where
  threefry masks are a large share of a small model's step.
  """
  if masks not in DROPOUT_MASKS:
    raise ValueError(f"dropout masks must be one of {DROPOUT_MASKS}, got {masks!r}")
  if masks == "jax":
    return nn.Dropout(rate, broadcast_dims=broadcast_dims)(x, deterministic)
  return HashDropout(rate, broadcast_dims)(x, deterministic)


class HashDropout(nn.Module):
  """`nn.Dropout` with `ops.hash_bernoulli` masks (see `dropout`)."""
  rate: float
  broadcast_dims: tuple[int, ...] = ()

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    if deterministic or self.rate == 0.0:
      return x
    if self.rate == 1.0:
      return jnp.zeros_like(x)
    dims = {d % x.ndim for d in self.broadcast_dims}
    shape = [1 if i in dims else n for i, n in enumerate(x.shape)]
    keep = ops.hash_bernoulli(self.make_rng("dropout"), 1.0 - self.rate, shape)
    return jnp.where(keep, x / (1.0 - self.rate), jnp.zeros((), x.dtype)).astype(x.dtype)


class Attention(nn.Module):
  """Multi-head dot-product attention with an optional autoregressive cache.

  Parameters and numerics are those of flax's `nn.MultiHeadDotProductAttention`
  with broadcast_dropout=False, so its checkpoints load unchanged: queries are
  scaled by 1/sqrt(D/H), masked logits are set to the dtype's minimum (a
  masked key gets exactly zero weight unless the whole row is masked), the
  softmax runs in float32 and dropout drops probabilities independently per
  example, head, query and key. It is our own module because flax's decode
  mode takes one query per call, and a prefill needs a block of queries.

  Attributes:
    num_heads: H; the query width D must be divisible by it.
    dropout_rate: dropout on attention probabilities.
    dropout_masks: "jax" (flax's masks) or "hash" (`dropout`).
    kernel_init: initializer of the four kernels (biases start at zero).
    dtype: computation dtype; parameters stay float32.
    implementation: the attention core, one of `ATTENTION_IMPLEMENTATIONS`
      (sow_weights and hash dropout masks always use "xla", which materializes
      the probabilities).
    output_projection: False returns the heads concatenated [B, L_q, D] without
      the output Linear ("out" has no parameters then): the official TVR
      cross-encoder's and TVC decoder's attentions (BertSelfAttention alone).
    backend: the platform the program is traced for (`ops.platform`; None: JAX's
      default backend): what "auto" stands for, and the CPU's projection gradient.
  """
  num_heads: int
  dropout_rate: float = 0.0
  dropout_masks: str = "jax"
  kernel_init: Initializer = nn.initializers.lecun_normal()
  dtype: Any = jnp.float32
  implementation: str = "xla"
  output_projection: bool = True
  backend: str | None = None

  @nn.compact
  def __call__(self, inputs_q: Array, inputs_kv: Array | None = None, *,
               mask: Array | None = None, causal: bool = False,
               decode: bool = False, deterministic: bool,
               sow_weights: bool = False, bias: Array | None = None,
               prefix_lm: int = 0) -> Array:
    """Attends from `inputs_q` to `inputs_kv`.

    Args:
      inputs_q: [B, L_q, D].
      inputs_kv: [B, L_kv, D_kv]; None for self-attention on inputs_q.
      mask: bool, broadcastable to [B, H, L_q, L_kv], True = may attend. With
        decode, the whole sequence's mask [.., max_len or 1, max_len or 1].
      causal: add `make_causal_mask` (self-attention only).
      decode: read and extend the cache (self-attention only; see the module
        docstring).
      deterministic: disables attention dropout.
      sow_weights: store the probabilities [B, H, L_q, L_kv] as the
        'intermediates' entry 'attention_weights'.
      bias: float logits term broadcastable to [B, H, L_q, L_kv], added before
        `mask` (`attention_core`); not with decode.
      prefix_lm: P > 0: a prefix LM over the first P positions (`attention_core`), in
        place of a `make_prefix_lm_mask` mask, so the fused kernels can take the prefix;
        self-attention without decode or causal, and `mask` masks keys only.

    Returns:
      [B, L_q, D].
    """
    features = inputs_q.shape[-1]
    if features % self.num_heads:
      raise ValueError(f"width {features} is not divisible by num_heads="
                       f"{self.num_heads}")
    is_self = inputs_kv is None
    if decode and bias is not None:
      raise ValueError("Attention: bias is not supported with decode=True")
    if not is_self and (causal or decode or prefix_lm):
      raise ValueError("causal masking, prefix_lm and decode=True apply to "
                       "self-attention only (inputs_kv=None)")
    if prefix_lm and (causal or decode):
      raise ValueError("prefix_lm replaces causal masking and takes no decode=True "
                       "(decode with a make_prefix_lm_mask mask)")
    if is_self:
      inputs_kv = inputs_q
    dense = functools.partial(
        nn.DenseGeneral, features=(self.num_heads, features // self.num_heads),
        kernel_init=self.kernel_init, dtype=self.dtype)
    projections = [dense(name=n) for n in ("query", "key", "value")]
    kernel = resolve_implementation(self.implementation, self.dtype, self.backend)
    if (FLASH_HEADS_FIRST and not (self.is_initializing() or decode or causal
                                   or sow_weights or bias is not None)
        and (deterministic or self.dropout_rate == 0) and kernel in TPU_KERNELS
        and (not prefix_lm or kernel == "splash_tpu")
        and (mask is None or _as_4d(mask).shape[1:3] == (1, 1))):
      out = nn.DenseGeneral(features, axis=(-2, -1), kernel_init=self.kernel_init,
                            dtype=self.dtype, name="out") if self.output_projection else None
      return _flash_heads_first(projections, out, inputs_q, inputs_kv, mask, self.dtype,
                                kernel, prefix_lm)
    if self.is_initializing() or decode:
      # Initialization creates the parameters, as flax's attention does. Decoding reads
      # each kernel once per call anyway; the fused projection's stacked [D, 3, H, D/H]
      # kernel would be a new buffer written on every generate call (85 MB for GPT-2
      # 117M), so one matmul per kernel, the same products.
      query = projections[0](inputs_q)  # [B, L_q, H, D/H]
      key = projections[1](inputs_kv)  # [B, L_kv, H, D/H]
      value = projections[2](inputs_kv)
    elif is_self:
      query, key, value = _fused_projection(projections, inputs_q, self.dtype, self.backend)
    else:
      query, = _fused_projection(projections[:1], inputs_q, self.dtype, self.backend)
      key, value = _fused_projection(projections[1:], inputs_kv, self.dtype, self.backend)

    start = None
    if decode:
      key, value, start = self._extend_cache(key, value)
    # Over the whole cache when decoding: masks are whole-sequence masks.
    masks = [mask, make_causal_mask(key.shape[1]) if causal else None]
    if start is not None:
      length, max_len = query.shape[1], key.shape[1]
      written = jnp.arange(max_len) < start + length
      masks = [_rows(m, start, length, max_len) for m in masks]
      masks.append(written[None, None, None, :])
    mask = combine_masks(*masks)

    if self.dropout_masks != "jax" and not deterministic and self.dropout_rate > 0:
      if prefix_lm:
        mask = combine_masks(mask, make_prefix_lm_mask(jnp.full((1,), prefix_lm),
                                                       query.shape[1]))
      weights = nn.dot_product_attention_weights(
          query, key, bias=bias, mask=mask, deterministic=True, dtype=self.dtype,
          force_fp32_for_softmax=True, module=self if sow_weights else None)
      weights = dropout(weights, self.dropout_rate, deterministic=False,
                        masks=self.dropout_masks)
      x = jnp.einsum("...hqk,...khd->...qhd", weights, value)
    else:
      dropout_rng = None
      if not deterministic and self.dropout_rate > 0:
        dropout_rng = self.make_rng("dropout")
      implementation = "xla" if sow_weights else resolve_implementation(
          self.implementation, self.dtype, self.backend)
      x = attention_core(query, key, value, mask, implementation=implementation,
                         dropout_rng=dropout_rng, dropout_rate=self.dropout_rate,
                         dtype=self.dtype, module=self if sow_weights else None,
                         bias=bias, prefix_lm=prefix_lm)
    x = checkpoint_name(x, "attention_out")  # `layers.REMAT_POLICIES`
    if not self.output_projection:
      return x.reshape(*x.shape[:-2], features)
    return nn.DenseGeneral(features, axis=(-2, -1),
                           kernel_init=self.kernel_init, dtype=self.dtype,
                           name="out")(x)

  def _extend_cache(self, key: Array,
                    value: Array) -> tuple[Array, Array, Array | None]:
    """Writes this call's keys/values [B, T, H, D/H] into the cache.

    Returns:
      (keys, values, start): the whole buffers as [B, max_len, H, D/H] and the
      index of this call's first position; when the call creates the cache,
      the inputs unchanged and start None.
    """
    exists = self.has_variable("cache", "cached_key")
    # Heads-major [B, H, max_len, D/H]: the layout of the batched (B, H) products of
    # attention, so a decode step reads the cache in place instead of transposing it.
    shape = (key.shape[0], key.shape[2], key.shape[1], key.shape[3])
    cached_key = self.variable("cache", "cached_key", jnp.zeros, shape, key.dtype)
    cached_value = self.variable("cache", "cached_value", jnp.zeros, shape, value.dtype)
    index = self.variable("cache", "cache_index",
                          lambda: jnp.zeros((), jnp.int32))
    if not exists:
      return key, value, None
    batch, heads, max_len, depth = cached_key.value.shape
    heads_first = lambda x: jnp.swapaxes(x, 1, 2)
    if key.shape[0] != batch or key.shape[1] > max_len or key.shape[2:] != (heads, depth):
      raise ValueError(
          f"decode step keys {key.shape} do not fit the cache "
          f"{cached_key.value.shape} ([batch, heads, max_len, head_dim])")
    start = index.value
    corner = (0, 0, start, 0)
    cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, heads_first(key),
                                                    corner)
    cached_value.value = jax.lax.dynamic_update_slice(cached_value.value,
                                                      heads_first(value), corner)
    index.value = start + key.shape[1]
    return heads_first(cached_key.value), heads_first(cached_value.value), start


def _fused_projection(projections: list[nn.Module], x: Array, dtype: Any,
                      backend: str | None = None) -> list[Array]:
  """The `nn.DenseGeneral` projections [D, H, D/H] of the same input `x` [.., D] as one
  matmul over their kernels side by side (one [D, n H D/H] GEMM instead of n narrow ones,
  and one for each gradient; `ops.dense_matmul`, whose kernel gradient takes the faster
  orientation on CPUs): the same parameters and function, each output element the same
  dot product over D."""
  params = [p.variables["params"] for p in projections]
  kernel = jnp.stack([p["kernel"] for p in params], axis=1)  # [D, n, H, D/H]
  bias = jnp.stack([p["bias"] for p in params])  # [n, H, D/H]
  x, kernel, bias = promote_dtype(x, kernel, bias, dtype=dtype)
  y = ops.dense_matmul(x, kernel.reshape(kernel.shape[0], -1), backend=backend).reshape(
      *x.shape[:-1], *kernel.shape[1:]) + bias
  # Named for the remat policies that keep the projections (`layers.REMAT_POLICIES`).
  y = checkpoint_name(y, "qkv")
  return [y[..., i, :, :] for i in range(len(projections))]  # each [.., H, D/H]


# The TPU path's layout lever: the projections write the Pallas kernel's [B, H, L, d]
# layout on sequences padded to `fused_attention.FUSED_PAD` and the output projection
# reads it, instead of slicing a fused [B, L, 3, H, d] projection, transposing and
# padding each of q, k, v and transposing and slicing the output back (each a copy
# through HBM). The same parameters and function (tests/test_models_precision.py).
FLASH_HEADS_FIRST = True


def _flash_heads_first(projections: list[nn.Module], out: nn.Module | None, inputs_q: Array,
                       inputs_kv: Array, mask: Array | None, dtype: Any,
                       implementation: str = "flash_tpu", prefix_lm: int = 0) -> Array:
  """Attention through `fused_attention.tpu_heads_first` with the projections in
  its layout: `projections` the query, key and value `DenseGeneral`s ([D, H, d] kernels),
  `out` the output one ([H, d, D]; None: the heads concatenated); `mask` keys only;
  `prefix_lm` P > 0: a prefix LM in the splash kernel's own mask (the rows after the
  prefix too: no split into the kernel's rows and materialized ones)."""
  batch, length = inputs_q.shape[:2]
  kv_length = inputs_kv.shape[1]
  pad = lambda x: jnp.pad(x, ((0, 0), (0, -x.shape[1] % fused_attention.FUSED_PAD), (0, 0)))
  padded_q = pad(inputs_q)
  padded_kv = padded_q if inputs_kv is inputs_q else pad(inputs_kv)

  def project(module, x):  # [B, L', D] -> [B, H, L', d]
    p = module.variables["params"]
    x, kernel, b = promote_dtype(x, p["kernel"], p["bias"], dtype=dtype)
    y = jnp.einsum("bld,dhk->bhlk", x, kernel) + b[None, :, None, :]
    return checkpoint_name(y, "qkv")  # `layers.REMAT_POLICIES`

  query = project(projections[0], padded_q)
  key, value = project(projections[1], padded_kv), project(projections[2], padded_kv)
  valid = fused_attention.key_valid(_as_4d(mask), batch, kv_length, key.shape[2])
  x = fused_attention.tpu_heads_first(query, key, value, valid, implementation, prefix_lm)
  x = checkpoint_name(x, "attention_out")  # `layers.REMAT_POLICIES`
  if out is None:
    return jnp.swapaxes(x, 1, 2)[:, :length].reshape(batch, length, -1)
  p = out.variables["params"]
  x, kernel, b = promote_dtype(x, p["kernel"], p["bias"], dtype=dtype)
  return (jnp.einsum("bhlk,hkd->bld", x, kernel) + b)[:, :length]


def _attention_normalized_last(query: Array, key: Array, value: Array, mask: Array | None,
                               dtype: Any) -> Array:
  """flax's `dot_product_attention` (no bias, dropout or sown weights) with the softmax's
  division moved after the values: softmax(s) v = (exp(s - max s) v) / sum exp(s - max s).
  The same function; the division runs over [.., L_q, H, d] instead of the [.., H, L_q,
  L_kv] probabilities, and its gradient needs no [.., H, L_q, L_kv] reduction."""
  query, key, value = promote_dtype(query, key, value, dtype=dtype)
  dtype = query.dtype
  query = query / jnp.sqrt(query.shape[-1]).astype(dtype)
  logits = jnp.einsum("...qhd,...khd->...hqk", query, key)
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(dtype).min)
  # float32 from here, as flax's force_fp32_for_softmax (whose float32 weights make the
  # values' product float32 too). A fully masked row is uniform, as in the softmax.
  logits = logits.astype(jnp.float32)
  unnormalized = jnp.exp(logits - jax.lax.stop_gradient(jnp.max(logits, -1, keepdims=True)))
  total = jnp.sum(unnormalized, -1)  # [.., H, L_q]
  out = jnp.einsum("...hqk,...khd->...qhd", unnormalized, value)
  return out / jnp.swapaxes(total, -1, -2)[..., None]


def resolve_implementation(implementation: str, dtype: Any = jnp.float32,
                           platform: str | None = None) -> str:
  """The implementation "auto" stands for on `platform` (`ops.platform`: a backend name,
  None for JAX's default backend); any other name as it is."""
  if implementation != "auto":
    return implementation
  platform = ops.platform(platform)
  if platform == "tpu":
    return "splash_tpu"
  if platform == "gpu":
    return "cudnn" if jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) else "xla"
  return "xla"


def attention_core(query: Array, key: Array, value: Array, mask: Array | None, *,
                   implementation: str = "xla", dropout_rng: Array | None = None,
                   dropout_rate: float = 0.0, dtype: Any = jnp.float32,
                   module: nn.Module | None = None, bias: Array | None = None,
                   prefix_lm: int = 0, backend: str | None = None) -> Array:
  """softmax(q k^T / sqrt(d) + mask) v per head, by `implementation`.

  Args:
    query: [B, L_q, H, d]; key, value: [B, L_kv, H, d].
    mask: bool broadcastable to [B, H, L_q, L_kv], True = may attend; None: all.
    implementation: `ATTENTION_IMPLEMENTATIONS`; the fused kernels fall back to
      "blocked" for dropout and for masks they cannot take; "auto" is `backend`'s
      (`resolve_implementation`).
    dropout_rng: drops probabilities with `dropout_rate` when given.
    module: sow the probabilities there (the "xla" path only).
    bias: float, broadcastable to [B, H, L_q, L_kv], added to the logits before the
      mask (BERT's "extended attention mask", (1 - m) * -10000, as official PyTorch
      code writes it); it always takes the materialized "xla" path.
    prefix_lm: P > 0: self-attention as a prefix LM (`make_prefix_lm_mask`) on top of
      `mask`, which must then mask keys only ([.., 1, L_kv] or None): positions < P
      attend to every position < P, position i >= P to j <= i. The fused kernels take
      the P prefix rows unmasked (they see only the prefix) and the L - P rows after
      them, which need the causal mask, take the materialized path: a video prefix of
      thousands of tokens never meets a per-query mask.

  Returns:
    [B, L_q, H, d].
  """
  if implementation not in ATTENTION_IMPLEMENTATIONS:
    raise ValueError(f"attention implementation {implementation!r}: expected one of "
                     f"{ATTENTION_IMPLEMENTATIONS}")
  implementation = resolve_implementation(implementation, dtype, backend)
  if prefix_lm:
    mask = _as_4d(mask)
    length = query.shape[1]
    if key.shape[1] != length or not 0 < prefix_lm <= length:
      raise ValueError(f"prefix_lm={prefix_lm} needs self-attention over at least that "
                       f"many positions, got queries {query.shape}, keys {key.shape}")
    if mask is not None and mask.shape[2] != 1:
      raise ValueError(f"with prefix_lm the mask must mask keys only ([.., 1, L_kv]), "
                       f"got {mask.shape}")
    fused = implementation in ("cudnn", *TPU_KERNELS)
    if fused and dropout_rng is None and bias is None and module is None:
      p = prefix_lm
      head = attention_core(query[:, :p], key[:, :p], value[:, :p],
                            None if mask is None else mask[..., :p],
                            implementation=implementation, dtype=dtype)
      if p == length:
        return head
      rows = make_prefix_lm_mask(jnp.full((1,), p), length)[..., p:, :]
      tail = attention_core(query[:, p:], key, value, combine_masks(mask, rows),
                            implementation="xla", dtype=dtype)
      return jnp.concatenate([head, tail.astype(head.dtype)], axis=1)
    mask = combine_masks(mask, make_prefix_lm_mask(jnp.full((1,), prefix_lm), length))
  if bias is not None:
    return nn.dot_product_attention(
        query, key, value, bias=bias, mask=mask, broadcast_dropout=False,
        dropout_rate=dropout_rate, deterministic=dropout_rng is None, dtype=dtype,
        force_fp32_for_softmax=True, dropout_rng=dropout_rng, module=module)
  mask = _as_4d(mask)
  key_padding = mask is None or mask.shape[1:3] == (1, 1)
  if dropout_rng is None and (implementation == "cudnn" or
                              (implementation in TPU_KERNELS and key_padding)):
    return fused_attention.fused_attention(implementation, query.astype(dtype),
                                           key.astype(dtype), value.astype(dtype), mask)
  xla = functools.partial(
      nn.dot_product_attention, broadcast_dropout=False, dropout_rate=dropout_rate,
      deterministic=dropout_rng is None, dtype=dtype, force_fp32_for_softmax=True)
  if implementation in ("cudnn", *TPU_KERNELS):  # dropout or a mask the kernel cannot take
    implementation = "blocked"
  if implementation != "blocked" or query.shape[1] <= ATTENTION_BLOCK:
    if dropout_rng is None and module is None:
      return _attention_normalized_last(query, key, value, mask, dtype)
    return xla(query, key, value, mask=mask, dropout_rng=dropout_rng, module=module)
  return _blocked_attention(xla, query, key, value, mask, dropout_rng)


def _as_4d(mask: Array | None) -> Array | None:
  """A bool mask broadcastable to [B, H, L_q, L_kv] as a 4-d array (None stays None)."""
  if mask is None:
    return None
  mask = jnp.asarray(mask, jnp.bool_)
  return mask.reshape((1,) * (4 - mask.ndim) + mask.shape)


def _blocked_attention(xla: Callable, query: Array, key: Array, value: Array,
                       mask: Array | None, dropout_rng: Array | None) -> Array:
  """`xla` attention over blocks of `ATTENTION_BLOCK` query rows (lax.map), each block
  rematerialized: the backward pass recomputes one block's logits at a time."""
  batch, length, heads, depth = query.shape
  blocks = math.ceil(length / ATTENTION_BLOCK)
  pad = blocks * ATTENTION_BLOCK - length
  q = jnp.pad(query, ((0, 0), (0, pad), (0, 0), (0, 0)))
  q = q.reshape(batch, blocks, ATTENTION_BLOCK, heads, depth).swapaxes(0, 1)
  row_mask = None
  if mask is not None and mask.shape[-2] != 1:  # rows differ: split them with the queries
    mask = _as_4d(mask)
    # Padded query rows may attend anywhere; their outputs are cut off below.
    rows = jnp.pad(mask, ((0, 0), (0, 0), (0, pad), (0, 0)), constant_values=True)
    row_mask = jnp.moveaxis(
        rows.reshape(rows.shape[:2] + (blocks, ATTENTION_BLOCK, rows.shape[-1])), 2, 0)
    mask = None

  @jax.checkpoint
  def block(args):
    q_block, index, mask_block = args
    rng = None if dropout_rng is None else jax.random.fold_in(dropout_rng, index)
    return xla(q_block, key, value, mask=mask if mask_block is None else mask_block,
               dropout_rng=rng)

  out = jax.lax.map(block, (q, jnp.arange(blocks), row_mask))
  return out.swapaxes(0, 1).reshape(batch, blocks * ATTENTION_BLOCK, heads, depth)[:, :length]


def empty_cache(apply_fn: Callable[[], Any]) -> Any:
  """Zeros shaped like the cache `apply_fn` (a decode call with mutable=["cache"]) creates.

  The flax way of making a cache runs the model; under `jax.eval_shape` it
  runs nothing, and zeros are the empty cache (module docstring).
  """
  shapes = jax.eval_shape(apply_fn)[1]["cache"]
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
