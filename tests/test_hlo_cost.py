"""`avtext.aot.hlo_cost`: bytes, FLOPs and interconnect bytes read from optimized HLO,
checked against hand counts of a hand-written module and against a program whose
FLOPs are known exactly; `cost_model.bound` against its definition."""
import jax
import jax.numpy as jnp
import pytest

from avtext.aot import chips
from avtext.aot import cost_model
from avtext.aot import hlo_cost
from avtext.aot import hlo_text

# A scanned layer as the TPU compiler writes it: a 12-trip while loop whose body slices
# the layer's weights out of a stack kept in HBM and multiplies an activation held in
# on-chip memory (S(1)) by them; an all-gather over 4 devices; a copy in HBM.
MODULE = """\
HloModule jit_step, entry_computation_layout={(f32[16,128]{1,0})->f32[16,128]{1,0}}

%fused_slice (p0: bf16[12,128,64], p1: s32[]) -> bf16[1,128,64] {
  %p0 = bf16[12,128,64]{2,1,0:T(8,128)(2,1)} parameter(0)
  %p1 = s32[]{:T(128)} parameter(1)
  %zero = s32[]{:T(128)} constant(0)
  ROOT %ds = bf16[1,128,64]{2,1,0:T(8,128)(2,1)} dynamic-slice(%p0, %p1, %zero, %zero), dynamic_slice_sizes={1,128,64}
}

%fused_dot (a: bf16[16,128], w: bf16[1,128,64]) -> bf16[16,64] {
  %a = bf16[16,128]{1,0:T(8,128)(2,1)S(1)} parameter(0)
  %w = bf16[1,128,64]{2,1,0:T(8,128)(2,1)} parameter(1)
  %b = bf16[128,64]{1,0:T(8,128)(2,1)} bitcast(%w)
  ROOT %d = bf16[16,64]{1,0:T(8,128)(2,1)} convolution(%a, %b), dim_labels=bf_io->bf
}

%body (t: (s32[], bf16[16,128], bf16[12,128,64])) -> (s32[], bf16[16,128], bf16[12,128,64]) {
  %t = (s32[]{:T(128)}, bf16[16,128]{1,0:T(8,128)(2,1)S(1)}, bf16[12,128,64]{2,1,0:T(8,128)(2,1)}) parameter(0)
  %i = s32[]{:T(128)} get-tuple-element(%t), index=0
  %x = bf16[16,128]{1,0:T(8,128)(2,1)S(1)} get-tuple-element(%t), index=1
  %ws = bf16[12,128,64]{2,1,0:T(8,128)(2,1)} get-tuple-element(%t), index=2
  %w = bf16[1,128,64]{2,1,0:T(8,128)(2,1)} fusion(%ws, %i), kind=kLoop, calls=%fused_slice
  %y = bf16[16,64]{1,0:T(8,128)(2,1)} fusion(%x, %w), kind=kOutput, calls=%fused_dot, metadata={op_name="jit(step)/jvp(Model)/layer/dot_general"}
  %one = s32[]{:T(128)} constant(1)
  %next = s32[]{:T(128)} add(%i, %one)
  ROOT %out = (s32[]{:T(128)}, bf16[16,128]{1,0:T(8,128)(2,1)S(1)}, bf16[12,128,64]{2,1,0:T(8,128)(2,1)}) tuple(%next, %x, %ws)
}

%cond (t: (s32[], bf16[16,128], bf16[12,128,64])) -> pred[] {
  %t = (s32[]{:T(128)}, bf16[16,128]{1,0:T(8,128)(2,1)S(1)}, bf16[12,128,64]{2,1,0:T(8,128)(2,1)}) parameter(0)
  %i = s32[]{:T(128)} get-tuple-element(%t), index=0
  %n = s32[]{:T(128)} constant(12)
  ROOT %lt = pred[]{:T(512)} compare(%i, %n), direction=LT
}

ENTRY %main (x: bf16[16,128], ws: bf16[12,128,64], g: f32[4,256]) -> f32[16,1024] {
  %x = bf16[16,128]{1,0:T(8,128)(2,1)S(1)} parameter(0)
  %ws = bf16[12,128,64]{2,1,0:T(8,128)(2,1)} parameter(1)
  %g = f32[4,256]{1,0:T(8,128)} parameter(2)
  %zero = s32[]{:T(128)} constant(0)
  %init = (s32[]{:T(128)}, bf16[16,128]{1,0:T(8,128)(2,1)S(1)}, bf16[12,128,64]{2,1,0:T(8,128)(2,1)}) tuple(%zero, %x, %ws)
  %loop = (s32[]{:T(128)}, bf16[16,128]{1,0:T(8,128)(2,1)S(1)}, bf16[12,128,64]{2,1,0:T(8,128)(2,1)}) while(%init), condition=%cond, body=%body
  %ag = f32[16,256]{1,0:T(8,128)} all-gather(%g), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}
  ROOT %c = f32[16,256]{1,0:T(8,128)} copy(%ag)
}
"""


