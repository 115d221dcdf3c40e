"""COOT task and hierarchical evaluator: packing, metrics by hand, a tiny end-to-end run."""
import numpy as np
import pytest

from avtext import experiment
from avtext.evals import hierarchical


def _at(degrees, scale=1.0):
  r = np.radians(np.asarray(degrees, np.float64))
  return scale * np.stack([np.cos(r), np.sin(r)], axis=1)


def test_hierarchical_metrics_by_hand():
  """Unit vectors at known angles: similarities are cos(angle differences).

  videos at 0, 90, 180 deg; paragraphs at 10, 175, 200 deg (pair i = row i).
  v2p ranks: v0 -> p0 first (cos 10); v1: p0 (cos 80) beats p1 (cos 85) -> 2;
  v2: p1 (cos 5) beats p2 (cos 20) -> 2.  p2v ranks: p0 -> 1; p1: v2 (cos 5)
  beats v1 (cos 85) -> 2; p2 -> v2 first (cos 20) -> 1.
  Norms must not matter (the evaluator normalises), so rows are scaled.
  """
  video = _at([0, 90, 180]) * np.array([[1.0], [3.0], [0.5]])
  paragraph = _at([10, 175, 200]) * np.array([[2.0], [1.0], [7.0]])
  r = hierarchical.hierarchical_results(video, paragraph, video, paragraph, ks=(1, 2, 50))
  assert r["v2p_R@1"] == pytest.approx(100 / 3)
  assert r["v2p_R@2"] == pytest.approx(100.0)
  assert r["v2p_MdR"] == 2.0  # COOT: floor(median of 1, 2, 2)
  assert r["v2p_MnR"] == pytest.approx(5 / 3)
  assert r["p2v_R@1"] == pytest.approx(200 / 3)
  assert r["p2v_MdR"] == 1.0
  assert r["p2v_MnR"] == pytest.approx(4 / 3)
  assert r["vp_R@1_mean"] == pytest.approx(50.0)
  assert r["vp_chance_r1"] == pytest.approx(100 / 3)
  assert r["c2s_R@1"] == r["v2p_R@1"] and r["num_clips"] == 3


def write_tiny_dataset(path, *, num_train=24, num_val=8, video_dim=16, text_dim=24, seed=0):
  """A small COOT-layout dataset: each segment's frames and sentence share a random code."""
  from avtext.data import coot_files
  rng = np.random.default_rng(seed)
  meta, videos, texts, lengths = {}, {}, {}, {}
  project_v = rng.normal(size=(8, video_dim))
  project_t = rng.normal(size=(8, text_dim))
  for i in range(num_train + num_val):
    key = f"v{i:03d}"
    n = int(rng.integers(2, 5))
    frames_per = rng.integers(3, 7, size=n)
    codes = rng.normal(size=(n, 8))
    videos[key] = np.concatenate([np.repeat(c[None] @ project_v, f, 0) for c, f in
                                  zip(codes, frames_per)]) + 0.1 * rng.normal(
                                      size=(int(frames_per.sum()), video_dim))
    sent_len = rng.integers(2, 5, size=n)
    texts[key] = np.concatenate([np.repeat(c[None] @ project_t, m, 0) for c, m in
                                 zip(codes, sent_len)])
    lengths[key] = [int(m) for m in sent_len]
    edges = np.concatenate([[0], np.cumsum(frames_per)]).astype(float)  # 1 frame per second
    meta[key] = {"data_key": key, "split": "train" if i < num_train else "val",
                 "duration_sec": float(edges[-1]),
                 "segments": [{"start_sec": edges[k], "stop_sec": edges[k + 1] - 1,
                               "text": f"sentence {k}"} for k in range(n)]}
  coot_files.write_meta(path, meta)
  coot_files.write_video_features_h5(path, "tiny_video", videos)
  coot_files.write_text_features(path, "tiny_text", texts, lengths)
  return meta, videos


