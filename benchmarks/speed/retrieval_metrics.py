"""Times avtext.metrics.retrieval.retrieval_metrics on a 10k x 10k matrix.

  .venv/bin/python benchmarks/bench_retrieval_metrics.py [--size 10000] [--repeats 7]

Both directions are timed the way the retrieval evaluator calls them:
retrieval_metrics(sim) for text->video (C-ordered rows) and
retrieval_metrics(sim.T) for video->text (a transposed view, no copy).
Prints the command, machine, date and the median (and min / max) of
`--repeats` runs after one warm-up run.
"""
import argparse
import datetime
import os
import platform
import statistics
import sys
import time

import numpy as np

from avtext.metrics.retrieval import retrieval_metrics


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown CPU"


def _time(fn, repeats: int) -> list:
  fn()  # warm-up: page in the matrix, first-call overheads
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return times


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", type=int, default=10_000, help="Q = N")
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()

  rng = np.random.default_rng(args.seed)
  # Noisy paired embeddings: a realistic spread of ranks, not a trivial diagonal.
  emb_text = rng.standard_normal((args.size, 256), dtype=np.float32)
  emb_video = emb_text + 5.0 * rng.standard_normal((args.size, 256), dtype=np.float32)
  sim = emb_text @ emb_video.T  # [Q, N] float32

  print(f"command: {' '.join([os.path.relpath(sys.executable)] + sys.argv)}")
  print(f"machine: {_cpu_model()}, {os.cpu_count()} logical CPUs, "
        f"{platform.platform()}, python {platform.python_version()}, "
        f"numpy {np.__version__}")
  print(f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}")
  print(f"matrix: {args.size} x {args.size} float32, median of {args.repeats} runs")
  for name, matrix in (("text->video retrieval_metrics(sim)", sim),
                       ("video->text retrieval_metrics(sim.T)", sim.T)):
    times = _time(lambda m=matrix: retrieval_metrics(m), args.repeats)
    metrics = retrieval_metrics(matrix)
    print(f"{name}: median {statistics.median(times):.3f} s "
          f"(min {min(times):.3f}, max {max(times):.3f})  "
          + ", ".join(f"{k}={v:.2f}" for k, v in metrics.items()))


if __name__ == "__main__":
  main()
