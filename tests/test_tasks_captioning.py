"""Captioning: the NLL, the synthetic attribute scorer, and a tiny end-to-end run."""
import collections
import json
import pathlib
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from avtext import experiment
from avtext.data import builders
from avtext.data import pipelines
from avtext.losses import captioning as caption_losses
from avtext.metrics import captioning as caption_metrics
from avtext.tasks import captioning
from avtext.text import tokenizers
from avworld import captions, clips, world

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "configs"))
import videocc_avr  # pylint: disable=g-import-not-at-top,wrong-import-position
import videocc_caption  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_sequence_nll_hand_computed():
  logits = jnp.array([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [5.0, 5.0, 5.0]]])
  targets = jnp.array([[0, 2, 1]])
  mask = jnp.array([[1, 1, 0]])  # the third position is padding
  loss, acc = caption_losses.sequence_nll(logits, targets, mask)
  want = (-np.log(np.exp(2) / (np.exp(2) + 2)) - np.log(1 / (np.e + 2))) / 2
  np.testing.assert_allclose(loss, want, rtol=1e-6)
  assert float(acc) == 50.0  # argmax right at position 0, wrong at 1
  # Label smoothing eps: (1 - eps) * NLL + eps * mean over classes of -log p.
  smooth, _ = caption_losses.sequence_nll(logits, targets, mask, label_smoothing=0.3)
  lp0 = np.log(np.array([np.exp(2), 1, 1]) / (np.exp(2) + 2))
  lp1 = np.log(np.array([1, np.e, 1]) / (np.e + 2))
  want = (0.7 * -lp0[0] + 0.3 * -lp0.mean() + 0.7 * -lp1[2] + 0.3 * -lp1.mean()) / 2
  np.testing.assert_allclose(smooth, want, rtol=1e-6)


def test_tvc_label_smoothing_loss_is_the_official_kl_sum():
  """TVCaption's LabelSmoothingLoss: q = 1 - eps on the target, eps / (V - 1) on each other
  word; sum over the real tokens of sum_w q_w (log q_w - log p_w); eps 0: mean CE."""
  logits = jnp.array([[[2.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.5], [5.0, 5.0, 5.0, 5.0]],
                      [[1.0, -1.0, 0.0, 3.0], [0.0, 0.0, 0.0, 0.0], [0.3, 0.2, 0.1, 0.0]]])
  targets = jnp.array([[0, 2, 1], [3, 1, 0]])
  mask = jnp.array([[1, 1, 0], [1, 1, 1]])  # one padded position (official label -1)
  real = [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
  v = 4
  logp = np.asarray(logits, np.float64)
  logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))

  def official(eps):
    total = 0.0
    for b, i in real:
      q = np.full(v, eps / (v - 1))
      q[int(targets[b, i])] = 1 - eps
      kept = q > 0  # torch's kl_div: 0 * log 0 = 0
      total += np.sum(q[kept] * (np.log(q[kept]) - logp[b, i][kept]))
    return total

  loss, per_word, acc = caption_losses.tvc_label_smoothing_loss(logits, targets, mask, 0.3)
  np.testing.assert_allclose([loss, per_word], [official(0.3), official(0.3) / 5], rtol=1e-6)
  assert float(acc) == pytest.approx(100 * 3 / 5)  # right at (0,0), (1,0), (1,2)
  np.testing.assert_allclose(caption_losses.tvc_label_smoothing_loss(logits, targets, mask, 1.0)[0],
                             official(1.0), rtol=1e-6)  # no mass on the target
  # eps = 0: the official nn.CrossEntropyLoss(ignore_index=-1), a mean over the real tokens.
  ce = -np.mean([logp[b, i, int(targets[b, i])] for b, i in real])
  loss0, per_word0, _ = caption_losses.tvc_label_smoothing_loss(logits, targets, mask, 0.0)
  np.testing.assert_allclose([loss0, per_word0], [ce, ce], rtol=1e-6)
  with pytest.raises(ValueError, match="label_smoothing=1.5"):
    caption_losses.tvc_label_smoothing_loss(logits, targets, mask, 1.5)


def test_parse_statements_recovers_every_generated_mention():
  """Every synonym and template the generator uses parses back to its mention dict."""
  src = clips.ClipCaptionSource("train", num_examples=3000, seed=7, spec=world.WorldSpec())
  for i in range(3000):
    d = src.describe(i)
    assert captions.parse_statements(d["caption"]) == captions.mention_statements(
        d["attributes"]["mentioned"]), d["caption"]