def tiny_config(path, config_file="configs/coot_activitynet.py"):
  from avtext.tasks import task_registry  # noqa: F401  (registers tasks on lookup)
  import importlib.util
  spec = importlib.util.spec_from_file_location("coot_cfg", config_file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config("tiny")
  config.dataset.path = str(path)
  config.dataset.video_features, config.dataset.text_features = "tiny_video", "tiny_text"
  config.dataset.expand_segments = 2
  return config


def test_dataset_segments_follow_the_official_rule(tmp_path):
  from avtext.data import builders
  meta, videos = write_tiny_dataset(tmp_path)
  config = tiny_config(tmp_path)
  source = builders.get_source(config.dataset, "train")
  item = source[0]
  key = item["id"]
  fps = len(videos[key]) / meta[key]["duration_sec"]  # 1 frame per second
  for (start, num), seg in zip(item["segments"], meta[key]["segments"]):
    stop = min(int(np.ceil(fps * seg["stop_sec"])) + 1, len(videos[key]))  # add_stop_frame 1
    assert start == int(np.floor(fps * seg["start_sec"])) and num == stop - start
  np.testing.assert_allclose(item["video"], videos[key], rtol=1e-6)
  with pytest.raises(ValueError, match="no videos in split 'val_1'"):
    builders.get_source(config.dataset, "val_1")
  config.dataset.path = str(tmp_path / "nowhere")
  with pytest.raises(FileNotFoundError, match="meta_all.json not found"):
    builders.get_source(config.dataset, "train")


def test_collate_packs_clips_into_slots(tmp_path):
  from avtext.tasks import task_registry
  write_tiny_dataset(tmp_path)
  config = tiny_config(tmp_path)
  config.data.pad_multiple, config.data.clip_pad_multiple = 8, 32
  config.data.pack_sequences = False  # the padded layout (packing: the test below)
  task = task_registry.build_task(config)
  ex = [{"video": np.ones((5, 2)), "clip_frames": np.arange(12.0).reshape(6, 2),
         "clip_lengths": np.array([2, 4]), "paragraph": np.ones((3, 1)),
         "sentence_lengths": np.array([1, 2])},
        {"video": np.ones((9, 2)), "clip_frames": np.ones((3, 2)), "clip_lengths": np.array([3]),
         "paragraph": np.ones((4, 1)), "sentence_lengths": np.array([4])}]
  batch = task.collate(ex)
  n = config.model.max_clips
  np.testing.assert_array_equal(batch["clip_slot"][:4], [0, 1, n, -1])
  assert batch["clips"].shape == (32, 8, 2) and batch["video"].shape == (2, 16, 2)
  np.testing.assert_array_equal(batch["clips_mask"].sum(1)[:4], [2, 4, 3, 0])
  np.testing.assert_array_equal(batch["sentences_mask"].sum(1)[:4], [1, 2, 4, 0])
  np.testing.assert_array_equal(batch["clips"][1, :4], np.arange(4.0, 12.0).reshape(4, 2))

  # static_shapes: every batch is the task's largest batch (batch_spec), one program a run;
  # the real rows and masks are those of the dynamic batch.
  config.data.static_shapes = True
  config.model.video_dim, config.model.text_dim = 2, 1
  static = task.collate(ex)
  spec = task.batch_spec(2, train=True)
  assert {k: v.shape for k, v in static.items()} == {k: v.shape for k, v in spec.items()}
  for key in ("clips_mask", "sentences_mask", "video_mask", "paragraph_mask", "clip_slot"):
    width = batch[key].shape[1] if batch[key].ndim > 1 else None
    rows = batch[key].shape[0]
    np.testing.assert_array_equal(static[key][:rows, :width] if width else static[key][:rows],
                                  batch[key])
  config.data.pack_sequences = True  # packed: one row per sequence at most, same spec
  packed = task.collate(ex)
  spec = task.batch_spec(2, train=True)
  assert {k: v.shape for k, v in packed.items()} == {k: v.shape for k, v in spec.items()}


@pytest.mark.slow  # `make test` budget: `make test-slow` (CI runs both)
def test_packed_sequences_give_the_unpacked_embeddings_loss_and_gradients(tmp_path):
  """data.pack_sequences packs clips / sentences / videos / paragraphs several to a row
  (segment-masked attention, positions restarting per sequence, pooling per sequence):
  an exact reformulation, so the eval-mode embeddings, loss and gradients equal the
  unpacked ones on the same batch."""
  import jax
  from avtext.data import array_store
  from avtext.tasks import task_registry
  config = tiny_config(tmp_path)
  config.data.max_frames = 12
  rng = np.random.default_rng(0)
  examples = []
  for _ in range(6):
    n = int(rng.integers(1, 5))
    clips = rng.integers(1, 13, n)
    sentences = rng.integers(1, 7, n)
    examples.append({
        "video": rng.normal(size=(int(rng.integers(3, 13)), 16)).astype(np.float32),
        "clip_frames": rng.normal(size=(int(clips.sum()), 16)).astype(np.float32),
        "clip_lengths": clips, "sentence_lengths": sentences,
        "paragraph": rng.normal(size=(int(sentences.sum()), 24)).astype(np.float32)})
  task = task_registry.build_task(config)
  config.data.pack_sequences = False
  plain = task.collate(examples)
  config.data.pack_sequences = True  # the configs' default
  packed = task.collate(examples)
  assert len(packed["clips"]) < len(plain["clips"])  # fewer rows computed
  for key in ("clips", "sentences", "video", "paragraph"):
    unpacked = packed[key].reshape((-1,) + packed[key].shape[2:])[packed[f"{key}_unpack"]]
    real = plain[f"{key}_mask"]
    np.testing.assert_array_equal(packed[f"{key}_unpack"] >= 0, real)
    np.testing.assert_array_equal(unpacked[real], plain[key][real])
  with pytest.raises(ValueError, match="need 2 rows"):
    array_store.pack(np.ones((2, 4)), np.ones((2, 4), bool), rows=1)

  variables = task.init_variables(jax.random.PRNGKey(0), plain)
  embed = task.predict_fns()["embed"]
  want, got = embed(variables, plain), embed(variables, packed)
  for name in want:
    np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)

  def loss(params, batch):
    video, text = task._encode({"params": params}, batch, train=False)  # pylint: disable=protected-access
    return task.loss(video, text, jax.random.PRNGKey(1))[0]
  value_and_grad = jax.jit(jax.value_and_grad(loss))  # op by op it takes minutes
  want_loss, want_grad = value_and_grad(variables["params"], plain)
  got_loss, got_grad = value_and_grad(variables["params"], packed)
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got_grad),
                          jax.tree.leaves(want_grad)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("config_file", [  # both behind -m slow: default-run budget
    pytest.param("configs/coot_activitynet.py", marks=pytest.mark.slow),
    pytest.param("configs/coot_youcook2.py", marks=pytest.mark.slow)])
