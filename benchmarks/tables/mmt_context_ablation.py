r"""MMT context ablation (TVR Table 14) on the synthetic long videos.

    .venv/bin/python benchmarks/mmt_context_ablation.py --data=workdirs/demo/tvr_data \
        --vocab=workdirs/demo/tvc_word2idx.json --out=workdirs/mmt_ablation [--seeds=0]

Trains `configs/mmt_tvc.py:demo` with context video+sub, video only and sub
only (`:demo,video`, `:demo,sub`), each in its own workdir (a finished run is
reused), evaluates its best checkpoint (val CIDEr-D, the official selection)
on test_public with `--mode=eval --step=best`, and prints BLEU-4 / METEOR /
ROUGE-L / CIDEr-D (x100) and the attribute precision / recall. Then, from the
written submission file, CIDEr-D against the references of one description
type at a time (v: video only, t: subtitle only, vt: both; moments with at
least one reference of the type), which shows what each context is used for.
`make demo-tvc` writes the data and the vocabulary first.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import time

import numpy as np

from avtext.metrics import captioning as caption_metrics

VARIANTS = {"video+sub": "demo", "video": "demo,video", "sub": "demo,sub",
            # Ours (the default before issue 29): the shared block's decoder layer (output
            # Linears, GELU MLP) and the mean label-smoothed NLL; not the official function.
            "video+sub ours": "demo,standard_decoder,mean_nll"}
METRICS = ("BLEU-4", "METEOR", "ROUGE-L", "CIDEr-D")


def run(variant: str, seed: int, args) -> pathlib.Path:
  workdir = pathlib.Path(args.out) / f"{variant.replace('+', '_').replace(' ', '_')}_s{seed}"
  common = [f"--config.dataset.path={args.data}", f"--config.model.vocab={args.vocab}",
            f"--workdir={workdir}", f"--config.seed={seed}"]
  config = f"--config=configs/mmt_tvc.py:{VARIANTS[variant]}"
  if not (workdir / "results.json").exists() or "best_eval" not in json.loads(
      (workdir / "results.json").read_text()):
    begin = time.time()
    subprocess.run([sys.executable, "-m", "avtext.main", config, *common], check=True)
    subprocess.run([sys.executable, "-m", "avtext.main", config, *common, "--mode=eval",
                    "--step=best"], check=True)
    results = json.loads((workdir / "results.json").read_text())
    results["best_eval"] = {"seconds": time.time() - begin}
    (workdir / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True))
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


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--data", default="workdirs/demo/tvr_data")
  parser.add_argument("--vocab", default="workdirs/demo/tvc_word2idx.json")
  parser.add_argument("--out", default="workdirs/mmt_ablation")
  parser.add_argument("--seeds", default="0")
  parser.add_argument("--variants", default="video+sub,video,sub",
                      help="comma list of " + ", ".join(VARIANTS))
  args = parser.parse_args()
  seeds = [int(s) for s in args.seeds.split(",")]
  rows = {}
  for variant in args.variants.split(","):
    if variant not in VARIANTS:
      parser.error(f"--variants: unknown {variant!r}; known: {', '.join(VARIANTS)}")
    per_seed = []
    for seed in seeds:
      workdir = run(variant, seed, args)
      results = json.loads((workdir / "results.json").read_text())
      best = results["best"]["step"]
      res = results[str(best)]
      sub = workdir / "captions" / f"test_step{best}.jsonl"
      per_seed.append({**{m: 100 * res[f"test/{m}"] for m in METRICS},
                       "attr_prec": res["test/attribute_precision"],
                       "attr_rec": res["test/attribute_recall"],
                       **{f"CIDEr-D[{k}]": v for k, v in by_type(pathlib.Path(args.data),
                                                                 sub).items()},
                       "best_step": best})
    rows[variant] = per_seed
  keys = [*METRICS, "attr_prec", "attr_rec", "CIDEr-D[v]", "CIDEr-D[t]", "CIDEr-D[vt]",
          "best_step"]
  print(f"{'context':<10}" + "".join(f"{k:>13}" for k in keys))
  for variant, per_seed in rows.items():
    cells = []
    for k in keys:
      vals = np.array([r[k] for r in per_seed], np.float64)
      cells.append(f"{vals.mean():8.2f}" + (f"±{vals.std():.2f}" if len(vals) > 1 else "     "))
    print(f"{variant:<10}" + "".join(f"{c:>13}" for c in cells))


if __name__ == "__main__":
  main()
