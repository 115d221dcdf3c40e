r"""A+V vs V-only vs A-only AVR on the synthetic test split (issue: BENCHMARKS.md table).

    .venv/bin/python benchmarks/avr_modalities.py [--workdir_root=workdirs/demo]

Runs `make demo`'s two stages: the RGB tower's pretraining
(`configs/synthetic_video_pretrain.py`, once), then the `configs/videocc_avr.py:demo`
setup three times (modalities rgb+audio, rgb, audio; the first two start from
the pretrained RGB tower, the A-only model has none). Each is evaluated on the
1000-clip synthetic test split. It prints a markdown table: overall t2v/v2t
R@1, R@5, MdR, and t2v R@1 on the captions that mention the sound (words about
sound can only be matched through audio), next to chance and oracle R@1.
Re-running resumes or reuses finished runs, `make demo`'s included. Extra
flags after `--` go to the three AVR runs, e.g. `-- --config.train.num_steps=300`.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
# (row, config variant, run directory under --workdir_root); A+V and the
# pretraining use `make demo`'s directory names, so `make demo WORKDIR=<root>`
# runs are reused.
VARIANTS = (("A+V", "demo", "avr"), ("V", "demo,rgb", "avr_rgb"),
            ("A", "demo,audio", "avr_audio"))


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--workdir_root", default="workdirs/demo")
  args, extra = parser.parse_known_args()
  extra = [a for a in extra if a != "--"]
  pretrain = REPO / args.workdir_root / "video_pretrain"
  cmd = [sys.executable, "-m", "avtext.main", "--config=configs/synthetic_video_pretrain.py",
         f"--workdir={pretrain}"]
  print("+", " ".join(cmd), flush=True)
  subprocess.run(cmd, cwd=REPO, check=True)
  rows = []
  for name, variant, run_dir in VARIANTS:
    workdir = REPO / args.workdir_root / run_dir
    t0 = time.time()
    cmd = [sys.executable, "-m", "avtext.main", f"--config=configs/videocc_avr.py:{variant}",
           f"--workdir={workdir}", *extra]
    if "V" in name:
      cmd.append(f"--config.init_from.workdir={pretrain}")
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=REPO, check=True)
    latest = json.loads((workdir / "results.json").read_text())["latest"]
    r = {k[len("test/"):]: v for k, v in latest.items() if k.startswith("test/")}
    rows.append((name, r, time.time() - t0))
  print("\n| video encoder | t2v R@1 | t2v R@5 | t2v MdR | v2t R@1 | sound captions t2v R@1 "
        "| chance R@1 | oracle t2v R@1 (all / sound) | wall s |")
  print("|---|---|---|---|---|---|---|---|---|")
  for name, r, wall in rows:
    print(f"| {name} | {r['t2v_R@1']:.1f} | {r['t2v_R@5']:.1f} | {r['t2v_MdR']:.0f} | "
          f"{r['v2t_R@1']:.1f} | {r['sound_t2v_r1']:.1f} | {r['chance_r1']:.2f} | "
          f"{r['oracle_t2v_r1']:.1f} / {r['sound_oracle_t2v_r1']:.1f} | {wall:.0f} |")


if __name__ == "__main__":
  main()
