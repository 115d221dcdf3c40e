r"""Decoding sweep of a trained VideoCC captioner on the synthetic world's val split.

    .venv/bin/python benchmarks/caption_decoding_sweep.py --run=workdirs/demo/caption \
        --settings="beam_size=1;beam_size=4,length_penalty=1.0;beam_size=1,min_length=12"

Loads the run's checkpoint (`--step`, default the latest) and config, and scores one
caption per clip of `--split` (default val: settings are chosen there, never on test)
for each `--settings` entry: `;`-separated, each a `,`-separated list of
`config.generation` fields (beam_size, length_penalty, min_length, max_new_tokens).
The run's own test evaluator is reused with its split replaced, so the baselines are
the demo's (the nearest-neighbour one embeds with the AVR run the caption run was
evaluated beside), computed once; nothing is retrained and nothing is written to the
run. The split's clips are rendered once and kept in memory for all settings.

Prints, per setting, BLEU-4 / METEOR / CIDEr-D (x100), attribute precision / recall
(%), mean caption length in tokens and the decoding time, then the baselines' rows;
`--out` also writes them as JSON.
"""
import argparse
import functools
import json
import pathlib
import time

import ml_collections

from avtext import evals
from avtext import runs
from avtext.evals import base
from avtext.tasks import registry
from avtext.train import partitioning

FIELDS = {"beam_size": int, "length_penalty": float, "min_length": int, "max_new_tokens": int}
COLUMNS = ("BLEU-4", "METEOR", "CIDEr-D", "attribute_precision", "attribute_recall")


def parse_settings(text: str) -> list[dict]:
  """"beam_size=4,length_penalty=1.0;beam_size=1" -> [{...}, {...}]."""
  settings = []
  for entry in filter(None, (e.strip() for e in text.split(";"))):
    setting = {}
    for pair in entry.split(","):
      key, _, value = pair.partition("=")
      key = key.strip()
      if key not in FIELDS or not value:
        raise ValueError(f"--settings: {pair!r}; expected <field>=<value> with a field of "
                         f"{list(FIELDS)}")
      setting[key] = FIELDS[key](value)
    settings.append(setting)
  return settings


def label(setting: dict) -> str:
  return ",".join(f"{k}={v}" for k, v in setting.items()) or "(run's own)"


def row(results: dict, prefix: str = "") -> dict:
  out = {k: results[prefix + k] * (1.0 if k.startswith("attribute") else 100.0)
         for k in COLUMNS if prefix + k in results}
  if prefix + "mean_length_tokens" in results:
    out["mean_length_tokens"] = results[prefix + "mean_length_tokens"]
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--run", required=True, help="a captioning run directory")
  parser.add_argument("--step", default=None, help="checkpoint step (default: the latest)")
  parser.add_argument("--split", default="val")
  parser.add_argument("--evaluator", default="test",
                      help="the run's evaluator whose baselines are reused")
  parser.add_argument("--settings", default="beam_size=1")
  parser.add_argument("--baselines", default=True, action=argparse.BooleanOptionalAction,
                      help="--no-baselines: the model's rows only (e.g. when the run's "
                           "training already scored the baselines on this split)")
  parser.add_argument("--out", default=None, help="JSON file for the rows")
  args = parser.parse_args()
  settings = parse_settings(args.settings)

  run = runs.load_run(args.run, step=int(args.step) if args.step else None)
  config = ml_collections.ConfigDict(run.config.to_dict())
  cfg = config.evals[args.evaluator]
  cfg.split = args.split
  if not args.baselines:
    del cfg["baselines"]
  config.evals = ml_collections.ConfigDict({args.split: cfg})
  task = registry.build_task(config)
  # Each clip rendered once for every setting.
  examples = task.eval_examples
  task.eval_examples = functools.lru_cache(maxsize=4)(
      lambda source: functools.lru_cache(maxsize=None)(examples(source)))
  evaluator = evals.build_evaluators(config, task)[args.split]
  mesh = partitioning.make_mesh()

  rows, baselines = [], {}
  for setting in settings:
    config.generation.update(setting)
    evaluator.cache = base.PredictCache(task)  # a new trace with the new decoding fields
    begin = time.time()
    results = evaluator.evaluate(run.variables, mesh=mesh, step=run.step)
    seconds = time.time() - begin
    rows.append({"setting": label(setting), **row(results), "seconds": seconds})
    print(json.dumps(rows[-1]), flush=True)
    for name in sorted({k.split("/")[0] for k in results if k.startswith("baseline_")}):
      baselines[name] = row(results, name + "/")

  print(f"\n{args.split} split, {results['num_videos']} clips, {run.workdir} step {run.step}")
  header = ["setting"] + [c.replace("attribute_", "attr_") for c in COLUMNS] + ["tokens", "s"]
  print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
  for r in rows + [{"setting": k, **v} for k, v in baselines.items()]:
    cells = [r["setting"]] + [f"{r[c]:.2f}" if c in r else "-" for c in COLUMNS]
    cells += [f"{r['mean_length_tokens']:.2f}" if "mean_length_tokens" in r else "-",
              f"{r['seconds']:.0f}" if "seconds" in r else "-"]
    print("| " + " | ".join(cells) + " |")
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(
        {"run": str(run.workdir), "step": run.step, "split": args.split, "rows": rows,
         "baselines": baselines}, indent=2))


if __name__ == "__main__":
  main()
