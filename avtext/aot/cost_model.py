"""How long a compiled train step takes on an accelerator: the bound and the prediction.

`bound(cost, chip, model_flops)` is the global roofline of the per-device costs of a
compiled program (`hlo_cost.analyze_hlo`): three times -- compute (FLOPs / bf16 peak),
memory (HBM bytes / HBM bandwidth) and communication (interconnect bytes / ICI
bandwidth) -- and the largest of them. No step of that program can be faster, but it
takes every kernel to overlap its compute and memory traffic with every other kernel's,
which kernels running one after another on a TensorCore or a GPU do not.

`predict(cost, chip, model_flops)` adds the kernels up, each on its own:

  kernel time  = max(compute, memory[, interconnect if synchronous]) + runs x launch
  compute      = sum over its products of FLOPs / (peak x matmul_fraction x fill), where
                 fill is the matmul unit's for that product's (m, n, k)
                 (`chips.matmul_fill`: a contraction over 64 on a 128-wide MXU fills
                 half of it), + its exp / tanh / ... results / transcendentals_per_s
                 (a fused attention kernel's softmax beside its products)
  memory       = its HBM bytes / (HBM bandwidth x hbm_fraction)
  interconnect = the bytes a collective sends / ICI bandwidth; a collective XLA made
                 asynchronous overlaps the kernels around it and adds nothing to its
                 kernel's time
  async copies = a TPU's prefetches into on-chip memory and async slices (`copy-start`,
                 `slice-start`), run by its DMA engines: their bytes take the HBM
                 bandwidth the kernels leave idle (each kernel's time beyond its own
                 memory time); only what does not fit there adds to the step
  step         = max(sum of kernel times + exposed async copies, all interconnect time)

The figures come from `avtext.aot.chips`, one public set per chip, never fitted. MFU at
each is the model's FLOPs (counted once, no recomputation) over time x peak.
"""
from avtext.aot.chips import Chip
from avtext.aot.chips import matmul_fill
from avtext.aot.hlo_cost import OP_CLASSES


def bound(cost, chip: Chip, model_flops: float) -> dict:
  """The roofline of one device's program: {compute_bound_s, memory_bound_s,
  ici_bound_s, step_time_lower_bound_s, bound_by, mfu_at_bound, breakdown, largest}.

  `cost` is an `hlo_cost.HloCost`; `model_flops` the device's share of the model's
  FLOPs (no remat). Each op class's share is its own time (its FLOPs, bytes or
  interconnect bytes at the chip's rate, whichever is largest) over the bound."""
  times = {"compute": cost.flops / chip.bf16_flops,
           "HBM": cost.bytes / chip.hbm_bytes_per_s,
           "ICI": cost.comm_bytes / chip.ici_bytes_per_s}
  by = max(times, key=times.get)
  step = times[by]
  breakdown = {}
  for name, row in cost.by_class().items():
    own = max(row["flops"] / chip.bf16_flops, row["bytes"] / chip.hbm_bytes_per_s,
              row["comm_bytes"] / chip.ici_bytes_per_s)
    breakdown[name] = {"bytes": row["bytes"], "flops": row["flops"],
                       "comm_bytes": row["comm_bytes"], "kernels": row["kernels"],
                       "share_of_bound": own / step if step else 0.0}
  largest = [{"name": k.name, "op_class": k.op_class, "opcode": k.opcode, "runs": k.runs,
              "bytes": k.bytes, "flops": k.flops, "op_name": k.op_name[-160:]}
             for k in cost.largest(15)]
  return {"compute_bound_s": times["compute"], "memory_bound_s": times["HBM"],
          "ici_bound_s": times["ICI"], "step_time_lower_bound_s": step, "bound_by": by,
          "mfu_at_bound": model_flops / (step * chip.bf16_flops) if step else 0.0,
          "breakdown": breakdown, "largest": largest}


def kernel_time(k, chip: Chip) -> dict:
  """{compute_s, memory_s, comm_s, launch_s, time_s} of one kernel's runs on `chip`."""
  compute = sum(f / (chip.bf16_flops * chip.matmul_fraction * matmul_fill(chip, m, n, kk))
                for f, m, n, kk in k.dots)
  if chip.transcendentals_per_s:
    compute += k.transcendentals / chip.transcendentals_per_s
  memory = k.bytes / (chip.hbm_bytes_per_s * chip.hbm_fraction)
  comm = k.comm_bytes / chip.ici_bytes_per_s if k.comm_bytes else 0.0
  launch = k.runs * chip.launch_s
  busy = max(compute, memory, 0.0 if k.async_comm else comm)
  return {"compute_s": compute, "memory_s": memory, "comm_s": comm, "launch_s": launch,
          "time_s": busy + launch}


def predict(cost, chip: Chip, model_flops: float, top: int = 15) -> dict:
  """The step as its kernels run one after another (module docstring): {step_s, mfu,
  bound_by ("kernels" or "ICI"), kernels_s, ici_s, launches, launch_s, by_class
  {class: {time_s, share, kernels, compute_s, memory_s}}, costliest [the `top` kernels
  by predicted time]}."""
  times = [(k, kernel_time(k, chip)) for k in cost.kernels]
  copies = [t for k, t in times if k.async_copy]
  idle = sum(t["time_s"] - t["launch_s"] - t["memory_s"]
             for k, t in times if not k.async_copy)
  dma = sum(t["memory_s"] for t in copies)
  exposed = max(0.0, dma - idle)
  for t in copies:  # each async copy keeps its share of what is exposed
    t["time_s"] = t["launch_s"] + (t["memory_s"] * exposed / dma if dma else 0.0)
  total = sum(t["time_s"] for _, t in times)
  ici = sum(t["comm_s"] for _, t in times)
  step = max(total, ici)
  by_class = {c: {"time_s": 0.0, "compute_s": 0.0, "memory_s": 0.0, "kernels": 0}
              for c in OP_CLASSES}
  for k, t in times:
    row = by_class[k.op_class]
    row["time_s"] += t["time_s"]
    row["compute_s"] += t["compute_s"]
    row["memory_s"] += t["memory_s"]
    row["kernels"] += k.runs
  for row in by_class.values():
    row["share"] = row["time_s"] / total if total else 0.0
  costliest = [{"name": k.name, "op_class": k.op_class, "runs": k.runs,
                "time_s": t["time_s"], "bound_by": "compute" if t["compute_s"] >= t["memory_s"]
                else "memory", "flops": k.flops, "bytes": k.bytes,
                "fill": (sum(d[0] for d in k.dots) / sum(
                    d[0] / matmul_fill(chip, *d[1:]) for d in k.dots)) if k.dots else None,
                "op_name": k.op_name[-160:]}
               for k, t in sorted(times, key=lambda kt: -kt[1]["time_s"])[:top]]
  launches = sum(k.runs for k in cost.kernels)
  return {"step_s": step, "mfu": model_flops / (step * chip.bf16_flops) if step else 0.0,
          "bound_by": "ICI" if ici > total else "kernels", "kernels_s": total, "ici_s": ici,
          "async_copies_s": dma, "async_copies_exposed_s": exposed,
          "launches": launches, "launch_s": launches * chip.launch_s,
          "by_class": by_class, "costliest": costliest}
