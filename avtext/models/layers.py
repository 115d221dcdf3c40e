"""Transformer building blocks shared by every avtext model.

One attention implementation (`Attention`: multi-head dot-product attention
with the parameters and numerics of flax's `nn.MultiHeadDotProductAttention`,
whose [D, H, D/H] query/key/value kernels are the layout of ViT/scenic
checkpoints, plus an autoregressive cache), one MLP, one transformer block and
the learned ViT position embedding. `EncoderBlock` is the pre-LN ViT/GPT-2
layer or the post-LN BERT layer; with `cross_attention=True` it is a decoder
layer, self-attention -> cross-attention -> MLP, for captioners and
cross-encoders. Models compose these; weight importers map public checkpoints
onto their parameter names:

  EncoderBlock
    attention             Attention:
                            query, key, value: {kernel [D, H, D/H],
                                                bias [H, D/H]},
                            out: {kernel [H, D/H, D], bias [D]}
    attention_norm        {scale, bias}
    cross_attention       Attention; key/value kernels [D_c, H, D/H]
                          (only with cross_attention=True)
    cross_attention_norm  {scale, bias} (only with cross_attention=True)
    mlp                   {dense_in: {kernel [D, M], bias [M]},
                           dense_out: {kernel [M, D], bias [D]}}
    mlp_norm              {scale, bias}

Masks are boolean, True where a query may attend to a key, and broadcastable
to the attention logits [B, heads, L_q, L_kv]. They are built only by
`make_padding_mask`, `make_causal_mask` and `make_prefix_lm_mask` and joined
by `combine_masks`; `EncoderBlock(causal=True)` is a shortcut for
`mask=make_causal_mask(L)`. A mask always describes the whole sequence, also
while decoding: the cache picks the rows of the positions being computed.

Autoregressive cache (`decode=True`, self-attention only). Each `Attention`
keeps, in the flax "cache" collection,
  cached_key, cached_value  [B, max_len, H, D/H]
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

Precision and memory (`Compute`, from `config.model` via
`avtext.models.registry.compute_from_config`): `dtype` is the computation
dtype (float32, or bfloat16 on accelerators); parameters stay float32, and the
softmax, LayerNorm statistics and everything after the model (losses, metrics)
run in float32. `remat` rematerializes each `EncoderBlock` in the backward pass
("none", "full", or a `jax.checkpoint_policies` name such as
"dots_with_no_batch_dims_saveable", which keeps the matmul outputs and
recomputes the rest). `attention` picks the implementation of the attention
core, all computing the same function (`ATTENTION_IMPLEMENTATIONS`).
`scan_layers` runs a stack of identical layers as one `jax.lax.scan`
(`scan_layers`), so the compiled program holds one layer instead of N: compile
time and program size stop growing with depth.
"""
import dataclasses
import functools
import math
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from avtext import ops

Array = jax.Array
Initializer = Callable[..., Array]

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

# "xla": the materialized [B, H, L_q, L_kv] softmax (flax's dot_product_attention).
# "blocked": the same softmax over query blocks of `ATTENTION_BLOCK` rows, each block
#   rematerialized in the backward pass, so only one block's logits are ever live
#   (memory-efficient attention in plain JAX; any backend).
# "cudnn": `jax.nn.dot_product_attention(implementation="cudnn")`, the fused flash
#   kernel on NVIDIA GPUs (bfloat16/float16 only).
# "flash_tpu": the Pallas flash-attention kernel for TPUs
#   (jax.experimental.pallas.ops.tpu.flash_attention): logits never leave on-chip memory.
#   Masks must be key-padding masks ([B, 1, 1, L_kv]) or none.
# The fused kernels have no attention dropout and the TPU one takes no per-query masks
# (causal, prefix-LM; cuDNN takes any mask): those calls use "blocked", the same
# function in bounded memory.
# Both pad the sequences to a multiple of `FUSED_PAD` and mask the padded keys.
ATTENTION_IMPLEMENTATIONS = ("xla", "blocked", "cudnn", "flash_tpu")
ATTENTION_BLOCK = 512
FUSED_PAD = 128


