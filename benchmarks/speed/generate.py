r"""Greedy / beam decoding speed: avtext's jitted generate beside transformers' PyTorch GPT-2.

    make bench-venv       # .venv-bench: requirements.lock + requirements-bench.txt (torch CPU)
    .venv-bench/bin/python -m benchmarks.speed.generate [--repeats=3] [--rounds=2]

GPT-2 117M (transformers' default GPT2Config: 12 layers, width 768, 50257
tokens), random weights: the PyTorch side creates them (seed 0) and saves a
safetensors checkpoint in the hub's layout, which avtext imports
(`avtext.weights.gpt2`), so both decode the same model. Each call generates
exactly 32 new tokens after a random 16-token prompt (EOS is suppressed for
32 tokens on both sides: `min_new_tokens=32` / `min_length=32`), at batch 1
and 16, greedy and beam 4 (HF: `num_beams=4`; avtext: with and without its
greedy guard, see `generate.generate`).

- PyTorch: `GPT2LMHeadModel.generate(use_cache=True, do_sample=False)` under
  `torch.inference_mode()`, fp32, torch's default threads.
- avtext: `jax.jit` of `generate.generate` over `gpt2.lm_decoding_fns`
  (prefill + `lax.while_loop`, preallocated KV cache), compiled once per shape
  before timing.

Each side runs in its own process (no second framework's threads beside it);
processes alternate PyTorch / avtext for `--rounds` rounds, each timing
`--repeats` calls per setting after one untimed call; the median over all
timed calls is reported. A third process times the matrix products of one
decode step alone (`side_gemm`), the floor for a step. Outputs of the two sides are
compared token for token, row by row: greedy ones agree unless two logits tie within
float error; beam search ones also depend on the two searches' stopping rules
(`generate.beam_search` vs HF's) and, with the guard, on the greedy guard.
--quick: one round of one call. Rows: per setting the two times, the ratio and the rows
with PyTorch's tokens; the floor per step at batch 1 and 16.
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from absl import flags
import numpy as np

from benchmarks import common

_SIDE = flags.DEFINE_enum("side", None, ["init", "torch", "jax", "gemm"], "(child processes)")
_WORKDIR = flags.DEFINE_string("workdir", None, "(child processes) the shared checkpoint")
_REPEATS = flags.DEFINE_integer("repeats", 5, "timed calls per setting and round")
_ROUNDS = flags.DEFINE_integer("rounds", 2, "rounds of alternating processes")
SYSTEM = "VideoCC captioning"
PROMPT, NEW = 16, 32
SETTINGS = [(1, 1), (16, 1), (1, 4), (16, 4)]  # (batch, beams)


def prompts(batch: int) -> np.ndarray:
  return np.random.default_rng(batch).integers(0, 50256, (batch, PROMPT))


def side_init(workdir: pathlib.Path) -> None:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  model = transformers.GPT2LMHeadModel(transformers.GPT2Config())
  model.save_pretrained(workdir, safe_serialization=True)


def side_torch(workdir: pathlib.Path, repeats: int) -> dict:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  model = transformers.GPT2LMHeadModel.from_pretrained(workdir).eval()
  out = {"threads": torch.get_num_threads()}
  for batch, beams in SETTINGS:
    ids = torch.tensor(prompts(batch))
    kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, num_beams=beams,
              use_cache=True, pad_token_id=50256, attention_mask=torch.ones_like(ids))
    times = []
    with torch.inference_mode():
      for r in range(repeats + 1):
        t0 = time.perf_counter()
        seq = model.generate(ids, **kw)
        if r:
          times.append(time.perf_counter() - t0)
    out[f"b{batch}_k{beams}"] = {"times": times, "tokens": seq[:, PROMPT:].tolist()}
  return out


def side_jax(workdir: pathlib.Path, repeats: int) -> dict:
  import functools  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from avtext.inference import generate  # pylint: disable=g-import-not-at-top
  from avtext.models import gpt2  # pylint: disable=g-import-not-at-top
  from avtext.weights import gpt2 as gpt2_weights  # pylint: disable=g-import-not-at-top
  kwargs, params = gpt2_weights.load_hf_gpt2(workdir)
  model = gpt2.GPT2(**kwargs)
  params = jax.device_put(params)

  @functools.partial(jax.jit, static_argnums=(2, 3))
  def run(params, prompt, beams, guard):
    start, step = gpt2.lm_decoding_fns(model, params, prompt, NEW)
    return generate.generate(start, step, max_new_tokens=NEW, eos_id=50256, beam_size=beams,
                             min_length=NEW, length_penalty=1.0 if beams > 1 else 0.0,
                             guard_greedy=guard)["tokens"]
  out = {"devices": str(jax.devices())}
  for batch, beams in SETTINGS:
    for guard in ((True, False) if beams > 1 else (True,)):
      ids = jnp.asarray(prompts(batch), jnp.int32)
      t0 = time.perf_counter()
      run(params, ids, beams, guard).block_until_ready()
      compile_s = time.perf_counter() - t0
      times = []
      for _ in range(repeats):
        t0 = time.perf_counter()
        tokens = run(params, ids, beams, guard).block_until_ready()
        times.append(time.perf_counter() - t0)
      key = f"b{batch}_k{beams}" + ("" if guard or beams == 1 else "_noguard")
      out[key] = {"times": times, "first_call_s": compile_s,
                  "tokens": np.asarray(tokens).tolist()}
  return out


def side_gemm(repeats: int) -> dict:
  """The matrix products of one decode step alone (no attention, cache or softmax).

  Per layer [B, 768] x [768, 2304] (qkv), x [768, 768] (out), x [768, 3072] and
  [B, 3072] x [3072, 768] (MLP), each layer its own weights; then [B, 768] x
  [768, 50257] (tied output): the floor a decode step cannot go below on this
  machine. At batch 1 they are matrix-vector products that read 494 MB of weights
  per step, memory-bound; "shared" reuses one layer's weights for all 12 (28 MB,
  which a 32 MB L3 cache holds: an under-estimate of the floor, kept for comparison).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  shapes = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]
  layers = [[jnp.asarray(rng.standard_normal(s, np.float32) * 0.02) for s in shapes]
            for _ in range(12)]
  e = jnp.asarray(rng.standard_normal((50257, 768), np.float32) * 0.02)

  @jax.jit
  def step(x, layers, e):
    for w in layers:
      q = x @ w[0]
      x = x + q[:, :768] @ w[1]
      x = x + jax.nn.gelu(x @ w[2]) @ w[3]
    return x @ e.T
  out = {}
  for batch in (1, 16):
    x = jnp.asarray(rng.standard_normal((batch, 768), np.float32))
    for name, weights in (("", layers), ("_shared", [layers[0]] * 12)):
      step(x, weights, e).block_until_ready()
      times = []
      for _ in range(repeats * 10):
        t0 = time.perf_counter()
        step(x, weights, e).block_until_ready()
        times.append(time.perf_counter() - t0)
      flops = 2 * batch * (12 * 768 * (2304 + 768 + 2 * 3072) + 768 * 50257)
      out[f"b{batch}{name}"] = {"times": times, "gflop": flops / 1e9}
  return out


