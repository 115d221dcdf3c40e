"""The S-MiT task end to end: phase 1 through the trainer freezes what the paper freezes
(params and BatchNorm statistics), features equal the model on clips, losses by config,
the feature layout's errors, and the two configs chained phase 1 -> phase 2."""
import json
import pathlib
import subprocess
import sys

import h5py
import jax
import ml_collections
import numpy as np
import pytest

from avtext.data import builders
from avtext.features import smit as smit_features
from avtext.losses import contrastive
from avtext.tasks import task_registry
from avtext.train import checkpointing
from avtext.train import optimizers
from tests.test_train_trainer import REPO
from tests.test_train_trainer import make_trainer

sys.path.insert(0, str(REPO / "configs"))
import smit_language_amm  # pylint: disable=g-import-not-at-top,wrong-import-position
import smit_spoken_amm  # pylint: disable=g-import-not-at-top,wrong-import-position

TINY_RESNET = dict(name="resnet", depth=18, width=4, stage_sizes=(1, 1))


def _flat(tree):
  return {optimizers.path_name(p): np.asarray(v)
          for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _clips_config(module, **extra):
  """Tiny phase 1 reading the clips directly, with a BatchNorm image backbone."""
  config = module.get_config("tiny")
  config.dataset = config.features_source
  config.model.video.image = ml_collections.ConfigDict(TINY_RESNET)
  config.model.video.image_mode = "frames"
  config.train.num_steps = 2
  config.evals = ml_collections.ConfigDict()
  config.eval.select = None
  for k, v in extra.items():
    config[k] = v
  return config


@pytest.mark.parametrize("module", [
    # The spoken model covers both BatchNorm cases (a frozen backbone, a trained encoder).
    # Both run with `make test-slow` (CI runs it; the default run's budget).
    pytest.param(smit_language_amm, marks=pytest.mark.slow),
    pytest.param(smit_spoken_amm, marks=pytest.mark.slow)],
                         ids=["language", "spoken"])
def test_phase1_keeps_frozen_params_and_batch_stats_bit_identical(tmp_path, module):
  config = _clips_config(module)
  trainer = make_trainer(config, tmp_path)
  state, _, _ = trainer.restore_or_init()
  before = _flat(jax.device_get({"params": state.params, **state.model_state}))
  trained = trainer.train()
  after = _flat(jax.device_get({"params": trained.params, **trained.model_state}))
  assert before.keys() == after.keys()
  frozen = [k for k in before if k.split("/", 1)[1].startswith(("video/image/", "video/temporal/",
                                                                "caption/text/"))]
  assert any(k.startswith("batch_stats/video/image/") for k in frozen)  # BatchNorm backbone
  for k in frozen:
    np.testing.assert_array_equal(after[k], before[k], err_msg=k)
  changed = [k for k in before if not np.array_equal(after[k], before[k])]
  assert any(k.startswith("params/video/head/") for k in changed)
  assert any(k.startswith("params/caption/head/") for k in changed)
  if module is smit_spoken_amm:  # the speech encoder trains from scratch, BatchNorm too
    assert any(k.startswith("batch_stats/caption/encoder/") for k in changed)
    assert any(k.startswith("params/caption/encoder/") for k in changed)


@pytest.fixture(scope="module")
def tiny_features(tmp_path_factory):
  config = smit_language_amm.get_config("tiny")
  out = tmp_path_factory.mktemp("smit_features")
  smit_features.extract(config, out, splits=("val",), batch_size=8)
  config.dataset.path = str(out)
  return config


@pytest.fixture(scope="module")
def tiny_model(tiny_features):
  """(task, phase-1 variables) of the tiny language config."""
  task = task_registry.build_task(tiny_features)
  return task, smit_features.phase1_variables(tiny_features, task)


def test_features_give_the_phase1_model_on_clips(tiny_features, tiny_model):
  config = tiny_features
  task, variables = tiny_model
  fns = task.predict_fns()
  feats = builders.get_source(config.dataset, "val")
  clips = builders.get_source(config.features_source, "val")
  assert len(feats) == len(clips) == 20
  idx = [0, 3, 7]

  def batch(source):
    ex = task.examples(source, train=False)
    rows = [ex(i) for i in idx]
    return {k: np.stack([r[k] for r in rows]) for k in rows[0] if k != "clip_id"}

  fb, cb = batch(feats), batch(clips)
  assert "image_frames" in cb and "image_embedding" in fb and "words" in fb
  np.testing.assert_allclose(fns["embed_video"](variables, fb), fns["embed_video"](variables, cb),
                             rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(fns["embed_text"](variables, fb), fns["embed_text"](variables, cb),
                             rtol=2e-3, atol=2e-3)  # words stored as float16
  # Ragged storage: item i's words are exactly its transcript's words (capped at max_words).
  item = feats[3]
  n_words = min(len(clips.describe(3)["transcript"].split()), config.model.max_words)
  assert item["words"].shape == (n_words, config.model.text.hidden_size)
  assert item["transcript"] == clips.describe(3)["transcript"]


def _asr_config(config, **source):
  """`config` reading other transcripts of the same clips (another seeded ASR WER)."""
  other = ml_collections.ConfigDict(config.to_dict())
  other.features_source.asr_wer = 0.5
  other.features_source.update(source)
  return other


def _words_at_full_length(task, variables, transcripts):
  """Each transcript's words from `caption_words` on data.max_text_len tokens."""
  tokens = task.tokenizer(transcripts, with_words=True)
  words, mask = jax.device_get(task.predict_fns()["caption_words"](variables, tokens))
  return [w[m] for w, m in zip(words, mask)], tokens["attention_mask"].sum(axis=1)


def test_reuse_copies_the_clip_side_and_computes_the_new_transcripts_words(
    tiny_features, tiny_model, tmp_path):
  task, variables = tiny_model
  config = _asr_config(tiny_features, num_val=12)  # the first 12 of the 20 clips
  first = pathlib.Path(tiny_features.dataset.path)
  out = smit_features.extract(config, tmp_path / "asr", splits=("val",), batch_size=8,
                              reuse=first)
  old = builders.get_source(tiny_features.dataset, "val")
  config.dataset.path = str(out)
  new = builders.get_source(config.dataset, "val")
  assert new.ids == old.ids[:12]
  clips = builders.get_source(config.features_source, "val")
  assert [new[i]["transcript"] for i in range(12)] == [
      clips.describe(i)["transcript"] for i in range(12)]
  assert sum(new[i]["transcript"] != old[i]["transcript"] for i in range(12)) >= 6
  for i in range(12):
    for key in ("image_embedding", "temporal_embedding", "log_mel"):
      np.testing.assert_array_equal(new[i][key], old[i][key], err_msg=key)
  assert json.loads((out / "meta.json").read_text())["reused"] == str(first.absolute())
  # Both builds' words are the text encoder's on full-length tokens (the words pass cuts
  # each length-ordered batch to its longest transcript; padding is masked).
  stored = [feats[i] for feats in (old, new) for i in range(len(feats))]
  transcripts = [item["transcript"] for item in stored]
  words, lengths = _words_at_full_length(task, variables, transcripts)
  assert lengths.max() < tiny_features.data.max_text_len and len(set(lengths)) > 3
  for item, w in zip(stored, words):
    np.testing.assert_allclose(np.asarray(item["words"], np.float32), w, rtol=2e-3, atol=2e-3,
                               err_msg=item["transcript"])


def test_reuse_refuses_other_clips_or_backbones(tiny_features, tmp_path):
  first = pathlib.Path(tiny_features.dataset.path)
  for change, match in (
      (dict(world_seed=1), r"origin.world_seed differ"),
      (dict(speech="espeak"), r"origin.speech differ"),
      (dict(num_val=30), r"val.h5 lacks 10 of the 30 clips")):
    with pytest.raises(ValueError, match=match):
      smit_features.extract(_asr_config(tiny_features, **change), tmp_path / "x",
                            splits=("val",), reuse=first)
  config = _asr_config(tiny_features)
  config.init_from.workdir = str(tmp_path)
  with pytest.raises(ValueError, match=r"init_from.workdir differ"):
    smit_features.extract(config, tmp_path / "x", splits=("val",), reuse=first)
  with pytest.raises(ValueError, match=r"not a finished smit_features directory"):
    smit_features.extract(_asr_config(tiny_features), tmp_path / "x", splits=("val",),
                          reuse=tmp_path)


def test_features_layout_errors_name_the_file_and_key(tmp_path, tiny_features):
  cfg = ml_collections.ConfigDict(dict(name="smit_features", path=None))
  with pytest.raises(ValueError, match="config.dataset.path is unset"):
    builders.get_source(cfg, "val")
  cfg.path = str(tmp_path)
  with pytest.raises(FileNotFoundError, match="meta.json: no such file"):
    builders.get_source(cfg, "val")
  src = pathlib.Path(tiny_features.dataset.path)
  (tmp_path / "meta.json").write_text((src / "meta.json").read_text())
  with h5py.File(src / "val.h5") as f, h5py.File(tmp_path / "val.h5", "w") as g:
    for key in f:
      if key != "words_offsets":
        f.copy(key, g)
  with pytest.raises(ValueError, match="val.h5: 'words' without 'words_offsets'"):
    builders.get_source(cfg, "val")
  with pytest.raises(FileNotFoundError, match="config.dataset.path: set it to your S-MiT"):
    builders.get_source(ml_collections.ConfigDict(dict(name="smit")), "train")


def test_loss_by_config_matches_the_library():
  sim = jax.random.normal(jax.random.PRNGKey(0), (6, 6))
  cfg = smit_language_amm.get_config("tiny").loss
  cfg.name = "amm"
  np.testing.assert_allclose(contrastive.smit_loss(sim, cfg, 0), contrastive.amm(sim, alpha=0.5))
  cfg.name = "mms"  # M = 0.001 * 1.002 ** floor(step / 1000)
  np.testing.assert_allclose(contrastive.smit_loss(sim, cfg, 2500),
                             contrastive.mms(sim, margin=0.001 * 1.002 ** 2), rtol=1e-6)
  cfg.name = "nce"  # S-MiT eq. 1: the positive is not in the denominator
  logits = np.asarray(sim, np.float64)
  off = ~np.eye(6, dtype=bool)
  lxy = -np.mean(np.diag(logits) - np.log(np.where(off, np.exp(logits), 0).sum(1)))
  lyx = -np.mean(np.diag(logits) - np.log(np.where(off, np.exp(logits), 0).sum(0)))
  np.testing.assert_allclose(contrastive.smit_loss(sim, cfg, 0), lxy + lyx, rtol=1e-5)
  cfg.name = "semi_hard_triplet"
  np.testing.assert_allclose(contrastive.smit_loss(sim, cfg, 0),
                             contrastive.semi_hard_triplet(sim, margin=1.0))
  cfg.name = "triplet"
  with pytest.raises(ValueError, match="config.loss.name='triplet'"):
    contrastive.smit_loss(sim, cfg, 0)


def test_paper_config_says_what_to_prepare(tmp_path):
  config = smit_language_amm.get_config()
  assert (config.train.batch_size, config.model.embed_dim, config.loss.name,
          config.optimizer.learning_rate) == (2048, 4096, "amm", 1e-3)
  assert smit_language_amm.get_config("phase2").optimizer.learning_rate == 1e-5
  with pytest.raises(ValueError, match="config.dataset.path is unset.*smit_features"):
    make_trainer(config, tmp_path).train()


@pytest.mark.slow
@pytest.mark.parametrize("caption", ["language", "spoken"])
def test_configs_chain_phase1_then_phase2(tmp_path, caption):
  """`make demo-smit`'s three commands on the tiny variant; the spoken model's ResNet
  carries its BatchNorm statistics from phase 1's best into phase 2."""
  py = [sys.executable, "-m"]
  cfg = f"--config=configs/smit_{caption}_amm.py:tiny"
  feats, p1, p2 = tmp_path / "f", tmp_path / "p1", tmp_path / "p2"
  for cmd in (["avtext.features", "smit", cfg, f"--out={feats}"],
              ["avtext.main", cfg, f"--workdir={p1}", f"--config.dataset.path={feats}"],
              ["avtext.main", cfg + ",phase2", f"--workdir={p2}",
               f"--config.init_from.workdir={p1}"]):
    proc = subprocess.run(py + cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
  assert "caption_to_video" in proc.stdout and "S-MiT protocol" in proc.stdout
  r1, r2 = (json.loads((p / "results.json").read_text()) for p in (p1, p2))
  best = r1["best"]["step"]
  assert "test/subset/mean/R@1" in r2[str(max(int(k) for k in r2 if k.isdigit()))]
  assert f"warm start from {p1} step {best}: <all> -> <all>" in proc.stderr  # phase 1's best
  if caption == "spoken":  # phase 2 starts from phase 1's best statistics, bit for bit
    assert "(with batch_stats)" in proc.stderr
    config = smit_spoken_amm.get_config("tiny,phase2")
    config.init_from.workdir = str(p1)
    start = make_trainer(config, tmp_path / "p2_start").restore_or_init()[0]
    s1 = checkpointing.restore_raw(p1, "best")[0]["model_state"]["batch_stats"]
    s2 = jax.device_get(start.model_state["batch_stats"])
    assert jax.tree.structure(s1) == jax.tree.structure(s2)
    for a, b in zip(jax.tree.leaves(s1), jax.tree.leaves(s2)):
      np.testing.assert_array_equal(a, b)


def test_oracle_on_a_subset_gallery_counts_fitting_clips_by_brute_force():
  from avworld import captions  # pylint: disable=g-import-not-at-top
  from avworld import spoken_clips  # pylint: disable=g-import-not-at-top
  from avtext.metrics import retrieval  # pylint: disable=g-import-not-at-top
  source = spoken_clips.SpokenClipSource("test", num_examples=80)
  idx = retrieval.subset_indices(80, n_subsets=1, subset_size=30, seed=3)[0]
  attrs = [source.describe(int(i))["attributes"] for i in idx]
  counts = [sum(captions.caption_fits(a["mentioned"], b) for b in attrs) for a in attrs]
  assert min(counts) >= 1
  np.testing.assert_allclose(source.oracle_recall_at_1(idx, gallery_is_subset=True),
                             100 * np.mean(1 / np.array(counts)))
  # The whole-split gallery has at least as many fitting clips, so a lower oracle.
  assert source.oracle_recall_at_1(idx) <= source.oracle_recall_at_1(idx, gallery_is_subset=True)
