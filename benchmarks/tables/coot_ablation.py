r"""COOT Table-1-style ablation on the synthetic paragraph videos.

    python -m benchmarks.tables.coot_ablation --data=workdirs/demo/coot_data \
        [--out=workdirs/bench/coot_ablation] [--seeds=0,1,2] [--epochs=10] [--variants=full,max]

Trains `configs/coot_activitynet.py:demo` once per (variant, seed) with the
command-line overrides below, each in its own workdir (a finished run is
reused), and prints paragraph->video / video->paragraph R@1/5/50 and
clip-sentence R@1 (mean +- std over seeds) at the best checkpoint (selected
by the config's rule, mean video-paragraph R@1 on the val split — the
official protocol, which selects on the split it reports). `make demo-coot`
writes the data first.

Variants (COOT Table 1): full = AF pooling + CMC + Contextual Transformer;
max / avg = the local poolers replaced; no_cmc = lambda 0; no_ctx = no
cross-attention between local and global context. Every variant computes the official
function (the global mean sums the padded clip slots, `avg_special`) except
masked_pool = full with our masked global mean (`config.model.masked_pool`).
--quick: one epoch of `full`, seed 0. Rows: each variant's cells (mean ± std over seeds).
"""
import json
import pathlib
import subprocess
import sys
import time

from absl import flags
import numpy as np

from benchmarks import common

_DATA = flags.DEFINE_string("data", "workdirs/demo/coot_data", "`make demo-coot`'s coot_data")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "seeds")
_EPOCHS = flags.DEFINE_integer("epochs", None, "override train.num_epochs")
SYSTEM = "COOT"

VARIANTS = {
    "full": [],
    "max": ["--config.model.local_pooler=max"],
    "avg": ["--config.model.local_pooler=avg"],
    "no_cmc": ["--config.loss.cycle_weight=0.0"],
    "no_ctx": ["--config.model.use_context=False"],
    # Ours, not the official function: the global mean over the real clips only.
    "masked_pool": ["--config.model.masked_pool=True"],
}
_VARIANTS = flags.DEFINE_list("variants", list(VARIANTS), "variants, in this order")
METRICS = ("p2v_R@1", "p2v_R@5", "p2v_R@50", "v2p_R@1", "v2p_R@5", "v2p_R@50", "c2s_R@1",
           "s2c_R@1")


def best_results(workdir: pathlib.Path, select: str = "val/vp_R@1_mean") -> dict:
  """The val metrics of the evaluation with the highest `select` (the first on ties)."""
  results = json.loads((workdir / "results.json").read_text())
  steps = sorted((int(k) for k in results if k.isdigit() and select in results[k]))
  if not steps:
    raise SystemExit(f"{workdir}/results.json: no evaluation with {select}")
  best = max(steps, key=lambda s: (results[str(s)][select], -s))
  return {k.split("/", 1)[1]: v for k, v in results[str(best)].items() if k.startswith("val/")}


def main(argv):
  del argv
  seeds = [0] if common.quick() else [int(x) for x in _SEEDS.value]
  names = ["full"] if common.quick() else _VARIANTS.value
  epochs = 1 if common.quick() else _EPOCHS.value
  unknown = sorted(set(names) - set(VARIANTS))
  if unknown:
    raise SystemExit(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")
  out = common.out_dir()
  table = {}
  for name in names:
    runs = []
    for seed in seeds:
      workdir = out / f"{name}_s{seed}"
      cmd = [sys.executable, "-m", "avtext.main", "--config=configs/coot_activitynet.py:demo",
             f"--workdir={workdir}", f"--config.dataset.path={_DATA.value}",
             f"--config.seed={seed}", "--config.evals.val.export_embeddings=False",
             *VARIANTS[name]]
      if epochs:
        cmd.append(f"--config.train.num_epochs={epochs}")
      start = time.time()
      subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=common.REPO)
      runs.append(best_results(workdir))
      print(f"{name} seed {seed}: {time.time() - start:.0f} s, "
            + ", ".join(f"{m} {runs[-1][m]:.1f}" for m in METRICS), flush=True)
    table[name] = runs
  print(f"\n| variant | {' | '.join(METRICS)} |")
  print("|---|" + "---|" * len(METRICS))
  caption = (f"val R@1 / R@5 / R@50 at the best evaluation, seeds {','.join(map(str, seeds))}"
             + (" (mean ± std)" if len(seeds) > 1 else ""))
  for name, runs in table.items():
    cells = [f"{np.mean([r[m] for r in runs]):.1f} ± {np.std([r[m] for r in runs]):.1f}"
             for m in METRICS]
    print(f"| {name} | {' | '.join(cells)} |")
    for m in METRICS:
      values = [r[m] for r in runs]
      common.record(SYSTEM, name, float(np.mean(values)), table=caption,
                    column=m.replace("_", " "), std=float(np.std(values)) if len(runs) > 1
                    else None, digits=3)
  chance = table[next(iter(table))][0]
  print(f"\nchance R@1: video level {chance['vp_chance_r1']:.2f}, clip level "
        f"{chance['cs_chance_r1']:.2f}; seeds {seeds}")


if __name__ == "__main__":
  common.main(main)