def remat_policy(name: str) -> Callable | None:
  """`config.model.remat` -> a `jax.checkpoint` policy; None for "none"."""
  if name in (None, "", "none"):
    return None
  if name == "full":
    return jax.checkpoint_policies.nothing_saveable
  policy = getattr(jax.checkpoint_policies, name, None)
  # The factories (save_only_these_names, ...) take arguments; only plain policies here.
  if policy is None or name.startswith(("save_", "offload_")):
    plain = sorted(n for n in dir(jax.checkpoint_policies)
                   if not n.startswith(("_", "save_", "offload_")))
    raise ValueError(f"config.model.remat={name!r}: expected 'none', 'full' or one of "
                     f"jax.checkpoint_policies {plain}")
  return policy


@dataclasses.dataclass(frozen=True)
class Compute:
  """How a model computes: dtype, rematerialization, attention (module docstring).

  Built from `config.model` by `avtext.models.registry.compute_from_config`; models
  hand it to their blocks (`block_kwargs`). The default is today's float32 path.
  """
  dtype: Any = jnp.float32
  remat: str = "none"
  attention: str = "xla"
  scan_layers: bool = False

  def __post_init__(self):
    remat_policy(self.remat)
    if self.attention not in ATTENTION_IMPLEMENTATIONS:
      raise ValueError(f"config.model.attention={self.attention!r}: expected one of "
                       f"{ATTENTION_IMPLEMENTATIONS}")

  def block_kwargs(self) -> dict[str, Any]:
    """Keyword arguments of `EncoderBlock` that carry these choices."""
    return dict(dtype=self.dtype, remat=self.remat, attention_impl=self.attention)


def remat(fn: Callable, name: str, static_argnums: tuple[int, ...] = ()) -> Callable:
  """`fn(module, *args)` rematerialized with policy `name` ("none": `fn` itself).

  For functions called inside a compact method with the module as first argument,
  so submodules keep their names; static_argnums count that module as 0.
  """
  policy = remat_policy(name)
  if policy is None:
    return fn
  return nn.remat(fn, policy=policy, static_argnums=static_argnums)

def scan_layers(params: Any, names: Sequence[str], step: Callable, carry: Any, *,
                rng: Array | None = None, collect: bool = False) -> Any:
  """`carry = step(carry, params[name], rng_i)` for each layer name, as one `lax.scan`.

  The layers keep their own parameters under their own names (`encoderblock_<i>`):
  checkpoints, weight importers and the unscanned path see the same tree, and a run
  may switch `config.model.scan_layers` on or off between restarts. The parameters
  are stacked here, inside the step, into [N, ...] arrays the scan slices; the
  gradient flows back through the stack to each layer's own arrays. `step` applies
  a detached module (`module.apply({"params": p}, ...)`, built with parent=None),
  never a bound one, since it runs inside a jax transformation.

  Args:
    params: the enclosing module's parameters (`self.variables["params"]`).
    names: the layers, in order; their parameter trees must have equal structure,
      shapes and dtypes.
    step: (carry, layer_params, rng or None) -> carry.
    carry: the first layer's input (any pytree).
    rng: split into one key per layer (dropout); None for deterministic calls.
    collect: also return every layer's output carry, stacked on a new leading axis.

  Returns:
    The last layer's output, or (output, stacked outputs) with collect=True.
  """
  if not names:
    return (carry, None) if collect else carry
  trees = [params[n] for n in names]
  structure = jax.tree.structure(trees[0])
  for name, tree in zip(names, trees):
    if (jax.tree.structure(tree) != structure or
        [jnp.shape(a) for a in jax.tree.leaves(tree)] !=
        [jnp.shape(a) for a in jax.tree.leaves(trees[0])]):
      raise ValueError(f"scan_layers: the parameters of {name!r} differ in structure or "
                       f"shape from those of {names[0]!r}; only identical layers scan")
  stacked = jax.tree.map(lambda *a: jnp.stack(a), *trees)
  keys = None if rng is None else jax.random.split(rng, len(names))

  def body(c, xs):
    layer_params, key = xs
    c = step(c, layer_params, key)
    return c, (c if collect else None)

  carry, outputs = jax.lax.scan(body, carry, (stacked, keys))
  return (carry, outputs) if collect else carry


