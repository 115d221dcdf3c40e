r"""S-MiT tables 2, 3 and 7 at demo scale on the synthetic S-MiT (phase 1: frozen visual
backbones, heads trained, as the paper's own ablations, app. C).

    python -m benchmarks.tables.smit_tables --table=2 --seeds=0,1,2    # losses, language model
    python -m benchmarks.tables.smit_tables --table=3 [--width=8 --steps=300]  # speech encoders
        [--encoders=resdavenet,resnet34,resnet50 --losses=nce,amm]          # x losses
    python -m benchmarks.tables.smit_tables --table=7                  # batch sizes
    python -m benchmarks.tables.smit_tables --table=speed [--models=language,resnet34]
                                                                       # examples/s, batch 2048

Every run is `python -m avtext.main --config=configs/smit_{language,spoken}_amm.py:demo`
with overrides, on the features `make demo-smit` writes (--features); a finished run
(results.json with the test split) is reused. Prints markdown rows of the 5 x 1k test
protocol on the best checkpoint on val (app. B; `--mode=eval --step=best`), as mean ±
std over the 5 subsets; with several seeds, the mean over seeds of each seed's subset
mean, ± the std over seeds. Runs go under --out. --quick: 2 steps a run, seed 0. Rows: the
table's cells (c2v, v2c and mean R@1 / R@5 / R@10 / mAP), or examples/s.
"""
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time

from absl import flags
import numpy as np

from benchmarks import common

_TABLE = flags.DEFINE_enum("table", None, ["2", "3", "7", "speed"], "which table",
                           required=True)
_SEEDS = flags.DEFINE_list("seeds", ["0"], "seeds")
_FEATURES = flags.DEFINE_string("features", "workdirs/demo/smit_features",
                                "`make demo-smit`'s features")
_STEPS = flags.DEFINE_integer("steps", None, "override train.num_steps")
_ENCODERS = flags.DEFINE_list("encoders", ["resnet34", "resnet50", "resdavenet"],
                              "table 3 / speed: speech encoders, in this order")
_LOSSES = flags.DEFINE_list("losses", ["nce", "amm"], "table 3: losses, in this order")
_MODELS = flags.DEFINE_list("models", ["language", "resnet34", "resnet50"],
                            "speed: language and/or speech encoders (as --encoders)")
_SPEED_STEPS = flags.DEFINE_integer("speed_steps", 12, "speed: train steps, logged every "
                                    "speed_steps/4 (the first window holds the compilation "
                                    "and is left out of the median)")
_WIDTH = flags.DEFINE_integer("width", 8, "table 3 / speed: the ResNets' base width (demo 8); "
                              "ResDAVEnet's widths scale with it (demo: the published / 8)")
SYSTEM = "S-MiT"
COLS = ("R@1", "R@5", "R@10", "mAP")
LOSS_NAMES = {"nce": "NCE", "semi_hard_triplet": "SHN", "mms": "MMS", "amm": "AMM"}


