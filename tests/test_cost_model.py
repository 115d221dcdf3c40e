"""`avtext.aot.cost_model.predict`: a step as its kernels run one after another, each at
its own limit, checked by hand on hand-written HLO; and the chip table's per-kernel
figures against the arithmetic their sources give."""
import pytest

from avtext.aot import chips
from avtext.aot import cost_model
from avtext.aot import hlo_cost

# Two products of the same rows and columns, one contracting over 64 and one over 128; an
# elementwise fusion over 4 MiB arrays, run 3 times by a loop; an asynchronous all-reduce
# (start / done) and a synchronous one, over 4 devices.
MODULE = """\
HloModule jit_step

%dot64 (a: bf16[256,64], w: bf16[64,128]) -> bf16[256,128] {
  %a = bf16[256,64]{1,0} parameter(0)
  %w = bf16[64,128]{1,0} parameter(1)
  ROOT %d = bf16[256,128]{1,0} dot(%a, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%dot128 (a: bf16[256,128], w: bf16[128,128]) -> bf16[256,128] {
  %a = bf16[256,128]{1,0} parameter(0)
  %w = bf16[128,128]{1,0} parameter(1)
  ROOT %d = bf16[256,128]{1,0} dot(%a, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%add (x: f32[1024,1024], y: f32[1024,1024]) -> f32[1024,1024] {
  %x = f32[1024,1024]{1,0} parameter(0)
  %y = f32[1024,1024]{1,0} parameter(1)
  ROOT %s = f32[1024,1024]{1,0} add(%x, %y)
}

%sum (p: f32[], q: f32[]) -> f32[] {
  %p = f32[] parameter(0)
  %q = f32[] parameter(1)
  ROOT %r = f32[] add(%p, %q)
}

%body (t: (s32[], f32[1024,1024])) -> (s32[], f32[1024,1024]) {
  %t = (s32[], f32[1024,1024]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[1024,1024]{1,0} get-tuple-element(%t), index=1
  %e = f32[1024,1024]{1,0} fusion(%x, %x), kind=kLoop, calls=%add
  ROOT %out = (s32[], f32[1024,1024]{1,0}) tuple(%i, %e)
}

%cond (t: (s32[], f32[1024,1024])) -> pred[] {
  %t = (s32[], f32[1024,1024]{1,0}) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main (a: bf16[256,64], w: bf16[64,128], b: bf16[256,128], v: bf16[128,128], x: f32[1024,1024], g: f32[1024], h: f32[1024]) -> f32[1024] {
  %a = bf16[256,64]{1,0} parameter(0)
  %w = bf16[64,128]{1,0} parameter(1)
  %b = bf16[256,128]{1,0} parameter(2)
  %v = bf16[128,128]{1,0} parameter(3)
  %x = f32[1024,1024]{1,0} parameter(4)
  %g = f32[1024]{0} parameter(5)
  %h = f32[1024]{0} parameter(6)
  %d64 = bf16[256,128]{1,0} fusion(%a, %w), kind=kOutput, calls=%dot64
  %d128 = bf16[256,128]{1,0} fusion(%b, %v), kind=kOutput, calls=%dot128
  %zero = s32[] constant(0)
  %init = (s32[], f32[1024,1024]{1,0}) tuple(%zero, %x)
  %loop = (s32[], f32[1024,1024]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  %ars = f32[1024]{0} all-reduce-start(%g), channel_id=1, replica_groups={{0,1,2,3}}, to_apply=%sum
  %ard = f32[1024]{0} all-reduce-done(%ars)
  ROOT %ar = f32[1024]{0} all-reduce(%h), channel_id=2, replica_groups={{0,1,2,3}}, to_apply=%sum
}
"""

# A 128 x 128 unit, 1 TFLOP/s, 100 GB/s of HBM, 1 GB/s of interconnect, 1 us a launch.
CHIP = chips.Chip("test chip", 16.0, bf16_flops=1e12, hbm_bytes_per_s=1e11,
                  ici_bytes_per_s=1e9, matmul_tile=(8, 128, 128), launch_s=1e-6)


def _times(chip=CHIP):
  cost = hlo_cost.analyze_hlo(MODULE, num_devices=4)
  return cost, {k.name: cost_model.kernel_time(k, chip) for k in cost.kernels}


