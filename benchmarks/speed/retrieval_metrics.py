"""Times avtext.metrics.retrieval.retrieval_metrics on a 10k x 10k matrix.

    python -m benchmarks.speed.retrieval_metrics [--size=10000] [--repeats=7]

Both directions are timed the way the retrieval evaluator calls them:
retrieval_metrics(sim) for text->video (C-ordered rows) and
retrieval_metrics(sim.T) for video->text (a transposed view, no copy).
Prints and records the median (and min / max) of `--repeats` runs after one warm-up run.
--quick: a 1000 x 1000 matrix, 2 runs.
"""
import statistics

from absl import flags
import numpy as np

from avtext.metrics.retrieval import retrieval_metrics
from benchmarks import common

_SIZE = flags.DEFINE_integer("size", 10_000, "Q = N")
_REPEATS = flags.DEFINE_integer("repeats", 7, "timed runs")
_SEED = flags.DEFINE_integer("seed", 0, "seed of the embeddings")


def main(argv):
  del argv
  size, repeats = (1000, 2) if common.quick() else (_SIZE.value, _REPEATS.value)
  rng = np.random.default_rng(_SEED.value)
  # Noisy paired embeddings: a realistic spread of ranks, not a trivial diagonal.
  emb_text = rng.standard_normal((size, 256), dtype=np.float32)
  emb_video = emb_text + 5.0 * rng.standard_normal((size, 256), dtype=np.float32)
  sim = emb_text @ emb_video.T  # [Q, N] float32
  table = f"{size:,} x {size:,} float32 similarity matrix, {repeats} runs"
  for name, call, matrix in (("text -> video", "retrieval_metrics(sim)", sim),
                             ("video -> text", "retrieval_metrics(sim.T)", sim.T)):
    times = common.timed(lambda m=matrix: retrieval_metrics(m), repeats)
    metrics = retrieval_metrics(matrix)
    print(f"{name} {call}: median {statistics.median(times):.3f} s "
          f"(min {min(times):.3f}, max {max(times):.3f})  "
          + ", ".join(f"{k}={v:.2f}" for k, v in metrics.items()))
    metric = f"{name}: `{call}`"
    for column, value in (("median", statistics.median(times)), ("min", min(times)),
                          ("max", max(times))):
      common.record("Library functions", metric, value, unit="s", table=table, column=column,
                    digits=3)


if __name__ == "__main__":
  common.main(main)
