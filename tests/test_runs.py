"""Opening a run from a program: the variables' snapshot cache of `avtext.runs` and the
lowered-program cache of `avtext.inference.exported` give what the slow paths give."""
import ml_dtypes
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from avtext import runs
from avtext.inference import exported
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


def test_cached_jit_equals_jit_and_reuses_its_export(tmp_path, monkeypatch):
  monkeypatch.setenv("AVTEXT_COMPILATION_CACHE", str(tmp_path / "jax"))

  def fn(params, batch):
    h = jnp.tanh(batch["x"] @ params["w"] + params["b"])
    return {"y": h.sum(-1), "n": jnp.linalg.norm(h, axis=-1)}

  rng = np.random.default_rng(0)
  params = {"w": rng.normal(size=(5, 7)).astype(np.float32),
            "b": rng.normal(size=(7,)).astype(np.float32)}
  batch = {"x": rng.normal(size=(3, 5)).astype(np.float32)}
  want = jax.jit(fn)(params, batch)
  got = exported.CachedJit(fn, "fn", "identity-a")(params, batch)
  for k in want:
    np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]))
  files = list((tmp_path / "jax" / "exports").glob("fn-*.jaxexport"))
  assert len(files) == 1

  from jax import export  # pylint: disable=g-import-not-at-top
  with monkeypatch.context() as m:  # a new program: deserialized, not traced again
    m.setattr(export, "export", lambda *a, **k: pytest.fail("traced again"))
    again = exported.CachedJit(fn, "fn", "identity-a")(params, batch)
  np.testing.assert_array_equal(np.asarray(again["y"]), np.asarray(want["y"]))
  # Another identity, other shapes: other entries.
  exported.CachedJit(fn, "fn", "identity-b")(params, batch)
  exported.CachedJit(fn, "fn", "identity-a")(params, {"x": batch["x"][:2]})
  assert len(list((tmp_path / "jax" / "exports").glob("fn-*.jaxexport"))) == 3
  monkeypatch.setenv("AVTEXT_COMPILATION_CACHE", "off")
  off = exported.CachedJit(fn, "fn", "identity-a")(params, batch)
  np.testing.assert_array_equal(np.asarray(off["n"]), np.asarray(want["n"]))
