"""Transformer building blocks shared by every avtext model.

One attention implementation (`avtext.models.attention`: its masks, cache and
kernels), one MLP, one transformer block and
the learned ViT position embedding. `EncoderBlock` is the pre-LN ViT/GPT-2
layer or the post-LN BERT layer; with `cross_attention=True` it is a decoder
layer, self-attention -> cross-attention -> MLP, for captioners and
cross-encoders. A paper's variant of the layer (COOT's norm, XML's and MMT's
official sublayers, MBT's LayerScale) subclasses it in that paper's module.
Models compose these; weight importers map public checkpoints onto their
parameter names:

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

Precision and memory (`Compute`, from `config.model` via
`avtext.models.model_registry.compute_from_config`): `dtype` is the computation
dtype (float32, or bfloat16 on accelerators); parameters stay float32, and the
softmax, LayerNorm statistics and everything after the model (losses, metrics)
run in float32. `remat` rematerializes each `EncoderBlock` in the backward pass
("none", "full", or a `jax.checkpoint_policies` name such as
"dots_with_no_batch_dims_saveable", which keeps the matmul outputs and
recomputes the rest). `attention` picks the implementation of the attention
core, all computing the same function (`attention.ATTENTION_IMPLEMENTATIONS`).
`scan_layers` runs a stack of identical layers as one `jax.lax.scan`
(`scan_layers`), so the compiled program holds one layer instead of N: compile
time and program size stop growing with depth.
"""
import dataclasses
import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from avtext import ops
from avtext.models import attention as attn
from avtext.models import fused_attention

Array = jax.Array
Initializer = Callable[..., Array]

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}



# Our named policies: what each transformer block keeps for its backward pass (the
# names are set in `attention.Attention` and `Mlp`); the rest is recomputed.
REMAT_POLICIES = {
    # the fused q/k/v projection and the attention core's output: the backward pass
    # recomputes the LayerNorms, the output projection and the MLP, not the attention
    "save_qkv_attention": ("qkv", "attention_out"),
    # ... and the MLP's first product: only LayerNorms, GELU and the output
    # projections are recomputed
    "save_qkv_attention_mlp": ("qkv", "attention_out", "mlp_in"),
}


def _save_attention_kernel(prim, *_, **params) -> bool:
  """Keeps what a fused attention kernel's backward reads of its forward (its output and
  softmax statistics, `fused_attention.KERNEL_RESIDUALS` / `CUDNN_FORWARD_PRIMITIVES`);
  everything else in the block is recomputed, as "full" does."""
  if prim.name == "name":
    return params.get("name") == fused_attention.KERNEL_RESIDUALS
  return prim.name in fused_attention.CUDNN_FORWARD_PRIMITIVES


def remat_policy(name: str) -> Callable | None:
  """`config.model.remat` -> a `jax.checkpoint` policy; None for "none"."""
  if name in (None, "", "none"):
    return None
  if name == "full":
    return jax.checkpoint_policies.nothing_saveable
  if name == "save_attention_kernel":
    return _save_attention_kernel
  if name in REMAT_POLICIES:
    return jax.checkpoint_policies.save_only_these_names(*REMAT_POLICIES[name])
  policy = getattr(jax.checkpoint_policies, name, None)
  # The factories (save_only_these_names, ...) take arguments; only plain policies here.
  if policy is None or name.startswith(("save_", "offload_")):
    plain = sorted(n for n in dir(jax.checkpoint_policies)
                   if not n.startswith(("_", "save_", "offload_")))
    raise ValueError(f"config.model.remat={name!r}: expected 'none', 'full', "
                     f"'save_attention_kernel', one of {sorted(REMAT_POLICIES)} or one of jax.checkpoint_policies {plain}")
  return policy


PATCH_EMBEDS = ("conv", "matmul")