def test_a_contraction_over_64_half_fills_a_128_wide_unit():
  cost, t = _times()
  kernels = {k.name: k for k in cost.kernels}
  assert kernels["d64"].dots == ((2.0 * 256 * 128 * 64, 256, 128, 64),)
  assert chips.matmul_fill(CHIP, 256, 128, 64) == 0.5
  # Half the FLOPs of the 128-deep product, at half fill: the same time.
  assert t["d64"]["compute_s"] == pytest.approx(2 * 256 * 128 * 64 / (1e12 * 0.5))
  assert t["d128"]["compute_s"] == pytest.approx(2 * 256 * 128 * 128 / 1e12)
  assert t["d64"]["compute_s"] == pytest.approx(t["d128"]["compute_s"])
  # Both compute-bound: their bytes take less (operands and output, bf16, at 100 GB/s).
  assert t["d64"]["memory_s"] == pytest.approx((256 * 64 + 64 * 128 + 256 * 128) * 2 / 1e11)
  assert t["d64"]["time_s"] == pytest.approx(t["d64"]["compute_s"] + 1e-6)
  # A 256-wide unit (v6e's) is filled a quarter by the 64-deep contraction.
  assert chips.matmul_fill(chips.CHIPS["v6e"], 256, 128, 64) == pytest.approx(0.125)


def test_a_memory_bound_fusion_costs_its_bytes_and_a_launch_per_run():
  _, t = _times()
  # 3 runs of x + x: read x twice (the fusion's two operands) and write the sum, f32.
  nbytes = 3 * 3 * 1024 * 1024 * 4
  assert t["e"]["compute_s"] == 0.0
  assert t["e"]["memory_s"] == pytest.approx(nbytes / 1e11)
  assert t["e"]["launch_s"] == pytest.approx(3e-6)
  assert t["e"]["time_s"] == pytest.approx(nbytes / 1e11 + 3e-6)
  # The chip's achievable fraction of its bandwidth stretches it.
  slower = chips.dataclasses.replace(CHIP, hbm_fraction=0.5)
  assert _times(slower)[1]["e"]["memory_s"] == pytest.approx(2 * nbytes / 1e11)


def test_an_async_collective_is_hidden_and_a_synchronous_one_is_not():
  cost, t = _times()
  kernels = {k.name: k for k in cost.kernels}
  sent = 2 * 1024 * 4 * 3 / 4  # a ring all-reduce over 4 devices
  assert kernels["ars"].async_comm and not kernels["ar"].async_comm
  assert kernels["ars"].comm_bytes == kernels["ar"].comm_bytes == sent
  assert t["ars"]["comm_s"] == t["ar"]["comm_s"] == pytest.approx(sent / 1e9)
  assert t["ars"]["time_s"] == pytest.approx(t["ars"]["memory_s"] + 1e-6)  # hidden
  assert t["ar"]["time_s"] == pytest.approx(sent / 1e9 + 1e-6)  # waited for


def test_the_step_is_the_sum_of_its_kernels_and_mfu_follows():
  cost, t = _times()
  p = cost_model.predict(cost, CHIP, model_flops=1e6)
  total = sum(v["time_s"] for v in t.values())
  assert p["step_s"] == pytest.approx(total) and p["bound_by"] == "kernels"
  assert p["launches"] == 2 + 3 + 2 and p["launch_s"] == pytest.approx(7e-6)
  assert p["mfu"] == pytest.approx(1e6 / (total * 1e12))
  assert sum(c["time_s"] for c in p["by_class"].values()) == pytest.approx(total)
  assert p["by_class"]["matmul/conv"]["time_s"] == pytest.approx(
      t["d64"]["time_s"] + t["d128"]["time_s"])
  assert [k["name"] for k in p["costliest"]][0] == "e"
  assert {k["name"]: k["fill"] for k in p["costliest"]}["d64"] == pytest.approx(0.5)
  # The global bound of the same program is never slower than the prediction.
  assert cost_model.bound(cost, CHIP, 1e6)["step_time_lower_bound_s"] <= p["step_s"]
  # An interconnect slower than all the kernels together binds the step.
  slow = chips.dataclasses.replace(CHIP, ici_bytes_per_s=1e3)
  q = cost_model.predict(cost, slow, model_flops=1e6)
  assert q["bound_by"] == "ICI" and q["step_s"] == pytest.approx(2 * 6144 / 1e3)


