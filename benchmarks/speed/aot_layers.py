r"""The cost model's two readings of a layered step against the step compiled unrolled.

    python -m benchmarks.speed.aot_layers [--batches=32,128] [--topology=v5e:2x2]
    python -m benchmarks.speed.aot_layers --paper=videocc_avr [--batches=]

A 4-layer AVR (MBT 256 wide with fusion from layer 2, a 4-layer BERT 256 wide, 257 RGB
tokens a clip, bf16, full remat; `small_avr`) compiled for the slice three ways, per
global batch:
  unrolled      the step with every layer in the program (`avtext.aot.programs.analyze`
                with scan_layers off): the reference
  scanned       the same step with each stack as one scan, read with every loop body
                weighted by its trip count (what `python -m avtext.aot` reports for a
                scanned config)
  extrapolated  programs with one and two layers per stack, extrapolated per layer
                (`avtext.aot.programs.extrapolate`: three compiles, `--extrapolate`)
and prints per-chip GFLOPs, HBM and ICI bytes of each and their ratios to the unrolled
compile. Rows: per batch, the unrolled compile's GFLOPs, HBM GB and ICI GB per chip and
the other two readings' ratios to them.

--paper=<config>: also the paper config on its target slice, scanned (as configured) and
extrapolated (four compiles for AVR); its unrolled compile takes half an hour here and
is not made. Rows: each reading's GFLOPs, HBM GB and ICI GB per chip, its step bound and
the MFU at the bound.
"""
import json

from absl import flags

from benchmarks import common

_BATCHES = flags.DEFINE_list("batches", ["32", "128"], "global batches")
_TOPOLOGY = flags.DEFINE_string("topology", "v5e:2x2", "TPU slice")
_PAPER = flags.DEFINE_string("paper", None, "also a paper config (configs/<name>.py) on its "
                             "target slice, scanned and extrapolated")
SYSTEM = "Paper configs at scale"
FIELDS = (("GFLOP", "flops_per_chip", 1e9), ("HBM GB", "bytes_per_chip", 1e9),
          ("ICI GB", "comm_bytes_per_chip", 1e9))
RATIO_OF = {"GFLOP": "FLOPs", "HBM GB": "HBM bytes", "ICI GB": "ICI bytes"}


def small_avr(batch: int, scan: bool):
  """configs/videocc_avr.py:tiny widened to 256 with 4 layers a stack, no frozen layers:
  MBT 4 layers (fusion_layer 2, 4 heads, MLP 1024), BERT 4 layers, 8 frames of 64 px
  (4 x 8 x 8 tubelets + [CLS] = 257 RGB tokens), bf16 compute, full remat."""
  config = common.load_config("configs/videocc_avr.py:tiny")
  config.model.dtype, config.model.remat, config.model.scan_layers = "bfloat16", "full", scan
  v, t = config.model.video, config.model.text
  v.num_layers, v.fusion_layer, v.hidden_size, v.mlp_dim, v.num_heads = 4, 2, 256, 1024, 4
  t.num_layers, t.hidden_size, t.intermediate_size, t.num_heads = 4, 256, 1024, 4
  config.optimizer.frozen = ()
  config.data.num_frames, config.data.image_size = 8, 64
  config.train.batch_size = batch
  return config


def readings(batch: int, topology: str) -> dict:
  """{unrolled, scanned, extrapolated: report} of `small_avr(batch)` on `topology`."""
  from avtext.tasks import task_registry  # pylint: disable=g-import-not-at-top
  from avtext.aot import programs as aot  # pylint: disable=g-import-not-at-top
  quiet = lambda message: None  # noqa: E731
  out = {}
  for name, scan in (("unrolled", False), ("scanned", True)):
    out[name] = aot.analyze(small_avr(batch, scan), topology,
                            build_task=task_registry.build_task, progress=quiet)
  out["extrapolated"] = aot.extrapolate(
      small_avr(batch, True), topology, build_task=task_registry.build_task, progress=quiet,
      model_flops_per_chip=out["scanned"]["model_flops_per_chip"])
  return out


