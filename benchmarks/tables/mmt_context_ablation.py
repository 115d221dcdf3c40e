r"""MMT context ablation (TVR Table 14) on the synthetic long videos.

    python -m benchmarks.tables.mmt_context_ablation --data=workdirs/demo/tvr_data \
        --vocab=workdirs/demo/tvc_word2idx.json [--out=workdirs/bench/mmt_context_ablation] \
        [--seeds=0] [--variants=video+sub,video,sub]

Trains `configs/mmt_tvc.py:demo` with context video+sub, video only and sub
only (`:demo,video`, `:demo,sub`), each in its own workdir (a finished run is
reused), evaluates its best checkpoint (val CIDEr-D, the official selection)
on test_public with `--mode=eval --step=best`, and prints BLEU-4 / METEOR /
ROUGE-L / CIDEr-D (x100) and the attribute precision / recall. Then, from the
written submission file, CIDEr-D against the references of one description
type at a time (v: video only, t: subtitle only, vt: both; moments with at
least one reference of the type), which shows what each context is used for.
`make demo-tvc` writes the data and the vocabulary first. --quick: one epoch of video+sub,
seed 0. Rows: each context's cells (mean ± std over seeds).
"""
import json
import pathlib

from absl import flags
import numpy as np

from avtext.metrics import captioning as caption_metrics
from benchmarks import common

_DATA = flags.DEFINE_string("data", "workdirs/demo/tvr_data", "`make demo-tvc`'s tvr_data")
_VOCAB = flags.DEFINE_string("vocab", "workdirs/demo/tvc_word2idx.json", "its word2idx")
_SEEDS = flags.DEFINE_list("seeds", ["0"], "seeds")
SYSTEM = "TVR: MMT"

VARIANTS = {"video+sub": "demo", "video": "demo,video", "sub": "demo,sub",
            # Ours (the default before issue 29): the shared block's decoder layer (output
            # Linears, GELU MLP) and the mean label-smoothed NLL; not the official function.
            "video+sub ours": "demo,standard_decoder,mean_nll"}
_VARIANTS = flags.DEFINE_list("variants", ["video+sub", "video", "sub"],
                              "contexts: " + ", ".join(VARIANTS))
METRICS = ("BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D")


def run(variant: str, seed: int) -> pathlib.Path:
  """The workdir of `variant` at `seed`, its best val checkpoint evaluated on test_public."""
  workdir = common.out_dir() / f"{variant.replace('+', '_').replace(' ', '_')}_s{seed}"
  common.train_and_test_best(
      f"configs/mmt_tvc.py:{VARIANTS[variant]}",
      [f"--config.dataset.path={_DATA.value}", f"--config.model.vocab={_VOCAB.value}",
       f"--config.seed={seed}"] + (["--config.train.num_epochs=1"] if common.quick() else []),
      workdir)
  return workdir


def by_type(data: pathlib.Path, submission: pathlib.Path) -> dict[str, float]:
  refs = [json.loads(l) for l in (data / "tvc_test_public_release.jsonl").read_text().splitlines()]
  hyps = {r["clip_id"]: r["descs"][0]["desc"]
          for r in map(json.loads, submission.read_text().splitlines())}
  out = {}
  for kind in ("v", "t", "vt"):
    sub = {r["clip_id"]: [d["desc"] for d in r["descs"] if d["type"] == kind] for r in refs}
    sub = {k: v for k, v in sub.items() if v}
    out[kind] = 100 * caption_metrics.caption_metrics(sub, {k: hyps[k] for k in sub})["CIDEr-D"]
  return out


def main(argv):
  del argv
  seeds = [0] if common.quick() else [int(x) for x in _SEEDS.value]
  names = ["video+sub"] if common.quick() else _VARIANTS.value
  rows = {}
  for variant in names:
    if variant not in VARIANTS:
      raise SystemExit(f"--variants: unknown {variant!r}; known: {', '.join(VARIANTS)}")
    per_seed = []
    for seed in seeds:
      workdir = run(variant, seed)
      results = json.loads((workdir / "results.json").read_text())
      best = results["best"]["step"]
      res = results[str(best)]
      sub = workdir / "captions" / f"test_step{best}.jsonl"
      per_seed.append({**{m: 100 * res[f"test/{m}"] for m in METRICS},
                       "attr_prec": res["test/attribute_precision"],
                       "attr_rec": res["test/attribute_recall"],
                       **{f"CIDEr-D[{k}]": v for k, v in by_type(pathlib.Path(_DATA.value),
                                                                 sub).items()},
                       "best_step": best})
    rows[variant] = per_seed
  keys = [*METRICS, "attr_prec", "attr_rec", "CIDEr-D[v]", "CIDEr-D[t]", "CIDEr-D[vt]",
          "best_step"]
  labels = {"attr_prec": "attr. precision", "attr_rec": "attr. recall",
            "CIDEr-D[v]": "CIDEr-D vs v refs", "CIDEr-D[t]": "CIDEr-D vs t refs",
            "CIDEr-D[vt]": "CIDEr-D vs vt refs", "best_step": "best step"}
  table = (f"test_public at the best val checkpoint, seeds {','.join(map(str, seeds))}"
           + (" (mean ± std)" if len(seeds) > 1 else ""))
  print(f"{'context':<10}" + "".join(f"{k:>13}" for k in keys))
  for variant, per_seed in rows.items():
    cells = []
    for k in keys:
      vals = np.array([r[k] for r in per_seed], np.float64)
      cells.append(f"{vals.mean():8.2f}" + (f"±{vals.std():.2f}" if len(vals) > 1 else "     "))
      if k != "best_step":
        common.record(SYSTEM, variant, float(vals.mean()), table=table,
                      column=labels.get(k, k), std=float(vals.std()) if len(vals) > 1 else None,
                      digits=4)
    print(f"{variant:<10}" + "".join(f"{c:>13}" for c in cells))


if __name__ == "__main__":
  common.main(main)
