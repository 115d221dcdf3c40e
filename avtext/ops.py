"""Small array ops shared by models and losses (pure jnp)."""
import jax
import jax.numpy as jnp


def l2_normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
  """x / max(||x||_2, eps) over the last axis, in at least float32.

  The same definition as torch's F.normalize, which the COOT and TVR
  reference implementations use.
  """
  x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)


def _fmix32(x: jax.Array) -> jax.Array:
  """MurmurHash3's 32-bit finalizer: a bijection of uint32 with full avalanche."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x85EBCA6B)
  x = x ^ (x >> 13)
  x = x * jnp.uint32(0xC2B2AE35)
  return x ^ (x >> 16)


def hash_bernoulli(key: jax.Array, p: float, shape) -> jax.Array:
  """bool `shape`, True with probability `p` (to 2^-24), a cheap stand-in for
  `jax.random.bernoulli` in dropout masks.

  Element i gets fmix32(fmix32(i * golden + k0) ^ k1) (a counter-based hash
  like SplitMix; k0, k1 are one `jax.random.bits` draw from `key`), compared
  with p * 2^24 on its top 24 bits. About 10 integer ops per element instead
  of threefry's ~100: on a CPU the threefry masks were ~25% of a COOT train
  step (BENCHMARKS.md). Distinct elements of one call get distinct hash inputs
  (the Weyl step is a bijection for < 2^32 elements); different keys give
  unrelated masks. Not for anything needing cryptographic quality.
  """
  shape = tuple(int(s) for s in shape)
  size = 1
  for s in shape:
    size *= s
  if size >= 2**32:
    raise ValueError(f"hash_bernoulli: {size} elements; at most 2^32 - 1")
  k0, k1 = jax.random.bits(key, (2,), jnp.uint32)
  counter = jax.lax.iota(jnp.uint32, size).reshape(shape) if size else jnp.zeros(shape,
                                                                                  jnp.uint32)
  x = _fmix32(_fmix32(counter * jnp.uint32(0x9E3779B9) + k0) ^ k1)
  threshold = jnp.uint32(min(round(p * 2**24), 2**24))
  return (x >> 8) < threshold