def main(argv):
  del argv
  repeats, rounds = (1, 1) if common.quick() else (_REPEATS.value, _ROUNDS.value)
  if _SIDE.value:
    workdir = pathlib.Path(_WORKDIR.value)
    if _SIDE.value == "init":
      side_init(workdir)
    elif _SIDE.value == "gemm":
      print("RESULT " + json.dumps(side_gemm(repeats)))
    else:
      fn = side_torch if _SIDE.value == "torch" else side_jax
      print("RESULT " + json.dumps(fn(workdir, repeats)))
    return

  with tempfile.TemporaryDirectory() as tmp:
    def child(side):
      res = subprocess.run(common.child(f"--side={side}", f"--workdir={tmp}",
                                        f"--repeats={repeats}"),
                           capture_output=True, text=True, check=False, cwd=common.REPO,
                           env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
      if res.returncode:
        sys.exit(f"{side} side failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
      lines = [l for l in res.stdout.splitlines() if l.startswith("RESULT ")]
      return json.loads(lines[-1][len("RESULT "):]) if lines else None

    child("init")
    gemm = child("gemm")
    runs = {"torch": [], "jax": []}
    for r in range(rounds):
      for side in ("torch", "jax"):
        print(f"round {r + 1}/{rounds}: {side}", flush=True)
        runs[side].append(child(side))
        print("  " + ", ".join(f"{key} {np.median(v['times']):.3f} s" for key, v in
                               runs[side][-1].items() if isinstance(v, dict)), flush=True)

  def median(side, key):
    return float(np.median(sum((run[key]["times"] for run in runs[side]), [])))

  table = (f"GPT-2 117M, {PROMPT}-token prompt + {NEW} new tokens, median of "
           f"{repeats * rounds} calls a side")
  print(f"\n{table}, CPU x{os.cpu_count()}")
  print(f"{'setting':<28}{'PyTorch s':>11}{'avtext s':>11}{'PyTorch tok/s':>15}"
        f"{'avtext tok/s':>14}{'ratio':>8}")
  ratios = {}
  for batch, beams in SETTINGS:
    key = f"b{batch}_k{beams}"
    t_torch = median("torch", key)
    for jkey in ([key] + ([key + "_noguard"] if beams > 1 else [])):
      t_jax = median("jax", jkey)
      label = f"batch {batch}, " + ("greedy" if beams == 1 else f"beam {beams}") + (
          ", no greedy guard" if jkey.endswith("noguard") else "")
      same = [a == b for a, b in zip(runs["jax"][0][jkey]["tokens"],
                                     runs["torch"][0][key]["tokens"])]
      print(f"{label:<28}{t_torch:11.3f}{t_jax:11.3f}{batch * NEW / t_torch:15.1f}"
            f"{batch * NEW / t_jax:14.1f}{t_torch / t_jax:7.2f}x"
            f"  rows with PyTorch's tokens: {sum(same)}/{len(same)}")
      for column, value, unit in (("PyTorch", t_torch, "s"), ("avtext", t_jax, "s"),
                                  ("ratio", t_torch / t_jax, "x"),
                                  ("rows with PyTorch's tokens", f"{sum(same)}/{len(same)}", "")):
        common.record(SYSTEM, label, value, unit=unit, table=table, column=column,
                      digits=3 if unit == "x" else 4)
      ratios[(beams, batch, jkey.endswith("noguard"))] = t_torch / t_jax
  for beams in (1, 4):
    common.record(SYSTEM, f"{'greedy' if beams == 1 else f'beam {beams}'} decoding vs "
                  "transformers' PyTorch GPT-2, batch 1 / 16",
                  f"{ratios[(beams, 1, False)]:.2f} / {ratios[(beams, 16, False)]:.2f}",
                  unit="x", headline="speed")
  for batch in (1, 16):
    t = float(np.median(gemm[f"b{batch}"]["times"]))
    shared = float(np.median(gemm[f"b{batch}_shared"]["times"]))
    print(f"floor, batch {batch}: the matrix products of one decode step alone take "
          f"{1e3 * t:.1f} ms ({gemm[f'b{batch}']['gflop']:.2f} GFLOP, "
          f"{gemm[f'b{batch}']['gflop'] / t:.0f} GFLOP/s) x {NEW} steps = {NEW * t:.3f} s "
          f"({1e3 * shared:.1f} ms with one layer's weights for all 12)")
    common.record(SYSTEM, f"floor: one decode step's matrix products alone, batch {batch}",
                  1e3 * t, unit="ms", table=table, column="a step", digits=3)


if __name__ == "__main__":
  common.main(main)
