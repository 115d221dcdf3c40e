r"""Every paper config compiled for its target TPU topology: the BENCHMARKS table.

    python benchmarks/aot_table.py [--configs=videocc_avr,xml_tvr] [--out=FILE.jsonl]

Runs `python -m avtext.aot --config=configs/<name>.py --json` (the paper setup, on
`config.target_topology`) for each config in its own process, then prints one markdown
row per config: topology, HBM needed / per chip (headroom), GFLOPs per step per chip
(the compiled program's, and the model's own without remat), HBM and interconnect
bytes per step per chip, the step-time lower bound and the term that sets it (compute,
HBM or ICI), the MFU that bound implies, the two op classes with the largest share of
the bound, and compile seconds.
Rows already in --out (same config) are reused, so an interrupted run resumes.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# What a config reads from your files that its shapes depend on, stood in for here:
# MMT's vocabulary is the word2idx file; a stand-in of 57,100 words, TVR's whole
# vocabulary (TVR paper, Table 1), an upper bound on TVCaption's word2idx (words seen
# more than 5 times).
TVC_VOCAB_WORDS = 57_100


def shape_flags(name: str, tmp: pathlib.Path) -> list[str]:
  if name.split(":")[0] != "mmt_tvc":
    return []
  from avtext.text import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  words = [f"word{i}" for i in range(TVC_VOCAB_WORDS - len(vocab_lib.WordVocab.SPECIAL))]
  vocab = vocab_lib.WordVocab({w: i for i, w in enumerate(
      list(vocab_lib.WordVocab.SPECIAL) + words)})
  vocab.save(tmp / "tvc_word2idx.json")
  return [f"--config.model.vocab={tmp / 'tvc_word2idx.json'}"]
PAPER_CONFIGS = ("videocc_avr", "videocc_caption", "smit_language_amm", "smit_spoken_amm",
                 "smit_language_amm:phase2", "smit_spoken_amm:phase2", "coot_activitynet",
                 "coot_youcook2", "xml_tvr", "mmt_tvc")


def config_flag(name: str) -> str:
  """"smit_language_amm:phase2" -> --config=configs/smit_language_amm.py:phase2"""
  base, _, variant = name.partition(":")
  return f"--config=configs/{base}.py" + (f":{variant}" if variant else "")


def run_one(name: str, extra: list[str]) -> dict:
  t0 = time.perf_counter()
  out = subprocess.run(
      [sys.executable, "-m", "avtext.aot", config_flag(name), "--json", *extra],
      cwd=REPO, capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  if out.returncode:
    tail = "\n".join(out.stderr.strip().splitlines()[-5:])
    return {"name": name, "error": tail, "wall_s": time.perf_counter() - t0}
  return {"name": name, **json.loads(out.stdout), "wall_s": time.perf_counter() - t0}


def row(r: dict) -> str:
  if "error" in r:
    return f"| {r['name']} | | failed: {r['error'].splitlines()[-1][:120]} | | | | | | | |"
  shares = sorted(r["breakdown"].items(), key=lambda kv: -kv[1]["share_of_bound"])[:2]
  top = ", ".join(f"{name} {100 * b['share_of_bound']:.0f} %" for name, b in shares)
  return (f"| {r['name']} | {r['topology']} ({r['chips']} chips) | "
          f"{r['hbm_needed_gib']:.1f} / {r['hbm_per_chip_gib']:.2f} GiB "
          f"({100 * r['headroom']:.0f} %) | "
          f"{r['flops_per_chip'] / 1e9:,.0f} ({r['model_flops_per_chip'] / 1e9:,.0f}) | "
          f"{r['bytes_per_chip'] / 1e9:,.1f} | {r['comm_bytes_per_chip'] / 1e9:,.2f} | "
          f"{1e3 * r['step_time_lower_bound_s']:,.1f} ms ({r['bound_by']}) | "
          f"{100 * r['mfu_at_bound']:.1f} % | {top} | {r['global_batch']} | "
          f"{r['compile_s']:.0f} s |")


HEADER = ("| config | topology | HBM needed / per chip (headroom) | GFLOPs/step/chip compiled "
          "(model) | HBM GB/step/chip | ICI GB/step/chip | step lower bound (by) | MFU at "
          "bound | largest op classes (share of bound) | global batch | compile |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")


def reread(r: dict, hlo: pathlib.Path) -> dict:
  """Row `r` with its costs and bound recomputed from its compiled HLO."""
  import math  # pylint: disable=g-import-not-at-top
  from avtext.train import cost_model  # pylint: disable=g-import-not-at-top
  from avtext.train import hlo_cost  # pylint: disable=g-import-not-at-top
  dims = [int(d) for d in r["topology"].split(":")[1].split("x")]
  chip = cost_model.per_device(cost_model.chip_of(r["topology"]),
                               r["chips"] // math.prod(dims))
  cost = hlo_cost.analyze_hlo(hlo.read_text(), r["chips"])
  return {**r, "flops_per_chip": cost.flops, "bytes_per_chip": cost.bytes,
          "comm_bytes_per_chip": cost.comm_bytes,
          **cost_model.bound(cost, chip, r["model_flops_per_chip"])}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--configs", default=",".join(PAPER_CONFIGS))
  parser.add_argument("--out", default=None, help="JSON lines, one report per config")
  parser.add_argument("--noevals", action="store_true", help="train step only")
  parser.add_argument("--hlo_dir", default=None, help="also keep each train step's "
                      "compiled HLO here (<config>.hlo), to re-read its costs")
  parser.add_argument("--reread", action="store_true", help="recompute the costs of rows "
                      "already in --out from their HLO in --hlo_dir with the current cost "
                      "model (no compile)")
  args = parser.parse_args()
  done = {}
  if args.out and pathlib.Path(args.out).exists():
    for line in pathlib.Path(args.out).read_text().splitlines():
      r = json.loads(line)
      if "error" not in r:
        done[r["name"]] = r
  rows = []
  for name in args.configs.split(","):
    if name not in done:
      print(f"compiling {name} ...", file=sys.stderr, flush=True)
      with tempfile.TemporaryDirectory() as tmp:
        hlo = ([f"--hlo_out={pathlib.Path(args.hlo_dir) / name.replace(':', '_')}.hlo"]
               if args.hlo_dir else [])
        done[name] = run_one(name, shape_flags(name, pathlib.Path(tmp)) + hlo +
                             (["--noevals"] if args.noevals else []))
      if args.out:
        with open(args.out, "a") as f:
          f.write(json.dumps(done[name]) + "\n")
    if args.reread and args.hlo_dir and "error" not in done[name]:
      done[name] = reread(done[name], pathlib.Path(args.hlo_dir) /
                          f"{name.replace(':', '_')}.hlo")
    rows.append(row(done[name]))
    print(rows[-1], file=sys.stderr, flush=True)
  print(HEADER)
  print("\n".join(rows))


if __name__ == "__main__":
  main()