def run(workdir: pathlib.Path, config: str, overrides: list[str], features: str) -> dict:
  """Trains (unless finished), then evaluates the best checkpoint on val (app. B)."""
  results = workdir / "results.json"
  base = [sys.executable, "-m", "avtext.main", f"--config={config}", f"--workdir={workdir}",
          f"--config.dataset.path={features}"] + overrides
  if not (results.exists() and "best" in json.loads(results.read_text())):
    print("$", " ".join(base), flush=True)
    t = time.time()
    proc = subprocess.run(base, cwd=common.REPO, capture_output=True, text=True)
    if proc.returncode:
      raise RuntimeError(f"{workdir}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    print(f"  {time.time() - t:.0f} s", flush=True)
  r = json.loads(results.read_text())
  if "test/subset/mean/R@1" not in r.get(str(r["best"]["step"]), {}):
    proc = subprocess.run(base + ["--mode=eval", "--step=best"], cwd=common.REPO,
                          capture_output=True, text=True)
    if proc.returncode:
      raise RuntimeError(f"{workdir} --step=best: {proc.stderr[-3000:]}")
    r = json.loads(results.read_text())
  return r


def test_row(results: dict) -> dict:
  """The test metrics of the best checkpoint on val."""
  return results[str(results["best"]["step"])]


def speed(config: str, overrides: list[str], features: str
          ) -> tuple[float | None, list[float], int]:
  """(median, all, exit code) train examples/s of the logged windows after the first
  (compilation); median None when the run failed (-9: killed, e.g. out of memory)."""
  cmd = [sys.executable, "-m", "avtext.main", f"--config={config}",
         f"--workdir={tempfile.mkdtemp()}", f"--config.dataset.path={features}"] + overrides
  print("$", " ".join(cmd), flush=True)
  proc = subprocess.run(cmd, cwd=common.REPO, capture_output=True, text=True)
  rates = [float(x) for x in re.findall(r"examples_per_sec=([0-9.]+)", proc.stderr)]
  if proc.returncode:
    print(proc.stderr[-1500:], file=sys.stderr)
    return None, rates, proc.returncode
  return float(np.median(rates[1:])), rates, 0


DIRECTIONS = {"caption_to_video": "c2v", "video_to_caption": "v2c", "mean": "mean"}


def fmt(rows: list[dict], metric: str = "", table: str = "") -> str:
  """'mean±std' per column and direction over seeds (one seed: the subset std); with a
  `metric`, each cell is also recorded."""
  out = []
  for d, short in DIRECTIONS.items():
    for c in COLS:
      key = f"test/subset/{d}/{c}"
      vals = np.array([r[key] for r in rows])
      std = vals.std() if len(rows) > 1 else rows[0][key + "_std"]
      out.append(f"{vals.mean():.1f}±{std:.1f}")
      if metric:
        common.record(SYSTEM, metric, round(float(vals.mean()), 1), table=table,
                      column=f"{short} {c}", std=round(float(std), 1))
  return " | ".join(out)


def speech_encoders(w: int) -> dict[str, tuple[str, list[str]]]:
  """Table 3's encoders at base width w (the published ResNets have 64; ResDAVEnet's
  published widths 128..1024 scale by the same w / 64): key -> (name, config flags)."""
  davenet = ",".join(str(c * w // 64) for c in (128, 128, 256, 512, 1024))
  return {
      "resnet34": (f"ResNet-34 (width {w})", ["--config.model.speech.depth=34",
                                              f"--config.model.speech.width={w}"]),
      "resnet50": (f"ResNet-50 (width {w})", ["--config.model.speech.depth=50",
                                              f"--config.model.speech.width={w}"]),
      "resdavenet": (f"ResDAVEnet (widths /{64 // w})",
                     ["--config.model.speech.name=resdavenet",
                      f"--config.model.speech.widths=({davenet})"])}


HEADER = ("| c2v R@1 | R@5 | R@10 | mAP | v2c R@1 | R@5 | R@10 | mAP | mean R@1 | R@5 | R@10 "
          "| mAP |")


def main(argv):
  del argv
  seeds = [0] if common.quick() else [int(x) for x in _SEEDS.value]
  steps_n = 2 if common.quick() else _STEPS.value
  root = common.out_dir()
  features = _FEATURES.value
  steps = [f"--config.train.num_steps={steps_n}"] if steps_n else []
  lang = "configs/smit_language_amm.py:demo"
  spoken = "configs/smit_spoken_amm.py:demo"
  protocol = (f"test, 5 x 1k subsets, best checkpoint on val, seeds {','.join(map(str, seeds))}"
              + (" (mean ± std over seeds)" if len(seeds) > 1 else " (± the subset std)"))
  if _TABLE.value == "2":
    table = f"Table 2, the losses (language model, phase 1): {protocol}"
    print("| loss " + HEADER)
    for loss in ("nce", "semi_hard_triplet", "mms", "amm"):
      rows = [test_row(run(root / f"t2_{loss}_s{s}", lang,
                           [f"--config.loss.name={loss}", f"--config.seed={s}"] + steps,
                           features)) for s in seeds]
      print(f"| {LOSS_NAMES[loss]} | {fmt(rows, LOSS_NAMES[loss], table)} |", flush=True)
  elif _TABLE.value == "3":
    w = _WIDTH.value
    encoders = speech_encoders(w)
    table = ("Table 3, speech encoders x losses (spoken model, phase 1, batch 256"
             + (f", {steps_n} steps" if steps_n else "") + f"): {protocol}")
    print("| encoder | loss " + HEADER)
    for key in _ENCODERS.value:
      name, over = encoders[key]
      for loss in _LOSSES.value:
        tag = key + ("" if w == 16 else f"_w{w}")
        tag += "" if steps_n is None else f"_n{steps_n}"
        rows = [test_row(run(root / f"t3_{tag}_{loss}_s{s}", spoken,
                             over + [f"--config.loss.name={loss}", f"--config.seed={s}",
                                     "--config.train.batch_size=256"] + steps,
                             features)) for s in seeds]
        print(f"| {name} | {LOSS_NAMES[loss]} | "
              f"{fmt(rows, f'{name}, {LOSS_NAMES[loss]}', table)} |", flush=True)
  elif _TABLE.value == "7":
    table = f"Table 7, batch size (AMM, phase 1, 100 epochs): {protocol}"
    print("| batch | steps " + HEADER)
    num_train = json.loads((pathlib.Path(features) / "meta.json").read_text())["splits"]["train"]
    for batch in (256, 512, 1024, 2048):
      n = steps_n or 100 * num_train // batch  # 100 epochs, as app. B
      rows = [test_row(run(root / f"t7_b{batch}_s{s}", lang,
                           [f"--config.train.batch_size={batch}", f"--config.seed={s}",
                            f"--config.train.num_steps={n}"], features)) for s in seeds]
      print(f"| {batch} | {n} | {fmt(rows, f'batch {batch} ({n} steps)', table)} |", flush=True)
  else:
    speed_steps = 4 if common.quick() else _SPEED_STEPS.value
    log = max(1, speed_steps // 4)
    args = ["--config.train.batch_size=2048", f"--config.train.num_steps={speed_steps}",
            f"--config.train.log_every_steps={log}",
            "--config.evals.val.every_epochs=1000", "--config.evals.test.every_steps=100000"]
    encoders = speech_encoders(_WIDTH.value)
    table = "train examples/s at batch 2048 (phase 1), median of the logged windows"
    for key in _MODELS.value:
      name, config, extra = (("language", lang, []) if key == "language" else
                             (f"spoken, {encoders[key][0]}", spoken, encoders[key][1]))
      median, rates, code = speed(config, args + extra, features)
      if median is None:
        print(f"{name}: failed at batch 2048 with exit {code}"
              f"{' (killed: out of memory?)' if code == -9 else ''}", flush=True)
        common.record(SYSTEM, name, f"failed (exit {code}"
                      f"{', killed: out of memory' if code == -9 else ''})", table=table)
        continue
      print(f"{name}: {median:.0f} train examples/s at batch 2048 (phase 1; windows of "
            f"{log} steps: {', '.join(f'{r:.0f}' for r in rates)})", flush=True)
      common.record(SYSTEM, name, round(median), unit="examples/s", table=table)


if __name__ == "__main__":
  common.main(main)
