"""The fused attention kernels behind `attention.attention_core`: cuDNN's flash attention
on NVIDIA GPUs and the Pallas flash-attention kernel on TPUs, on sequences padded to a
multiple of `FUSED_PAD`, and the Pallas kernels' block sizes."""
import functools
import math

import jax
from jax.ad_checkpoint import checkpoint_name
import jax.numpy as jnp

Array = jax.Array
FUSED_PAD = 128


def fused_attention(implementation: str, query: Array, key: Array, value: Array,
                     mask: Array | None) -> Array:
  """A fused kernel on sequences padded to a multiple of `FUSED_PAD` (cuDNN's flash
  attention and the Pallas TPU kernels take no ragged lengths such as ViT's 1 + N):
  "cudnn", "flash_tpu" or "splash_tpu" (`tpu_heads_first`)."""
  batch, length = query.shape[:2]
  kv_length = key.shape[1]
  pad_q, pad_kv = -length % FUSED_PAD, -kv_length % FUSED_PAD
  pad = lambda x, n: jnp.pad(x, ((0, 0), (0, n), (0, 0), (0, 0)))
  query, key, value = pad(query, pad_q), pad(key, pad_kv), pad(value, pad_kv)
  real_key = jnp.arange(kv_length + pad_kv) < kv_length  # [L_kv']
  if implementation == "cudnn":
    if mask is None:  # cuDNN's own padding support: no [B, H, L, L] mask in memory
      lengths = lambda n: jnp.full((batch,), n, jnp.int32)
      out = jax.nn.dot_product_attention(
          query, key, value, query_seq_lengths=lengths(length),
          key_value_seq_lengths=lengths(kv_length), implementation="cudnn")
      return out[:, :length]
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
  heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # [B, H, L, d], the kernel's layout
  out = tpu_heads_first(heads_first(query), heads_first(key), heads_first(value),
                        key_valid(mask, batch, kv_length, kv_length + pad_kv), implementation)
  return heads_first(out)[:, :length]


def key_valid(mask: Array | None, batch: int, kv_length: int, padded: int) -> Array:
  """[B, padded] bool: the keys a TPU kernel may attend to, the real ones (< kv_length)
  that a key padding mask ([B or 1, 1, 1, kv_length], or None) keeps."""
  valid = jnp.broadcast_to((jnp.arange(padded) < kv_length)[None], (batch, padded))
  if mask is None:
    return valid
  keys = jnp.broadcast_to(mask[:, 0, 0, :], (batch, kv_length))
  return jnp.logical_and(valid, jnp.pad(keys, ((0, 0), (0, padded - kv_length))))


def tpu_heads_first(query: Array, key: Array, value: Array, kv_valid: Array,
                    implementation: str = "flash_tpu", prefix_lm: int = 0) -> Array:
  """A Pallas TPU kernel in its own layout: query [B, H, L_q, d], key and value
  [B, H, L_kv, d], lengths multiples of `FUSED_PAD`; `kv_valid` [B, L_kv] bool, False for
  padded or masked keys (segment 0; queries and real keys are segment 1). Returns
  [B, H, L_q, d] (padded query rows included). `implementation`: "flash_tpu" (the flash
  kernel: a forward, a dK/dV and a dQ kernel) or "splash_tpu" (the splash kernel, its
  backward one fused dQ/dK/dV kernel: `splash_block_sizes`). `prefix_lm` P > 0 (splash
  only; self-attention): a prefix LM, query i attends to key j when j < P or j <= i
  (`attention.make_prefix_lm_mask`), the mask computed inside the kernel."""
  batch, heads, length, depth = query.shape
  segments = (jnp.ones((batch, length), jnp.int32), kv_valid.astype(jnp.int32))
  if prefix_lm and implementation != "splash_tpu":
    raise ValueError(f"prefix_lm on the TPU kernels' layout needs the splash kernel, not "
                     f"{implementation!r}")
  if implementation == "splash_tpu":
    kernel = _splash_kernel(heads, length, key.shape[2], depth, prefix_lm)
  else:
    blocks = flash_block_sizes(length, key.shape[2])

    def kernel(q, k, v, q_ids, kv_ids):
      # The forward kernel's name carries no block sizes (the backward ones' do): the
      # scope puts them in its op_name for `avtext.aot.hlo_cost`.
      with jax.named_scope(f"flash_fwd_block_q={blocks.block_q}"):
        return _pallas_flash(q, k, v, q_ids, kv_ids, 1.0 / math.sqrt(depth), blocks)

  # A Mosaic kernel is not partitioned by XLA: under a mesh (the trainer and avtext.aot
  # set one for flash_tpu, partitioning.mesh_context) each device runs it on its slice
  # of the batch.
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty and "data" in mesh.axis_names:
    batch_axis = jax.sharding.PartitionSpec("data")
    kernel = jax.shard_map(kernel, mesh=mesh, in_specs=batch_axis, out_specs=batch_axis,
                           check_vma=False)
  return kernel(query, key, value, *segments)


