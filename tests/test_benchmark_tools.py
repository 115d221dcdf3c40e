"""The benchmarks' shared helpers (benchmarks/common/: HLO counts, config overrides), on
known facts, and a script's own flag checks as a user meets them."""
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from benchmarks import common
from benchmarks.common import hlo as hlo_lib

REPO = pathlib.Path(__file__).resolve().parents[1]


def _hlo(fn, *args) -> str:
  return jax.jit(fn).lower(*args).compile().as_text()


def test_traffic_counts_an_elementwise_kernels_operand_and_result_bytes():
  # exp(x) * 2 over f32[256, 64]: one fused kernel reading 64 KiB and writing 64 KiB.
  x = jnp.ones((256, 64), jnp.float32)
  assert hlo_lib.hlo_traffic(_hlo(lambda v: jnp.exp(v) * 2, x)) == (2 * 256 * 64 * 4, 1)
  # Two results of one input (a multi-output kernel or two kernels): 64 KiB of bfloat16
  # in, at least the two 32/64 KiB results out, the input read at least once.
  y = jnp.ones((256, 128), jnp.bfloat16)
  moved, kernels = hlo_lib.hlo_traffic(
      _hlo(lambda v: (v.astype(jnp.float32) * 3, v * 2), y))
  assert kernels >= 1 and moved >= 64 * 1024 + 128 * 1024 + 64 * 1024


def test_traffic_leaves_products_out_and_dots_are_counted_with_their_flops():
  a, b = jnp.ones((64, 32), jnp.float32), jnp.ones((32, 16), jnp.float32)
  hlo = _hlo(lambda u, v: u @ v, a, b)
  assert hlo_lib.hlo_traffic(hlo) == (0, 0)
  (key, count), = hlo_lib.hlo_dots(hlo).items()
  assert count == 1 and key[1:3] == ((64, 32), (32, 16))
  assert hlo_lib.dot_flops(*key[1:]) == 2 * 64 * 32 * 16


def test_traffic_refuses_loops():
  x = jnp.ones((8,), jnp.float32)
  hlo = _hlo(lambda v: jax.lax.fori_loop(0, jnp.int32(v[0]), lambda i, s: s * 2, v), x)
  with pytest.raises(ValueError, match="loop"):
    hlo_lib.hlo_traffic(hlo)


def test_config_overrides_set_fields_and_name_unknown_ones():
  config = common.load_config(
      "configs/videocc_avr.py",
      ("train.batch_size=3", "model.video.init_from_vit.path=", "model.remat=none",
       "model.scan_layers=False"))
  assert config.train.batch_size == 3
  assert config.model.video.init_from_vit.path == ""
  assert config.model.remat == "none" and config.model.scan_layers is False
  assert common.load_config("configs/videocc_avr.py:demo").train.num_steps == 300
  with pytest.raises(KeyError, match="model.nope"):
    common.load_config("configs/videocc_avr.py", ("model.nope=1",))
  with pytest.raises(ValueError, match="dotted.key=value"):
    common.load_config("configs/videocc_avr.py", ("train.batch_size",))


def _aot_scenic(*args):
  # Flags are checked before anything heavy is imported: a process costs well under a second.
  return subprocess.run([sys.executable, "-m", "benchmarks.speed.aot_scenic", *args],
                        cwd=REPO, capture_output=True, text=True, timeout=300)


def test_aot_scenic_refuses_a_directory_without_scenic_and_unknown_sides(tmp_path):
  proc = _aot_scenic(f"--scenic_dir={tmp_path}")
  assert proc.returncode != 0 and "scenic/projects/mbt/model.py" in proc.stderr, proc.stderr
  model = tmp_path / "scenic" / "projects" / "mbt" / "model.py"
  model.parent.mkdir(parents=True)
  model.write_text("")
  proc = _aot_scenic(f"--scenic_dir={tmp_path}", "--sides=scenic,flax")
  assert proc.returncode != 0 and "subset of scenic,avtext" in proc.stderr, proc.stderr


def test_buffer_assignment_bytes_sums_the_allocations():
  text = ("BufferAssignment:\nallocation 0: size 512, thread-local:\n value: <28 select.9 @0>\n"
          "allocation 1: size 2564096, parameter 0, shape |f32[16,40000]|\n"
          "allocation 2: size 4096, constant:\n")
  assert hlo_lib.buffer_assignment_bytes(text) == 512 + 2564096 + 4096