def shard_batch(x: Array) -> Array:
  """`x` [B, ...] constrained to be split over the mesh's "data" axis, when a mesh is set
  (`partitioning.mesh_context`) and divides B; else `x`. Where parameters are sharded
  too (FSDP), the compiler's sharding propagation can otherwise pick a layout that
  replicates the batch (measured: the captioner's decoder, 130 GB a chip)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or "data" not in mesh.axis_names or x.shape[0] % mesh.shape["data"]:
    return x
  return jax.lax.with_sharding_constraint(x, jax.sharding.PartitionSpec("data"))


def dropout_rng(module: nn.Module, deterministic: bool, *rates: float) -> Array | None:
  """The "dropout" key a scanned stack needs (`scan_layers`), or None when no layer
  drops anything (deterministic, or every rate 0)."""
  if deterministic or not any(rates):
    return None
  return module.make_rng("dropout")


# BERT's `gelu` is the exact erf form; ViT (big_vision, scenic) and GPT-2
# (`gelu_new`) use the tanh approximation. The difference (~1e-3) matters when
# matching a reference implementation, so the choice is explicit.
ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "gelu": functools.partial(nn.gelu, approximate=False),
    "gelu_tanh": functools.partial(nn.gelu, approximate=True),
    "relu": nn.relu,
}


def get_activation(name: str) -> Callable[[Array], Array]:
  try:
    return ACTIVATIONS[name]
  except KeyError:
    raise ValueError(
        f"unknown activation {name!r}; expected one of {sorted(ACTIVATIONS)}"
    ) from None


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
  """
  num_heads: int
  dropout_rate: float = 0.0
  dropout_masks: str = "jax"
  kernel_init: Initializer = nn.initializers.lecun_normal()
  dtype: Any = jnp.float32
  implementation: str = "xla"
  output_projection: bool = True

  @nn.compact
  def __call__(self, inputs_q: Array, inputs_kv: Array | None = None, *,
               mask: Array | None = None, causal: bool = False,
               decode: bool = False, deterministic: bool,
               sow_weights: bool = False, bias: Array | None = None) -> Array:
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
    if not is_self and (causal or decode):
      raise ValueError("causal masking and decode=True apply to "
                       "self-attention only (inputs_kv=None)")
    if is_self:
      inputs_kv = inputs_q
    dense = functools.partial(
        nn.DenseGeneral, features=(self.num_heads, features // self.num_heads),
        kernel_init=self.kernel_init, dtype=self.dtype)
    query = dense(name="query")(inputs_q)  # [B, L_q, H, D/H]
    key = dense(name="key")(inputs_kv)  # [B, L_kv, H, D/H]
    value = dense(name="value")(inputs_kv)

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
      implementation = "xla" if sow_weights else self.implementation
      x = attention_core(query, key, value, mask, implementation=implementation,
                         dropout_rng=dropout_rng, dropout_rate=self.dropout_rate,
                         dtype=self.dtype, module=self if sow_weights else None,
                         bias=bias)
    if not self.output_projection:
      return x.reshape(*x.shape[:-2], features)
    return nn.DenseGeneral(features, axis=(-2, -1),
                           kernel_init=self.kernel_init, dtype=self.dtype,
                           name="out")(x)

  def _extend_cache(self, key: Array,
                    value: Array) -> tuple[Array, Array, Array | None]:
    """Writes this call's keys/values [B, T, H, D/H] into the cache.

    Returns:
      (keys, values, start): the whole buffers [B, max_len, H, D/H] and the
      index of this call's first position; when the call creates the cache,
      the inputs unchanged and start None.
    """
    exists = self.has_variable("cache", "cached_key")
    cached_key = self.variable("cache", "cached_key", jnp.zeros, key.shape,
                               key.dtype)
    cached_value = self.variable("cache", "cached_value", jnp.zeros,
                                 value.shape, value.dtype)
    index = self.variable("cache", "cache_index",
                          lambda: jnp.zeros((), jnp.int32))
    if not exists:
      return key, value, None
    batch, max_len = cached_key.value.shape[:2]
    if (key.shape[0] != batch or key.shape[1] > max_len or
        key.shape[2:] != cached_key.value.shape[2:]):
      raise ValueError(
          f"decode step keys {key.shape} do not fit the cache "
          f"{cached_key.value.shape} ([batch, max_len, heads, head_dim])")
    start = index.value
    corner = (0, start, 0, 0)
    cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, key,
                                                    corner)
    cached_value.value = jax.lax.dynamic_update_slice(cached_value.value,
                                                      value, corner)
    index.value = start + key.shape[1]
    return cached_key.value, cached_value.value, start


