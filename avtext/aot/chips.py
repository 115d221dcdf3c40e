"""The accelerators a config is compiled for: one set of public figures per chip, one home.

Every figure the cost model (`avtext.aot.cost_model`) uses lives here, with its source.
None is fitted to a config or to a measurement: `benchmarks.speed.paper_step_predicted`
checks the model against measured steps with exactly these.

Roofline figures (all chips): peak dense bf16 FLOP/s, usable HBM, HBM bandwidth, and the
interconnect bandwidth a chip sends at (half the bidirectional per-chip figure: every
collective here sends as much as it receives).
  TPU v4, v5e, v5p, v6e: the Cloud TPU system-architecture pages
    (cloud.google.com/tpu/docs/v4, v5e, v5p, v6e): "peak compute per chip (bf16)", "HBM
    capacity / bandwidth", "bidirectional inter-chip interconnect (ICI) bandwidth per
    chip"; v5e's 15.75 GiB is what its runtime leaves usable.
  H100 SXM5: NVIDIA's H100 datasheet: 989 TFLOP/s dense bf16, 80 GB HBM3 at 3.35 TB/s,
    NVLink 4 at 900 GB/s bidirectional per GPU, 132 SMs (boost clock 1.98 GHz), 50 MB L2;
    `H100_TARGET` describes the same chip to XLA's GPU compiler.

Per-kernel figures:
  matmul_tile      (M, N, K): the granularity of the matmul unit. A product's rows,
                   output columns and contraction are padded up to multiples of these;
                   the unit's fill for a dot is the product of the three ratios.
                   TPU: each TensorCore's MXUs are 128 x 128 systolic arrays (v4, v5e,
                   v5p: "four MXUs" per TensorCore, system-architecture pages), 256 x 256
                   on v6e (Trillium's MXU, cloud.google.com/tpu/docs/v6e); weights
                   fill the K x N array, rows stream through it in groups of 8
                   (a vreg's 8 sublanes x 128 lanes, the Pallas TPU block-shape rule).
                   H100: Hopper's warpgroup MMA, `wgmma.mma_async.m64nNk16` for bf16
                   with N a multiple of 8 (PTX ISA, "Asynchronous Warpgroup Level
                   Matrix Multiply-Accumulate"): M in 64s, N in 8s, K in 16s.
  matmul_fraction  of peak a tensor-core kernel reaches at full fill. H100: 0.75, the
                   best published Hopper kernel, FlashAttention-3 (Shah et al. 2024,
                   arXiv:2407.08608): 740 of 989 TFLOP/s in bf16. TPU: 1.0 (no public
                   figure; the MXU streams at its peak once filled).
  hbm_fraction     of the datasheet bandwidth a streaming kernel reaches. H100: 0.84,
                   2.8 of 3.35 TB/s measured for coalesced loads with Nsight Compute
                   (mikamirai.com/blog/gpu-memory-bandwidth, "realistic bandwidth
                   ceilings"). TPU: 1.0 (no public figure).
  transcendentals_per_s
                   exp / log / tanh results per second, for kernels whose softmax runs
                   beside their matmuls (the fused attention kernels) and fusions that
                   compute them. H100: the special-function units, 16 results per clock
                   per SM for compute capability 9.0 (CUDA C++ Programming Guide,
                   "Arithmetic Instructions" throughput table) x 132 SMs x 1.83 GHz
                   (the clock of the 989 TFLOP/s figure) = 3.9e12/s, the figure
                   FlashAttention-3 s3.1 quotes; with head dim 64 an attention score's
                   exp takes as long as its 4 x 64 matmul FLOPs. TPU: 0 (not charged;
                   no public figure for the EUP).
  launch_s         fixed cost of each kernel run. H100: 1 us, back-to-back launches of
                   a 2.9 us kernel take 3.8 us each (NVIDIA Technical Blog, "Getting
                   Started with CUDA Graphs"). TPU: 0 (one program, no host launch).
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
  matmul_tile: tuple[int, int, int] = (8, 128, 128)  # (M, N, K) granularity
  matmul_fraction: float = 1.0  # of peak at full fill
  hbm_fraction: float = 1.0  # of the HBM bandwidth a streaming kernel reaches
  transcendentals_per_s: float = 0.0  # 0: not charged
  launch_s: float = 0.0  # per kernel run


H100_SMS = 132

CHIPS = {
    "v4": Chip("TPU v4", 32.0, 275e12, 1228e9, 300e9),
    "v5e": Chip("TPU v5 lite", 15.75, 197e12, 819e9, 200e9),
    "v5p": Chip("TPU v5p", 95.0, 459e12, 2765e9, 600e9),
    "v6e": Chip("TPU v6 lite", 31.25, 918e12, 1640e9, 400e9, matmul_tile=(8, 256, 256)),
    "h100": Chip("NVIDIA H100 80GB HBM3", 80e9 / GIB, 989e12, 3350e9, 450e9, "cuda",
                 matmul_tile=(64, 8, 16), matmul_fraction=0.75, hbm_fraction=0.84,
                 transcendentals_per_s=16 * H100_SMS * 1.83e9, launch_s=1e-6),
}


# The H100 SXM5 as XLA's GPU compiler models it (a `stream_executor.GpuTargetConfigProto`
# text, what `avtext.aot.programs.gpu_topology_devices` hands the CUDA plugin): the
# figures of `CHIPS["h100"]` (HBM, its bandwidth, the SMs) beside the boost clock, the L2
# and compute capability 9.0 of the datasheet and the CUDA limits of that architecture.
H100_TARGET = f"""gpu_device_info {{
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: {H100_SMS}
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: {int(CHIPS["h100"].hbm_bytes_per_s)}
  l2_cache_size: 52428800 clock_rate_ghz: 1.98
  device_memory_size: {round(CHIPS["h100"].hbm_gib * GIB)}
  shared_memory_per_block_optin: 232448 cuda_compute_capability {{ major: 9 }}
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
}}
platform_name: "CUDA"
device_description_str: "{CHIPS["h100"].name}"
"""


def chip_of(topology: str) -> Chip:
  """The chip of a topology name ("v5e:4x4", "h100:1x8")."""
  kind = topology.split(":")[0].lower()
  if kind not in CHIPS:
    raise ValueError(f"topology {topology!r}: unknown chip {kind!r}; expected one of "
                     f"{sorted(CHIPS)} (e.g. v5e:4x4, v4:2x2x4, h100:1x8)")
  return CHIPS[kind]


def per_device(chip: Chip, devices_per_chip: int) -> Chip:
  """The chip's figures per JAX device: libtpu describes a v4 / v5p chip as two devices
  (its two TensorCores), each with half the chip's HBM, bandwidths and FLOP/s (the
  per-kernel figures are the TensorCore's own and stay)."""
  if devices_per_chip <= 1:
    return chip
  n = devices_per_chip
  return dataclasses.replace(
      chip, name=f"{chip.name} TensorCore ({n} per chip)", hbm_gib=chip.hbm_gib / n,
      bf16_flops=chip.bf16_flops / n, hbm_bytes_per_s=chip.hbm_bytes_per_s / n,
      ici_bytes_per_s=chip.ici_bytes_per_s / n,
      transcendentals_per_s=chip.transcendentals_per_s / n)


def fill(size: int, tile: int) -> float:
  """The share of a unit `tile` wide that a dimension of `size` keeps busy: size over
  size rounded up to a multiple of tile (64 on a 128-wide unit: 0.5)."""
  if size <= 0 or tile <= 1:
    return 1.0
  return size / (-(-size // tile) * tile)


def matmul_fill(chip: Chip, m: int, n: int, k: int) -> float:
  """The matmul unit's fill for a product of m rows, n output columns, k contracted."""
  tm, tn, tk = chip.matmul_tile
  return fill(m, tm) * fill(n, tn) * fill(k, tk)