def test_hand_written_module_costs_by_hand():
  cost = hlo_cost.analyze_hlo(MODULE, num_devices=4)
  assert cost.unreadable_loops == 0
  by_name = {k.name: k for k in cost.kernels}
  # 12 runs of the slice fusion: it reads one [128, 64] slice of the stack (64 wide, so
  # padded to 128 lanes by T(8,128)) and writes it, 2 x 128 x 128 x 2 bytes, and reads
  # the s32 counter (4 bytes).
  w = by_name["w"]
  assert w.runs == 12 and w.bytes == 12 * (2 * 128 * 128 * 2 + 4)
  assert w.op_class == "copies/transposes"
  # The product: the activation is on chip (no HBM bytes), the weights slice is read
  # (128 x 128 padded bf16) and the [16, 64] output written (16 x 128 padded).
  y = by_name["y"]
  assert y.op_class == "matmul/conv"
  assert y.bytes == 12 * (128 * 128 * 2 + 16 * 128 * 2)
  assert y.flops == 12 * 2 * 16 * 128 * 64
  assert cost.flops == 12 * 2 * 16 * 128 * 64
  # The all-gather: each of 4 devices receives the 3 shards it lacks, 3/4 of 16 x 256 f32,
  # and reads its f32[4,256] shard (padded to 8 rows) and writes the whole output.
  ag = by_name["ag"]
  assert ag.op_class == "collectives"
  assert ag.comm_bytes == 16 * 256 * 4 * 3 / 4 == cost.comm_bytes
  assert ag.bytes == 8 * 256 * 4 + 16 * 256 * 4
  assert by_name["c"].bytes == 2 * 16 * 256 * 4
  # The loop's scalar work: the counter's add and the condition's compare, 12 runs each.
  assert by_name["next"].bytes == 12 * 3 * 4 and by_name["lt"].bytes == 12 * (4 + 4 + 1)
  assert cost.bytes == w.bytes + y.bytes + ag.bytes + by_name["c"].bytes + \
      by_name["next"].bytes + by_name["lt"].bytes
  # Counting on-chip operands too (XLA's cost analysis does) adds the activation reads.
  everything = hlo_cost.analyze_hlo(MODULE, num_devices=4, all_spaces=True)
  assert everything.bytes == cost.bytes + 12 * 16 * 128 * 2


def test_tiling_pads_the_minor_dimensions():
  [a] = hlo_text.parse_shape("bf16[3,100,64]{2,1,0:T(8,128)(2,1)}")
  assert a.nbytes(tiled=False) == 3 * 100 * 64 * 2
  assert a.nbytes() == 3 * 104 * 128 * 2
  [b] = hlo_text.parse_shape("f32[64,100]{0,1:T(8,128)}")  # dim 0 is the minor one
  assert b.nbytes() == 128 * 104 * 4
  [c] = hlo_text.parse_shape("f32[5,7]{1,0}")  # no tiling (CPU, GPU)
  assert c.nbytes() == 5 * 7 * 4 and c.memory_space == 0