def attention_core(query: Array, key: Array, value: Array, mask: Array | None, *,
                   implementation: str = "xla", dropout_rng: Array | None = None,
                   dropout_rate: float = 0.0, dtype: Any = jnp.float32,
                   module: nn.Module | None = None, bias: Array | None = None) -> Array:
  """softmax(q k^T / sqrt(d) + mask) v per head, by `implementation`.

  Args:
    query: [B, L_q, H, d]; key, value: [B, L_kv, H, d].
    mask: bool broadcastable to [B, H, L_q, L_kv], True = may attend; None: all.
    implementation: `ATTENTION_IMPLEMENTATIONS`; the fused kernels fall back to
      "blocked" for dropout and for masks they cannot take.
    dropout_rng: drops probabilities with `dropout_rate` when given.
    module: sow the probabilities there (the "xla" path only).
    bias: float, broadcastable to [B, H, L_q, L_kv], added to the logits before the
      mask (BERT's "extended attention mask", (1 - m) * -10000, as official PyTorch
      code writes it); it always takes the materialized "xla" path.

  Returns:
    [B, L_q, H, d].
  """
  if implementation not in ATTENTION_IMPLEMENTATIONS:
    raise ValueError(f"attention implementation {implementation!r}: expected one of "
                     f"{ATTENTION_IMPLEMENTATIONS}")
  if bias is not None:
    return nn.dot_product_attention(
        query, key, value, bias=bias, mask=mask, broadcast_dropout=False,
        dropout_rate=dropout_rate, deterministic=dropout_rng is None, dtype=dtype,
        force_fp32_for_softmax=True, dropout_rng=dropout_rng, module=module)
  if mask is not None:
    mask = jnp.asarray(mask, jnp.bool_)
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
  key_padding = mask is None or mask.shape[1:3] == (1, 1)
  if dropout_rng is None and (implementation == "cudnn" or
                              (implementation == "flash_tpu" and key_padding)):
    return _fused_attention(implementation, query.astype(dtype), key.astype(dtype),
                            value.astype(dtype), mask)
  xla = functools.partial(
      nn.dot_product_attention, broadcast_dropout=False, dropout_rate=dropout_rate,
      deterministic=dropout_rng is None, dtype=dtype, force_fp32_for_softmax=True)
  if implementation in ("cudnn", "flash_tpu"):  # dropout or a mask the kernel cannot take
    implementation = "blocked"
  if implementation != "blocked" or query.shape[1] <= ATTENTION_BLOCK:
    return xla(query, key, value, mask=mask, dropout_rng=dropout_rng, module=module)
  return _blocked_attention(xla, query, key, value, mask, dropout_rng)


