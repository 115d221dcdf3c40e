r"""Compile a config for a TPU slice ahead of time, on any machine: does it fit, how fast can it go.

    python -m avtext.aot --config=configs/videocc_avr.py [--topology=v5e:4x4] [--json]

The config's real train step (the trainer's own jitted step, with the config's dtype,
remat, attention, micro-batches and partitioning) is lowered from abstract inputs at the
config's global batch (shapes from `Task.example_spec`: no data file is opened and no
weights are read) onto the devices of `--topology` (default `config.target_topology`),
which `jax.experimental.topologies` describes from libtpu alone (requirements-tpu.txt),
and compiled by the TPU compiler. Then, per chip

(per JAX device: a v5e chip is one device; libtpu describes a v4 or v5p chip as two,
each with half the chip's HBM and FLOP/s)

  HBM needed      arguments + outputs + temporaries - aliased (donated) buffers, from
                  the compiled program's memory analysis, against the chip's HBM
  FLOPs           the step's HLO cost analysis, rematerialized work included, from the
                  unrolled step lowered on a CPU device (`lowered_costs`: the compiled
                  program's own count sees no FLOPs inside Pallas kernels and counts a
                  scanned loop's body once); the compiled count is in the JSON too
  bytes accessed  the compiled program's cost analysis (with scan_layers scaled by the
                  loops' trip counts, `lowered_costs`); / the chip's HBM bandwidth =
                  the memory-bandwidth bound
  step bound      max(FLOPs / bf16 peak, bytes / bandwidth): no step can be faster
  MFU at bound    model FLOPs (the same step lowered without remat, before the
                  compiler) / (step bound x peak): the best utilization this program
                  allows; a real step is slower

With --evals (default on) each predict function the evaluators call is compiled too, at
config.eval.batch_size, and must fit beside the parameters. `fits` is HBM needed <= the
chip's HBM; the paper configs keep >= 10 % headroom (tests/test_aot.py, BENCHMARKS.md).
The chip table below holds the public per-chip figures; topology names are libtpu's
("v5e:4x4", "v4:2x2x4", "v5p:2x2x2", "v6e:2x2").
"""
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
from typing import Any

from absl import flags
from absl import logging
from ml_collections import config_flags
import numpy as np

from avtext import cli
from avtext import errors

FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "configs/<experiment>.py[:variant]; --config.<field>=<value> overrides",
    lock_config=True, flag_values=FLAGS)
_TOPOLOGY = flags.DEFINE_string(
    "topology", None, "TPU slice, e.g. v5e:4x4 or v4:2x2x4 (default: config.target_topology)",
    flag_values=FLAGS)
_JSON = flags.DEFINE_bool("json", False, "print one JSON object instead of the report",
                          flag_values=FLAGS)
_EVALS = flags.DEFINE_bool("evals", True, "also compile the evaluators' predict functions",
                           flag_values=FLAGS)
flags.mark_flag_as_required("config", flag_values=FLAGS)


GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  hbm_gib: float  # usable HBM per chip
  bf16_flops: float  # peak dense bf16 FLOP/s per chip
  hbm_bytes_per_s: float  # HBM bandwidth per chip


# Cloud TPU system-architecture pages; v5e's 15.75 GiB is what its runtime leaves usable.
CHIPS = {
    "v4": Chip("TPU v4", 32.0, 275e12, 1228e9),
    "v5e": Chip("TPU v5 lite", 15.75, 197e12, 819e9),
    "v5p": Chip("TPU v5p", 95.0, 459e12, 2765e9),
    "v6e": Chip("TPU v6 lite", 31.25, 918e12, 1640e9),
}


def chip_of(topology: str) -> Chip:
  kind = topology.split(":")[0].lower()
  if kind not in CHIPS:
    raise ValueError(f"topology {topology!r}: unknown chip {kind!r}; expected one of "
                     f"{sorted(CHIPS)} (e.g. v5e:4x4, v4:2x2x4)")
  return CHIPS[kind]


@contextlib.contextmanager
def _quiet_stderr():
  """libtpu prints cloud-metadata warnings when it finds no TPU VM: drop them."""
  sys.stderr.flush()
  saved = os.dup(2)
  with open(os.devnull, "w") as null:
    os.dup2(null.fileno(), 2)
  try:
    yield
  finally:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)


def per_device(chip: Chip, topology: str, devices: list) -> Chip:
  """The chip's figures per JAX device: libtpu describes a v4 / v5p chip as two devices
  (its two TensorCores), each with half the chip's HBM, bandwidth and FLOP/s."""
  dims = [int(d) for d in topology.split(":")[1].split("x")]
  per_chip = len(devices) // int(np.prod(dims))
  if per_chip <= 1:
    return chip
  return Chip(f"{chip.name} TensorCore ({per_chip} per chip)", chip.hbm_gib / per_chip,
              chip.bf16_flops / per_chip, chip.hbm_bytes_per_s / per_chip)