def test_scanned_matmuls_counted_once_per_trip_on_a_real_program():
  """A jitted scan of 7 matmuls compiled here: XLA's own count sees the loop body once,
  the walk sees 7 runs, the exact FLOPs of the program."""
  m, k, n, steps = 32, 48, 48, 7

  def f(x, ws):
    return jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)[0]

  compiled = jax.jit(f).lower(jnp.ones((m, k)), jnp.ones((steps, k, n))).compile()
  cost = hlo_cost.analyze_hlo(compiled.as_text())
  assert cost.unreadable_loops == 0
  assert cost.flops == steps * 2 * m * k * n
  xla = compiled.cost_analysis()
  xla = xla[0] if isinstance(xla, (list, tuple)) else xla
  assert cost.flops > 3 * xla["flops"]  # XLA counted the body once


def test_bound_takes_the_largest_term_and_names_it():
  cost = hlo_cost.analyze_hlo(MODULE, num_devices=4)
  chip = chips.Chip("test chip", 16.0, bf16_flops=1e9, hbm_bytes_per_s=1e9,
                         ici_bytes_per_s=1e6)
  r = cost_model.bound(cost, chip, model_flops=cost.flops / 2)
  assert r["bound_by"] == "ICI"
  assert r["step_time_lower_bound_s"] == pytest.approx(cost.comm_bytes / 1e6)
  assert r["mfu_at_bound"] == pytest.approx(cost.flops / 2 / (r["step_time_lower_bound_s"] * 1e9))
  assert r["breakdown"]["collectives"]["share_of_bound"] == pytest.approx(1.0)
  assert sum(b["bytes"] for b in r["breakdown"].values()) == pytest.approx(cost.bytes)
  assert [k["name"] for k in r["largest"]][0] == max(cost.kernels, key=lambda k: k.bytes).name


def test_chip_table_and_per_device_split():
  assert chips.chip_of("v5e:4x4").ici_bytes_per_s == 200e9
  with pytest.raises(ValueError, match="unknown chip 'v9x'"):
    chips.chip_of("v9x:2x2")
  half = chips.per_device(chips.CHIPS["v4"], 2)
  assert half.hbm_gib == 16.0 and half.bf16_flops == 137.5e12


FLASH = """\
HloModule jit_attention

ENTRY %main (q: bf16[2,4,1280,128], k: bf16[2,4,1280,128], v: bf16[2,4,1280,128], sq: s32[2,1280,128], sk: s32[2,8,1280]) -> bf16[2,4,1280,128] {
  %q = bf16[2,4,1280,128]{3,2,1,0:T(8,128)(2,1)} parameter(0)
  %k = bf16[2,4,1280,128]{3,2,1,0:T(8,128)(2,1)} parameter(1)
  %v = bf16[2,4,1280,128]{3,2,1,0:T(8,128)(2,1)} parameter(2)
  %sq = s32[2,1280,128]{2,1,0:T(8,128)} parameter(3)
  %sk = s32[2,8,1280]{2,1,0:T(8,128)} parameter(4)
  ROOT %flash_attention.3 = bf16[2,4,1280,128]{3,2,1,0:T(8,128)(2,1)} custom-call(%q, %k, %v, %sq, %sk), custom_call_target="tpu_custom_call", metadata={op_name="jit(f)/flash_fwd_block_q=640/jit(flash_attention)/pallas_call"}
}
"""


def test_flash_kernel_rereads_the_streamed_side_per_block():
  """The forward flash kernel reads K, V and their segment ids once per 640-row block
  of queries (1280 / 640 = 2 reads), Q and its segment ids once, writes O once; its
  FLOPs are 2 products of 2 x 4 x 1280 x 1280 x 128 multiply-adds."""
  cost = hlo_cost.analyze_hlo(FLASH)
  [kernel] = cost.kernels
  assert kernel.op_class == "attention kernels"
  qkvo = 2 * 4 * 1280 * 128 * 2
  once = qkvo + 2 * 1280 * 128 * 4 + qkvo  # q, its segment ids, o
  assert kernel.bytes == once + 2 * (2 * qkvo + 2 * 8 * 1280 * 4)
  assert kernel.flops == 2 * 2 * (2 * 4 * 1280 * 1280 * 128)
  # Without the scope the kernel's default 128-row blocks: 10 reads of K and V.
  default = hlo_cost.analyze_hlo(FLASH.replace("flash_fwd_block_q=640/", ""))
  assert default.bytes == once + 10 * (2 * qkvo + 2 * 8 * 1280 * 4)
  # Called through avtext's residual-naming wrapper: the custom call is named by the
  # block-size scope and no jit(flash_attention) scope is left; the same reads.
  wrapped = hlo_cost.analyze_hlo(FLASH.replace("%flash_attention.3", "%flash_fwd_block_q_640")
                                 .replace("jit(flash_attention)/", ""))
  assert wrapped.kernels[0].bytes == kernel.bytes and wrapped.flops == kernel.flops


