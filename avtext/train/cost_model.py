"""The step-time bound of a compiled train step on an accelerator: chips and the roofline.

`bound(cost, chip, model_flops)` turns the per-device costs of a compiled program
(`hlo_cost.analyze_hlo`) into three times -- compute (FLOPs / bf16 peak), memory
(HBM bytes / HBM bandwidth) and communication (interconnect bytes / ICI bandwidth) --
and the bound, the largest of them: no step of that program can be faster, since each
resource must at least do its own work (overlap can hide the others, not shrink the
largest). MFU at the bound is the model's FLOPs (counted once, no recomputation) over
bound x peak: the best utilization the program allows; a real step is slower.

`CHIPS` holds the public per-chip figures, one home for them (`avtext.aot` and the
benchmarks read them here). Sources: Cloud TPU system-architecture pages
(cloud.google.com/tpu/docs/v4, v5e, v5p, v6e): peak dense bf16, HBM capacity and
bandwidth, "bidirectional inter-chip interconnect (ICI) bandwidth per chip"; v5e's
15.75 GiB is what its runtime leaves usable. NVIDIA H100 SXM5 datasheet: 989 TFLOP/s
dense bf16, 80 GB HBM3 at 3.35 TB/s, NVLink 4 at 900 GB/s bidirectional per GPU. The
communication term charges the bytes a device sends at half the bidirectional figure
(every collective here sends as much as it receives).
"""
import dataclasses

GIB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  hbm_gib: float  # usable HBM per chip
  bf16_flops: float  # peak dense bf16 FLOP/s per chip
  hbm_bytes_per_s: float  # HBM bandwidth per chip
  ici_bytes_per_s: float  # interconnect bandwidth a chip sends at (half the bidirectional)
  platform: str = "tpu"


CHIPS = {
    "v4": Chip("TPU v4", 32.0, 275e12, 1228e9, 300e9),
    "v5e": Chip("TPU v5 lite", 15.75, 197e12, 819e9, 200e9),
    "v5p": Chip("TPU v5p", 95.0, 459e12, 2765e9, 600e9),
    "v6e": Chip("TPU v6 lite", 31.25, 918e12, 1640e9, 400e9),
    "h100": Chip("NVIDIA H100 80GB HBM3", 80e9 / GIB, 989e12, 3350e9, 450e9, "cuda"),
}


def chip_of(topology: str) -> Chip:
  """The chip of a topology name ("v5e:4x4", "h100:1x8")."""
  kind = topology.split(":")[0].lower()
  if kind not in CHIPS:
    raise ValueError(f"topology {topology!r}: unknown chip {kind!r}; expected one of "
                     f"{sorted(CHIPS)} (e.g. v5e:4x4, v4:2x2x4, h100:1x8)")
  return CHIPS[kind]


def per_device(chip: Chip, devices_per_chip: int) -> Chip:
  """The chip's figures per JAX device: libtpu describes a v4 / v5p chip as two devices
  (its two TensorCores), each with half the chip's HBM, bandwidths and FLOP/s."""
  if devices_per_chip <= 1:
    return chip
  n = devices_per_chip
  return dataclasses.replace(
      chip, name=f"{chip.name} TensorCore ({n} per chip)", hbm_gib=chip.hbm_gib / n,
      bf16_flops=chip.bf16_flops / n, hbm_bytes_per_s=chip.hbm_bytes_per_s / n,
      ici_bytes_per_s=chip.ici_bytes_per_s / n)


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