def _fused_attention(implementation: str, query: Array, key: Array, value: Array,
                     mask: Array | None) -> Array:
  """A fused kernel on sequences padded to a multiple of `FUSED_PAD` (cuDNN's flash
  attention and the Pallas TPU kernel take no ragged lengths such as ViT's 1 + N)."""
  batch, length, heads, depth = query.shape
  kv_length = key.shape[1]
  pad_q, pad_kv = -length % FUSED_PAD, -kv_length % FUSED_PAD
  pad = lambda x, n: jnp.pad(x, ((0, 0), (0, n), (0, 0), (0, 0)))
  query, key, value = pad(query, pad_q), pad(key, pad_kv), pad(value, pad_kv)
  real_key = jnp.arange(kv_length + pad_kv) < kv_length  # [L_kv']
  if implementation == "cudnn":
    # Padded query rows may attend anywhere (their outputs are cut off below).
    keys = jnp.broadcast_to(real_key, (1, 1, 1, kv_length + pad_kv))
    if mask is not None:
      mask = jnp.pad(mask, ((0, 0), (0, 0), (0, 0), (0, pad_kv)))
      if mask.shape[2] != 1:
        mask = jnp.pad(mask, ((0, 0), (0, 0), (0, pad_q), (0, 0)), constant_values=True)
      keys = jnp.logical_and(keys, mask)
    keys = jnp.broadcast_to(keys, (batch, keys.shape[1], length + pad_q, kv_length + pad_kv))
    out = jax.nn.dot_product_attention(query, key, value, mask=keys, implementation="cudnn")
    return out[:, :length]
  from jax.experimental.pallas.ops.tpu import flash_attention as pallas_flash  # pylint: disable=g-import-not-at-top
  # Segment ids: real keys (and every query) are segment 1, padded or masked keys 0.
  kv_ids = jnp.broadcast_to(real_key[None], (batch, kv_length + pad_kv))
  if mask is not None:
    kv_ids = jnp.logical_and(kv_ids, jnp.pad(
        jnp.broadcast_to(mask[:, 0, 0, :], (batch, kv_length)), ((0, 0), (0, pad_kv))))
  segments = pallas_flash.SegmentIds(q=jnp.ones((batch, length + pad_q), jnp.int32),
                                     kv=kv_ids.astype(jnp.int32))
  heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # [B, H, L, d], the kernel's layout

  def kernel(q, k, v, q_ids, kv_ids):
    return pallas_flash.flash_attention(
        q, k, v, segment_ids=pallas_flash.SegmentIds(q=q_ids, kv=kv_ids),
        sm_scale=1.0 / math.sqrt(depth))

  # A Mosaic kernel is not partitioned by XLA: under a mesh (the trainer and avtext.aot
  # set one for flash_tpu, partitioning.mesh_context) each device runs it on its slice
  # of the batch.
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty and "data" in mesh.axis_names:
    batch_axis = jax.sharding.PartitionSpec("data")
    kernel = jax.shard_map(kernel, mesh=mesh, in_specs=batch_axis, out_specs=batch_axis,
                           check_vma=False)
  out = kernel(heads_first(query), heads_first(key), heads_first(value), segments.q,
               segments.kv)
  return heads_first(out)[:, :length]


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
    mask = jnp.asarray(mask, jnp.bool_)
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
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


class Mlp(nn.Module):
  """Position-wise feed-forward: Dense(mlp_dim) -> activation -> Dense(D)."""
  mlp_dim: int
  activation: str = "gelu"
  kernel_init: Initializer = nn.initializers.xavier_uniform()
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    features = x.shape[-1]
    x = nn.Dense(self.mlp_dim, dtype=self.dtype, kernel_init=self.kernel_init,
                 name="dense_in")(x)
    x = get_activation(self.activation)(x)
    return nn.Dense(features, dtype=self.dtype, kernel_init=self.kernel_init,
                    name="dense_out")(x)


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
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
    bias = self.param("bias", nn.initializers.zeros, (x.shape[-1],), jnp.float32)
    y = x.astype(jnp.float32)
    mean = jnp.mean(y, axis=-1, keepdims=True)
    std = jnp.std(y, axis=-1, keepdims=True, ddof=1)
    return (scale * (y - mean) / (std + self.epsilon) + bias).astype(self.dtype)