# The splash kernel's blocks: major query and key blocks as large as fit (the flash
# kernel's forward limit, 640 rows, for both), computed 128 keys at a time.
SPLASH_MAX_BLOCK = 640
# Build the splash kernel for Pallas' interpreter: the CPU tests (vmapped over a batch
# it does not run under `pltpu.force_tpu_interpret_mode`, which the flash kernel's use).
SPLASH_INTERPRET = False


def splash_block_sizes(q_length: int, kv_length: int):
  """Block sizes of the splash kernel for sequences padded to `FUSED_PAD`, with the
  fused backward kernel (dQ, dK and dV from one pass over the scores: 5 products where
  the flash kernel's two backward kernels run 7)."""
  from jax.experimental.pallas.ops.tpu import splash_attention  # pylint: disable=g-import-not-at-top
  block_q = _largest_block(q_length, SPLASH_MAX_BLOCK)
  block_kv = _largest_block(kv_length, SPLASH_MAX_BLOCK)
  return splash_attention.BlockSizes(
      block_q=block_q, block_kv=block_kv, block_kv_compute=FUSED_PAD,
      block_q_dkv=block_q, block_kv_dkv=block_kv, block_kv_dkv_compute=FUSED_PAD,
      use_fused_bwd_kernel=True)


def _splash_kernel(heads: int, q_length: int, kv_length: int, depth: int,
                   prefix_lm: int = 0):
  """kernel(q, k, v, q_ids, kv_ids) on [B, H, L, d]: the splash kernel of a full mask
  (padding is in the segment ids) or of a prefix LM over the first `prefix_lm` positions,
  per example, queries scaled by 1/sqrt(d) first (the kernel takes no scale), its output
  and log-sum-exp named `KERNEL_RESIDUALS`."""
  from jax.experimental.pallas.ops.tpu import splash_attention  # pylint: disable=g-import-not-at-top
  shape = (q_length, kv_length)
  one_head = (_prefix_lm_mask(shape, prefix_lm) if prefix_lm
              else splash_attention.FullMask(shape))
  mask = splash_attention.MultiHeadMask([one_head] * heads)
  splash = splash_attention.make_splash_mha(
      mask, block_sizes=splash_block_sizes(q_length, kv_length), head_shards=1,
      q_seq_shards=1, residual_checkpoint_name=KERNEL_RESIDUALS, interpret=SPLASH_INTERPRET)

  def kernel(q, k, v, q_ids, kv_ids):
    q = q * jnp.asarray(1.0 / math.sqrt(depth), q.dtype)
    one = lambda q, k, v, q_ids, kv_ids: splash(
        q, k, v, segment_ids=splash_attention.SegmentIds(q=q_ids, kv=kv_ids))
    return jax.vmap(one)(q, k, v, q_ids, kv_ids)
  return kernel


