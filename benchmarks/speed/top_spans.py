"""Times avtext.inference.spans.top_spans on a VCMR-sized workload.

  python benchmarks/bench_top_spans.py            # 100 queries x 100 videos x 128 clips
  python benchmarks/bench_top_spans.py --k=200    # XML's max_before_nms

Default workload: 10,000 rows (100 queries x their top-100 videos, TVR eq. 8)
of 128 clips, with XML's length prior Lmin = 2, Lmax = 16 (TVR sec. 4.3) and
k = 100 spans per row (R@100 is the largest K TVR reports). Prints the command,
machine, date and the median / min / max of --repeats timed calls after one
compile-and-warm-up call. With --dense the same top-k is also timed on the
full [L, L] start-end product masked by the prior (the official XML decoding),
for comparison.
"""
import argparse
import datetime
import platform
import shlex
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from avtext.inference import spans


def _dense_top_spans(p_start, p_end, *, min_len, max_len, k):
  """Reference decoding over the full [L, L] matrix (not for production use)."""
  length = p_start.shape[-1]
  span_len = jnp.arange(length)[None, :] - jnp.arange(length)[:, None] + 1
  valid = (span_len >= min_len) & (span_len <= max_len)
  product = jnp.where(valid, p_start[..., :, None] * p_end[..., None, :], -jnp.inf)
  score, index = jax.lax.top_k(product.reshape(*product.shape[:-2], -1), k)
  return index // length, index % length, score


def _time(fn, args, repeats):
  jax.block_until_ready(fn(*args))  # compile + warm-up
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return times


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--queries", type=int, default=100)
  parser.add_argument("--videos", type=int, default=100)
  parser.add_argument("--clips", type=int, default=128)
  parser.add_argument("--min_len", type=int, default=2)
  parser.add_argument("--max_len", type=int, default=16)
  parser.add_argument("--k", type=int, default=100)
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--dense", action="store_true",
                      help="also time the full [L, L] decoding")
  args = parser.parse_args(argv)

  shape = (args.queries, args.videos, args.clips)
  key_start, key_end = jax.random.split(jax.random.key(0))
  p_start = jax.nn.softmax(jax.random.normal(key_start, shape), axis=-1)
  p_end = jax.nn.softmax(jax.random.normal(key_end, shape), axis=-1)
  static = dict(min_len=args.min_len, max_len=args.max_len, k=args.k)

  print("command:", shlex.join([sys.executable] + sys.argv))
  print("date:", datetime.datetime.now().astimezone().isoformat(timespec="seconds"))
  print("machine:", platform.node(), platform.machine(), platform.processor() or "",
        f"python {platform.python_version()}, jax {jax.__version__}")
  print("devices:", ", ".join(str(d.device_kind) for d in jax.local_devices()[:1]),
        f"(x{jax.local_device_count()}, backend {jax.default_backend()})")
  print(f"workload: {args.queries * args.videos} rows x {args.clips} clips, "
        f"Lmin={args.min_len} Lmax={args.max_len} k={args.k}, float32")

  variants = {"top_spans (banded)": spans.top_spans}
  if args.dense:
    variants["dense [L, L] reference"] = _dense_top_spans
  for name, fn in variants.items():
    jitted = jax.jit(lambda a, b, fn=fn: fn(a, b, **static))
    times = _time(jitted, (p_start, p_end), args.repeats)
    print(f"{name}: median {1e3 * statistics.median(times):.2f} ms, "
          f"min {1e3 * min(times):.2f} ms, max {1e3 * max(times):.2f} ms "
          f"over {args.repeats} calls")


if __name__ == "__main__":
  main()
