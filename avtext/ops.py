"""Small array ops shared by models and losses (pure jnp)."""
import functools
import math

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


PLATFORMS = ("cpu", "gpu", "tpu")


def platform(backend: str | None = None) -> str:
  """The platform a program is traced for: `backend` (a model's `config.model.backend`,
  passed down by its builder), else JAX's default backend; "cpu", "gpu" or "tpu" (CUDA
  and ROCm are "gpu"). `avtext.aot` compiles TPU and GPU programs on a CPU host by
  building the model with its target's backend."""
  name = backend or jax.default_backend()
  return "gpu" if name in ("cuda", "rocm") else name


def dense_dot_general(lhs: jax.Array, rhs: jax.Array, dimension_numbers, precision=None,
                      preferred_element_type=None, *, backend: str | None = None) -> jax.Array:
  """`jax.lax.dot_general` for `nn.Dense(dot_general=functools.partial(...,
  backend=...))`: `dense_matmul` for the Dense's contraction (last axis of the input by a
  2-D kernel's first), plain `lax.dot_general` for anything else."""
  if (rhs.ndim != 2 or preferred_element_type is not None
      or tuple(map(tuple, dimension_numbers[0])) != ((lhs.ndim - 1,), (0,))
      or any(map(tuple, dimension_numbers[1]))):
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type)
  return dense_matmul(lhs, rhs, precision, backend=backend)


def dense_matmul(x: jax.Array, kernel: jax.Array, precision=None, *,
                 backend: str | None = None) -> jax.Array:
  """x [..., D_in] @ kernel [D_in, D_out], whose kernel gradient (a contraction over all
  N rows of x) is computed in the orientation with the smaller kernel dimension as the
  output's rows: (dy^T x)^T where D_in > D_out, x^T dy otherwise, the choice kept from
  XLA's layout assignment by an optimization barrier (on a kernel-sized array). The same
  function and the same sums of products as `x @ kernel` (reverse mode only, as any
  custom_vjp). On XLA's CPU backend the orientation matters: for N = 12,800 rows of
  3072 -> 256 (XML's video projection) (dy^T x)^T took 255 ms against 417 ms for x^T dy,
  the one XLA picked on its own, and for 256 -> 768 (a fused query / key / value
  projection) x^T dy 76 ms against 110 ms (2-core dev VM, shared with other jobs;
  BENCHMARKS.md, XML train step). Only where the program is traced for the CPU
  (`platform(backend)`): elsewhere (measured nowhere else, and remat policies on TPU / GPU
  configs see plain dots) the plain product."""
  if platform(backend) != "cpu":
    return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())),
                               precision=precision)
  return _dense_matmul(x, kernel, precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _dense_matmul(x: jax.Array, kernel: jax.Array, precision) -> jax.Array:
  return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())), precision=precision)


def _dense_matmul_fwd(x, kernel, precision):
  return _dense_matmul(x, kernel, precision), (x, kernel)


def _dense_matmul_bwd(precision, residuals, dy):
  x, kernel = residuals
  dx = jax.lax.dot_general(dy, kernel, (((dy.ndim - 1,), (1,)), ((), ())), precision=precision)
  x_rows, dy_rows = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
  over_rows = (((0,), (0,)), ((), ()))
  if kernel.shape[0] > kernel.shape[1]:  # [D_out, D_in], then transposed
    dkernel = jax.lax.optimization_barrier(
        jax.lax.dot_general(dy_rows, x_rows, over_rows, precision=precision)).T
  else:
    dkernel = jax.lax.optimization_barrier(
        jax.lax.dot_general(x_rows, dy_rows, over_rows, precision=precision))
  return dx.astype(x.dtype), dkernel.astype(kernel.dtype)


_dense_matmul.defvjp(_dense_matmul_fwd, _dense_matmul_bwd)


def broadcast_leading(x: jax.Array, lead: tuple[int, ...], *,
                      backend: str | None = None) -> jax.Array:
  """`jnp.broadcast_to(x, lead + x.shape)` whose gradient, the sum over the leading axes,
  is a matrix product with ones: XLA's CPU reduce over a major axis ran ~10x slower than
  that product for [128, 100, 256] -> [100, 256] (a position table added to every item of
  the batch; 2-core dev VM, shared with other jobs). The same sums. Only where the program
  is traced for the CPU (`platform(backend)`, as `dense_matmul`); elsewhere
  `jnp.broadcast_to`."""
  lead = tuple(int(n) for n in lead)
  if platform(backend) != "cpu":
    return jnp.broadcast_to(x, lead + x.shape)
  return _broadcast_leading(x, lead)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _broadcast_leading(x: jax.Array, lead: tuple[int, ...]) -> jax.Array:
  return jnp.broadcast_to(x, lead + x.shape)


def _broadcast_leading_fwd(x, lead):
  return _broadcast_leading(x, lead), None


def _broadcast_leading_bwd(lead, _, dy):
  n = math.prod(lead)
  ones = jnp.ones((1, n), dy.dtype)
  dx = jax.lax.optimization_barrier(ones @ dy.reshape(n, -1))
  return (dx.reshape(dy.shape[len(lead):]),)


_broadcast_leading.defvjp(_broadcast_leading_fwd, _broadcast_leading_bwd)