def test_statement_precision_recall_hand_computed():
  clip = {"num_objects": 2, "background": "striped", "sound": "tone",
          "objects": [{"shape": "circle", "colour": "red", "motion": "left"},
                      {"shape": "square", "colour": "blue", "motion": "still"}]}
  # 9 distinct true atoms: count, background, sound, 2 shapes, 2 colours, 2 motions.
  assert len(captions.clip_statements(clip)) == 9
  # Says: red (true), disc = circle (true), green (false), striped (true).
  text = "A scarlet disc and a green thing on a stripy background."
  assert captions.parse_statements(text) == {("colour", "red"), ("shape", "circle"),
                                             ("colour", "green"), ("background", "striped")}
  got = captions.statement_precision_recall([text, "Nothing here."], [clip, clip])
  assert got["attribute_precision"] == pytest.approx(100 * 3 / 4)
  assert got["attribute_recall"] == pytest.approx(100 * 3 / 18)
  assert got["attributes_per_caption"] == 2.0
  # "one of them" is not a count; "only one" is.
  assert captions.parse_statements("Two shapes, one of them a box.") == {
      ("num_objects", 2), ("shape", "square")}
  assert ("num_objects", 1) in captions.parse_statements("Only one ball rising.")


def test_task_rejects_mismatched_vocab(tmp_path):
  config = videocc_caption.get_config("tiny")
  tokenizers.write_vocab_subset(["a red circle."], tmp_path / "v.json")
  config.model.decoder.vocab_subset = str(tmp_path / "v.json")
  config.model.decoder.vocab_size = 50257
  with pytest.raises(ValueError, match="vocab_size=50257 but the tokenizer has"):
    captioning.CaptioningTask(config)


def test_paper_config_says_what_to_prepare(tmp_path):
  config = videocc_caption.get_config()
  assert config.model.decoder.vocab_size == 50257 and config.model.decoder.num_layers == 12
  assert config.optimizer.learning_rate == 1e-4 and config.optimizer.weight_decay == 0.01
  with pytest.raises(FileNotFoundError, match="VideoCC3M"):
    builders.get_source(config.dataset, "train")
  assert videocc_caption.get_config("finetune").train.num_steps == 1000


@pytest.mark.slow  # default-run budget (BENCHMARKS.md, "Default test run"); `make test-slow`
def test_tiny_run_trains_evaluates_and_writes_predictions(tmp_path):
  """AVR tiny run -> vocab subset -> captioner warm-started from it, with both baselines."""
  avr_config = videocc_avr.get_config("tiny")
  experiment.build(avr_config, tmp_path / "avr").train()

  config = videocc_caption.get_config("tiny")
  train = builders.get_source(config.dataset, "train")
  train_captions = pipelines.source_captions(train)
  tokenizers.write_vocab_subset(train_captions, tmp_path / "vocab.json")
  config.model.decoder.vocab_subset = str(tmp_path / "vocab.json")
  config.init_from.workdir = str(tmp_path / "avr")
  config.evals.test.baselines.nearest_neighbour = dict(run=str(tmp_path / "avr"), step=None,
                                                       num_train=32, num_clips=1)
  workdir = tmp_path / "cap"
  state = experiment.build(config, workdir).train()
  assert int(state.step) == config.train.num_steps
  latest = json.loads((workdir / "results.json").read_text())["latest"]
  assert latest["test/num_videos"] == config.dataset.num_eval
  for prefix in ("test/", "test/baseline_most_frequent/", "test/baseline_nearest_neighbour/"):
    for key in ("BLEU-4", "ROUGE-L", "CIDEr-D", "attribute_precision", "attribute_recall"):
      assert prefix + key in latest
  assert latest["test/reference/attribute_precision"] == 100.0

  # The files hold what was scored: re-scoring them gives the logged numbers.
  test = builders.get_source(config.dataset, "test")
  refs = {test.describe(i)["clip_id"]: [test.describe(i)["caption"]] for i in range(len(test))}
  folder = workdir / "captions"
  rows = json.loads((folder / "test_step10.json").read_text())
  hyps = {r["image_id"]: r["caption"] or "<empty>" for r in rows}
  assert set(hyps) == set(refs)
  scores = caption_metrics.caption_metrics(refs, hyps)
  for key in ("BLEU-4", "ROUGE-L", "CIDEr-D"):
    assert scores[key] == pytest.approx(latest["test/" + key], abs=1e-9)
  attrs = [test.describe(i)["attributes"] for i in range(len(test))]
  ids = [test.describe(i)["clip_id"] for i in range(len(test))]
  pr = captions.statement_precision_recall([hyps[i] for i in ids], attrs)
  assert pr["attribute_recall"] == pytest.approx(latest["test/attribute_recall"])
  # The baselines are what they say: the mode of the training captions, and
  # training captions picked per clip.
  mf = json.loads((folder / "test_baseline_most_frequent.json").read_text())
  counts = collections.Counter(train_captions[:config.evals.test.baselines.most_frequent.num_train])
  assert {r["caption"] for r in mf} == {max(counts, key=lambda c: (counts[c], -train_captions.index(c)))}
  nn = json.loads((folder / "test_baseline_nearest_neighbour.json").read_text())
  pool = set(train_captions[:config.evals.test.baselines.nearest_neighbour.num_train])
  assert all(r["caption"] in pool for r in nn) and len({r["caption"] for r in nn}) > 1
