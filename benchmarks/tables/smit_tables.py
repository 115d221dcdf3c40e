r"""S-MiT tables 2, 3 and 7 at demo scale on the synthetic S-MiT (phase 1: frozen visual
backbones, heads trained, as the paper's own ablations, app. C).

    python benchmarks/smit_tables.py --table=2 --seeds=0,1,2     # losses, language model
    python benchmarks/smit_tables.py --table=3 [--width=8 --steps=300]  # speech encoders x losses
        [--encoders=resdavenet,resnet34,resnet50 --losses=nce,amm]
    python benchmarks/smit_tables.py --table=7                   # batch sizes
    python benchmarks/smit_tables.py --table=speed [--models=language,resnet34]  # examples/s,
                                                                 # batch 2048

Every run is `python -m avtext.main --config=configs/smit_{language,spoken}_amm.py:demo`
with overrides, on the features `make demo-smit` writes (--features); a finished run
(results.json with the test split) is reused. Prints markdown rows of the 5 x 1k test
protocol on the best checkpoint on val (app. B; `--mode=eval --step=best`), as mean ±
std over the 5 subsets; with several seeds, the mean over seeds of each seed's subset
mean, ± the std over seeds.
"""
import argparse
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
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
    proc = subprocess.run(base, cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
      raise RuntimeError(f"{workdir}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    print(f"  {time.time() - t:.0f} s", flush=True)
  r = json.loads(results.read_text())
  if "test/subset/mean/R@1" not in r.get(str(r["best"]["step"]), {}):
    proc = subprocess.run(base + ["--mode=eval", "--step=best"], cwd=REPO, capture_output=True,
                          text=True)
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
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
  rates = [float(x) for x in re.findall(r"examples_per_sec=([0-9.]+)", proc.stderr)]
  if proc.returncode:
    print(proc.stderr[-1500:], file=sys.stderr)
    return None, rates, proc.returncode
  return float(np.median(rates[1:])), rates, 0


def fmt(rows: list[dict]) -> str:
  """'mean±std' per column and direction over seeds (one seed: the subset std)."""
  out = []
  for d in ("caption_to_video", "video_to_caption", "mean"):
    for c in COLS:
      key = f"test/subset/{d}/{c}"
      vals = np.array([r[key] for r in rows])
      std = vals.std() if len(rows) > 1 else rows[0][key + "_std"]
      out.append(f"{vals.mean():.1f}±{std:.1f}")
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


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--table", required=True, choices=["2", "3", "7", "speed"])
  p.add_argument("--seeds", default="0")
  p.add_argument("--features", default="workdirs/demo/smit_features")
  p.add_argument("--workdirs", default="workdirs/bench/smit")
  p.add_argument("--steps", type=int, default=None, help="override train.num_steps")
  p.add_argument("--encoders", default="resnet34,resnet50,resdavenet",
                 help="table 3 / speed: speech encoders, in this order")
  p.add_argument("--losses", default="nce,amm", help="table 3: losses, in this order")
  p.add_argument("--models", default="language,resnet34,resnet50",
                 help="speed: language and/or speech encoders (as --encoders)")
  p.add_argument("--speed_steps", type=int, default=12,
                 help="speed: train steps, logged every --speed_steps/4 (the first window "
                      "holds the compilation and is left out of the median)")
  p.add_argument("--width", type=int, default=8,
                 help="table 3 / speed: the ResNets' base width (demo 8); ResDAVEnet's widths "
                      "scale with it (demo: the published widths / 8)")
  a = p.parse_args()
  seeds = [int(s) for s in a.seeds.split(",")]
  root = pathlib.Path(a.workdirs)
  steps = [f"--config.train.num_steps={a.steps}"] if a.steps else []
  lang = "configs/smit_language_amm.py:demo"
  spoken = "configs/smit_spoken_amm.py:demo"
  if a.table == "2":
    print("| loss " + HEADER)
    for loss in ("nce", "semi_hard_triplet", "mms", "amm"):
      rows = [test_row(run(root / f"t2_{loss}_s{s}", lang,
                           [f"--config.loss.name={loss}", f"--config.seed={s}"] + steps,
                           a.features)) for s in seeds]
      print(f"| {LOSS_NAMES[loss]} | {fmt(rows)} |", flush=True)
  elif a.table == "3":
    w = a.width
    encoders = speech_encoders(w)
    print("| encoder | loss " + HEADER)
    for key in a.encoders.split(","):
      name, over = encoders[key]
      for loss in a.losses.split(","):
        tag = key + ("" if w == 16 else f"_w{w}")
        tag += "" if a.steps is None else f"_n{a.steps}"
        rows = [test_row(run(root / f"t3_{tag}_{loss}_s{s}", spoken,
                             over + [f"--config.loss.name={loss}", f"--config.seed={s}",
                                     "--config.train.batch_size=256"] + steps,
                             a.features)) for s in seeds]
        print(f"| {name} | {LOSS_NAMES[loss]} | {fmt(rows)} |", flush=True)
  elif a.table == "7":
    print("| batch | steps " + HEADER)
    num_train = json.loads((pathlib.Path(a.features) / "meta.json").read_text())["splits"]["train"]
    for batch in (256, 512, 1024, 2048):
      n = 100 * num_train // batch  # 100 epochs, as app. B
      rows = [test_row(run(root / f"t7_b{batch}_s{s}", lang,
                           [f"--config.train.batch_size={batch}", f"--config.seed={s}",
                            f"--config.train.num_steps={n}"], a.features)) for s in seeds]
      print(f"| {batch} | {n} | {fmt(rows)} |", flush=True)
  else:
    log = max(1, a.speed_steps // 4)
    common = ["--config.train.batch_size=2048", f"--config.train.num_steps={a.speed_steps}",
              f"--config.train.log_every_steps={log}",
              "--config.evals.val.every_epochs=1000", "--config.evals.test.every_steps=100000"]
    encoders = speech_encoders(a.width)
    for key in a.models.split(","):
      name, config, extra = (("language", lang, []) if key == "language" else
                             (f"spoken, {encoders[key][0]}", spoken, encoders[key][1]))
      median, rates, code = speed(config, common + extra, a.features)
      if median is None:
        print(f"{name}: failed at batch 2048 with exit {code}"
              f"{' (killed: out of memory?)' if code == -9 else ''}", flush=True)
        continue
      print(f"{name}: {median:.0f} train examples/s at batch 2048 (phase 1; windows of "
            f"{log} steps: {', '.join(f'{r:.0f}' for r in rates)})", flush=True)


if __name__ == "__main__":
  main()