def topology_devices(topology: str) -> list:
  """The devices of a TPU slice described by libtpu (no TPU needed)."""
  # libtpu takes a machine-wide lock file by default; describing a slice needs no chip,
  # so several checks (and tests) may run at once.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  chip_of(topology)
  try:
    with _quiet_stderr():
      desc = topologies.get_topology_desc(topology_name=topology, platform="tpu")
  except Exception as e:  # pylint: disable=broad-except
    raise RuntimeError(
        f"libtpu could not describe topology {topology!r} ({type(e).__name__}: {e}); is "
        "libtpu installed (pip install -r requirements-tpu.txt) and the name libtpu's "
        "(v5e:4x4, v4:2x2x4)?") from e
  return list(desc.devices)


def _cost(analysis) -> dict:
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0] if analysis else {}
  return dict(analysis or {})


def _memory(compiled) -> dict[str, int]:
  m = compiled.memory_analysis()
  return {k: int(getattr(m, f"{k}_size_in_bytes")) for k in
          ("argument", "output", "temp", "alias", "generated_code")}


def _needed(mem: dict[str, int]) -> int:
  return mem["argument"] + mem["output"] + mem["temp"] - mem["alias"]


def _sharded(batch: dict, sharding) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  return {k: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding)
          for k, s in batch.items()}


def _variant(config, *, remat: bool, scan: bool):
  """The config for a CPU lowering: the materialized attention (the TPU kernel lowers only
  for TPUs; same FLOPs), remat kept or off, layers scanned as configured or unrolled."""
  plain = config.copy_and_resolve_references()
  with plain.unlocked():
    for node in _model_nodes(plain.model):
      if "remat" in node and not remat:
        node.remat = "none"
      if "attention" in node:
        node.attention = "xla"
      if "scan_layers" in node and not scan:
        node.scan_layers = False
  return plain


def _without_remat(config):
  """The config with remat off, unrolled layers and the materialized attention: its
  un-optimized program counts the model's FLOPs once (no recomputation)."""
  return _variant(config, remat=False, scan=False)


def scans_layers(config) -> bool:
  return any(node.get("scan_layers") for node in _model_nodes(config.model))


def lowered_costs(config) -> dict[str, dict[str, float]]:
  """HLO cost analyses of the config's train step lowered on one CPU device (tracing
  only, no compilation), remat as configured, the materialized attention:
  {"unrolled": ..., "scanned": ... (only with scan_layers)}, each {"flops", "bytes"}.

  The compiled TPU program's own count misses two things: XLA counts a while loop's
  body once, whatever its trip count (`scan_layers`), and sees no FLOPs inside a Pallas
  kernel (`flash_tpu`). The unrolled lowering has neither problem, so it gives the
  step's FLOPs (remat's recomputation included); the ratio unrolled / scanned scales
  the compiled program's bytes accessed (an estimate: a ratio of un-fused costs,
  compared with the unrolled compile in tests/test_aot.py)."""
  import jax  # pylint: disable=g-import-not-at-top
  costs = {}
  for name, scan in (("unrolled", False), ("scanned", True)):
    if scan and not scans_layers(config):
      continue
    lowered = _train_step(_variant(config, remat=True, scan=scan), jax.devices("cpu")[:1])[3]
    cost = _cost(lowered.cost_analysis())
    costs[name] = {"flops": float(cost.get("flops", 0.0)),
                   "bytes": float(cost.get("bytes accessed", 0.0))}
  return costs


def _model_nodes(node):
  import ml_collections  # pylint: disable=g-import-not-at-top
  yield node
  for value in node.values():
    if isinstance(value, ml_collections.ConfigDict):
      yield from _model_nodes(value)


def _train_step(config, devices):
  """(trainer, lowered train step) on `devices` from abstract inputs."""
  from avtext import ops  # pylint: disable=g-import-not-at-top
  from avtext.tasks import registry  # pylint: disable=g-import-not-at-top
  from avtext.train import partitioning  # pylint: disable=g-import-not-at-top
  from avtext.train import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  task = registry.build_task(config)
  with tempfile.TemporaryDirectory() as workdir:
    # The evaluators' names only (config.eval.select is checked against them); their
    # predict functions are compiled separately (`_predict_fns`), no split is opened.
    run = trainer_lib.Trainer(config, workdir, task, {name: None for name in config.get("evals", {})},
                              devices=devices)
  batch = _sharded(task.batch_spec(config.train.batch_size, train=True),
                   partitioning.data_sharding(run.mesh))
  state, tx, schedule = run.abstract_state(batch)
  step = run.make_train_step(tx, schedule, jax.tree.map(lambda x: x.sharding, state))
  # Traced as the TPU program, also when counting its FLOPs on a CPU device.
  with partitioning.mesh_context(run.mesh, config), ops.lowering_for("tpu"):
    return run, task, state, step.lower(state, batch)