@pytest.mark.slow  # two TPU compiles: ~1 min beside the other tests
def test_scan_and_python_loop_of_the_same_layers_on_a_tpu():
  """8 layers of tanh(x @ w) over stacked weights, with their gradient, compiled for a
  v5e once as a `lax.scan` and once as a Python loop (no while loop: XLA's own count is
  whole there). FLOPs: both exactly 8 x 3 products of 2 m d d (XLA's count of the loop
  within 0.2 %; of the scan, one trip). Bytes: the walk over every memory space is within
  15 % of XLA's count of the loop (measured 89 %: XLA charges some operands it slices
  whole); the scan moves more HBM bytes than the loop (measured +20 %: its loop-carried
  copies and stacked-gradient updates), less than twice."""
  import os  # pylint: disable=g-import-not-at-top
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  device = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices[0]
  sharding = jax.sharding.SingleDeviceSharding(device)
  n, m, d = 8, 8192, 2048

  def layer(c, w):
    return jnp.tanh(c @ w).astype(c.dtype)

  def scanned(x, ws):
    return jnp.sum(jax.lax.scan(lambda c, w: (layer(c, w), None), x, ws)[0].astype(
        jnp.float32))

  def looped(x, ws):
    for i in range(n):
      x = layer(x, ws[i])
    return jnp.sum(x.astype(jnp.float32))
  args = (jax.ShapeDtypeStruct((m, d), jnp.bfloat16, sharding=sharding),
          jax.ShapeDtypeStruct((n, d, d), jnp.bfloat16, sharding=sharding))
  costs = {}
  for f in (looped, scanned):
    compiled = jax.jit(jax.grad(f, argnums=(0, 1))).lower(*args).compile()
    xla = compiled.cost_analysis()
    xla = xla[0] if isinstance(xla, (list, tuple)) else xla
    costs[f.__name__] = (hlo_cost.analyze_hlo(compiled.as_text()),
                         hlo_cost.analyze_hlo(compiled.as_text(), all_spaces=True), xla)
  flops = n * 3 * 2 * m * d * d
  (loop, loop_all, loop_xla), (scan, _, scan_xla) = costs["looped"], costs["scanned"]
  assert loop.flops == scan.flops == flops and scan.unreadable_loops == 0
  assert abs(loop_xla["flops"] / flops - 1) < 2e-3 and scan_xla["flops"] < flops / 4
  assert abs(loop_all.bytes / loop_xla["bytes accessed"] - 1) < 0.15
  assert loop.bytes <= scan.bytes < 2 * loop.bytes


