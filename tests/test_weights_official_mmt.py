"""Official TVCaption MMT checkpoint import (avtext/weights/official_mmt.py), no torch:
a tiny avtext MMT's weights written out in the official names and layouts (.npz), imported
with `import_checkpoint`, loaded with `runs.load_run`, must give back the same weights
and the same forward; a missing or extra tensor stops the import naming it."""
import pathlib
import sys

import jax
import numpy as np
import pytest

from avtext import runs
from avtext.models import mmt
from avtext.models import model_registry
from avtext.text import vocab
from avtext import import_checkpoint as import_tool
from avtext.weights import official

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "configs"))
import mmt_tvc  # pylint: disable=g-import-not-at-top,wrong-import-position

HEADS = 2


def _vocab(path: pathlib.Path) -> pathlib.Path:
  # 7 special tokens + 10 words
  vocab.WordVocab.build(["a b c d e f g h i j"], min_count=0).save(path)
  return path


def _official_state(params, num_layers: int, smoothing: float) -> dict[str, np.ndarray]:
  """The inverse of the converter, written from the official module names (model.py)."""
  p = jax.tree.map(np.asarray, params)
  sd = {}

  def linear(name, leaf):
    sd[f"{name}.weight"], sd[f"{name}.bias"] = leaf["kernel"].T, leaf["bias"]

  def norm(name, leaf):
    sd[f"{name}.weight"], sd[f"{name}.bias"] = leaf["scale"], leaf["bias"]

  def attention(name, leaf):
    for part in ("query", "key", "value"):
      k = leaf[part]["kernel"]  # [D, H, Dh]
      sd[f"{name}.{part}.weight"] = k.reshape(k.shape[0], -1).T
      sd[f"{name}.{part}.bias"] = leaf[part]["bias"].reshape(-1)

  sd["embeddings.word_embeddings.weight"] = p["word_embeddings"]["embedding"]
  for off, ours in (("word_fc", "word_fc"), ("video_embeddings", "video_fc")):
    norm(f"embeddings.{off}.0", p[ours]["norm_in"])
    linear(f"embeddings.{off}.2", p[ours]["dense"])
    norm(f"embeddings.{off}.4", p[ours]["norm_out"])
  d = p["token_type_embeddings"]["embedding"].shape[1]
  sd["embeddings.position_embeddings.pe"] = mmt.sinusoidal_positions(50, d)
  sd["embeddings.token_type_embeddings.weight"] = p["token_type_embeddings"]["embedding"]
  norm("embeddings.LayerNorm", p["embedding_norm"])
  for i in range(num_layers):
    enc, e = f"encoder.layer.{i}", p[f"encoder_{i}"]
    attention(f"{enc}.attention.self", e["attention"])
    out = e["attention"]["out"]["kernel"]  # [H, Dh, D]
    sd[f"{enc}.attention.output.dense.weight"] = out.reshape(-1, out.shape[-1]).T
    sd[f"{enc}.attention.output.dense.bias"] = e["attention"]["out"]["bias"]
    norm(f"{enc}.attention.output.LayerNorm", e["attention_norm"])
    linear(f"{enc}.hidden_intermediate.dense", e["mlp"]["dense_in"])
    sd[f"{enc}.memory_intermediate.dense.weight"] = np.full((d, d), 7.0, np.float32)  # unused
    sd[f"{enc}.memory_intermediate.dense.bias"] = np.full((d,), 7.0, np.float32)
    linear(f"{enc}.output.dense", e["mlp"]["dense_out"])
    norm(f"{enc}.output.LayerNorm", e["mlp_norm"])
    dec, q = f"decoder.layer.{i}", p[f"decoder_{i}"]
    attention(f"{dec}.self_attention", q["attention"])
    norm(f"{dec}.norm1", q["attention_norm"])
    attention(f"{dec}.dec_enc_attention", q["cross_attention"])
    norm(f"{dec}.norm2", q["cross_attention_norm"])
    linear(f"{dec}.output.dense", q["mlp"])
    norm(f"{dec}.output.LayerNorm", q["mlp_norm"])
  linear("decoder_classifier.transform.dense", p["head_transform"])
  norm("decoder_classifier.transform.LayerNorm", p["head_norm"])
  sd["decoder_classifier.decoder.weight"] = p["head_output"]["kernel"].T
  sd["decoder_classifier.bias"] = p["head_output"]["bias"]
  v = p["head_output"]["bias"].shape[0]
  sd["loss_func.one_hot"] = np.full((1, v), smoothing / (v - 1), np.float32)
  return {k: np.ascontiguousarray(x, np.float32) for k, x in sd.items()}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """(config, params, state dict, meta, dir): the :tiny MMT (2 heads), random weights with
  LayerNorm scales and biases off 1 / 0, in the official layout."""
  root = tmp_path_factory.mktemp("mmt_import")
  config = mmt_tvc.get_config("tiny")
  config.model.vocab = str(_vocab(root / "vocab.json"))
  config.model.max_positions = 50
  model = model_registry.build_model(config.model)
  n = 6
  ids = np.ones((1, n), np.int32)
  params = model.init(jax.random.PRNGKey(0), ids, np.zeros((1, n, config.model.video_dim),
                                                            np.float32), ids, ids, ids)["params"]
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda x: np.asarray(x) + 0.1 * rng.normal(size=x.shape).astype(np.float32),
                        params)
  meta = {"model_cfg": {"hidden_size": 32, "intermediate_size": 32, "vocab_size": 17,
                        "num_attention_heads": HEADS, "num_hidden_layers": 2,
                        "layer_norm_eps": 1e-12, "label_smoothing": 0.2,
                        "share_wd_cls_weight": False, "type_vocab_size": 2},
          "opt": {"max_v_len": 8, "max_sub_len": 12, "max_cap_len": 10, "ctx_mode": "video_sub",
                  "no_norm_vfeat": True, "word2idx_path": "./cache/tvc_word2idx.json"},
          "epoch": 3}
  return config, params, _official_state(params, 2, 0.2), meta, root