def test_an_async_copy_takes_the_bandwidth_the_kernels_leave_idle():
  """A TPU prefetch (`copy-start` of 4 MiB into on-chip memory, S(1)) beside a
  compute-bound product: its bytes move while the product computes; only what does not
  fit in the product's idle HBM time adds to the step."""
  dot128 = MODULE[MODULE.index("%dot128"):MODULE.index("%add")]  # MODULE's product
  text = "HloModule jit_prefetch\n\n" + dot128 + """ENTRY %main (b: bf16[256,128], v: bf16[128,128], c: f32[1024,1024]) -> (bf16[256,128], f32[1024,1024]) {
  %b = bf16[256,128]{1,0} parameter(0)
  %v = bf16[128,128]{1,0} parameter(1)
  %c = f32[1024,1024]{1,0} parameter(2)
  %cs = (f32[1024,1024]{1,0:S(1)}, f32[1024,1024]{1,0}, u32[]{:S(2)}) copy-start(%c)
  %d128 = bf16[256,128]{1,0} fusion(%b, %v), kind=kOutput, calls=%dot128
  %cd = f32[1024,1024]{1,0:S(1)} copy-done(%cs)
  ROOT %t = (bf16[256,128]{1,0}, f32[1024,1024]{1,0:S(1)}) tuple(%d128, %cd)
}
"""
  cost = hlo_cost.analyze_hlo(text)
  kernels = {k.name: k for k in cost.kernels}
  assert kernels["cs"].async_copy and not kernels["d128"].async_copy
  assert kernels["cs"].bytes == 1024 * 1024 * 4  # read from HBM once, into VMEM
  copy_s = 1024 * 1024 * 4 / 1e11
  dot = cost_model.kernel_time(kernels["d128"], CHIP)
  idle = dot["compute_s"] - dot["memory_s"]  # the product's HBM-idle time
  p = cost_model.predict(cost, CHIP, model_flops=0.0)
  assert p["async_copies_s"] == pytest.approx(copy_s)
  assert p["async_copies_exposed_s"] == pytest.approx(copy_s - idle)
  assert p["step_s"] == pytest.approx(dot["time_s"] + copy_s - idle + 1e-6)
  # A product 100 times slower hides the whole copy: the step is the product's (and
  # the copy's launch).
  slow = chips.dataclasses.replace(CHIP, bf16_flops=1e10)
  q = cost_model.predict(cost, slow, model_flops=0.0)
  assert q["async_copies_exposed_s"] == 0.0
  assert q["step_s"] == pytest.approx(
      cost_model.kernel_time(kernels["d128"], slow)["time_s"] + 1e-6)


def test_attention_kernels_pay_their_softmax_on_the_special_function_units():
  """cuDNN's fused forward attention, [B, L, H, d] = [2, 256, 4, 64]: 2 products of
  B H L L d multiply-adds, one exp per score; on the H100's figures the exps take as
  long as the products at their peak (4 x 64 FLOPs a score at 989 TFLOP/s against one
  exp at 3.9e12 a second)."""
  text = """\
HloModule jit_f

ENTRY %main (q: bf16[2,256,4,64], k: bf16[2,256,4,64], v: bf16[2,256,4,64]) -> bf16[2,256,4,64] {
  %q = bf16[2,256,4,64]{3,2,1,0} parameter(0)
  %k = bf16[2,256,4,64]{3,2,1,0} parameter(1)
  %v = bf16[2,256,4,64]{3,2,1,0} parameter(2)
  %fmha = (bf16[2,256,4,64]{3,2,1,0}, u8[0]{0}) custom-call(%q, %k, %v), custom_call_target="__cudnn$fmhaSoftmax", backend_config={"cudnn_fmha_backend_config":{"intermediate_tensor_shape":{"element_type":"BF16","dimensions":["2","4","256","256"]}}}
  ROOT %o = bf16[2,256,4,64]{3,2,1,0} get-tuple-element(%fmha), index=0
}
"""
  [kernel] = hlo_cost.analyze_hlo(text).kernels
  scores = 2 * 4 * 256 * 256
  assert kernel.op_class == "attention kernels"
  assert kernel.flops == 2 * 2 * scores * 64 and kernel.transcendentals == scores
  assert kernel.dots == ((kernel.flops, 256, 64, 256),)
  h100 = chips.CHIPS["h100"]
  t = cost_model.kernel_time(kernel, h100)
  matmul = kernel.flops / (h100.bf16_flops * h100.matmul_fraction)
  assert h100.transcendentals_per_s == pytest.approx(3.865e12, rel=1e-3)
  assert t["compute_s"] == pytest.approx(matmul + scores / h100.transcendentals_per_s)
  assert scores / h100.transcendentals_per_s == pytest.approx(
      4 * 64 * scores / h100.bf16_flops, rel=0.01)


