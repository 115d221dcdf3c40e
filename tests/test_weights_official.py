"""The shared part of official checkpoint import (`avtext.weights.official`): reading,
the safe unpickler, and the used-once / set-once bookkeeping. The per-system round trips
are in tests/test_official_<system>.py."""
import importlib.util
import os
import pickle

import jax
import numpy as np
import pytest

from avtext.weights import official


def _checkpoint(tensors, tmp_path):
  return official.Checkpoint(tensors=tensors, meta={}, path=tmp_path / "model.chkpt")


def test_npz_round_trip_keeps_names_arrays_and_meta(tmp_path):
  tensors = {"encoder.0.weight": np.arange(6, dtype=np.float32).reshape(2, 3),
             "encoder.0.bias": np.ones(2, np.float32)}
  path = tmp_path / "state.npz"
  official.save_npz(path, tensors, {"model_cfg": {"hidden_size": 2, "ctx_mode": "video_sub"}})
  ckpt = official.read_checkpoint(path)
  assert sorted(ckpt.tensors) == sorted(tensors)
  for k, v in tensors.items():
    np.testing.assert_array_equal(ckpt.tensors[k], v)
  assert ckpt.meta == {"model_cfg": {"hidden_size": 2, "ctx_mode": "video_sub"}}


def test_bad_paths_and_formats_say_what_was_expected(tmp_path):
  with pytest.raises(FileNotFoundError, match="no such file"):
    official.read_checkpoint(tmp_path / "missing.chkpt")
  (tmp_path / "weights.h5").write_bytes(b"x")
  with pytest.raises(official.ImportCheckpointError, match="unknown checkpoint format"):
    official.read_checkpoint(tmp_path / "weights.h5")
  if importlib.util.find_spec("torch") is None:  # the default install has no torch
    (tmp_path / "model.chkpt").write_bytes(b"x")
    with pytest.raises(ImportError, match=r"pip install -e \.\[convert\]"):
      official.read_checkpoint(tmp_path / "model.chkpt")


class _Config(dict):  # an EasyDict-like class the official code pickles beside the weights
  pass


class _Exploit:
  def __reduce__(self):
    return (os.system, ("touch /tmp/avtext_unpickle_ran",))


def test_unpickler_builds_no_foreign_class_and_runs_nothing(tmp_path):
  marker = "/tmp/avtext_unpickle_ran"
  if os.path.exists(marker):
    os.remove(marker)
  cfg = _Config(hidden_size=256)
  cfg.extra = 3  # attributes too
  blob = pickle.dumps({"model_cfg": cfg, "evil": _Exploit(), "epoch": 7})
  loaded = official._torch_pickle_module().loads(blob)  # pylint: disable=protected-access
  assert dict(loaded["model_cfg"]) == {"hidden_size": 256, "extra": 3}
  assert type(loaded["model_cfg"]).__module__.startswith("official.")
  assert loaded["epoch"] == 7
  assert not os.path.exists(marker), "os.system ran while unpickling"


def test_split_state_dict_finds_the_model_entry(tmp_path):
  w = np.zeros((2, 2), np.float32)
  tensors, meta = official.split_state_dict({"model": {"a.weight": w}, "epoch": 3}, tmp_path)
  assert list(tensors) == ["a.weight"] and meta == {"epoch": 3}
  with pytest.raises(official.ImportCheckpointError, match="no state dict found"):
    official.split_state_dict({"epoch": 3}, tmp_path)


def test_porter_sets_every_leaf_once_and_names_every_problem(tmp_path):
  abstract = {"params": {"dense": {"kernel": jax.ShapeDtypeStruct((3, 2), np.float32),
                                   "bias": jax.ShapeDtypeStruct((2,), np.float32)}}}
  w = np.arange(6, dtype=np.float32).reshape(2, 3)  # torch layout [out, in]
  good = {"fc.weight": w, "fc.bias": np.array([1, 2], np.float32)}
  porter = official.Porter(_checkpoint(good, tmp_path), abstract)
  porter.copy("fc.weight", "params/dense/kernel", official.linear_kernel)
  porter.copy("fc.bias", "params/dense/bias")
  out = porter.finish()
  np.testing.assert_array_equal(out["params"]["dense"]["kernel"], w.T)
  np.testing.assert_array_equal(out["params"]["dense"]["bias"], [1, 2])

  bad = {**good, "fc.extra": np.zeros(1, np.float32)}
  porter = official.Porter(_checkpoint(bad, tmp_path), abstract)
  porter.copy("fc.weight", "params/dense/kernel")  # not transposed: shape (2, 3) vs (3, 2)
  porter.copy("fc.missing", "params/dense/bias")
  with pytest.raises(official.ImportCheckpointError) as e:
    porter.finish()
  text = str(e.value)
  for piece in ("'fc.missing' missing", "'fc.extra'", "'fc.bias'", "params/dense/kernel",
                "shape (3, 2), got (2, 3)", "model.chkpt"):
    assert piece in text, (piece, text)


def test_porter_refuses_a_leaf_set_twice_and_an_unknown_leaf(tmp_path):
  abstract = {"params": {"b": jax.ShapeDtypeStruct((2,), np.float32)}}
  porter = official.Porter(_checkpoint({"x": np.ones(2, np.float32),
                                        "y": np.ones(2, np.float32)}, tmp_path), abstract)
  porter.copy("x", "params/b")
  porter.copy("y", "params/b")
  with pytest.raises(official.ImportCheckpointError, match="set twice"):
    porter.finish()
  porter = official.Porter(_checkpoint({"x": np.ones(2, np.float32)}, tmp_path), abstract)
  porter.copy("x", "params/c")
  with pytest.raises(official.ImportCheckpointError, match="'params/c' does not exist"):
    porter.finish()


def test_head_layouts_match_a_torch_linear():
  rng = np.random.default_rng(0)
  w, b, x = rng.standard_normal((6, 4)), rng.standard_normal(6), rng.standard_normal((5, 4))
  torch_out = x @ w.T + b  # torch Linear
  heads = np.einsum("ld,dhk->lhk", x, official.heads_in(w, 3)) + official.heads_bias(b, 3)
  np.testing.assert_allclose(heads.reshape(5, 6), torch_out)
  w_out = rng.standard_normal((4, 6))
  np.testing.assert_allclose(np.einsum("lhk,hko->lo", heads, official.heads_out(w_out, 3)),
                             torch_out @ w_out.T)


def test_cli_stops_with_one_line_naming_the_file(tmp_path):
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  missing = tmp_path / "model.ckpt"
  proc = subprocess.run(
      [sys.executable, "-m", "avtext.import_checkpoint", "--system=xml",
       f"--checkpoint={missing}", f"--out={tmp_path / 'run'}"],
      capture_output=True, text=True, check=False, timeout=120)
  assert proc.returncode == 2, proc.stderr
  assert proc.stderr.strip().splitlines()[-1] == (
      f"error: --checkpoint={missing}: no such file")
  assert not (tmp_path / "run").exists()
