r"""avtext's AVR paper train step beside scenic's MBT, both compiled ahead of time for a TPU slice.

    fetch github:google-research/scenic; git --git-dir=<mirror> archive HEAD scenic/__init__.py \
        scenic/projects/__init__.py scenic/projects/mbt scenic/projects/baselines scenic/model_lib \
        scenic/common_lib scenic/train_lib <scenic/dataset_lib/*.py> | tar -x -C <scenic checkout>
    python -m benchmarks.speed.aot_scenic --scenic_dir=<scenic checkout> [--topology=v5e:4x4] \
        [--out=workdirs/bench/aot_scenic] [--reanalyse] [--json]

Two train steps of `configs/videocc_avr.py` (global batch 256, RGB [B, 32, 224, 224, 3] and
log-mel [B, 800, 128], BERT-base on 32 tokens, D = 256 projections, NCE at sigma 0.05, clipped
SGD with momentum, params and optimizer state float32 and replicated, the batch sharded on the
`data` axis of all the slice's chips), compiled by libtpu for `--topology` on this CPU:

  avtext   the config as it is: avtext's MBT (bf16, the config's remat, scanned layers, the
           Pallas attention kernel "auto" picks), `avtext.aot.programs`'s pieces (`train_step`, `program_cost`, ...).
  scenic   the same config, trainer, BERT-base text tower (avtext.models.bert, with the config's
           bf16 / remat / scan), projections, loss and optimizer, with the video tower swapped
           for scenic's own `scenic.projects.mbt.model.MBT` imported from --scenic_dir at run
           time: ViT-B/16 (12 layers, 768 wide, 12 heads, MLP 3072), tubelets 2 x 16 x 16
           ('3d_conv'), spectrogram patches 16 x 16, bottleneck fusion at layer 8 with
           n_bottlenecks 4, classifier 'token' (the embedding is the mean of the two
           modalities' [CLS], as in avtext; scenic then adds one bottleneck token: 5),
           `dtype=bfloat16` (scenic's `model_dtype_str`; its patch convs and final LayerNorm
           take no dtype and stay float32 from the float32 inputs, as in a scenic run),
           dropout 0. scenic's MBT has no remat, no scanned layers and no attention kernel
           option (flax's materialized softmax), so none are used. Nothing of scenic is
           stubbed: its imports load with this repository's venv.

Only the video tower differs, so the rows compare the two MBT implementations. Per chip:
HBM needed (arguments + outputs + temporaries - aliased), and from the compiled program's HLO
(`avtext.aot.hlo_cost.analyze_hlo`) HBM bytes, FLOPs and ICI bytes, the roofline bound
(`avtext.aot.cost_model.bound`, v5e figures) and MFU at the bound. Model FLOPs: each side's
step lowered without remat on one CPU device (`avtext.aot.programs.model_flops_per_step`), the same
count for both.

A program that needs more HBM than the chip has does not compile (RESOURCE_EXHAUSTED). The
compiles therefore run with XLA's dump on (`<hlo_dir>/dump`): the optimized HLO
(`*.after_optimizations.txt`) and the buffer assignment are written before the memory check,
so a side that does not fit still gets its bytes, FLOPs and bound from its HLO; its HBM
needed is then the compiler's own figure for the temporaries alone, from its error (a floor:
arguments come on top). The sum of the dumped buffer assignment's allocations is printed for
both sides as a like-for-like reading (it reads under the memory analysis: the AVR step 8.18
against 9.87 GiB). The dumped HLO and each side's figures are kept under --out;
--reanalyse reads `<out>/<side>.json` and the dumped HLO again without compiling.
--quick: both towers at 2 layers (fusion at layer 1) and a global batch of one clip a chip.
Rows: each side's HBM needed, HBM bytes, FLOPs, ICI bytes, step bound and MFU at the bound.
"""
import datetime
import json
import math
import os
import pathlib
import re
import time

from absl import app
from absl import flags

from benchmarks import common
from benchmarks.common import hlo as hlo_lib

SIDES = ("scenic", "avtext")
GIB = 2 ** 30
_SCENIC_DIR = flags.DEFINE_string("scenic_dir", None, "a checkout of google-research/scenic "
                                  "(the directory holding scenic/)", required=True)
_TOPOLOGY = flags.DEFINE_string("topology", "v5e:4x4", "libtpu's name of the TPU slice")
_REANALYSE = flags.DEFINE_bool("reanalyse", False, "read --out again instead of compiling")
_SIDES = flags.DEFINE_list("sides", list(SIDES), "a subset of scenic,avtext")
_JSON = flags.DEFINE_bool("json", False, "print one JSON object")


