"""Opening a run from a program: the variables' snapshot cache of `avtext.runs` and the
lowered-program cache of `avtext.inference.exported` give what the slow paths give."""
import jax
import ml_dtypes
import numpy as np

from avtext import runs
from avtext.train import checkpointing


def _save(workdir, step, params):
  ckpt = checkpointing.Checkpointer(workdir / checkpointing.LATEST_DIR, async_save=False)
  state = {"params": params, "model_state": {}, "opt_state": {"mu": params},
           "step": np.int32(step)}
  ckpt.save(step, state, {"position": step})
  ckpt.wait()
  ckpt.close()


def _params(seed):
  rng = np.random.default_rng(seed)
  return {"dense": {"kernel": rng.normal(size=(3, 4)).astype(np.float32),
                    "bias": rng.normal(size=(4,)).astype(ml_dtypes.bfloat16)},
          "scale": np.float32(seed)}


def test_snapshot_gives_the_checkpoint_and_follows_a_rewrite(tmp_path, monkeypatch):
  monkeypatch.setenv(runs.RUN_CACHE_ENV, str(tmp_path / "cache"))
  workdir = tmp_path / "run"
  _save(workdir, 1, _params(1))
  _save(workdir, 2, _params(2))
  first, step = runs.read_variables(workdir)  # orbax, then a snapshot of step 2
  assert step == 2 and len(list((tmp_path / "cache").glob("*.npz"))) == 1

  def no_orbax(*args, **kwargs):
    raise AssertionError("the snapshot should have answered")
  with monkeypatch.context() as m:
    m.setattr(checkpointing, "restore_raw", no_orbax)
    second, step2 = runs.read_variables(workdir)
  assert step2 == 2
  for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second)):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
  assert second["params"]["dense"]["bias"].dtype == ml_dtypes.bfloat16
  assert jax.tree.structure(first) == jax.tree.structure(second)
  # Step 1 by number: its own snapshot; "best" (no best_checkpoints/ here) is not cached.
  one, _ = runs.read_variables(workdir, 1)
  np.testing.assert_array_equal(one["params"]["dense"]["kernel"],
                                _params(1)["dense"]["kernel"])
  # Step 2 written again with other values: a new key, the old snapshot is not used.
  checkpointing.Checkpointer(workdir / checkpointing.LATEST_DIR,
                             async_save=False)._manager.delete(2)
  _save(workdir, 2, _params(7))
  again, _ = runs.read_variables(workdir)
  np.testing.assert_array_equal(again["params"]["dense"]["kernel"],
                                _params(7)["dense"]["kernel"])
  monkeypatch.setenv(runs.RUN_CACHE_ENV, "off")
  off, _ = runs.read_variables(workdir)
  np.testing.assert_array_equal(off["params"]["dense"]["kernel"],
                                _params(7)["dense"]["kernel"])


_CACHED_JIT_SCRIPT = """
import json, os, sys
import jax, jax.numpy as jnp, numpy as np
from avtext.inference import exported
traced = []
def fn(params, batch):
  traced.append(1)
  h = jnp.tanh(batch["x"] @ params["w"] + params["b"])
  return {"y": h.sum(-1), "n": jnp.linalg.norm(h, axis=-1)}
rng = np.random.default_rng(0)
params = {"w": rng.normal(size=(5, 7)).astype(np.float32),
          "b": rng.normal(size=(7,)).astype(np.float32)}
batch = {"x": rng.normal(size=(int(sys.argv[1]), 5)).astype(np.float32)}
got = exported.CachedJit(fn, "fn", sys.argv[2])(params, batch)
n = len(traced)
want = jax.jit(lambda p, b: fn(p, b))(params, batch)
print(json.dumps({"traced": n, "devices": jax.device_count(),
                  "equal": all(np.array_equal(np.asarray(got[k]), np.asarray(want[k]))
                               for k in want)}))
"""


def test_cached_jit_equals_jit_and_a_second_program_loads_it(tmp_path):
  """Run as programs are, on one device: the first compiles and saves the executable,
  the next with the same function, identity and shapes loads it (no tracing) and
  gives the same bits; another identity or shape compiles its own."""
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  env = dict(os.environ, XLA_FLAGS="", AVTEXT_COMPILATION_CACHE=str(tmp_path / "jax"))

  def program(rows, identity):
    out = subprocess.run([sys.executable, "-c", _CACHED_JIT_SCRIPT, str(rows), identity],
                         env=env, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])

  first, second = program(3, "a"), program(3, "a")
  assert first == {"traced": 1, "devices": 1, "equal": True}, first
  assert second == {"traced": 0, "devices": 1, "equal": True}, second
  assert program(3, "b")["traced"] == 1 and program(2, "a")["traced"] == 1
  assert len(list((tmp_path / "jax" / "exports").glob("fn-*.executable"))) == 3