# The splash kernels as the TPU compiler writes them (vmapped over a batch of 2, 2 heads,
# 1,280 queries and keys, head dim 64): the mask's scalar-prefetched tables first, then
# q, k, v, the segment ids; the fused backward kernel also writes dQ's partial sums per
# key block (5-d). Their xprof metadata holds newlines, and a continuation line starts
# with "}" without closing the computation.
SPLASH = """\
HloModule jit_attention

ENTRY %main (t0: s8[1,1,1], t1: s8[1,1,1], q: bf16[2,2,1280,64], k: bf16[2,2,1280,64], v: bf16[2,2,1280,64], sq: s32[2,1280,128], sk: s32[2,8,1280], lse: f32[2,2,8,1280], do: bf16[2,2,1280,64], di: f32[2,2,8,1280]) -> bf16[2,2,1280,64] {
  %t0 = s8[1,1,1]{2,1,0} parameter(0)
  %t1 = s8[1,1,1]{2,1,0} parameter(1)
  %q = bf16[2,2,1280,64]{3,2,1,0:T(8,128)(2,1)} parameter(2)
  %k = bf16[2,2,1280,64]{3,2,1,0:T(8,128)(2,1)} parameter(3)
  %v = bf16[2,2,1280,64]{3,2,1,0:T(8,128)(2,1)} parameter(4)
  %sq = s32[2,1280,128]{2,1,0:T(8,128)} parameter(5)
  %sk = s32[2,8,1280]{2,1,0:T(8,128)} parameter(6)
  %lse = f32[2,2,8,1280]{3,2,1,0:T(8,128)} parameter(7)
  %do = bf16[2,2,1280,64]{3,2,1,0:T(8,128)(2,1)} parameter(8)
  %di = f32[2,2,8,1280]{3,2,1,0:T(8,128)} parameter(9)
  %splash_mha_fwd_segmented_residuals.1 = (bf16[2,2,1280,64]{3,2,1,0:T(8,128)(2,1)}, f32[2,2,1280,128]{3,2,1,0:T(8,128)}) custom-call(%t0, %t1, %q, %k, %v, %sq, %sk), custom_call_target="tpu_custom_call", frontend_attributes={kernel_metadata={"xprof_metadata":"{\\"block_q\\": 640, \\"block_kv\\": 640,
\\"block_q_dkv\\": 640, \\"block_kv_dkv\\": 640
}"}}, metadata={op_name="jit(f)/splash_mha_fwd_segmented_residuals/pallas_call"}
  %splash_mha_dkv_segmented_no_residuals.1 = (bf16[2,2,2,1280,64]{4,3,2,1,0:T(8,128)(2,1)}, bf16[2,2,1280,64]{3,2,1,0:T(8,128)(2,1)}, bf16[2,2,1280,64]{3,2,1,0:T(8,128)(2,1)}) custom-call(%t0, %t1, %q, %k, %v, %sk, %sq, %lse, %do, %di), custom_call_target="tpu_custom_call", frontend_attributes={kernel_metadata={"xprof_metadata":"{\\"block_q\\": 640, \\"block_kv\\": 640,
\\"block_q_dkv\\": 640, \\"block_kv_dkv\\": 640
}"}}, metadata={op_name="jit(f)/splash_mha_dkv_segmented_no_residuals/pallas_call"}
  ROOT %o = bf16[2,2,1280,64]{3,2,1,0:T(8,128)(2,1)} get-tuple-element(%splash_mha_fwd_segmented_residuals.1), index=0
}
"""


def test_splash_kernels_products_and_streamed_operands():
  """Both calls are read (the "}"-led continuation line does not end the module): the
  forward's 2 products and the fused backward's 5 over 2 x 2 x 1280 x 1280 scores of
  head dim 64, one exp a score each; the forward reads K, V and the key segment ids once
  per 640-row query block (2 blocks), the backward Q, the query segment ids, the
  log-sum-exp, dO and di once per 640-key block."""
  cost = hlo_cost.analyze_hlo(SPLASH)
  fwd, bwd = cost.kernels
  scores = 2 * 2 * 1280 * 1280
  assert fwd.op_class == bwd.op_class == "attention kernels"
  assert fwd.flops == 2 * 2 * scores * 64 and bwd.flops == 5 * 2 * scores * 64
  assert fwd.transcendentals == bwd.transcendentals == scores
  assert fwd.dots == ((fwd.flops, 1280, 64, 1280),)
  qkv = 2 * 2 * 1280 * 128 * 2  # bf16, head dim 64 padded to 128 lanes
  sq, sk, lse = 2 * 1280 * 128 * 4, 2 * 8 * 1280 * 4, 2 * 2 * 8 * 1280 * 4
  tables = 2  # two s8[1,1,1] tables (no tiled layout in this text)
  assert fwd.bytes == tables + qkv + 2 * (2 * qkv + sk) + sq + (qkv + 2 * 2 * 1280 * 128 * 4)
  assert bwd.bytes == tables + 2 * qkv + sk + 2 * (qkv + sq + 2 * lse + qkv) + (
      2 * qkv + 2 * qkv)
