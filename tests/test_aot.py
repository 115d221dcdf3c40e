"""`python -m avtext.aot`: a config's real train step compiled for a TPU topology on this
CPU machine (libtpu from requirements-tpu.txt describes the slice), with the compiler's
memory and cost analyses. The FLOPs are checked against a hand count of the tiny AVR
model written out below."""
import json
import pathlib
import subprocess
import sys

import pytest

from avtext.tasks import task_registry
from avtext.aot import chips
from avtext.aot import programs as aot
from avtext.aot import hlo_cost

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from benchmarks.speed import aot_layers  # pylint: disable=g-import-not-at-top,wrong-import-position
from configs import videocc_avr  # pylint: disable=g-import-not-at-top,wrong-import-position


def _layer_flops(tokens: int, width: int, mlp: int) -> int:
  """Forward FLOPs of one transformer layer: q, k, v, out and the MLP's two matmuls
  (2 FLOPs a multiply-add), plus q k^T and the weighted sum of values."""
  return 2 * tokens * (4 * width * width + 2 * width * mlp) + 2 * 2 * tokens * tokens * width


def tiny_avr_train_flops() -> int:
  """FLOPs of one train step of configs/videocc_avr.py:tiny (batch 8), by hand.

  MBT width 32, 2 layers, MLP 64; fusion from layer 1 with 2 bottleneck tokens.
  RGB: 4 frames of 32^2 in (2, 8, 8) tubelets -> 2*4*4 = 32 patches + [CLS] = 33 tokens
  (35 with the bottleneck). Audio: 2 x 32 spectrogram frames x 128 mel bins in (8, 16)
  patches -> 8*8 = 64 + [CLS] = 65 tokens (67). BERT width 32, 2 layers, MLP 64, 16
  tokens; its embeddings and layer 0 are frozen (forward only, no backward: nothing
  below them trains). Training = forward + backward ~ 3 x forward for trained parts.
  """
  mbt = (2 * 32 * (2 * 8 * 8 * 3) * 32 + 2 * 64 * (8 * 16) * 32  # patch embeddings
         + _layer_flops(33, 32, 64) + _layer_flops(35, 32, 64)  # rgb layers 0, 1
         + _layer_flops(65, 32, 64) + _layer_flops(67, 32, 64))  # audio layers 0, 1
  text_trained, text_frozen = _layer_flops(16, 32, 64), _layer_flops(16, 32, 64)
  per_example = 3 * (mbt + text_trained) + text_frozen
  return 8 * per_example