def make_layer_norm(kind: str, epsilon: float, dtype: Any, name: str) -> nn.Module:
  """'standard' (nn.LayerNorm) or 'coot' (`CootLayerNorm`)."""
  if kind == "standard":
    return nn.LayerNorm(epsilon=epsilon, dtype=dtype, name=name)
  if kind == "coot":
    return CootLayerNorm(epsilon=epsilon, dtype=dtype, name=name)
  raise ValueError(f"layer_norm must be 'standard' or 'coot', got {kind!r}")


class EncoderBlock(nn.Module):
  """Transformer layer: self-attention, [cross-attention,] MLP, with residuals.

  pre_norm=True is the ViT / GPT-2 layer, x + f(LN(x)); pre_norm=False is the
  BERT layer, LN(x + f(x)). With cross_attention=True a cross-attention
  sublayer (queries from x, keys/values from `context`) sits between the two,
  with the same residual and LayerNorm placement (the transformer decoder
  layer). Dropout follows every branch's output (BERT's hidden dropout, ViT's
  residual dropout); `attention_dropout_rate` drops attention probabilities.
  `stochastic_depth` drops each residual branch per example with this
  probability and rescales the kept ones (timm's DropPath), so eval needs no
  correction.

  Attributes:
    num_heads: attention heads; the width D must be divisible by it.
    mlp_dim: hidden width of the MLP.
    pre_norm: LayerNorm placement, see above.
    activation: key of `ACTIVATIONS`.
    layer_norm_eps: 1e-6 for ViT, 1e-12 for BERT, 1e-5 for GPT-2.
    causal: add `make_causal_mask` to self-attention (decoder layers); a
      prefix-LM passes `mask=make_prefix_lm_mask(...)` instead.
    cross_attention: add the cross-attention sublayer; calls need `context`.
    self_attention: False (with cross_attention=True) drops the
      self-attention sublayer: a cross-attention-only layer, COOT's context
      "TransformerDecoder" (the global context as the query over the clips).
    feed_forward: False drops the MLP sublayer (`mlp_dim` unused): XML's
      Self-Encoder, attention -> linear -> residual -> LayerNorm (TVR sec. 4.1).
    feed_forward_kind: "mlp" (Dense(mlp_dim) -> activation -> Dense(D)) or
      "linear": one Dense(D) without activation (`mlp_dim` unused; the official
      TVC decoder layer's BertOutput, LN(x + dropout(Linear(x)))).
    cross_mask: "keys" (a query attends to the real context positions) or
      "additive": the official TVR / BERT cross mask, (1 - m_q m_k) * -10000 added
      to the logits in float32 (m_q: the call's padding_mask, m_k: its
      context_mask): real rows as "keys" up to float rounding, while a padded
      query row attends to every context position, padded ones included (the
      official XML cross-encoder, whose padded rows reach ConvSE). Needs
      padding_mask and context_mask; always the materialized "xla" attention.
    attention_output: "dense" (the attention's output Linear, then dropout on the
      branch) or "none": the concatenated heads go straight into the residual,
      no output Linear and no branch dropout (attention-probability dropout
      stays): the official TVR cross-encoder (LN(x + CrossAttn(x, c))) and TVC
      decoder layer. Applies to every attention sublayer of the block.
    layer_norm: "standard" (nn.LayerNorm) or "coot" (`CootLayerNorm`).
    dropout_rate: dropout on every branch output.
    attention_dropout_rate: dropout on attention probabilities.
    dropout_masks: "jax" (flax's) or "hash" (`dropout`), for every dropout.
    stochastic_depth: per-example drop probability of each residual branch.
    kernel_init: initializer of every kernel (xavier for ViT, normal(0.02)
      for BERT).
    dtype: computation dtype; parameters stay float32.
    remat: rematerialize the layer in the backward pass: "none", "full" or a
      `jax.checkpoint_policies` name (`remat_policy`); decode calls never remat.
    attention_impl: the attention core (`ATTENTION_IMPLEMENTATIONS`).
  """
  num_heads: int
  mlp_dim: int
  pre_norm: bool = True
  activation: str = "gelu"
  layer_norm_eps: float = 1e-6
  causal: bool = False
  cross_attention: bool = False
  self_attention: bool = True
  feed_forward: bool = True
  feed_forward_kind: str = "mlp"
  attention_output: str = "dense"
  cross_mask: str = "keys"
  layer_norm: str = "standard"
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dropout_masks: str = "jax"
  stochastic_depth: float = 0.0
  kernel_init: Initializer = nn.initializers.xavier_uniform()
  dtype: Any = jnp.float32
  remat: str = "none"
  attention_impl: str = "xla"

  @nn.compact
  def __call__(self, x: Array, padding_mask: Array | None = None, *,
               mask: Array | None = None, context: Array | None = None,
               context_mask: Array | None = None, deterministic: bool,
               decode: bool = False) -> Array:
    """Applies the layer.

    Args:
      x: [B, L, D]; with decode, the next T positions [B, T, D].
      padding_mask: [B, L] ([B, max_len] with decode), nonzero for real
        tokens; masks keys only, see `make_padding_mask`.
      mask: bool self-attention mask broadcastable to [B, H, L, L]
        ([.., max_len, max_len] with decode), True = may attend; combined
        with padding_mask and `causal`.
      context: [B, L_c, D_c], what cross-attention attends to; required
        exactly when cross_attention=True.
      context_mask: [B, L_c], nonzero for real context positions; padded
        ones get zero attention weight. None: all real.
      deterministic: disables dropout and stochastic depth.
      decode: extend the self-attention cache (module docstring).

    Returns:
      [B, L, D] (with decode [B, T, D]).
    """
    if self.cross_attention != (context is not None):
      raise ValueError(
          f"EncoderBlock(cross_attention={self.cross_attention}) was called "
          f"{'without' if context is None else 'with'} a context; pass "
          f"context [B, L_c, D_c] exactly when cross_attention=True")
    if context_mask is not None and context is None:
      raise ValueError("context_mask given without context")
    if not (self.self_attention or self.cross_attention):
      raise ValueError("EncoderBlock(self_attention=False) needs cross_attention=True")
    cross_bias = None
    if self.cross_mask not in ("keys", "additive"):
      raise ValueError(f"EncoderBlock cross_mask={self.cross_mask!r}; expected 'keys' or "
                       "'additive'")
    if self.cross_mask == "additive" and self.cross_attention:
      if padding_mask is None or context_mask is None:
        raise ValueError("EncoderBlock(cross_mask='additive') needs padding_mask and "
                         "context_mask (the official cross mask is their outer product)")
      m_q = padding_mask.astype(jnp.float32)[:, None, :, None]
      m_k = context_mask.astype(jnp.float32)[:, None, None, :]
      cross_bias = (1.0 - m_q * m_k) * -10000.0
      context_mask = None  # the bias masks the keys
    if padding_mask is not None:
      # While decoding the keys are the whole cache, checked by `Attention`.
      mask = combine_masks(
          make_padding_mask(padding_mask, None if decode else x.shape[1]),
          mask)
    body = EncoderBlock._sublayers
    if not decode:
      body = remat(body, self.remat, static_argnums=(5, 6))
    return body(self, x, mask, context, context_mask, deterministic, decode, cross_bias)

  def _sublayers(self, x: Array, mask: Array | None, context: Array | None,
                 context_mask: Array | None, deterministic: bool,
                 decode: bool, cross_bias: Array | None = None) -> Array:
    if self.attention_output not in ("dense", "none"):
      raise ValueError(f"EncoderBlock attention_output={self.attention_output!r}; expected "
                       "'dense' or 'none'")
    if self.feed_forward_kind not in ("mlp", "linear"):
      raise ValueError(f"EncoderBlock feed_forward_kind={self.feed_forward_kind!r}; "
                       "expected 'mlp' or 'linear'")
    projected = self.attention_output == "dense"
    attention = functools.partial(
        Attention, num_heads=self.num_heads,
        dropout_rate=self.attention_dropout_rate,
        dropout_masks=self.dropout_masks,
        kernel_init=self.kernel_init, dtype=self.dtype,
        implementation=self.attention_impl, output_projection=projected)
    branches = []
    if self.self_attention:
      branches.append(("attention", lambda y: attention(name="attention")(
          y, mask=mask, causal=self.causal, decode=decode,
          deterministic=deterministic)))
    if self.cross_attention:
      context_keys = None
      if context_mask is not None:
        context_keys = make_padding_mask(context_mask, context.shape[1])
      branches.append(("cross_attention",
                       lambda y: attention(name="cross_attention")(
                           y, context, mask=context_keys, bias=cross_bias,
                           deterministic=deterministic)))
    if self.feed_forward and self.feed_forward_kind == "linear":
      branches.append(("mlp", nn.Dense(x.shape[-1], kernel_init=self.kernel_init,
                                       dtype=self.dtype, name="mlp")))
    elif self.feed_forward:
      branches.append(("mlp", Mlp(
          mlp_dim=self.mlp_dim, activation=self.activation,
          kernel_init=self.kernel_init, dtype=self.dtype, name="mlp")))
    for name, branch in branches:
      norm = make_layer_norm(self.layer_norm, self.layer_norm_eps, self.dtype,
                             f"{name}_norm")
      y = branch(norm(x) if self.pre_norm else x)
      if name == "mlp" or projected:
        y = dropout(y, self.dropout_rate, deterministic=deterministic,
                    masks=self.dropout_masks)
      # One keep/drop decision per example: broadcast over tokens and width.
      y = dropout(y, self.stochastic_depth, deterministic=deterministic,
                  masks=self.dropout_masks, broadcast_dims=(1, 2))
      x = x + y if self.pre_norm else norm(x + y)
    return x


