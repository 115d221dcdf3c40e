r"""Our XML train step with and without the CPU matmul / reduction forms of `avtext.ops`,
in one process on the train-step benchmark's batch, steps alternating.

    .venv/bin/python benchmarks/xml_step_ab.py --reps 12

"plain" traces the step under `ops.lowering_for("tpu")`, which replaces `ops.dense_matmul`
and `ops.broadcast_leading` by the plain product and broadcast (the computation before
they existed), "ops" as the code is on the CPU; both from the same init on `bench_xml_train_step.make_batch(seed)`
(configs/xml_tvr.py, float32, `Trainer.make_train_step`). After one untimed step each,
`--reps` rounds time one step of each variant, the order flipping every round, so that
load on a shared machine hits both alike; prints the medians and their ratio.
"""
import argparse
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
import bench_xml_train_step  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reps", type=int, default=12)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  from avtext import ops  # pylint: disable=g-import-not-at-top
  examples = bench_xml_train_step.make_batch(args.seed)
  steps = {}
  # "plain" is traced as for another backend (`ops.lowering_for`), which drops the CPU forms.
  for name, platform in (("plain", "tpu"), ("ops", "cpu")):
    with ops.lowering_for(platform):
      steps[name] = bench_xml_train_step.avtext_step_fn(examples, 851)[0]
      print(f"{name}: step-1 loss {steps[name]():.6f}", flush=True)  # traced and compiled here
  times = {name: [] for name in steps}
  for i in range(args.reps):
    for name in (list(steps) if i % 2 == 0 else list(steps)[::-1]):
      begin = time.perf_counter()
      steps[name]()
      times[name].append(time.perf_counter() - begin)
  for name, t in times.items():
    print(f"{name}: " + " ".join(f"{x:.3f}" for x in t))
  med = {name: float(np.median(t)) for name, t in times.items()}
  paired = np.asarray(times["plain"]) / np.asarray(times["ops"])
  print(f"median step: plain {med['plain']:.3f} s, ops {med['ops']:.3f} s; plain/ops "
        f"{med['plain'] / med['ops']:.3f} (per round: median {np.median(paired):.3f}, "
        f"range {paired.min():.3f}-{paired.max():.3f}); {args.reps} rounds")


if __name__ == "__main__":
  main()