def _prefix_lm_mask(shape: tuple[int, int], prefix: int):
  """The splash kernel's prefix-LM mask: (query i, key j) kept when j < prefix or j <= i,
  computed in the kernel from the positions (no [L, L] array), blocks wholly masked
  skipped. A splash mask is compared by value: equal shapes and prefixes are one mask."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask  # pylint: disable=g-import-not-at-top

  class PrefixLMMask(splash_attention_mask._ComputableMask):  # pylint: disable=protected-access

    def __init__(self):
      super().__init__(shape, lambda q_ids, kv_ids: (kv_ids < prefix) | (q_ids >= kv_ids))

    def __eq__(self, other):
      return (type(other).__name__ == "PrefixLMMask" and self.shape == other.shape
              and self.prefix == other.prefix)

    def __hash__(self):
      return hash(("PrefixLMMask", self.shape, prefix))

    prefix = property(lambda self: prefix)

  return PrefixLMMask()


# What the remat policy "save_attention_kernel" (`layers.remat_policy`) keeps of a fused
# attention kernel's forward for its backward pass: the Pallas kernel's output and its
# softmax statistics (named below), cuDNN's output and statistics (its forward
# primitive's outputs). The backward kernels then run without the forward run again.
KERNEL_RESIDUALS = "attention_kernel"
CUDNN_FORWARD_PRIMITIVES = ("dot_product_attention_fwd", "dot_product_attention_fwd_wrapper")


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _pallas_flash(q, k, v, q_ids, kv_ids, sm_scale, blocks):
  """`pallas_flash.flash_attention` ([B, H, L, d], segment ids), its forward and backward
  kernels as they are, with the forward's residuals named `KERNEL_RESIDUALS`: the same
  function and gradient, which a remat policy can now keep instead of recomputing."""
  from jax.experimental.pallas.ops.tpu import flash_attention as pallas_flash  # pylint: disable=g-import-not-at-top
  return pallas_flash.flash_attention(
      q, k, v, segment_ids=pallas_flash.SegmentIds(q=q_ids, kv=kv_ids), sm_scale=sm_scale,
      block_sizes=blocks)


def _pallas_flash_fwd(q, k, v, q_ids, kv_ids, sm_scale, blocks):
  from jax.experimental.pallas.ops.tpu import flash_attention as pallas_flash  # pylint: disable=g-import-not-at-top
  segments = pallas_flash.SegmentIds(q=q_ids, kv=kv_ids)
  # The kernel's own forward rule (`_flash_attention_fwd`, jax 0.10.2): the output and
  # the softmax's row sums and maxima, [B, H, L] each.
  o, l, m = pallas_flash._flash_attention_impl(  # pylint: disable=protected-access
      q, k, v, None, segments, True, False, sm_scale, blocks.block_b, blocks.block_q,
      blocks.block_k_major, blocks.block_k, False)
  o, l, m = (checkpoint_name(x, KERNEL_RESIDUALS) for x in (o, l, m))
  return o, (q, k, v, segments, o, l, m)


def _pallas_flash_bwd(sm_scale, blocks, residuals, do):
  from jax.experimental.pallas.ops.tpu import flash_attention as pallas_flash  # pylint: disable=g-import-not-at-top
  q, k, v, segments, o, l, m = residuals
  dq, dk, dv, _, _ = pallas_flash._flash_attention_bwd(  # pylint: disable=protected-access
      False, False, sm_scale, blocks, False, (q, k, v, None, segments, o, l, m), do)
  return dq, dk, dv, None, None


_pallas_flash.defvjp(_pallas_flash_fwd, _pallas_flash_bwd)


# The Pallas flash kernels stream one operand side block by block and re-read the other
# side once per block of it: the forward and dQ kernels read K and V once per block of
# queries, the dK/dV kernel reads Q, dO and the softmax statistics once per block of
# keys. Large major blocks cut that traffic (at 3,200 tokens and 128-row blocks K and V
# are read 25 times); the limits are the kernels' scoped VMEM on a v5e at the AVR paper
# step's per-chip shape, found by compiling for it (`tests/test_models_precision.py`):
# 640 query rows in the forward and dQ kernels, 3,200 key rows in the dK/dV kernel
# (3,200-row query blocks do not fit).
FLASH_MAX_BLOCK_Q = 640
FLASH_MAX_BLOCK_K_DKV = 4096


def _largest_block(length: int, limit: int) -> int:
  """The largest multiple of `FUSED_PAD` that divides `length` and is <= limit."""
  best = FUSED_PAD
  for block in range(FUSED_PAD, min(length, limit) + 1, FUSED_PAD):
    if length % block == 0:
      best = block
  return best


def flash_block_sizes(q_length: int, kv_length: int):
  """The Pallas flash kernels' block sizes for sequences padded to `FUSED_PAD`: major
  blocks as large as fit (`FLASH_MAX_BLOCK_Q`, `FLASH_MAX_BLOCK_K_DKV`), minor blocks
  of 128."""
  from jax.experimental.pallas.ops.tpu import flash_attention as pallas_flash  # pylint: disable=g-import-not-at-top
  block_q = _largest_block(q_length, FLASH_MAX_BLOCK_Q)
  return pallas_flash.BlockSizes(
      block_q=block_q, block_k_major=FUSED_PAD, block_k=FUSED_PAD, block_b=1,
      block_q_major_dkv=FUSED_PAD, block_k_major_dkv=_largest_block(
          kv_length, FLASH_MAX_BLOCK_K_DKV), block_k_dkv=FUSED_PAD,
      block_q_dkv=FUSED_PAD, block_k_major_dq=FUSED_PAD, block_k_dq=FUSED_PAD,
      block_q_dq=block_q)