def test_tiny_run_trains_evaluates_and_exports(tmp_path, config_file):
  import h5py
  import jax
  from avtext.tasks import task_registry
  write_tiny_dataset(tmp_path / "data")
  config = tiny_config(tmp_path / "data", config_file)
  task = task_registry.build_task(config)
  trainer = experiment.build(config, tmp_path / "run", task=task)
  trainer.train()
  import json
  results = json.loads((tmp_path / "run" / "results.json").read_text())
  last = results["latest"]
  assert last["step"] == 6 and 0 <= last["val/v2p_R@1"] <= 100
  assert last["val/num_videos"] == 8 and last["val/vp_chance_r1"] == pytest.approx(12.5)
  with h5py.File(tmp_path / "run" / "embeddings" / "embeddings_6.h5") as h5:
    # concat(mean over clips, Contextual Transformer output): 2 x hidden.
    assert h5["vid_emb"].shape == (8, 2 * config.model.hidden_size)
    num_clips = int(np.sum(h5["clip_num"][:]))
    assert h5["clip_emb"].shape[0] == num_clips == last["val/num_clips"]
    # The exported embeddings reproduce the reported metric.
    from avtext.evals import hierarchical
    again = hierarchical.hierarchical_results(h5["vid_emb_before_norm"][:], h5["par_emb"][:],
                                              h5["clip_emb"][:], h5["sent_emb"][:])
    assert again["p2v_R@1"] == pytest.approx(last["val/p2v_R@1"])
    assert [k.decode() if isinstance(k, bytes) else k for k in h5["key"][:]] == [
        f"v{i:03d}" for i in range(24, 32)]
  del jax