def record_small(batch: int, got: dict, table: str) -> str:
  """Records one batch's row (the unrolled compile's costs, each reading's ratios to
  them); returns it as a markdown row."""
  ref, cells = got["unrolled"], []
  for label, key, scale in FIELDS:
    common.record(SYSTEM, f"batch {batch}", ref[key] / scale, table=table,
                  column=f"unrolled {label}")
    cells.append(f"{ref[key] / scale:,.3f}")
  for name in ("extrapolated", "scanned"):
    for label, key, _ in FIELDS:
      ratio = got[name][key] / ref[key]
      common.record(SYSTEM, f"batch {batch}", ratio, table=table,
                    column=f"{name} / unrolled, {RATIO_OF[label]}")
      cells.append(f"{ratio:.3f}")
  return f"| batch {batch} | " + " | ".join(cells) + " |"


def record_paper(name: str, batch: int, got: dict) -> None:
  """Records the paper config's two readings, one row each."""
  table = (f"{name}'s paper step on {got['scanned']['topology']} (global batch {batch}), "
           "per chip")
  for reading, r in got.items():
    metric = ("scanned (as configured)" if reading == "scanned" else
              f"extrapolated ({len(r['programs'])} programs)")
    for label, key, scale in FIELDS:
      common.record(SYSTEM, metric, r[key] / scale, table=table, column=label, digits=5)
    common.record(SYSTEM, metric, f"{1e3 * r['step_time_lower_bound_s']:.1f} ms "
                  f"({r['bound_by']})", table=table, column="step bound")
    common.record(SYSTEM, metric, 100 * r["mfu_at_bound"], unit="%", table=table,
                  column="MFU at bound", digits=3)
    print(f"| {metric} | " + " | ".join(f"{r[k] / sc:,.1f}" for _, k, sc in FIELDS)
          + f" | {1e3 * r['step_time_lower_bound_s']:.1f} ms ({r['bound_by']}) | "
          f"{100 * r['mfu_at_bound']:.1f} % |", flush=True)


def paper(name: str) -> None:
  """The paper config's scanned reading and its per-layer extrapolation, recorded."""
  from avtext.tasks import task_registry  # pylint: disable=g-import-not-at-top
  from avtext.aot import programs as aot  # pylint: disable=g-import-not-at-top
  config = common.load_config(f"configs/{name}.py")
  got = {"scanned": aot.analyze(config, build_task=task_registry.build_task)}
  got["extrapolated"] = aot.extrapolate(
      config, build_task=task_registry.build_task,
      model_flops_per_chip=got["scanned"]["model_flops_per_chip"])
  (common.out_dir() / f"{name}.json").write_text(json.dumps(got, indent=1, default=str))
  print(json.dumps({n: {k: r[k] for _, k, _ in FIELDS} for n, r in got.items()}), flush=True)
  record_paper(name, int(config.train.batch_size), got)


def main(argv) -> None:
  del argv
  topology = _TOPOLOGY.value
  table = (f"the small AVR's step on {topology}, per chip: the unrolled compile, and the "
           "extrapolation's and the scanned reading's ratios to it")
  if _BATCHES.value:
    print(f"| {topology} | " + " | ".join(f"unrolled {f}" for f, _, _ in FIELDS) + " | "
          + " | ".join(f"{n} / unrolled, {RATIO_OF[f]}" for n in ("extrapolated", "scanned")
                       for f, _, _ in FIELDS) + " |")
  for batch in map(int, _BATCHES.value):
    got = readings(batch, topology)
    print(json.dumps({n: {k: r[k] for _, k, _ in FIELDS} for n, r in got.items()}),
          flush=True)
    print(record_small(batch, got, table), flush=True)
  if _PAPER.value:
    paper(_PAPER.value)


if __name__ == "__main__":
  common.main(main)
