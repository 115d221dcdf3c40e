r"""The cost model's two readings of a layered step against the step compiled unrolled.

    python -m benchmarks.speed.aot_layers [--batches=32,128] [--topology=v5e:2x2]
    python -m benchmarks.speed.aot_layers --paper=videocc_avr [--batches=]

A 4-layer AVR (MBT 256 wide with fusion from layer 2, a 4-layer BERT 256 wide, 257 RGB
tokens a clip, bf16, full remat; `small_avr`) compiled for the slice three ways, per
global batch:
  unrolled      the step with every layer in the program (`avtext.train.aot.analyze`
                with scan_layers off): the reference
  scanned       the same step with each stack as one scan, read with every loop body
                weighted by its trip count (what `python -m avtext.aot` reports for a
                scanned config)
  extrapolated  programs with one and two layers per stack, extrapolated per layer
                (`avtext.train.aot.extrapolate`: three compiles, `--extrapolate`)
and prints per-chip GFLOPs, HBM and ICI bytes of each and their ratios to the unrolled
compile. Rows: per batch, each reading's GFLOPs, HBM GB and ICI GB per chip and its
ratio to the unrolled one.

--paper=<config>: also the paper config on its target slice, scanned (as configured) and
extrapolated (four compiles for AVR); its unrolled compile takes half an hour here and
is not made. Rows: each reading's GFLOPs, HBM GB and ICI GB per chip, the step bound and
MFU at the bound, and the extrapolation's ratio to the scanned reading.
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
  from avtext.tasks import registry  # pylint: disable=g-import-not-at-top
  from avtext.train import aot  # pylint: disable=g-import-not-at-top
  quiet = lambda message: None  # noqa: E731
  out = {}
  for name, scan in (("unrolled", False), ("scanned", True)):
    out[name] = aot.analyze(small_avr(batch, scan), topology,
                            build_task=registry.build_task, progress=quiet)
  out["extrapolated"] = aot.extrapolate(small_avr(batch, True), topology,
                                        build_task=registry.build_task, progress=quiet)
  return out


def paper(name: str) -> None:
  """The paper config's scanned reading and its per-layer extrapolation, recorded."""
  from avtext.tasks import registry  # pylint: disable=g-import-not-at-top
  from avtext.train import aot  # pylint: disable=g-import-not-at-top
  config = common.load_config(f"configs/{name}.py")
  got = {"scanned": aot.analyze(config, build_task=registry.build_task),
         "extrapolated": aot.extrapolate(config, build_task=registry.build_task)}
  table = (f"{name}'s paper step on {got['scanned']['topology']} (global batch "
           f"{config.train.batch_size}), per chip: scanned and extrapolated")
  for reading, r in got.items():
    metric = reading + (f" ({len(r['programs'])} programs, stacks "
                        f"{', '.join(f'{k} {v}' for k, v in r['stacks'].items())})"
                        if reading == "extrapolated" else "")
    cells = []
    for label, key, scale in FIELDS:
      common.record(SYSTEM, metric, r[key] / scale, table=table, column=label, digits=5)
      cells.append(f"{r[key] / scale:,.1f}")
      if reading == "extrapolated":
        common.record(SYSTEM, metric, r[key] / got["scanned"][key], table=table,
                      column=f"{label} / scanned")
    common.record(SYSTEM, metric, f"{1e3 * r['step_time_lower_bound_s']:.1f} ms "
                  f"({r['bound_by']})", table=table, column="step bound")
    common.record(SYSTEM, metric, 100 * r["mfu_at_bound"], "%", table=table,
                  column="MFU at bound", digits=3)
    print(f"| {metric} | {' | '.join(cells)} | {1e3 * r['step_time_lower_bound_s']:.1f} ms "
          f"({r['bound_by']}) | {100 * r['mfu_at_bound']:.1f} % |", flush=True)


def main(argv) -> None:
  del argv
  topology = _TOPOLOGY.value
  table = (f"the small AVR's step on {topology}, per chip: each reading against the "
           "unrolled compile")
  print(f"| {topology} | " + " | ".join(f"{f} (/ unrolled)" for f, _, _ in FIELDS) + " |")
  for batch in map(int, _BATCHES.value):
    got = readings(batch, topology)
    ref = got["unrolled"]
    for name, r in got.items():
      cells = []
      for label, key, scale in FIELDS:
        ratio = r[key] / ref[key]
        cells.append(f"{r[key] / scale:,.3f} ({ratio:.3f})")
        common.record(SYSTEM, f"batch {batch}, {name}", r[key] / scale, table=table,
                      column=label)
        if name != "unrolled":
          common.record(SYSTEM, f"batch {batch}, {name}", ratio, table=table,
                        column=f"{label} / unrolled")
      print(f"| batch {batch}, {name} | " + " | ".join(cells) + " |", flush=True)
    print(json.dumps({n: {k: r[k] for _, k, _ in FIELDS} for n, r in got.items()}),
          flush=True)
  if _PAPER.value:
    paper(_PAPER.value)


if __name__ == "__main__":
  common.main(main)
