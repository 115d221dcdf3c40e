"""Times avtext.inference.spans.top_spans on a VCMR-sized workload.

  python -m benchmarks.speed.top_spans [--dense]    # 100 queries x 100 videos x 128 clips
  python -m benchmarks.speed.top_spans --k=200      # XML's max_before_nms

Default workload: 10,000 rows (100 queries x their top-100 videos, TVR eq. 8)
of 128 clips, with XML's length prior Lmin = 2, Lmax = 16 (TVR sec. 4.3) and
k = 100 spans per row (R@100 is the largest K TVR reports). Prints and records the
median / min / max of --repeats timed calls after one compile-and-warm-up call. With
--dense the same top-k is also timed on the full [L, L] start-end product masked by the
prior (the official XML decoding), for comparison. --quick: 10 queries x 10 videos, 2 calls.
"""
import statistics

from absl import flags
import jax
import jax.numpy as jnp

from avtext.inference import spans
from benchmarks import common

_QUERIES = flags.DEFINE_integer("queries", 100, "queries")
_VIDEOS = flags.DEFINE_integer("videos", 100, "videos per query")
_CLIPS = flags.DEFINE_integer("clips", 128, "clips per video")
_MIN_LEN = flags.DEFINE_integer("min_len", 2, "Lmin")
_MAX_LEN = flags.DEFINE_integer("max_len", 16, "Lmax")
_K = flags.DEFINE_integer("k", 100, "spans per row")
_REPEATS = flags.DEFINE_integer("repeats", 10, "timed calls")
_DENSE = flags.DEFINE_bool("dense", False, "also time the full [L, L] decoding")


def _dense_top_spans(p_start, p_end, *, min_len, max_len, k):
  """Reference decoding over the full [L, L] matrix (not for production use)."""
  length = p_start.shape[-1]
  span_len = jnp.arange(length)[None, :] - jnp.arange(length)[:, None] + 1
  valid = (span_len >= min_len) & (span_len <= max_len)
  product = jnp.where(valid, p_start[..., :, None] * p_end[..., None, :], -jnp.inf)
  score, index = jax.lax.top_k(product.reshape(*product.shape[:-2], -1), k)
  return index // length, index % length, score


def main(argv):
  del argv
  queries, videos, repeats = ((10, 10, 2) if common.quick() else
                              (_QUERIES.value, _VIDEOS.value, _REPEATS.value))
  shape = (queries, videos, _CLIPS.value)
  key_start, key_end = jax.random.split(jax.random.key(0))
  p_start = jax.nn.softmax(jax.random.normal(key_start, shape), axis=-1)
  p_end = jax.nn.softmax(jax.random.normal(key_end, shape), axis=-1)
  static = dict(min_len=_MIN_LEN.value, max_len=_MAX_LEN.value, k=_K.value)
  table = (f"{queries * videos:,} rows x {_CLIPS.value} clips, Lmin {_MIN_LEN.value}, "
           f"Lmax {_MAX_LEN.value}, float32, {repeats} calls")
  print(f"{table}; {jax.default_backend()} x{jax.local_device_count()}")
  variants = {"`top_spans` (banded, O(L * Lmax))": spans.top_spans}
  if _DENSE.value:
    variants["dense [L, L] start x end product + mask (the official XML decoding)"] = (
        _dense_top_spans)
  for name, fn in variants.items():
    jitted = jax.jit(lambda a, b, fn=fn: fn(a, b, **static))
    times = common.timed(lambda j=jitted: jax.block_until_ready(j(p_start, p_end)), repeats)
    print(f"{name}: median {1e3 * statistics.median(times):.2f} ms, "
          f"min {1e3 * min(times):.2f} ms, max {1e3 * max(times):.2f} ms")
    for column, value in (("median", statistics.median(times)), ("min", min(times)),
                          ("max", max(times))):
      common.record("Library functions", f"{name}, k {_K.value}", 1e3 * value, unit="ms",
                    table=table, column=column, digits=3)


if __name__ == "__main__":
  common.main(main)
