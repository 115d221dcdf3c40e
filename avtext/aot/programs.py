"""Compiling a config ahead of time for a TPU slice or GPU hosts: the library behind
`python -m avtext.aot` (which documents the report) and the speed benchmarks.

`analyze(config, topology, build_task=...)` lowers the trainer's own jitted train step from
abstract inputs (`train_step`) onto the devices libtpu or the CUDA plugin describes
(`topology_devices`), compiles it, reads its memory and its costs (`hlo_cost`,
`cost_model`) and returns the report dict. The
task and the predict functions to compile come from the caller (`avtext.aot`'s command
line passes the task registry and the evaluators' predict functions); `avtext.aot.report`
writes the report as text.
"""
import contextlib
import os
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

import numpy as np

from avtext.aot import chips as chips_lib
from avtext.aot import cost_model
from avtext.aot import hlo_cost

Chip = chips_lib.Chip
BuildTask = Callable[[Any], Any]  # config -> task (the caller's task registry)


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


def gpu_topology_devices(topology: str) -> list:
  """The GPUs of `topology` ("h100:HOSTSxGPUS", e.g. h100:1x1, h100:1x8) described by
  the CUDA PJRT plugin of requirements-cuda12.txt from `chips.H100_TARGET`, no GPU needed."""
  dims = topology.split(":")[1].split("x") if ":" in topology else []
  if len(dims) != 2 or not all(d.isdigit() and int(d) > 0 for d in dims):
    raise ValueError(f"topology {topology!r}: a GPU topology is h100:HOSTSxGPUS "
                     "(h100:1x1 for one GPU, h100:1x8 for an 8-GPU host)")
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    desc = topologies.get_topology_desc(
        topology_name=topology, platform="cuda", topology=f"1x{dims[0]}x{dims[1]}",
        target_config=chips_lib.H100_TARGET)
  except Exception as e:  # pylint: disable=broad-except
    raise RuntimeError(
        f"the CUDA plugin could not describe {topology!r} ({type(e).__name__}: "
        f"{str(e).splitlines()[0] if str(e) else ''}); compiling for GPUs needs the CUDA "
        "wheels: make venv ACCEL=cuda12 (or pip install -r requirements-cuda12.txt)") from e
  return list(desc.devices)