def model_flops_per_step(config) -> float:
  """FLOPs of one train step of the whole global batch, counted once: the step lowered
  without remat on one CPU device (tracing only, no compilation), HLO cost analysis."""
  import jax  # pylint: disable=g-import-not-at-top
  lowered = _train_step(_without_remat(config), jax.devices("cpu")[:1])[3]
  return float(_cost(lowered.cost_analysis()).get("flops", 0.0))


# The predict functions each evaluator type calls: {config key: default name}
# (avtext/evals/*.py read `cfg.get(key, default)`); None keys are fixed names.
EVALUATOR_FNS = {
    "retrieval": {"text_fn": "embed_text", "video_fn": "embed_video"},
    "captioning": {"captions_fn": "captions"},
    "classification": {"logits_fn": "logits"},
    "hierarchical": {"embed_fn": "embed"},
    "moments": {None: ("encode_query", "encode_context", "span_logits")},
}


def evaluator_fns(config) -> list[str]:
  """The predict functions `config.evals` calls (tools' own predict functions aside)."""
  names = set()
  for cfg in (config.get("evals") or {}).values():
    for key, default in EVALUATOR_FNS.get(cfg.get("type"), {}).items():
      names.update(default if key is None else (cfg.get(key, default),))
  return sorted(names)


def _predict_fns(config, run, task, state) -> dict:
  """{name: lowered predict function} for the evaluators' predict functions."""
  import jax  # pylint: disable=g-import-not-at-top
  from avtext import ops  # pylint: disable=g-import-not-at-top
  from avtext.train import partitioning  # pylint: disable=g-import-not-at-top
  from avtext.tasks import registry  # pylint: disable=g-import-not-at-top
  spec = task.example_spec(train=False)
  fns = task.predict_fns()
  del registry, spec
  names = evaluator_fns(config)
  variables = {"params": state.params, **state.model_state}
  shardings = jax.tree.map(lambda x: x.sharding, variables)
  batch_size = config.eval.get("batch_size") or config.train.batch_size
  shards = partitioning.num_data_shards(run.mesh)
  batch_size = -(-batch_size // shards) * shards  # evaluators pad the last batch likewise
  lowered = {}
  for name in names:
    if name not in fns:
      continue
    batch = _sharded(task.batch_spec(batch_size, train=False, predict_fn=name),
                     partitioning.data_sharding(run.mesh))
    with partitioning.mesh_context(run.mesh, config), ops.lowering_for("tpu"):
      lowered[name] = jax.jit(fns[name]).lower(variables, batch)
  return lowered


def analyze(config, topology: str | None = None, *, evals: bool = True) -> dict[str, Any]:
  """Compiles `config` for `topology` (default config.target_topology); the report dict."""
  topology = topology or config.get("target_topology")
  if not topology:
    raise ValueError("no topology: pass --topology=v5e:4x4 (or set config.target_topology)")
  chip = per_device(chip_of(topology), topology, devices := topology_devices(topology))
  t0 = time.perf_counter()
  run, task, state, lowered = _train_step(config, devices)
  lower_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  compiled = lowered.compile()
  compile_s = time.perf_counter() - t0
  mem = _memory(compiled)
  cost = _cost(compiled.cost_analysis())
  chips = run.mesh.size
  lowered_cost = lowered_costs(config)
  flops = lowered_cost["unrolled"]["flops"] / chips
  bytes_factor = (lowered_cost["unrolled"]["bytes"] / max(lowered_cost["scanned"]["bytes"], 1.0)
                  if "scanned" in lowered_cost else 1.0)
  bytes_accessed = float(cost.get("bytes accessed", 0.0)) * bytes_factor
  model_flops = model_flops_per_step(config) / chips
  compute_s = flops / chip.bf16_flops
  memory_s = bytes_accessed / chip.hbm_bytes_per_s
  bound = max(compute_s, memory_s)
  needed = _needed(mem)
  report = {
      "config": config.get("task"), "topology": topology, "chip": chip.name,
      "chips": chips, "mesh": dict(run.mesh.shape),
      "global_batch": int(config.train.batch_size),
      "microbatches": int(config.train.get("microbatches") or 1),
      "dtype": config.model.get("dtype") or "float32",
      "remat": config.model.get("remat") or "none",
      "scan_layers": scans_layers(config),
      "bytes_loop_factor": bytes_factor,
      "fsdp": bool((config.get("partitioning") or {}).get("fsdp", False)),
      "hbm_needed_gib": needed / GIB, "hbm_per_chip_gib": chip.hbm_gib,
      "headroom": 1.0 - needed / GIB / chip.hbm_gib,
      "fits": needed / GIB <= chip.hbm_gib,
      "memory_gib": {k: v / GIB for k, v in mem.items()},
      "flops_per_chip": flops, "model_flops_per_chip": model_flops,
      "compiled_flops_per_chip": float(cost.get("flops", 0.0)),
      "bytes_per_chip": bytes_accessed,
      "compute_bound_s": compute_s, "memory_bound_s": memory_s,
      "step_time_lower_bound_s": bound,
      "mfu_at_bound": model_flops / (bound * chip.bf16_flops) if bound else 0.0,
      "lower_s": lower_s, "compile_s": compile_s,
  }
  if evals:
    report["predict"] = {}
    for name, fn in _predict_fns(config, run, task, state).items():
      t0 = time.perf_counter()
      c = fn.compile()
      m = _memory(c)
      report["predict"][name] = {"hbm_needed_gib": _needed(m) / GIB,
                                 "fits": _needed(m) / GIB <= chip.hbm_gib,
                                 "compile_s": time.perf_counter() - t0}
    report["fits"] = report["fits"] and all(p["fits"] for p in report["predict"].values())
  return report


def advice(report: dict) -> str:
  """What to change when a config does not fit (or fits without 10 % headroom)."""
  steps = []
  if report["dtype"] == "float32":
    steps.append("--config.model.dtype=bfloat16")
  if report["remat"] == "none":
    steps.append("--config.model.remat=full")
  if not report["fsdp"]:
    steps.append("--config.partitioning.fsdp=True")
  steps.append(f"--config.train.microbatches={2 * report['microbatches']} (tasks with "
               "an encode/combine split)")
  steps.append("a larger slice (--topology)")
  return "; or ".join(steps)


def format_report(r: dict) -> str:
  lines = [
      f"{r['topology']} ({r['chips']} x {r['chip']}, mesh {r['mesh']}), global batch "
      f"{r['global_batch']} in {r['microbatches']} micro-batch(es), {r['dtype']} compute, "
      f"remat {r['remat']}, FSDP {'on' if r['fsdp'] else 'off'}"
      f"{', layers scanned' if r.get('scan_layers') else ''}",
      f"  HBM per chip     {r['hbm_needed_gib']:.2f} GiB needed of {r['hbm_per_chip_gib']} GiB "
      f"({100 * r['headroom']:.0f} % headroom): args {r['memory_gib']['argument']:.2f}, "
      f"outputs {r['memory_gib']['output']:.2f}, temporaries {r['memory_gib']['temp']:.2f}, "
      f"aliased {r['memory_gib']['alias']:.2f}",
      f"  FLOPs per chip   {r['flops_per_chip'] / 1e9:.4g} GFLOP per step "
      f"(model {r['model_flops_per_chip'] / 1e9:.4g} without remat)",
      f"  bytes per chip   {r['bytes_per_chip'] / 1e9:.4g} GB per step"
      + (f" (the scanned program's x{r['bytes_loop_factor']:.3g}, `lowered_costs`)"
         if r.get("scan_layers") else ""),
      f"  step bound       {1e3 * r['step_time_lower_bound_s']:.4g} ms = max(compute "
      f"{1e3 * r['compute_bound_s']:.4g} ms, HBM bandwidth {1e3 * r['memory_bound_s']:.4g} ms);"
      f" MFU at the bound {100 * r['mfu_at_bound']:.0f} %",
      f"  compile          {r['compile_s']:.0f} s (lowering {r['lower_s']:.0f} s)",
  ]
  for name, p in (r.get("predict") or {}).items():
    lines.append(f"  predict {name}: {p['hbm_needed_gib']:.2f} GiB, compiled in "
                 f"{p['compile_s']:.0f} s{'' if p['fits'] else ' (does not fit)'}")
  if r["fits"]:
    lines.append("fits" + ("" if r["headroom"] >= 0.1 else
                           f" (under 10 % headroom; to gain some: {advice(r)})"))
  else:
    lines.append(f"does not fit: {advice(r)}")
  return "\n".join(lines)


def main(argv):
  if len(argv) > 1:
    raise errors.BadInput(f"unexpected arguments {list(argv[1:])}; see --help")
  config = cli.config_value(_CONFIG)
  logging.set_verbosity(logging.WARNING)
  try:
    report = analyze(config, _TOPOLOGY.value, evals=_EVALS.value)
  except (ValueError, RuntimeError) as e:
    raise errors.BadInput(str(e)) from None
  print(json.dumps(report, indent=2, sort_keys=True) if _JSON.value
        else format_report(report))


if __name__ == "__main__":
  cli.run(main, FLAGS)