@dataclasses.dataclass(frozen=True)
class Compute:
  """How a model computes, each choice the same function: dtype, rematerialization,
  attention, the patch embedding's kernel (module docstring).

  Built from `config.model` by `avtext.models.model_registry.compute_from_config`; models
  hand it to their blocks (`EncoderBlock.compute`). Its defaults: a config's that leaves them unset.
  """
  dtype: Any = jnp.float32
  remat: str = "none"
  attention: str = "xla"
  scan_layers: bool = False
  # The platform traced for (`config.model.backend`): `avtext.ops`' CPU-only rewrites and
  # what "auto" attention stands for. None: JAX's default backend (`ops.platform`).
  backend: str | None = None
  # Patch and tubelet embeddings (ViT, MBT): "conv" (nn.Conv) or "matmul" (`PatchMatmul`,
  # the same parameters and function as one matmul).
  patch_embed: str = "conv"

  def __post_init__(self):
    remat_policy(self.remat)
    if self.patch_embed not in PATCH_EMBEDS:
      raise ValueError(f"config.model.patch_embed={self.patch_embed!r}: expected one of "
                       f"{PATCH_EMBEDS}")
    if self.attention not in attn.ATTENTION_IMPLEMENTATIONS:
      raise ValueError(f"config.model.attention={self.attention!r}: expected one of "
                       f"{attn.ATTENTION_IMPLEMENTATIONS}")
    if self.backend not in (None, *ops.PLATFORMS):
      raise ValueError(f"config.model.backend={self.backend!r}: expected one of {ops.PLATFORMS}")


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
    x = get_activation(self.activation)(checkpoint_name(x, "mlp_in"))  # REMAT_POLICIES
    return nn.Dense(features, dtype=self.dtype, kernel_init=self.kernel_init,
                    name="dense_out")(x)


def norm_params(module: nn.Module, width: int) -> tuple[Array, Array]:
  """A norm's float32 `scale` (ones) and `bias` (zeros) [width], named as nn.LayerNorm's."""
  return (module.param("scale", nn.initializers.ones, (width,), jnp.float32),
          module.param("bias", nn.initializers.zeros, (width,), jnp.float32))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _layer_norm(x: Array, scale: Array, bias: Array, epsilon: float, dtype: Any) -> Array:
  return nn.LayerNorm(epsilon=epsilon, dtype=dtype, parent=None).apply(
      {"params": {"scale": scale, "bias": bias}}, x)


def _layer_norm_forward(x, scale, bias, epsilon, dtype):
  return _layer_norm(x, scale, bias, epsilon, dtype), (x, scale)


def _layer_norm_backward(epsilon, dtype, residuals, dy):
  """The gradient of y = (x - mean) r scale + bias, r = 1 / sqrt(var + eps), from x alone:
  dx = r (g - mean(g) - x_hat mean(g x_hat)) with g = dy scale, x_hat = (x - mean) r."""
  del dtype
  x, scale = residuals
  x32, dy = x.astype(jnp.float32), dy.astype(jnp.float32)
  mean = jnp.mean(x32, -1, keepdims=True)
  # flax's statistics (use_fast_variance): E[x^2] - E[x]^2, clipped at 0.
  var = jnp.maximum(0.0, jnp.mean(jnp.square(x32), -1, keepdims=True) - jnp.square(mean))
  r = jax.lax.rsqrt(var + epsilon)
  x_hat = (x32 - mean) * r
  g = dy * scale
  dx = r * (g - jnp.mean(g, -1, keepdims=True) -
            x_hat * jnp.mean(g * x_hat, -1, keepdims=True))
  lead = tuple(range(x.ndim - 1))
  return dx.astype(x.dtype), jnp.sum(dy * x_hat, lead), jnp.sum(dy, lead)


_layer_norm.defvjp(_layer_norm_forward, _layer_norm_backward)


class LayerNorm(nn.Module):
  """`nn.LayerNorm` over the last axis (the same parameters, scale and bias [D], and the
  same outputs: its own function runs the forward pass) with the gradient written out
  (`_layer_norm_backward`): the backward pass keeps x and recomputes the row statistics,
  where autodiff keeps [.., D]-shaped broadcasts of them."""
  epsilon: float = 1e-6
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    scale, bias = norm_params(self, x.shape[-1])
    return _layer_norm(x, scale, bias, self.epsilon, self.dtype)