class PatchMatmul(nn.Conv):
  """`nn.Conv` with stride = kernel size (ViT patches, MBT tubelets) computed as a
  reshape and one matmul: the same parameters (kernel [*patch, C, D], bias [D]) and
  function, for backends whose convolutions are slow or absent for this shape (measured
  on TPU v5e, 16 clips of 32 x 224^2: 2.7 GiB of temporaries against the conv's 1.7, so
  the paper config keeps the conv)."""

  @nn.compact
  def __call__(self, x: Array) -> Array:
    patch = tuple(self.kernel_size)
    if tuple(self.strides or ()) != patch or self.padding != "VALID":
      raise ValueError("PatchMatmul needs strides = kernel_size and padding='VALID'")
    channels = x.shape[-1]
    kernel = self.param("kernel", self.kernel_init, patch + (channels, self.features),
                        self.param_dtype)
    bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype)
    batch, spatial, n = x.shape[0], x.shape[1:-1], len(patch)
    grid = [s // p for s, p in zip(spatial, patch)]
    x = x.reshape((batch,) + sum(((g, p) for g, p in zip(grid, patch)), ()) + (channels,))
    # [B, g1, p1, ..., gn, pn, C] -> [B, g1, ..., gn, p1, ..., pn, C]
    x = x.transpose((0,) + tuple(1 + 2 * i for i in range(n)) +
                    tuple(2 + 2 * i for i in range(n)) + (2 * n + 1,))
    x = x.reshape((batch, *grid, -1)).astype(self.dtype)
    y = x @ kernel.reshape(-1, self.features).astype(self.dtype)
    return y + bias.astype(self.dtype)


class AddPositionEmbedding(nn.Module):
  """Adds a learned embedding per token position (ViT; init as in BERT).

  The table's length is the token count seen at init; applying the module to
  a different count is an error rather than a silent truncation, since the
  positions index a fixed patch grid (resize the table to change it).
  """
  stddev: float = 0.02

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """x: [B, L, D] -> x + pos_embedding[None]."""
    # A different token count at apply time fails flax's shape check
    # (ScopeParamShapeError naming pos_embedding).
    pos = self.param("pos_embedding", nn.initializers.normal(self.stddev),
                     x.shape[1:], jnp.float32)
    return x + pos.astype(x.dtype)[None]
