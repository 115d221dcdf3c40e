r"""Every paper config compiled for its target TPU topology: the BENCHMARKS table.

    python -m benchmarks.speed.aot_table [--configs=videocc_avr,xml_tvr] [--out=DIR] [--keep_hlo]

Runs `python -m avtext.aot --config=configs/<name>.py --json` (the paper setup, on
`config.target_topology`) for each config in its own process, then prints one markdown
row per config: topology, HBM needed / per chip (headroom), GFLOPs per step per chip
(the compiled program's, and the model's own without remat), HBM and interconnect
bytes per step per chip, the step-time lower bound and the term that sets it (compute,
HBM or ICI), the MFU that bound implies, the two op classes with the largest share of
the bound, the predicted step (its kernels one after another, each at its own limit:
`avtext.aot.cost_model.predict`) and the MFU it implies, and compile seconds.
Each config's report is kept in <out>/aot.jsonl (and with --keep_hlo its train step's
compiled HLO in <out>/hlo/<config>.hlo, which --reread reads again with the current cost
model, no compile); reports already there are reused, so an interrupted run resumes.
--quick: xml_tvr's train step only. Rows: one per config, the table's columns.
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from absl import flags

from benchmarks import common

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
_CONFIGS = flags.DEFINE_list("configs", list(PAPER_CONFIGS), "configs[:variant] under configs/")
_NOEVALS = flags.DEFINE_bool("noevals", False, "train step only")
_KEEP_HLO = flags.DEFINE_bool("keep_hlo", False, "also keep each train step's compiled HLO "
                              "(<out>/hlo/<config>.hlo), to re-read its costs")
_REREAD = flags.DEFINE_bool("reread", False, "recompute the costs of the reports in --out "
                            "from their kept HLO with the current cost model (no compile)")
SYSTEM = "Paper configs at scale"
HEADLINE = ("videocc_avr", "videocc_caption")


def config_flag(name: str) -> str:
  """"smit_language_amm:phase2" -> --config=configs/smit_language_amm.py:phase2"""
  base, _, variant = name.partition(":")
  return f"--config=configs/{base}.py" + (f":{variant}" if variant else "")


def run_one(name: str, extra: list[str]) -> dict:
  t0 = time.perf_counter()
  out = subprocess.run(
      [sys.executable, "-m", "avtext.aot", config_flag(name), "--json", *extra],
      cwd=common.REPO, capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  if out.returncode:
    tail = "\n".join(out.stderr.strip().splitlines()[-5:])
    return {"name": name, "error": tail, "wall_s": time.perf_counter() - t0}
  return {"name": name, **json.loads(out.stdout), "wall_s": time.perf_counter() - t0}


def row(r: dict) -> str:
  if "error" in r:
    return f"| {r['name']} | | failed: {r['error'].splitlines()[-1][:120]} | | | | | | | | |"
  shares = sorted(r["breakdown"].items(), key=lambda kv: -kv[1]["share_of_bound"])[:2]
  top = ", ".join(f"{name} {100 * b['share_of_bound']:.0f} %" for name, b in shares)
  return (f"| {r['name']} | {r['topology']} ({r['chips']} chips) | "
          f"{r['hbm_needed_gib']:.1f} / {r['hbm_per_chip_gib']:.2f} GiB "
          f"({100 * r['headroom']:.0f} %) | "
          f"{r['flops_per_chip'] / 1e9:,.0f} ({r['model_flops_per_chip'] / 1e9:,.0f}) | "
          f"{r['bytes_per_chip'] / 1e9:,.1f} | {r['comm_bytes_per_chip'] / 1e9:,.2f} | "
          f"{1e3 * r['step_time_lower_bound_s']:,.1f} ms ({r['bound_by']}) | "
          f"{100 * r['mfu_at_bound']:.1f} % | {predicted(r)} | {top} | "
          f"{r['global_batch']} | {r['compile_s']:.0f} s |")


HEADER = ("| config | topology | HBM needed / per chip (headroom) | GFLOPs/step/chip compiled "
          "(model) | HBM GB/step/chip | ICI GB/step/chip | step lower bound (by) | MFU at "
          "bound | predicted step (MFU) | largest op classes (share of bound) | global batch "
          "| compile |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|")


def reread(r: dict, hlo: pathlib.Path) -> dict:
  """Row `r` with its costs and bound recomputed from its compiled HLO."""
  import math  # pylint: disable=g-import-not-at-top
  from avtext.aot import chips  # pylint: disable=g-import-not-at-top
  from avtext.aot import cost_model  # pylint: disable=g-import-not-at-top
  from avtext.aot import hlo_cost  # pylint: disable=g-import-not-at-top
  dims = [int(d) for d in r["topology"].split(":")[1].split("x")]
  chip = chips.per_device(chips.chip_of(r["topology"]), r["chips"] // math.prod(dims))
  cost = hlo_cost.analyze_hlo(hlo.read_text(), r["chips"])
  return {**r, "flops_per_chip": cost.flops, "bytes_per_chip": cost.bytes,
          "comm_bytes_per_chip": cost.comm_bytes,
          **cost_model.bound(cost, chip, r["model_flops_per_chip"]),
          "predicted": cost_model.predict(cost, chip, r["model_flops_per_chip"])}


def predicted(r: dict) -> str:
  p = r.get("predicted")
  return f"{1e3 * p['step_s']:,.1f} ms ({100 * p['mfu']:.1f} %)" if p else "-"


def record(r: dict) -> None:
  name = r["name"]

  def row(column, value, unit="", **kw):
    common.record(SYSTEM, name, value, unit=unit, table="each paper config on its target "
                  "topology (per chip)", column=column, **kw)

  if "error" in r:
    row("topology", f"failed: {r['error'].splitlines()[-1][:120]}")
    return
  shares = sorted(r["breakdown"].items(), key=lambda kv: -kv[1]["share_of_bound"])[:2]
  row("topology", f"{r['topology']} ({r['chips']} chips)")
  row("HBM needed / per chip (headroom)", f"{r['hbm_needed_gib']:.1f} / "
      f"{r['hbm_per_chip_gib']:.2f} GiB ({100 * r['headroom']:.0f} %)")
  row("GFLOPs/step compiled (model)", f"{r['flops_per_chip'] / 1e9:.0f} "
      f"({r['model_flops_per_chip'] / 1e9:.0f})")
  row("HBM GB/step", r["bytes_per_chip"] / 1e9)
  row("ICI GB/step", r["comm_bytes_per_chip"] / 1e9, digits=3)
  row("step lower bound (by)", f"{1e3 * r['step_time_lower_bound_s']:.1f} ms ({r['bound_by']})")
  row("MFU at bound", 100 * r["mfu_at_bound"], "%", digits=3)
  if r.get("predicted"):
    row("predicted step", 1e3 * r["predicted"]["step_s"], "ms", digits=4)
    row("MFU predicted", 100 * r["predicted"]["mfu"], "%", digits=3)
  row("largest op classes (share of bound)",
      ", ".join(f"{n} {100 * b['share_of_bound']:.0f} %" for n, b in shares))
  row("global batch", r["global_batch"])
  row("compile", round(r["compile_s"]), "s")
  if name in HEADLINE:  # the predicted step; the bound where a report has none
    if r.get("predicted"):
      common.record(SYSTEM, f"{name} train step on {r['topology']}: MFU at its predicted "
                    "step", 100 * r["predicted"]["mfu"], unit="%", headline="quality",
                    digits=3)
    else:
      common.record(SYSTEM, f"{name} train step on {r['topology']}: MFU at its "
                    f"{r['bound_by']} bound", 100 * r["mfu_at_bound"], unit="%",
                    headline="quality", digits=3)


def main(argv):
  del argv
  out = common.out_dir()
  reports = out / "aot.jsonl"
  hlo_dir = out / "hlo"
  if _KEEP_HLO.value:
    hlo_dir.mkdir(parents=True, exist_ok=True)
  names = ["xml_tvr"] if common.quick() else _CONFIGS.value
  done = {}
  if reports.exists():
    for line in reports.read_text().splitlines():
      r = json.loads(line)
      if "error" not in r:
        done[r["name"]] = r
  rows = []
  for name in names:
    fresh = name not in done
    if fresh:
      print(f"compiling {name} ...", flush=True)
      with tempfile.TemporaryDirectory() as tmp:
        hlo = ([f"--hlo_out={hlo_dir / name.replace(':', '_')}.hlo"] if _KEEP_HLO.value else [])
        done[name] = run_one(name, shape_flags(name, pathlib.Path(tmp)) + hlo +
                             (["--noevals"] if _NOEVALS.value or common.quick() else []))
      with open(reports, "a") as f:
        f.write(json.dumps(done[name]) + "\n")
    if _REREAD.value and "error" not in done[name]:
      done[name] = reread(done[name], hlo_dir / f"{name.replace(':', '_')}.hlo")
    if fresh or _REREAD.value:
      record(done[name])
    rows.append(row(done[name]))
    print(rows[-1], flush=True)
  print(HEADER)
  print("\n".join(rows))


if __name__ == "__main__":
  common.main(main)