@dataclasses.dataclass(frozen=True)
class Dropout:
  """A block's dropout (`EncoderBlock`).

  rate: on every residual branch's output (BERT's hidden dropout, ViT's residual dropout).
  attention: on attention probabilities.
  stochastic_depth: each residual branch dropped per example with this probability, the
    kept ones rescaled (timm's DropPath), so eval needs no correction.
  masks: "jax" (flax's) or "hash" (`attention.dropout`), for every dropout.
  """
  rate: float = 0.0
  attention: float = 0.0
  stochastic_depth: float = 0.0
  masks: str = "jax"

  def __post_init__(self):
    if self.masks not in attn.DROPOUT_MASKS:
      raise ValueError(f"dropout_masks must be one of {attn.DROPOUT_MASKS}, got "
                       f"{self.masks!r}")


class EncoderBlock(nn.Module):
  """Transformer layer: self-attention, [cross-attention,] feed-forward, with residuals.

  pre_norm=True is the ViT / GPT-2 layer, x + f(LN(x)); pre_norm=False is the
  BERT layer, LN(x + f(x)). With cross_attention=True a cross-attention
  sublayer (queries from x, keys/values from `context`) sits between the two,
  with the same residual and LayerNorm placement (the transformer decoder
  layer). `dropout` (`Dropout`) drops every branch's output, the attention
  probabilities, and whole branches per example (stochastic depth).

  This class holds the one residual wiring; a paper's variant of the layer subclasses it
  in that paper's model module and overrides the pieces it changes: `_attention` (the
  attention sublayers), `_feed_forward`, `_norm`, `SELF_ATTENTION` (False: a
  cross-attention-only layer), `_rescale` (each branch's output before dropout) and
  `_cross_bias` (the cross-attention mask).

  Attributes:
    num_heads: attention heads; the width D must be divisible by it.
    mlp_dim: hidden width of the MLP.
    pre_norm: LayerNorm placement, see above.
    activation: key of `ACTIVATIONS`.
    layer_norm_eps: 1e-6 for ViT, 1e-12 for BERT, 1e-5 for GPT-2.
    causal: add `make_causal_mask` to self-attention (decoder layers); a
      prefix-LM passes `mask=make_prefix_lm_mask(...)` instead.
    cross_attention: add the cross-attention sublayer; calls need `context`.
    dropout: the rates and masks (`Dropout`).
    kernel_init: initializer of every kernel (xavier for ViT, normal(0.02)
      for BERT).
    compute: dtype (computation; parameters stay float32), remat (the layer
      rematerialized in the backward pass, `remat_policy`; decode calls never remat),
      attention (the core, `ATTENTION_IMPLEMENTATIONS`) and backend (`Compute`).
    query_positions: 0 (all), or n > 0: the layer computes only the outputs of the first n
      positions, [B, n, D] (their queries attend to every key and value of x), the same
      values as the full layer's [:, :n]; for a last layer whose caller reads [CLS] only.
      Self-attention layers without `causal` or cross-attention.
  """
  num_heads: int
  mlp_dim: int
  pre_norm: bool = True
  activation: str = "gelu"
  layer_norm_eps: float = 1e-6
  causal: bool = False
  cross_attention: bool = False
  dropout: Dropout = Dropout()
  kernel_init: Initializer = nn.initializers.xavier_uniform()
  compute: Compute = Compute()
  query_positions: int = 0

  def __post_init__(self):
    if self.query_positions and (self.causal or self.cross_attention or
                                 not self.SELF_ATTENTION):
      raise ValueError("EncoderBlock(query_positions > 0) is for self-attention layers "
                       "without causal masking, prefix_lm, cross-attention or decode")
    if not (self.SELF_ATTENTION or self.cross_attention):
      raise ValueError(f"{type(self).__name__} has no self-attention: it needs "
                       "cross_attention=True")
    super().__post_init__()

  # The pieces a paper's variant overrides (class docstring).
  SELF_ATTENTION = True  # False: a cross-attention-only layer

  def _attention(self, name: str, *, output_projection: bool = True) -> attn.Attention:
    """An attention sublayer; output_projection=False: the concatenated heads go straight
    into the residual (no output Linear, and no dropout on the branch)."""
    return attn.Attention(
        num_heads=self.num_heads, dropout_rate=self.dropout.attention,
        dropout_masks=self.dropout.masks, kernel_init=self.kernel_init,
        dtype=self.compute.dtype, implementation=self.compute.attention,
        output_projection=output_projection, backend=self.compute.backend, name=name)

  def _feed_forward(self, width: int) -> Callable[[Array], Array] | None:
    """The feed-forward sublayer of a [.., width] input (None: the layer has none)."""
    del width
    return Mlp(mlp_dim=self.mlp_dim, activation=self.activation,
               kernel_init=self.kernel_init, dtype=self.compute.dtype, name="mlp")

  def _norm(self, name: str) -> nn.Module:
    return LayerNorm(epsilon=self.layer_norm_eps, dtype=self.compute.dtype, name=name)

  def _rescale(self, name: str, y: Array) -> Array:
    del name
    return y

  def _cross_bias(self, padding_mask: Array | None, context_mask: Array | None
                  ) -> tuple[Array | None, Array | None]:
    """(a float bias added to the cross-attention logits, the context mask left to apply)."""
    del padding_mask
    return None, context_mask

  @nn.compact
  def __call__(self, x: Array, padding_mask: Array | None = None, *,
               mask: Array | None = None, context: Array | None = None,
               context_mask: Array | None = None, deterministic: bool,
               decode: bool = False, prefix_lm: int = 0) -> Array:
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
      prefix_lm: P > 0: self-attention as a prefix LM over the first P positions
        (`attention.attention_core`), with `mask` masking keys only; the fused
        attention kernels then take the prefix.

    Returns:
      [B, L, D] (with decode [B, T, D]; with query_positions = n, [B, n, D]).
    """
    if self.query_positions and (decode or prefix_lm):
      raise ValueError("EncoderBlock(query_positions > 0) is for self-attention layers "
                       "without causal masking, prefix_lm, cross-attention or decode")
    if self.cross_attention != (context is not None):
      raise ValueError(
          f"{type(self).__name__}(cross_attention={self.cross_attention}) was called "
          f"{'without' if context is None else 'with'} a context; pass "
          f"context [B, L_c, D_c] exactly when cross_attention=True")
    if context_mask is not None and context is None:
      raise ValueError("context_mask given without context")
    cross_bias = None
    if self.cross_attention:
      cross_bias, context_mask = self._cross_bias(padding_mask, context_mask)
    if padding_mask is not None:
      # While decoding the keys are the whole cache, checked by `Attention`.
      mask = attn.combine_masks(
          attn.make_padding_mask(padding_mask, None if decode else x.shape[1]),
          mask)
    body = EncoderBlock._sublayers
    if not decode:
      body = remat(body, self.compute.remat, static_argnums=(5, 6, 8))
    return body(self, x, mask, context, context_mask, deterministic, decode, cross_bias,
                prefix_lm)

  def _sublayers(self, x: Array, mask: Array | None, context: Array | None,
                 context_mask: Array | None, deterministic: bool,
                 decode: bool, cross_bias: Array | None = None,
                 prefix_lm: int = 0) -> Array:
    # (name, f, whether dropout follows f's output): an attention sublayer without its
    # output Linear feeds the residual undropped.
    branches = []
    n = self.query_positions
    if self.SELF_ATTENTION:
      attention = self._attention("attention")
      if n:
        if mask is not None and mask.shape[-2] != 1:
          mask = mask[..., :n, :]
        branches.append(("attention", lambda y: attention(
            y[:, :n], y, mask=mask, deterministic=deterministic),
                         attention.output_projection))
      else:
        branches.append(("attention", lambda y: attention(
            y, mask=mask, causal=self.causal, decode=decode,
            deterministic=deterministic, prefix_lm=prefix_lm),
                         attention.output_projection))
    if self.cross_attention:
      context_keys = None
      if context_mask is not None:
        context_keys = attn.make_padding_mask(context_mask, context.shape[1])
      cross = self._attention("cross_attention")
      branches.append(("cross_attention", lambda y: cross(
          y, context, mask=context_keys, bias=cross_bias, deterministic=deterministic),
                       cross.output_projection))
    feed_forward = self._feed_forward(x.shape[-1])
    if feed_forward is not None:
      branches.append(("mlp", feed_forward, True))
    dropout = self.dropout
    for name, branch, drops in branches:
      norm = self._norm(f"{name}_norm")
      y = self._rescale(name, branch(norm(x) if self.pre_norm else x))
      if drops:
        y = attn.dropout(y, dropout.rate, deterministic=deterministic, masks=dropout.masks)
      # One keep/drop decision per example: broadcast over tokens and width.
      y = attn.dropout(y, dropout.stochastic_depth, deterministic=deterministic,
                       masks=dropout.masks, broadcast_dims=(1, 2))
      if n and name == "attention":
        x = x[:, :n]
      x = x + y if self.pre_norm else norm(x + y)
    return x


class PatchMatmul(nn.Module):
  """`nn.Conv(features, kernel_size, strides=kernel_size, padding="VALID")` (ViT patches,
  MBT tubelets) computed as a reshape and one matmul: the same parameters (kernel
  [*patch, C, D], bias [D], nn.Conv's initializers) and function, for backends whose
  convolutions are slow or absent for this shape (measured on TPU v5e, 16 clips of
  32 x 224^2: 2.7 GiB of temporaries against the conv's 1.7, so the paper config keeps
  the conv). Takes nn.Conv's arguments; strides and padding must be those."""
  features: int
  kernel_size: Sequence[int]
  strides: Sequence[int] | None = None
  padding: str = "VALID"
  dtype: Any = jnp.float32
  kernel_init: Initializer = nn.initializers.lecun_normal()  # nn.Conv's
  bias_init: Initializer = nn.initializers.zeros

  @nn.compact
  def __call__(self, x: Array) -> Array:
    patch = tuple(self.kernel_size)
    if tuple(self.strides or ()) != patch or self.padding != "VALID":
      raise ValueError("PatchMatmul needs strides = kernel_size and padding='VALID'")
    channels = x.shape[-1]
    kernel = self.param("kernel", self.kernel_init, patch + (channels, self.features),
                        jnp.float32)
    bias = self.param("bias", self.bias_init, (self.features,), jnp.float32)
    batch, spatial, n = x.shape[0], x.shape[1:-1], len(patch)
    grid = [s // p for s, p in zip(spatial, patch)]
    x = x.reshape((batch,) + sum(((g, p) for g, p in zip(grid, patch)), ()) + (channels,))
    # [B, g1, p1, ..., gn, pn, C] -> [B, g1, ..., gn, p1, ..., pn, C]
    x = x.transpose((0,) + tuple(1 + 2 * i for i in range(n)) +
                    tuple(2 + 2 * i for i in range(n)) + (2 * n + 1,))
    x = x.reshape((batch, *grid, -1)).astype(self.dtype)
    y = x @ kernel.reshape(-1, self.features).astype(self.dtype)
    return y + bias.astype(self.dtype)


class ConvStem(nn.Module):
  """The hybrid ViT's convolutional stem (Dosovitskiy et al. 2021 §3.1, "Hybrid
  Architecture"; the small stride-2 stack of Xiao et al. 2021, "Early Convolutions Help
  Transformers See Better"): per image, `len(features)` 3x3 convolutions of stride 2
  (SAME padding), each followed by a LayerNorm over channels and a GELU. The patch
  embedding that follows cuts the [H / 2^n, W / 2^n] feature map into patches.

  Parameters: conv_<i> {kernel [3, 3, C_in, features[i]], bias}, norm_<i> {scale, bias}.
  """
  features: Sequence[int]
  layer_norm_eps: float = 1e-6
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    """x: [..., H, W, C] -> [..., H / 2^n, W / 2^n, features[-1]]."""
    lead = x.shape[:-3]
    x = x.reshape((-1,) + x.shape[-3:])
    for i, width in enumerate(self.features):
      x = nn.Conv(width, kernel_size=(3, 3), strides=(2, 2), padding="SAME",
                  dtype=self.dtype, name=f"conv_{i}")(x)
      x = nn.LayerNorm(epsilon=self.layer_norm_eps, dtype=self.dtype, name=f"norm_{i}")(x)
      x = nn.gelu(x, approximate=False)
    return x.reshape(lead + x.shape[1:])


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
