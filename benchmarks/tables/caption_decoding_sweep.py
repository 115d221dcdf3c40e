r"""Decoding sweep of a trained VideoCC captioner on the synthetic world's val split.

    python -m benchmarks.tables.caption_decoding_sweep --run=workdirs/demo/caption \
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
(%), mean caption length in tokens and the decoding time, then the baselines' rows, and
writes them as JSON to <out>/sweep.json. --quick: the first setting, no baselines. Rows:
the printed cells.
"""
import functools
import json
import time

from absl import flags
import ml_collections

from avtext import evals
from avtext import runs
from avtext.evals import base
from avtext.tasks import task_registry
from avtext.train import partitioning
from benchmarks import common

_RUN = flags.DEFINE_string("run", None, "a captioning run directory", required=True)
_STEP = flags.DEFINE_integer("step", None, "checkpoint step (default: the latest)")
_SPLIT = flags.DEFINE_string("split", "val", "the split scored (settings are chosen on val)")
_EVALUATOR = flags.DEFINE_string("evaluator", "test", "the run's evaluator whose baselines "
                                 "are reused")
_SETTINGS = flags.DEFINE_string("settings", "beam_size=1", "`;`-separated settings, each "
                                "`,`-separated config.generation fields")
_BASELINES = flags.DEFINE_bool("baselines", True, "--nobaselines: the model's rows only (e.g. "
                               "when the run's training already scored the baselines)")
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


def main(argv):
  del argv
  settings = parse_settings(_SETTINGS.value)[:1 if common.quick() else None]
  baselines_on = _BASELINES.value and not common.quick()
  run = runs.load_run(_RUN.value, step=_STEP.value)
  config = ml_collections.ConfigDict(run.config.to_dict())
  split = _SPLIT.value
  cfg = config.evals[_EVALUATOR.value]
  cfg.split = split
  if not baselines_on:
    del cfg["baselines"]
  config.evals = ml_collections.ConfigDict({split: cfg})
  task = task_registry.build_task(config)
  # Each clip rendered once for every setting.
  examples = task.eval_examples
  task.eval_examples = functools.lru_cache(maxsize=4)(
      lambda source: functools.lru_cache(maxsize=None)(examples(source)))
  evaluator = evals.build_evaluators(config, task)[split]
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

  print(f"\n{split} split, {results['num_videos']} clips, {run.workdir} step {run.step}")
  header = ["setting"] + [c.replace("attribute_", "attr_") for c in COLUMNS] + ["tokens", "s"]
  print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
  table = f"{split} split, {results['num_videos']} clips, one caption a clip"
  for r in rows + [{"setting": k, **v} for k, v in baselines.items()]:
    cells = [r["setting"]] + [f"{r[c]:.2f}" if c in r else "-" for c in COLUMNS]
    cells += [f"{r['mean_length_tokens']:.2f}" if "mean_length_tokens" in r else "-",
              f"{r['seconds']:.0f}" if "seconds" in r else "-"]
    print("| " + " | ".join(cells) + " |")
    for c in COLUMNS + ("mean_length_tokens",):
      if c in r:
        common.record("VideoCC captioning", r["setting"], r[c], table=table,
                      column=c.replace("_", " "), digits=4)
  (common.out_dir() / "sweep.json").write_text(json.dumps(
      {"run": str(run.workdir), "step": run.step, "split": split, "rows": rows,
       "baselines": baselines}, indent=2))


if __name__ == "__main__":
  common.main(main)