def per_device(chip: Chip, topology: str, devices: list) -> Chip:
  """The chip's figures per JAX device (`chips.per_device`)."""
  dims = [int(d) for d in topology.split(":")[1].split("x")]
  return chips_lib.per_device(chip, len(devices) // int(np.prod(dims)))


def topology_devices(topology: str) -> list:
  """The devices of a TPU slice described by libtpu, or of GPU hosts described by the
  CUDA PJRT plugin (`gpu_topology_devices`); no accelerator needed."""
  if chips_lib.chip_of(topology).platform == "cuda":
    return gpu_topology_devices(topology)
  # libtpu takes a machine-wide lock file by default; describing a slice needs no chip,
  # so several checks (and tests) may run at once.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  chips_lib.chip_of(topology)
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


def memory(compiled) -> dict[str, int]:
  m = compiled.memory_analysis()
  return {k: int(getattr(m, f"{k}_size_in_bytes")) for k in
          ("argument", "output", "temp", "alias", "generated_code")}


def hbm_needed(mem: dict[str, int]) -> int:
  """Bytes a program needs on the device: arguments + outputs + temporaries - aliased."""
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


def _model_nodes(node):
  return (n for _, n in _model_nodes_with_paths(node))


def _model_nodes_with_paths(node, path=()):
  """(path of keys, node) for `node` and every ConfigDict under it."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  yield path, node
  for key, value in node.items():
    if isinstance(value, ml_collections.ConfigDict):
      yield from _model_nodes_with_paths(value, path + (key,))


def _abstract_run(config, devices, build_task: BuildTask):
  """(trainer, task, abstract batch, abstract state, tx, schedule) on `devices`."""
  from avtext.train import partitioning  # pylint: disable=g-import-not-at-top
  from avtext.train import trainer as trainer_lib  # pylint: disable=g-import-not-at-top
  task = build_task(config)
  with tempfile.TemporaryDirectory() as workdir:
    # The evaluators' names only (config.eval.select is checked against them); their
    # predict functions are compiled separately (`lower_predict_fns`), no split is opened.
    run = trainer_lib.Trainer(config, workdir, task, {name: None for name in config.get("evals", {})},
                              devices=devices)
  batch = _sharded(task.batch_spec(config.train.batch_size, train=True),
                   partitioning.data_sharding(run.mesh))
  return (run, task, batch, *run.abstract_state(batch))


def train_step(config, devices, build_task: BuildTask):
  """(trainer, task, abstract state, lowered train step) on `devices` from abstract
  inputs; `build_task(config)` gives the task (train/ imports no task). The model is
  built for the devices' platform (`for_target`): the TPU program, also when counting its
  FLOPs on a CPU device."""
  from avtext.train import partitioning  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  config = for_target(config, devices)
  run, task, batch, state, tx, schedule = _abstract_run(config, devices, build_task)
  step = run.make_train_step(tx, schedule, jax.tree.map(lambda x: x.sharding, state))
  with partitioning.mesh_context(run.mesh, config):
    return run, task, state, step.lower(state, batch)


def for_target(config, devices):
  """`config` with `model.backend` the platform a program for `devices` is traced for
  (`_target`), so the model its task builds carries that platform's ops (`avtext.ops`)
  and "auto" attention's kernel."""
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.model.backend = _target(devices)
  return config


def _target(devices) -> str:
  """The platform a program for `devices` is traced for: theirs ("tpu", "gpu"); CPU
  devices (the FLOP-counting lowerings) trace the accelerator program, "tpu"."""
  platform = devices[0].platform
  return "gpu" if platform in ("cuda", "rocm", "gpu") else "tpu"


def model_flops_per_step(config, build_task: BuildTask) -> float:
  """FLOPs of one train step of the whole global batch, counted once: the step lowered
  without remat on one CPU device (tracing only, no compilation), HLO cost analysis."""
  import jax  # pylint: disable=g-import-not-at-top
  lowered = train_step(_without_remat(config), jax.devices("cpu")[:1], build_task)[3]
  return float(_cost(lowered.cost_analysis()).get("flops", 0.0))


def lowered_batch_size(config, run) -> int:
  """The predict functions' batch: config.eval.batch_size padded to the data shards (the
  evaluators pad their last batch likewise)."""
  from avtext.train import partitioning  # pylint: disable=g-import-not-at-top
  batch_size = config.eval.get("batch_size") or config.train.batch_size
  shards = partitioning.num_data_shards(run.mesh)
  return -(-batch_size // shards) * shards


def lower_predict_fns(config, run, task, state, names: Sequence[str]) -> dict:
  """{name: lowered predict function} for the task's predict functions `names` (those
  the evaluators call) at config.eval.batch_size on the run's mesh, with the task
  `train_step` built (for the mesh's platform)."""
  import jax  # pylint: disable=g-import-not-at-top
  from avtext.train import partitioning  # pylint: disable=g-import-not-at-top
  fns = task.predict_fns()
  variables = {"params": state.params, **state.model_state}
  batch_size = lowered_batch_size(config, run)
  lowered = {}
  for name in names:
    if name not in fns:
      continue
    batch = _sharded(task.batch_spec(batch_size, train=False, predict_fn=name),
                     partitioning.data_sharding(run.mesh))
    with partitioning.mesh_context(run.mesh, config):
      lowered[name] = jax.jit(fns[name]).lower(variables, batch)
  return lowered


def _progress(message: str) -> None:
  """A progress line on stderr (the compiles take minutes on a small machine)."""
  print(f"aot: {message}", file=sys.stderr, flush=True)


def program_cost(compiled, devices: int) -> hlo_cost.HloCost:
  """The per-device costs of a compiled program, from its optimized HLO."""
  return hlo_cost.analyze_hlo(compiled.as_text(), devices)


def _slice(config, topology: str | None) -> tuple[str, Chip, list]:
  """(topology name, per-device chip, devices) for `topology` or config.target_topology."""
  topology = topology or config.get("target_topology")
  if not topology:
    raise ValueError("no topology: pass --topology=v5e:4x4 (or set config.target_topology)")
  devices = topology_devices(topology)
  return topology, per_device(chips_lib.chip_of(topology), topology, devices), devices


def analyze(config, topology: str | None = None, *, build_task: BuildTask,
            predict_fns: Sequence[str] | None = None, progress=_progress,
            hlo_out: str | None = None) -> dict[str, Any]:
  """Compiles `config` for `topology` (default config.target_topology); the report dict.

  `build_task(config)` gives the task; `predict_fns`: the predict functions to compile
  too (`avtext.evals.predict_fn_names(config)`: the evaluators'), each reported under
  "predict" and counted in "fits" (None: the train step only, no "predict").
  Bytes, FLOPs and interconnect bytes are read from the compiled program
  (`hlo_cost.analyze_hlo`: every kernel weighted by its loops' trip counts, so scanned
  layers count N times); the bound is `cost_model.bound`. `progress(message)` is
  told what runs (lowering, compiling, ...)."""
  topology, chip, devices = _slice(config, topology)
  progress(f"lowering the train step (global batch {config.train.batch_size}) for "
           f"{topology}, {len(devices)} x {chip.name}")
  t0 = time.perf_counter()
  run, task, state, lowered = train_step(config, devices, build_task)
  lower_s = time.perf_counter() - t0
  progress(f"lowered in {lower_s:.0f} s; compiling for {topology} (minutes for a paper "
           "config: the AVR step takes 2 on 2 quiet cores)")
  t0 = time.perf_counter()
  compiled = lowered.compile()
  compile_s = time.perf_counter() - t0
  progress(f"compiled in {compile_s:.0f} s; reading the program's costs")
  mem = memory(compiled)
  xla = _cost(compiled.cost_analysis())
  chips = run.mesh.size
  if hlo_out:
    with open(hlo_out, "w") as f:
      f.write(compiled.as_text())
  cost = program_cost(compiled, chips)
  progress("counting the model's FLOPs (the step lowered without remat on the CPU)")
  model_flops = model_flops_per_step(config, build_task) / chips
  roof = cost_model.bound(cost, chip, model_flops)
  predicted = cost_model.predict(cost, chip, model_flops)
  needed = hbm_needed(mem)
  from avtext.models import model_registry  # pylint: disable=g-import-not-at-top
  compute = model_registry.compute_from_config(config.model)
  report = {
      "config": config.get("task"), "topology": topology, "chip": chip.name,
      "chips": chips, "mesh": dict(run.mesh.shape),
      "global_batch": int(config.train.batch_size),
      "microbatches": int(config.train.get("microbatches") or 1),
      "dtype": np.dtype(compute.dtype).name, "remat": compute.remat, "attention": compute.attention,
      "scan_layers": scans_layers(config),
      "fsdp": bool((config.get("partitioning") or {}).get("fsdp", False)),
      "hbm_needed_gib": needed / chips_lib.GIB, "hbm_per_chip_gib": chip.hbm_gib,
      "headroom": 1.0 - needed / chips_lib.GIB / chip.hbm_gib,
      "fits": needed / chips_lib.GIB <= chip.hbm_gib,
      "memory_gib": {k: v / chips_lib.GIB for k, v in mem.items()},
      "flops_per_chip": cost.flops, "model_flops_per_chip": model_flops,
      "bytes_per_chip": cost.bytes, "comm_bytes_per_chip": cost.comm_bytes,
      # XLA's own cost analysis, for comparison: a loop body counted once, no FLOPs
      # inside Mosaic kernels, on-chip operands charged as memory traffic.
      "xla_cost_analysis": {"flops": float(xla.get("flops", 0.0)),
                            "bytes": float(xla.get("bytes accessed", 0.0))},
      "unreadable_loops": cost.unreadable_loops,
      **roof,
      # The kernels one after another, each at its own limit (`cost_model.predict`).
      "predicted": predicted,
      "lower_s": lower_s, "compile_s": compile_s,
  }
  if predict_fns is not None:
    report["predict"] = {}
    for name, fn in lower_predict_fns(config, run, task, state, predict_fns).items():
      progress(f"compiling the predict function {name}")
      t0 = time.perf_counter()
      c = fn.compile()
      m = memory(c)
      report["predict"][name] = {
          "hbm_needed_gib": hbm_needed(m) / chips_lib.GIB,
          "fits": hbm_needed(m) / chips_lib.GIB <= chip.hbm_gib,
          "compile_s": time.perf_counter() - t0,
          # One batch of config.eval.batch_size (padded to the data shards), predicted.
          "batch": lowered_batch_size(config, run),
          "predicted_s": cost_model.predict(program_cost(c, chips), chip, 0.0)["step_s"]}
    report["fits"] = report["fits"] and all(p["fits"] for p in report["predict"].values())
  progress("done")
  return report


# ---- per-layer extrapolation ----------------------------------------------------------

def layer_stacks(config) -> dict[str, int]:
  """{stack: depth} for the runs of identical layers in config.model, each named by its
  config path ("video", "text", "model" for config.model itself): a node's `num_layers`
  layers, or for MBT (a node with `fusion_layer`) two runs, its towers' unimodal layers
  below `fusion_layer` ("video.unimodal") and the fusion layers from it up
  ("video.fusion")."""
  stacks = {}
  for path, node in _model_nodes_with_paths(config.model):
    if "num_layers" not in node:
      continue
    name, depth = ".".join(path) or "model", int(node.num_layers)
    if "fusion_layer" in node:
      unimodal = min(max(int(node.fusion_layer), 0), depth)
      stacks[f"{name}.unimodal"], stacks[f"{name}.fusion"] = unimodal, depth - unimodal
    else:
      stacks[name] = depth
  return stacks


def with_depths(config, depths: dict[str, int]):
  """A copy of `config` with the stacks named in `depths` (`layer_stacks`' names) that
  many layers deep, every layer unrolled (scan_layers off); nothing else changes."""
  current = layer_stacks(config)
  unknown = set(depths) - set(current)
  if unknown:
    raise ValueError(f"no layer stack {sorted(unknown)} in config.model; its stacks: "
                     f"{current}")
  stacks = {**current, **depths}
  out = config.copy_and_resolve_references()
  with out.unlocked():
    for path, node in _model_nodes_with_paths(out.model):
      if "scan_layers" in node:
        node.scan_layers = False
      if "num_layers" not in node:
        continue
      name = ".".join(path) or "model"
      if "fusion_layer" in node:
        unimodal, fusion = stacks[f"{name}.unimodal"], stacks[f"{name}.fusion"]
        # fusion_layer == num_layers: no fusion layer (as the full config when it has none).
        node.fusion_layer, node.num_layers = unimodal, unimodal + fusion
      else:
        node.num_layers = stacks[name]
  return out


def _check_identical_layers(params, frozen) -> None:
  """Raises if config.optimizer.frozen freezes some layers of a stack and not others
  (e.g. a text tower's lower four): such layers differ in cost (no backward pass), and
  a program with one or two layers cannot stand for the rest."""
  import re  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from avtext.train import optimizers  # pylint: disable=g-import-not-at-top
  seen: dict[str, set] = {}
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  masks = jax.tree_util.tree_leaves(frozen)
  for (path, _), is_frozen in zip(leaves, masks):
    name = optimizers.path_name(path)
    key = re.sub(r"_\d+(?=/|$)", "_<i>", name)
    if key != name:
      seen.setdefault(key, set()).add(bool(is_frozen))
  mixed = sorted(k for k, v in seen.items() if len(v) > 1)
  if mixed:
    raise ValueError(
        "per-layer extrapolation needs a stack's layers to cost the same, but "
        f"config.optimizer.frozen freezes some layers of a stack and not others ({mixed[0]}"
        f"{' and more' if len(mixed) > 1 else ''}): compile the config whole instead")


class _ClassCost:
  """Per-device costs by op class (an `hlo_cost.HloCost` without its kernels): what
  `cost_model.bound` reads."""

  def __init__(self, rows: dict[str, dict[str, float]]):
    self.rows = rows

  def by_class(self):
    return self.rows

  def _total(self, field):
    return sum(row[field] for row in self.rows.values())

  bytes = property(lambda self: self._total("bytes"))
  flops = property(lambda self: self._total("flops"))
  comm_bytes = property(lambda self: self._total("comm_bytes"))

  def largest(self, n):
    del n
    return []


def extrapolate(config, topology: str | None = None, *, build_task: BuildTask,
                progress=_progress, model_flops_per_chip: float | None = None
                ) -> dict[str, Any]:
  """The unrolled train step's per-chip costs from small programs compiled for
  `topology`: all layer stacks (`layer_stacks`) one layer deep, then the stacks of each
  depth d >= 2 two layers deep; each stack adds (d - 1) x (its two-layer program's cost
  - the one-layer program's), per op class:
      cost(L) = cost(1, .., 1) + sum_s (L_s - 1) (cost(1, .., 2_s, .., 1) - cost(1, .., 1))
  (stacks of equal depth move together, so AVR's 8 unimodal, 4 fusion and 12 text layers
  take four compiles). Every program is the config's own step (dtype, remat, attention,
  partitioning, batch) with its layers unrolled. Returns the stacks, each program's
  depths and costs, the extrapolated flops/bytes/comm_bytes per chip and the bound
  (`cost_model.bound`; no "largest" kernels: the sums are per class).
  `model_flops_per_chip`: `analyze`'s, when the caller has it (else counted here)."""
  stacks = layer_stacks(config)
  deep = {}
  for name, depth in stacks.items():
    if depth >= 2:
      deep.setdefault(depth, []).append(name)
  if not deep:
    raise ValueError(f"no layer stack of 2 or more layers in config.model ({stacks}): "
                     "compile the config whole (`analyze`)")
  topology, chip, devices = _slice(config, topology)
  if config.optimizer.get("frozen"):
    run, _, _, state, _, _ = _abstract_run(config, devices, build_task)
    _check_identical_layers(state.params, run.frozen)
  base = {name: min(depth, 1) for name, depth in stacks.items()}
  plans = [(base, 1)] + [({**base, **{n: 2 for n in names}}, depth - 1)
                         for depth, names in sorted(deep.items())]
  programs, totals = [], None
  for i, (depths, weight) in enumerate(plans):
    progress(f"program {i + 1} of {len(plans)}: layers {depths}, compiling for {topology}")
    t0 = time.perf_counter()
    run, _, _, lowered = train_step(with_depths(config, depths), devices, build_task)
    compiled = lowered.compile()
    cost = program_cost(compiled, run.mesh.size)
    rows = cost.by_class()
    programs.append({"depths": depths, "flops": cost.flops, "bytes": cost.bytes,
                     "comm_bytes": cost.comm_bytes, "unreadable_loops": cost.unreadable_loops,
                     "hbm_needed_gib": hbm_needed(memory(compiled)) / chips_lib.GIB,
                     "compile_s": time.perf_counter() - t0})
    if totals is None:
      base_rows, totals = rows, {c: dict(r) for c, r in rows.items()}
      continue
    for c, row in rows.items():
      for field in ("bytes", "flops", "comm_bytes", "kernels"):
        totals[c][field] += weight * (row[field] - base_rows[c][field])
  model_flops = model_flops_per_chip
  if model_flops is None:
    progress("counting the model's FLOPs (the step lowered without remat on the CPU)")
    model_flops = model_flops_per_step(config, build_task) / len(devices)
  cost = _ClassCost(totals)
  roof = cost_model.bound(cost, chip, model_flops)
  roof.pop("largest")
  return {"topology": topology, "stacks": stacks, "programs": programs,
          "flops_per_chip": cost.flops, "bytes_per_chip": cost.bytes,
          "comm_bytes_per_chip": cost.comm_bytes, "model_flops_per_chip": model_flops,
          **roof}