@flags.validator("scenic_dir", message="no scenic/projects/mbt/model.py there; pass a "
                 "checkout of github.com/google-research/scenic")
def _has_scenic(path):
  return path is None or (pathlib.Path(path) / "scenic" / "projects" / "mbt" / "model.py").is_file()


@flags.validator("sides", message=f"expected a non-empty subset of {','.join(SIDES)}")
def _known_sides(sides):
  return bool(sides) and not set(sides) - set(SIDES)


# ---- scenic's MBT as the dual encoder's video tower ------------------------------------------

def register_scenic_tower(scenic_dir: str) -> None:
  """Registers model "scenic_mbt": scenic's `MBT` returning {'embedding': [B, D]}."""
  common.import_checkout(scenic_dir)  # scenic is imported from here
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  from scenic.projects.mbt import model as scenic_mbt  # pylint: disable=g-import-not-at-top
  from avtext.models import model_registry  # pylint: disable=g-import-not-at-top

  class ScenicMBTTower(nn.Module):
    """scenic's MBT on avtext's clip inputs: 'rgb' [B, T, H, W, 3], 'audio' [B, T_a, mel]."""
    hidden_size: int
    num_layers: int
    num_heads: int
    mlp_dim: int
    rgb_patch: tuple  # (t, h, w)
    audio_patch: tuple  # (time, mel)
    n_bottlenecks: int
    fusion_layer: int
    dtype: object

    @nn.compact
    def __call__(self, inputs, *, train: bool):
      t, h, w = self.rgb_patch
      patches = ml_collections.ConfigDict({"size": (h, w, t)})  # scenic's (h, w, t)
      temporal = ml_collections.ConfigDict({"method": "3d_conv",
                                            "kernel_init_method": "central_frame_initializer"})
      if tuple(self.audio_patch) != (h, w):
        raise ValueError(f"scenic's MBT patches both modalities with patches.size[:2] = {(h, w)};"
                         f" audio_patch {tuple(self.audio_patch)} differs")
      out = scenic_mbt.MBT(
          mlp_dim=self.mlp_dim, num_layers=self.num_layers, num_heads=self.num_heads,
          num_classes=1, patches=patches, hidden_size=self.hidden_size,
          temporal_encoding_config=temporal,
          attention_config=ml_collections.ConfigDict({"type": "spacetime"}),
          dropout_rate=0.0, attention_dropout_rate=0.0, classifier="token",
          modality_fusion=("spectrogram", "rgb"), fusion_layer=self.fusion_layer,
          use_bottleneck=True, n_bottlenecks=self.n_bottlenecks, return_prelogits=True,
          dtype=self.dtype, name="mbt")(
              {"rgb": inputs["rgb"], "spectrogram": inputs["audio"][..., None]}, train=train)
      return {"embedding": jnp.mean(jnp.stack([out["rgb"], out["spectrogram"]]), axis=0)}

  @model_registry.register_model("scenic_mbt")
  def _scenic_mbt(cfg):
    return ScenicMBTTower(
        hidden_size=cfg.hidden_size, num_layers=cfg.num_layers, num_heads=cfg.num_heads,
        mlp_dim=cfg.mlp_dim, rgb_patch=tuple(cfg.rgb_patch), audio_patch=tuple(cfg.audio_patch),
        n_bottlenecks=cfg.n_bottlenecks, fusion_layer=cfg.fusion_layer,
        dtype=model_registry.compute_from_config(cfg).dtype)