def _batch(config, rng, b=3):
  v_len, s_len = 8, 12
  ids = rng.integers(7, 17, size=(b, v_len + s_len)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[0, 5:v_len] = 0  # padded video
  mask[1, v_len + 4:] = 0  # padded subtitle
  video = rng.normal(size=(b, v_len + s_len, config.model.video_dim)).astype(np.float32)
  types = np.broadcast_to(np.r_[np.zeros(v_len), np.ones(s_len)].astype(np.int32), ids.shape)
  caption = rng.integers(4, 17, size=(b, 9)).astype(np.int32)
  return ids, video, mask, np.ascontiguousarray(types), caption


@pytest.mark.slow  # `make test` budget: `make test-slow` (CI runs both)
def test_npz_round_trip_imports_evaluates_and_equals_the_direct_forward(tiny, tmp_path):
  config, params, state, meta, root = tiny
  ckpt = tmp_path / "model.npz"
  official.save_npz(ckpt, state, meta)
  (tmp_path / "tvc_word2idx.json").write_text(pathlib.Path(config.model.vocab).read_text())
  paper = mmt_tvc.get_config()  # 768 wide, 12 heads: all replaced by the checkpoint's
  paper.model.dtype = "float32"  # (the paper config computes in bfloat16)
  run_dir = import_tool.import_checkpoint("mmt", str(ckpt), str(tmp_path / "run"), paper)
  run = runs.load_run(run_dir)
  # The paper config took the checkpoint's sizes, heads, smoothing and lengths, and the
  # vocabulary beside the checkpoint (named as opt.word2idx_path names it).
  m = run.config.model
  assert (m.hidden_size, m.num_heads, m.word_dim, m.num_layers, m.vocab_size, m.video_dim) == (
      32, HEADS, 16, 2, 17, config.model.video_dim)
  assert m.decoder_layer == "official" and run.config.loss.name == "kl_sum"
  assert run.config.loss.label_smoothing == pytest.approx(0.2)
  assert m.vocab == str((tmp_path / "tvc_word2idx.json").absolute())
  assert (run.config.data.max_v_len, run.config.data.max_cap_len) == (8, 10)
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, run.params), params)
  direct = mmt.MMT(vocab_size=17, video_dim=config.model.video_dim, hidden_size=32, num_layers=2,
                   num_heads=HEADS, intermediate_size=32, word_dim=16, max_positions=50)
  batch = _batch(config, np.random.default_rng(1))
  want = direct.apply({"params": params}, *batch)
  got = run.model.apply({"params": run.params}, *batch)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  # It evaluates: the task's greedy captions from the imported run.
  task = run.task()
  ctx = dict(zip(("ctx_ids", "video", "ctx_mask", "token_type_ids"), batch[:4]))
  out = task.predict_fns()["captions"]({"params": run.params}, ctx)
  assert np.asarray(out["tokens"]).shape == (3, 9)


def test_missing_and_extra_tensors_are_named(tiny, tmp_path):
  config, _, state, meta, _ = tiny
  bad = dict(state)
  del bad["decoder.layer.1.norm2.bias"]
  bad["decoder.layer.0.output.extra"] = np.zeros(3, np.float32)
  ckpt = tmp_path / "bad.npz"
  official.save_npz(ckpt, bad, meta)
  with pytest.raises(official.ImportCheckpointError) as e:
    import_tool.import_checkpoint("mmt", str(ckpt), str(tmp_path / "run"), config=config)
  assert "'decoder.layer.1.norm2.bias' missing" in str(e.value)
  assert "decoder.layer.0.output.extra" in str(e.value)


def test_unmappable_official_settings_stop_the_import(tiny, tmp_path):
  config, _, state, meta, _ = tiny
  ckpt = tmp_path / "tied.npz"
  official.save_npz(ckpt, state, {**meta, "model_cfg": {**meta["model_cfg"],
                                                        "share_wd_cls_weight": True}})
  with pytest.raises(ValueError, match="share_wd_cls_weight=True"):
    import_tool.import_checkpoint("mmt", str(ckpt), str(tmp_path / "run"), config=config)
  ckpt = tmp_path / "novocab.npz"
  official.save_npz(ckpt, state, meta)
  with pytest.raises(ValueError, match=r"config.model.vocab is not set .* word2idx"):
    import_tool.import_checkpoint("mmt", str(ckpt), str(tmp_path / "run2"))


def test_the_default_config_is_found_from_any_working_directory(tiny, tmp_path, monkeypatch):
  _, _, state, meta, _ = tiny
  ckpt = tmp_path / "novocab.npz"
  official.save_npz(ckpt, state, meta)
  monkeypatch.chdir(tmp_path)  # configs/mmt_tvc.py is not under the working directory
  with pytest.raises(ValueError, match=r"config.model.vocab is not set .* word2idx"):
    import_tool.import_checkpoint("mmt", str(ckpt), str(tmp_path / "run"))