def test_per_kernel_figures_follow_their_sources():
  h100, v5e = chips.CHIPS["h100"], chips.CHIPS["v5e"]
  # The 989 TFLOP/s of the datasheet are 132 SMs x 4096 dense bf16 FLOPs a clock at
  # 1.83 GHz; the special-function units give 16 results a clock per SM at that clock.
  assert 132 * 4096 * 1.83e9 == pytest.approx(h100.bf16_flops, rel=1e-3)
  assert h100.matmul_fraction == pytest.approx(740 / 989, abs=0.01)
  assert h100.hbm_fraction == pytest.approx(2.8 / 3.35, abs=0.01)
  assert v5e.matmul_tile == (8, 128, 128) and chips.CHIPS["v6e"].matmul_tile[1:] == (256, 256)
  assert chips.fill(64, 128) == 0.5 and chips.fill(200, 128) == pytest.approx(200 / 256)
  # A v4 TensorCore is half a chip; its unit and fractions stay the core's own.
  half = chips.per_device(chips.CHIPS["v4"], 2)
  assert half.bf16_flops == 137.5e12 and half.matmul_tile == (8, 128, 128)


def test_plan_counts_the_schedule_at_the_predicted_step():
  """configs/videocc_avr.py trains 4 epochs at global batch 256 and evaluates MSR-VTT
  every 5,000 steps and at the end: with 10.3 M clips an epoch (VideoCC's size), a
  predicted step of 0.5 s and 2 ms a batch of 64 for each embedding function."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from avtext.aot import report as report_lib  # pylint: disable=g-import-not-at-top
  from configs import videocc_avr  # pylint: disable=g-import-not-at-top
  config = videocc_avr.get_config()
  fake = {"topology": "v5e:4x4", "chips": 16, "predicted": {"step_s": 0.5},
          "predict": {"embed_text": {"batch": 64, "predicted_s": 0.002},
                      "embed_video": {"batch": 64, "predicted_s": 0.002}}}
  p = report_lib.plan(fake, config, examples=10_300_000, eval_examples=1000)
  per_epoch = 10_300_000 // 256  # 40,234
  steps = 4 * per_epoch
  assert p["steps_per_epoch"] == per_epoch and p["steps"] == steps
  assert p["train_s"] == pytest.approx(steps * 0.5)
  msrvtt = p["evals"]["msrvtt"]
  assert msrvtt["passes"] == steps // 5000 + 1  # 32 periodic + the last step
  assert msrvtt["pass_s"] == pytest.approx(2 * 16 * 0.002)  # ceil(1000 / 64) batches, 2 fns
  assert p["total_s"] == pytest.approx(steps * 0.5 + msrvtt["passes"] * 2 * 16 * 0.002)
  assert p["chip_hours"] == pytest.approx(p["total_s"] * 16 / 3600)
  assert "chip-hours" in report_lib.format_plan(p)
  # An epoch-counted config without a dataset size says what to pass.
  with pytest.raises(ValueError, match="--examples=N"):
    report_lib.plan(fake, config)
  # A step-counted one needs none; evaluations it cannot time are counted only.
  steps_config = ml_collections.ConfigDict(config.to_dict())
  steps_config.train.num_steps, steps_config.train.num_epochs = 12_000, None
  q = report_lib.plan(fake, steps_config)
  assert q["steps"] == 12_000 and q["evals"]["msrvtt"]["passes"] == 3
  assert q["eval_s"] is None and "training only" in report_lib.format_plan(q)
