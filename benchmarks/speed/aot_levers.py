r"""The speed levers of the AVR paper step, one after another, by the per-kernel model.

    python -m benchmarks.speed.aot_levers [--config=configs/videocc_avr.py] \
        [--topology=v5e:4x4] [--gpu_topology=h100:1x8]

Compiles the config's train step for the TPU slice (`avtext.aot.programs.analyze`, no
evaluators) four times, each adding a lever to the one before:
  1. before      remat "full", the Pallas flash kernel, the fused q/k/v projection sliced,
                 transposed and padded per head (`attention.FLASH_HEADS_FIRST` off)
  2. + remat     "save_attention_kernel": the kernel's output and softmax statistics kept,
                 its forward not run again in the backward pass
  3. + layout    the projections written in the kernel's [B, H, L, d] layout on padded
                 sequences, the output projection reading it
  4. + splash    the splash kernel (attention "auto" on a TPU): one fused dQ/dK/dV
                 backward kernel
and, on the GPU hosts (the CUDA wheels: requirements-cuda12.txt), remat "full" against
"save_attention_kernel" with cuDNN's kernel. Rows: HBM needed (headroom), the global
bound and the predicted step (`avtext.aot.cost_model.predict`) with the MFU at each, and
the predicted time of the op classes that move. Each compile runs in its own process.
--quick: the tiny AVR config on v5e:2x2, no GPU rows (printed, not stored).
"""
import json
import os
import subprocess
import sys

from absl import flags

from benchmarks import common

_CONFIG = flags.DEFINE_string("config", "configs/videocc_avr.py", "the config")
_TOPOLOGY = flags.DEFINE_string("topology", "v5e:4x4", "the TPU slice")
_GPU = flags.DEFINE_string("gpu_topology", "h100:1x8", "GPU hosts ('' for none)")
_ONE = flags.DEFINE_string("one", None, "(internal) compile one setting, print its JSON")

# (name, topology kind, remat, attention, projections in the kernel's layout)
SETTINGS = (
    ("before: full remat, flash kernel, projections sliced and transposed", "tpu", "full",
     "flash_tpu", False),
    ("+ remat save_attention_kernel", "tpu", "save_attention_kernel", "flash_tpu", False),
    ("+ projections in the kernel's layout", "tpu", "save_attention_kernel", "flash_tpu", True),
    ("+ splash kernel (the config's attention auto)", "tpu", "save_attention_kernel", "auto",
     True),
    ("GPU: full remat, cuDNN kernel", "gpu", "full", "auto", True),
    ("GPU: + remat save_attention_kernel", "gpu", "save_attention_kernel", "auto", True),
)
CLASSES = ("attention kernels", "matmul/conv", "copies/transposes", "elementwise/norm fusions")


def compile_one(index: int, config_spec: str, topology: str) -> dict:
  from avtext.aot import programs  # pylint: disable=g-import-not-at-top
  from avtext.models import attention  # pylint: disable=g-import-not-at-top
  from avtext.tasks import task_registry  # pylint: disable=g-import-not-at-top
  _, _, remat, attn, heads_first = SETTINGS[index]
  overrides = ("model.remat=" + remat, "model.attention=" + attn)
  if common.quick():
    overrides += ("optimizer.frozen=()",)
  config = common.load_config(config_spec, overrides)
  attention.FLASH_HEADS_FIRST = heads_first
  r = programs.analyze(config, topology, build_task=task_registry.build_task,
                       progress=lambda m: print(m, file=sys.stderr, flush=True))
  p = r["predicted"]
  return {"hbm_needed_gib": r["hbm_needed_gib"], "hbm_per_chip_gib": r["hbm_per_chip_gib"],
          "headroom": r["headroom"], "bound_s": r["step_time_lower_bound_s"],
          "bound_by": r["bound_by"], "mfu_at_bound": r["mfu_at_bound"],
          "predicted_s": p["step_s"], "mfu": p["mfu"],
          "classes": {c: p["by_class"][c]["time_s"] for c in CLASSES}}


def main(argv):
  del argv
  config = "configs/videocc_avr.py:tiny" if common.quick() else _CONFIG.value
  topology = "v5e:2x2" if common.quick() else _TOPOLOGY.value
  if _ONE.value is not None:
    index, target = _ONE.value.split("@")
    print(json.dumps(compile_one(int(index), config, target)))
    return
  table = (f"{config.split('/')[-1]}'s train step by lever, per chip: the global bound and "
           "the predicted step")
  lines = ["| lever | topology | HBM needed (headroom) | bound (MFU) | predicted (MFU) | "
           + " | ".join(CLASSES) + " |", "|---" * (5 + len(CLASSES)) + "|"]
  for index, (name, kind, *_) in enumerate(SETTINGS):
    target = topology if kind == "tpu" else _GPU.value
    if not target or (kind == "gpu" and common.quick()):
      continue
    print(f"compiling {name} for {target} ...", file=sys.stderr, flush=True)
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.speed.aot_levers", f"--one={index}@{target}",
         f"--config={_CONFIG.value}", "--results=", *(["--quick"] if common.quick() else [])],
        cwd=common.REPO, capture_output=True, text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"})
    if out.returncode:
      raise RuntimeError(f"{name}: compile failed:\n{out.stderr[-3000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])

    def row(column, value, unit="", **kw):
      common.record("Paper configs at scale", name, value, unit=unit, table=table,
                    column=column, **kw)
    row("topology", target)
    row("HBM needed (headroom)", f"{r['hbm_needed_gib']:.2f} / {r['hbm_per_chip_gib']:.2f} "
        f"GiB ({100 * r['headroom']:.0f} %)")
    row("bound (MFU)", f"{1e3 * r['bound_s']:.1f} ms ({100 * r['mfu_at_bound']:.1f} %)")
    row("predicted (MFU)", f"{1e3 * r['predicted_s']:.1f} ms ({100 * r['mfu']:.1f} %)")
    for c in CLASSES:
      row(c, 1e3 * r["classes"][c], "ms", digits=4)
    lines.append(f"| {name} | {target} | {r['hbm_needed_gib']:.2f} GiB "
                 f"({100 * r['headroom']:.0f} %) | {1e3 * r['bound_s']:.1f} ms "
                 f"({100 * r['mfu_at_bound']:.1f} %) | {1e3 * r['predicted_s']:.1f} ms "
                 f"({100 * r['mfu']:.1f} %) | " + " | ".join(
                     f"{1e3 * r['classes'][c]:.1f}" for c in CLASSES) + " |")
    print(lines[-1], flush=True)
  print("\n".join(lines))


if __name__ == "__main__":
  common.main(main)