@pytest.mark.slow  # `make test` budget: `make test-slow` (CI runs both)
def test_tiny_avr_compiles_for_v5e_2x2_with_hand_counted_flops():
  out = subprocess.run(
      [sys.executable, "-m", "avtext.aot", "--config=configs/videocc_avr.py:tiny",
       "--topology=v5e:2x2", "--json"], cwd=REPO, capture_output=True, text=True,
      timeout=600, env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stderr[-3000:]
  report = json.loads(out.stdout)
  for key in ("hbm_needed_gib", "hbm_per_chip_gib", "fits", "flops_per_chip",
              "bytes_per_chip", "comm_bytes_per_chip", "step_time_lower_bound_s",
              "bound_by", "breakdown", "largest", "compile_s"):
    assert key in report, key
  assert report["chips"] == 4 and report["chip"] == "TPU v5 lite"
  assert report["hbm_per_chip_gib"] == 15.75 and report["fits"] is True
  assert 0 < report["hbm_needed_gib"] < 1
  hand = tiny_avr_train_flops()
  compiled = report["flops_per_chip"] * report["chips"]
  model = report["model_flops_per_chip"] * report["chips"]
  assert 0.5 * hand <= compiled <= 2 * hand, (compiled, hand)
  assert 0.5 * hand <= model <= 2 * hand, (model, hand)
  assert report["step_time_lower_bound_s"] == max(
      report["compute_bound_s"], report["memory_bound_s"], report["ici_bound_s"]) > 0
  terms = {"compute": "compute_bound_s", "HBM": "memory_bound_s", "ICI": "ici_bound_s"}
  assert report[terms[report["bound_by"]]] == report["step_time_lower_bound_s"]
  # The breakdown covers the whole program; replicated state: one gradient all-reduce.
  assert set(report["breakdown"]) == set(hlo_cost.OP_CLASSES)
  assert sum(b["bytes"] for b in report["breakdown"].values()) == pytest.approx(
      report["bytes_per_chip"])
  assert report["comm_bytes_per_chip"] > 0 and len(report["largest"]) == 15
  # Progress lines on stderr while it works.
  assert "compiling for v5e:2x2" in out.stderr and "aot: done" in out.stderr
  # The evaluators' predict functions compiled too, at config.eval.batch_size.
  assert set(report["predict"]) == {"embed_text", "embed_video"}
  # The predicted step: its kernels one after another, never faster than the bound; the
  # predict functions' batches predicted too.
  p = report["predicted"]
  assert p["step_s"] >= report["step_time_lower_bound_s"]
  assert sum(c["time_s"] for c in p["by_class"].values()) == pytest.approx(p["kernels_s"])
  assert p["mfu"] == pytest.approx(report["model_flops_per_chip"] / (p["step_s"] * 197e12))
  assert len(p["costliest"]) == 15 and p["launches"] == sum(
      b["kernels"] for b in report["breakdown"].values())
  assert all(v["predicted_s"] > 0 for v in report["predict"].values())


@pytest.mark.slow  # `make test` budget: `make test-slow` (CI runs both)
def test_paper_options_compile_for_tpu_and_remat_recomputes():
  """bf16 + full remat + FSDP + attention "auto" lower and compile for a real TPU slice:
  "auto" is the Pallas splash kernel there (under shard_map: its forward and fused
  backward kernels in the compiled program); remat adds recomputed FLOPs over the
  model's own."""
  config = videocc_avr.get_config("tiny")
  config.model.dtype, config.model.remat, config.model.attention = (
      "bfloat16", "full", "auto")
  config.partitioning.fsdp, config.partitioning.fsdp_min_size = True, 1
  report = aot.analyze(config, "v5e:2x2", build_task=task_registry.build_task,
                        progress=lambda m: None)
  assert report["fits"] and report["dtype"] == "bfloat16"
  assert report["flops_per_chip"] > report["model_flops_per_chip"] > 0
  kernels = report["breakdown"]["attention kernels"]
  assert kernels["kernels"] > 0 and kernels["flops"] > 0
  # FSDP: parameters gathered and gradients scattered over the interconnect.
  assert report["comm_bytes_per_chip"] > 0


def _cuda_plugin() -> bool:
  try:
    import jax_plugins.xla_cuda12  # pylint: disable=g-import-not-at-top,unused-import
    return True
  except ImportError:
    return False


@pytest.mark.skipif(not _cuda_plugin(), reason="compiling for GPUs needs the CUDA wheels "
                    "(make venv ACCEL=cuda12); the default venv has none")
def test_h100_target_compiles_with_cudnn_attention():
  """An 8-GPU H100 host described by the CUDA plugin on this CPU: "auto" attention is
  cuDNN's fused kernel in the compiled program, and the report has the H100's figures."""
  config = videocc_avr.get_config("tiny")
  config.model.dtype, config.model.remat, config.model.attention = (
      "bfloat16", "full", "auto")
  report = aot.analyze(config, "h100:1x8", build_task=task_registry.build_task,
                        progress=lambda m: None)
  assert report["chips"] == 8 and report["chip"] == "NVIDIA H100 80GB HBM3"
  assert report["fits"] and report["hbm_per_chip_gib"] == pytest.approx(74.5, abs=0.1)
  assert report["breakdown"]["attention kernels"]["kernels"] > 0
  assert report["flops_per_chip"] > report["model_flops_per_chip"] > 0
  # cuDNN's kernels pay their softmax on the special-function units, a launch per run.
  p = report["predicted"]
  assert p["by_class"]["attention kernels"]["time_s"] > 0
  assert p["step_s"] >= report["step_time_lower_bound_s"] + p["launches"] * 1e-6 * 0.999


def test_unknown_topology_and_missing_topology_are_clear_errors():
  with pytest.raises(ValueError, match="unknown chip 'v9x'"):
    chips.chip_of("v9x:2x2")
  with pytest.raises(ValueError, match="no topology"):
    aot.analyze(videocc_avr.get_config("tiny"), None, build_task=task_registry.build_task)
  with pytest.raises(ValueError, match="h100:HOSTSxGPUS"):
    aot.gpu_topology_devices("h100:8")


@pytest.mark.slow  # five small TPU compiles: ~6 min on 2 quiet cores
def test_layer_readings_match_the_unrolled_compile():
  """A 4-layer AVR (`benchmarks.speed.aot_layers.small_avr`: MBT and BERT 256 wide, 4
  layers a stack, fusion from layer 2, 257 RGB tokens, bf16, full remat) compiled for
  v5e:2x2 with every layer unrolled, and read the cost model's two other ways: the
  scanned program with each loop body weighted by its trip count, and the per-layer
  extrapolation from programs with one and two layers per stack (three compiles).
  Measured at batch 32: extrapolated/unrolled FLOPs 1.000, HBM bytes 1.009, ICI bytes
  1.000; scanned/unrolled 1.008, 1.009, 1.000. At batch 128 (`python -m
  benchmarks.speed.aot_layers`, not here) the extrapolation's bytes are 1.014x, the
  scanned program's 1.135x: it is another program (stacked parameters and gradients,
  another fusion plan), within 5 % only at this batch."""
  got = aot_layers.readings(32, "v5e:2x2")
  unrolled, scanned, extrapolated = got["unrolled"], got["scanned"], got["extrapolated"]
  assert not unrolled["scan_layers"] and scanned["scan_layers"]
  assert unrolled["unreadable_loops"] == 0 and scanned["unreadable_loops"] == 0
  # The acceptance bound: the extrapolation within 5 % of the whole unrolled program.
  for key in ("flops_per_chip", "bytes_per_chip", "comm_bytes_per_chip"):
    assert extrapolated[key] == pytest.approx(unrolled[key], rel=0.05), key
  assert [p["depths"] for p in extrapolated["programs"]] == [
      {"text": 1, "video.unimodal": 1, "video.fusion": 1},
      {"text": 1, "video.unimodal": 2, "video.fusion": 2},
      {"text": 2, "video.unimodal": 1, "video.fusion": 1}]
  # Layers add FLOPs linearly: the one- and two-layer programs' difference is a layer.
  assert extrapolated["flops_per_chip"] == pytest.approx(unrolled["flops_per_chip"], rel=0.005)
  assert extrapolated["model_flops_per_chip"] == unrolled["model_flops_per_chip"]
  # The scanned reading: XLA's own count holds about one layer per stack; trip counts
  # restore the rest.
  assert 0.9 < unrolled["flops_per_chip"] / unrolled["xla_cost_analysis"]["flops"] <= 1
  assert scanned["xla_cost_analysis"]["flops"] < 0.7 * unrolled["xla_cost_analysis"]["flops"]
  assert scanned["flops_per_chip"] == pytest.approx(unrolled["flops_per_chip"], rel=0.02)
  assert scanned["bytes_per_chip"] == pytest.approx(unrolled["bytes_per_chip"], rel=0.05)
  assert scanned["model_flops_per_chip"] == unrolled["model_flops_per_chip"]
  # The scan holds its stacked layers' parameters and their accumulated gradients beside
  # the carry: at most one more copy of the train state (the program's arguments).
  extra = scanned["hbm_needed_gib"] - unrolled["hbm_needed_gib"]
  assert extra <= unrolled["memory_gib"]["argument"], (extra, unrolled["memory_gib"])


def test_layer_stacks_split_mbt_at_its_fusion_layer_and_set_depths_unrolled():
  config = videocc_avr.get_config()
  assert aot.layer_stacks(config) == {"video.unimodal": 8, "video.fusion": 4, "text": 12}
  assert config.model.scan_layers
  small = aot.with_depths(config, {"video.unimodal": 1, "video.fusion": 2})
  v = small.model.video
  assert (v.fusion_layer, v.num_layers, small.model.text.num_layers) == (1, 3, 12)
  assert not any(node.get("scan_layers") for _, node in aot._model_nodes_with_paths(small.model))
  assert aot.layer_stacks(small) == {"video.unimodal": 1, "video.fusion": 2, "text": 12}
  # No fusion (fusion_layer >= num_layers) stays none at any depth.
  config.model.video.fusion_layer = 20
  assert aot.layer_stacks(config)["video.fusion"] == 0
  nofusion = aot.with_depths(config, {"video.unimodal": 2})
  assert (nofusion.model.video.fusion_layer, nofusion.model.video.num_layers) == (2, 2)
  assert config.model.video.num_layers == 12  # the caller's config is not changed
  with pytest.raises(ValueError, match="no layer stack \\['vision'\\]"):
    aot.with_depths(config, {"vision": 1})


def test_extrapolation_refuses_stacks_whose_layers_differ_and_configs_without_stacks():
  # configs/videocc_avr.py:tiny freezes the text tower's layer 0 of 2: its layers differ
  # in cost (no backward pass below the trained ones).
  with pytest.raises(ValueError, match="text/encoderblock_<i>"):
    aot.extrapolate(videocc_avr.get_config("tiny"), "v5e:2x2", build_task=task_registry.build_task,
                    progress=lambda m: None)
  config = videocc_avr.get_config("tiny")
  config.model.video.num_layers = config.model.text.num_layers = 1
  with pytest.raises(ValueError, match="no layer stack of 2 or more"):
    aot.extrapolate(config, "v5e:2x2", build_task=task_registry.build_task)