def configs(topology: str) -> dict:
  """{side: config}: the AVR paper config, and the same with scenic's MBT as video tower."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  avtext = common.load_config("configs/videocc_avr.py")
  with avtext.unlocked():
    avtext.target_topology = topology
    avtext.evals = ml_collections.ConfigDict()
    if common.quick():
      v = avtext.model.video
      v.num_layers, v.fusion_layer = 2, 1
      avtext.train.batch_size = math.prod(int(d) for d in topology.split(":")[1].split("x"))
  scenic = avtext.copy_and_resolve_references()
  v = avtext.model.video
  with scenic.unlocked():
    scenic.model.video = ml_collections.ConfigDict(dict(
        name="scenic_mbt", modalities=v.modalities, hidden_size=v.hidden_size,
        num_layers=v.num_layers, num_heads=v.num_heads, mlp_dim=v.mlp_dim,
        rgb_patch=tuple(v.rgb_patch), audio_patch=tuple(v.audio_patch),
        n_bottlenecks=v.n_bottlenecks, fusion_layer=v.fusion_layer))
  return {"avtext": avtext, "scenic": scenic}


# ---- compiling, reading the dump -------------------------------------------------------------

def _dumped(dump: pathlib.Path) -> set:
  return set(dump.glob("*after_optimizations.txt")) if dump.is_dir() else set()


def compile_side(side: str, config, devices, hlo_dir: pathlib.Path) -> dict:
  """Lowers and compiles `side`'s train step; its figures (HLO paths, memory) as a dict."""
  from avtext.tasks import task_registry  # pylint: disable=g-import-not-at-top
  from avtext.aot import programs as aot  # pylint: disable=g-import-not-at-top
  dump = hlo_dir / "dump"
  before = _dumped(dump)
  log = lambda m: print(f"aot_scenic: {side}: {m}", flush=True)  # noqa: E731
  log(f"lowering the train step (global batch {config.train.batch_size})")
  t0 = time.perf_counter()
  _, _, _, lowered = aot.train_step(config, devices, task_registry.build_task)
  log(f"lowered in {time.perf_counter() - t0:.0f} s; compiling (minutes)")
  t0 = time.perf_counter()
  out = {"side": side, "global_batch": int(config.train.batch_size), "chips": len(devices)}
  try:
    compiled = lowered.compile()
    out["memory_analysis"] = aot.memory(compiled)
    out["fits"] = True
  except Exception as e:  # pylint: disable=broad-except
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    out["fits"], out["error"] = False, str(e).splitlines()[0][:400]
  out["compile_s"] = time.perf_counter() - t0
  new = sorted(_dumped(dump) - before, key=lambda p: p.stat().st_size)
  if not new:
    raise RuntimeError(f"{side}: XLA dumped no optimized HLO under {dump}; was XLA_FLAGS "
                       "overridden?")
  out["hlo"] = str(new[-1])  # the train step: the largest module of this compile
  log(f"compiled in {out['compile_s']:.0f} s ({'fits' if out['fits'] else out['error']}); "
      "counting the model's FLOPs (lowered without remat on the CPU)")
  out["model_flops_per_step"] = aot.model_flops_per_step(config, task_registry.build_task)
  return out


def analyse(fig: dict, chip) -> dict:
  """The side's row: HBM needed, the HLO's costs and the bound, from its dumped HLO."""
  from avtext.aot import cost_model  # pylint: disable=g-import-not-at-top
  from avtext.aot import hlo_cost  # pylint: disable=g-import-not-at-top
  hlo = pathlib.Path(fig["hlo"])
  assignment = hlo.with_name(hlo.name.replace(".txt", "-buffer-assignment.txt"))
  cost = hlo_cost.analyze_hlo(hlo.read_text(), fig["chips"])
  model_flops = fig["model_flops_per_step"] / fig["chips"]
  roof = cost_model.bound(cost, chip, model_flops)
  assigned = hlo_lib.buffer_assignment_bytes(assignment.read_text()) if assignment.is_file() else None
  mem = fig.get("memory_analysis")
  if mem:
    needed = (mem["argument"] + mem["output"] + mem["temp"] - mem["alias"]) / GIB
  else:  # "... required for HLO temporaries (21.29G) exceeds ...": GiB, the temporaries alone
    found = re.search(r"temporaries \(([\d.]+)G\)", fig.get("error", ""))
    needed = float(found.group(1)) if found else assigned / GIB
  return {**fig, "hbm_needed_gib": needed,
          "buffer_assignment_gib": assigned / GIB if assigned else None,
          "hbm_per_chip_gib": chip.hbm_gib, "bytes_per_chip": cost.bytes,
          "flops_per_chip": cost.flops, "comm_bytes_per_chip": cost.comm_bytes,
          "model_flops_per_chip": model_flops, "unreadable_loops": cost.unreadable_loops,
          **roof}


# ---- the table -------------------------------------------------------------------------------

