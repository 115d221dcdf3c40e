r"""A+V vs V-only vs A-only AVR on the synthetic test split.

    python -m benchmarks.tables.avr_modalities [--out=workdirs/demo] [-- --config.<key>=<value>]

Runs `make demo`'s two stages under --out: the RGB tower's pretraining
(`configs/synthetic_video_pretrain.py`, once, in video_pretrain/), then the
`configs/videocc_avr.py:demo` setup three times (modalities rgb+audio, rgb, audio; the
first two start from the pretrained RGB tower, the A-only model has none). Each is
evaluated on the 1000-clip synthetic test split. It prints a markdown table: overall
t2v/v2t R@1, R@5, MdR, and t2v R@1 on the captions that mention the sound (words about
sound can only be matched through audio), next to chance and oracle R@1. Re-running
resumes or reuses finished runs; with --out=workdirs/demo, `make demo`'s stage 1 and A+V
run are reused. Arguments after `--` go to the three AVR runs. --quick: 2 steps each, 16
test clips. Rows: the table's cells.
"""
import json
import subprocess
import sys
import time

from benchmarks import common

# (row, config variant, run directory under --out); A+V and the pretraining use
# `make demo`'s directory names, so `make demo WORKDIR=<out>` runs are reused.
VARIANTS = (("A+V", "demo", "avr"), ("V", "demo,rgb", "avr_rgb"),
            ("A", "demo,audio", "avr_audio"))
SYSTEM = "VideoCC AVR"


def main(argv):
  extra = [a for a in argv[1:] if a != "--"]
  if common.quick():
    extra += ["--config.train.num_steps=2", "--config.dataset.num_eval=16"]
  root = common.out_dir().absolute()
  pretrain = root / "video_pretrain"
  cmd = [sys.executable, "-m", "avtext.main", "--config=configs/synthetic_video_pretrain.py",
         f"--workdir={pretrain}"] + (["--config.train.num_steps=2"] if common.quick() else [])
  print("+", " ".join(cmd), flush=True)
  subprocess.run(cmd, cwd=common.REPO, check=True)
  rows = []
  for name, variant, run_dir in VARIANTS:
    workdir = root / run_dir
    start = time.time()
    cmd = [sys.executable, "-m", "avtext.main", f"--config=configs/videocc_avr.py:{variant}",
           f"--workdir={workdir}", *extra]
    if "V" in name:
      cmd.append(f"--config.init_from.workdir={pretrain}")
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=common.REPO, check=True)
    latest = json.loads((workdir / "results.json").read_text())["latest"]
    r = {k[len("test/"):]: v for k, v in latest.items() if k.startswith("test/")}
    rows.append((name, r, time.time() - start))
  print("\n| video encoder | t2v R@1 | t2v R@5 | t2v MdR | v2t R@1 | sound captions t2v R@1 "
        "| chance R@1 | oracle t2v R@1 (all / sound) | wall s |")
  print("|---|---|---|---|---|---|---|---|---|")
  table = "the 1000-clip synthetic test split, 300 steps of batch 64 each"
  for name, r, wall in rows:
    print(f"| {name} | {r['t2v_R@1']:.1f} | {r['t2v_R@5']:.1f} | {r['t2v_MdR']:.0f} | "
          f"{r['v2t_R@1']:.1f} | {r['sound_t2v_r1']:.1f} | {r['chance_r1']:.2f} | "
          f"{r['oracle_t2v_r1']:.1f} / {r['sound_oracle_t2v_r1']:.1f} | {wall:.0f} |")
    for column, key in (("t2v R@1", "t2v_R@1"), ("t2v R@5", "t2v_R@5"), ("t2v MdR", "t2v_MdR"),
                        ("v2t R@1", "v2t_R@1"), ("sound captions t2v R@1", "sound_t2v_r1")):
      common.record(SYSTEM, name, r[key], table=table, column=column, digits=3)
    common.record(SYSTEM, name, round(wall), unit="s", table=table, column="wall")
  common.record(SYSTEM, "oracle (all / sound captions)", f"{rows[0][1]['oracle_t2v_r1']:.1f} / "
                f"{rows[0][1]['sound_oracle_t2v_r1']:.1f}", table=table, column="t2v R@1")


if __name__ == "__main__":
  common.main(main)