def table(rows: dict, topology: str) -> str:
  lines = [f"## AVR train step, scenic's MBT vs avtext's, {topology}, global batch "
           f"{next(iter(rows.values()))['global_batch']}, {datetime.date.today()}", "",
           "| video tower | HBM needed / chip | HBM GB/step/chip | GFLOP/step/chip (model) | "
           "ICI GB/step/chip | step bound (by) | MFU at bound |", "|---|---|---|---|---|---|---|"]
  for side, r in rows.items():
    fit = "" if r["fits"] else " (temporaries alone; does not fit)"
    lines.append(
        f"| {side} | {'' if r['fits'] else '>= '}{r['hbm_needed_gib']:.2f} / "
        f"{r['hbm_per_chip_gib']:.2f} GiB{fit} | "
        f"{r['bytes_per_chip'] / 1e9:,.1f} | {r['flops_per_chip'] / 1e9:,.0f} "
        f"({r['model_flops_per_chip'] / 1e9:,.0f}) | {r['comm_bytes_per_chip'] / 1e9:,.2f} | "
        f"{1e3 * r['step_time_lower_bound_s']:,.1f} ms ({r['bound_by']}) | "
        f"{100 * r['mfu_at_bound']:.1f} % |")
  lines += ["", "By op class (HBM GB / GFLOP / share of bound), per chip per step:", "",
            "| op class | " + " | ".join(rows) + " |", "|---" * (len(rows) + 1) + "|"]
  classes = sorted({c for r in rows.values() for c in r["breakdown"]})
  for c in classes:
    cells = []
    for r in rows.values():
      b = r["breakdown"].get(c)
      cells.append(f"{b['bytes'] / 1e9:,.1f} / {b['flops'] / 1e9:,.0f} / "
                   f"{100 * b['share_of_bound']:.0f} %" if b else "-")
    lines.append(f"| {c} | " + " | ".join(cells) + " |")
  for side, r in rows.items():
    check = (f"; buffer assignment {r['buffer_assignment_gib']:.2f} GiB"
             if r.get("buffer_assignment_gib") is not None else "")
    lines.append(f"\n{side}: compiled in {r['compile_s']:.0f} s"
                 f"{'' if r['fits'] else ' to ' + r['error']}{check}; HLO {r['hlo']}")
  return "\n".join(lines)


def main(argv) -> None:
  del argv
  hlo_dir = common.out_dir()
  if not _REANALYSE.value:
    # Before jax starts: the optimized HLO and buffer assignment of every compile, also of
    # one that runs out of HBM.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={hlo_dir}/dump"
                               " --xla_dump_hlo_as_text").strip()
  from avtext.aot import chips  # pylint: disable=g-import-not-at-top
  from avtext.aot import programs as aot  # pylint: disable=g-import-not-at-top
  topology = _TOPOLOGY.value
  if not _REANALYSE.value:
    register_scenic_tower(_SCENIC_DIR.value)
    devices = aot.topology_devices(topology)
    for side, config in configs(topology).items():
      if side in _SIDES.value:
        fig = compile_side(side, config, devices, hlo_dir)
        (hlo_dir / f"{side}.json").write_text(json.dumps(fig, indent=1))
  rows = {}
  for side in SIDES:
    path = hlo_dir / f"{side}.json"
    if path.is_file():
      fig = json.loads(path.read_text())
      rows[side] = analyse(fig, aot.per_device(chips.chip_of(topology), topology,
                                               [None] * fig["chips"]))
  if not rows:
    raise app.UsageError(f"no figures under {hlo_dir}: run without --reanalyse first")
  print(json.dumps(rows, indent=1, sort_keys=True) if _JSON.value else table(rows, topology))
  if _REANALYSE.value:
    return  # the rows of the compile that wrote these figures are in the store
  caption = f"{topology}, global batch {next(iter(rows.values()))['global_batch']}"
  for side, r in rows.items():
    metric = f"{side}'s MBT"
    record = lambda column, value, unit="", **kw: common.record(  # noqa: E731
        "Paper configs at scale", metric, value, unit=unit, table=caption, column=column, **kw)
    record("HBM needed / chip", f"{'' if r['fits'] else '>= '}{r['hbm_needed_gib']:.2f} / "
           f"{r['hbm_per_chip_gib']:.2f} GiB" + ("" if r["fits"] else " (does not fit)"))
    record("HBM GB/step/chip", r["bytes_per_chip"] / 1e9)
    record("GFLOP/step/chip", r["flops_per_chip"] / 1e9, digits=5)
    record("model GFLOP/step/chip", r["model_flops_per_chip"] / 1e9, digits=5)
    record("ICI GB/step/chip", r["comm_bytes_per_chip"] / 1e9, digits=3)
    record("step bound", f"{1e3 * r['step_time_lower_bound_s']:.1f} ms ({r['bound_by']})")
    record("MFU at bound", 100 * r["mfu_at_bound"], "%", digits=3)


if __name__ == "__main__":
  common.main(main)
