"""Evaluators declared in config: hand-computed retrieval/classification metrics.

A fake task whose predict functions return the batch's own arrays, over a fake
source registered as a dataset, so every metric can be worked out by hand.
"""
import ml_collections
import numpy as np
import pytest

from avtext import evals
from avtext.data import builders
from avtext.metrics import classification as classification_metrics
from avtext.metrics import retrieval as retrieval_metrics
from avtext.train import partitioning

# Three videos, two test clips each whose mean is a one-hot vector; seven
# captions, one-to-many (video ids a, a, b, c, c, c, b).
_VIDEO = {"a": [1.0, 0.0, 0.0], "b": [0.0, 1.0, 0.0], "c": [0.0, 0.0, 1.0]}
_CAPTIONS = [("a", [0.9, 0.1, 0.0]), ("a", [0.2, 0.8, 0.0]), ("b", [0.0, 1.0, 0.0]),
             ("c", [0.0, 0.0, 1.0]), ("c", [0.5, 0.0, 0.4]), ("c", [0.3, 0.3, 0.35]),
             ("b", [0.1, 0.2, 0.7])]


class _Source:
  kind = "clips"

  def __init__(self, rows):
    self.rows = rows

  def __len__(self):
    return len(self.rows)

  def __getitem__(self, i):
    return self.rows[i]


def _one_to_many_rows():
  rows = []
  for i, (vid, text) in enumerate(_CAPTIONS):
    mean = np.array(_VIDEO[vid], np.float32)
    rows.append({"text": np.array(text, np.float32),
                 "video": np.stack([2 * mean, np.zeros(3, np.float32)]),  # K = 2
                 "video_id": vid, "caption": f"caption {i}"})
  return rows


def _paired_rows(n=6, seed=0):
  rng = np.random.default_rng(seed)
  return [{"text": rng.normal(size=4).astype(np.float32),
           "video": rng.normal(size=(1, 4)).astype(np.float32)} for _ in range(n)]


def _classification_rows(n=5, k=3, c=4, seed=1):
  rng = np.random.default_rng(seed)
  return [{"logits_in": rng.normal(size=(k, c)).astype(np.float32),
           "labels": (rng.random(c) < 0.5).astype(np.float32), "video_id": f"v{i}"}
          for i in range(n)]


_SPLITS = {"one_to_many": _one_to_many_rows(), "paired": _paired_rows(),
           "classes": _classification_rows()}


@builders.register_dataset("test_evals_fake")
def _fake_dataset(dataset_config, split):
  del dataset_config
  return _Source(_SPLITS[split])


class _Task:
  """Predict functions that pass the batch's arrays through, counting traces."""
  label_names = ("g:x", "g:y", "h:x", "h:y")

  def __init__(self):
    self.traces = {"text": 0, "video": 0, "logits": 0}
    self.seen_keys = set()

  def eval_examples(self, source):
    return source.__getitem__

  def predict_fns(self):
    def embed_text(variables, batch):
      del variables
      self.traces["text"] += 1
      self.seen_keys.update(batch)
      return batch["text"]

    def embed_video(variables, batch):
      del variables
      self.traces["video"] += 1
      return batch["video"]

    def logits(variables, batch):
      del variables
      self.traces["logits"] += 1
      return batch["logits_in"]

    return {"embed_text": embed_text, "embed_video": embed_video, "logits": logits}


def _config(**entries):
  config = ml_collections.ConfigDict()
  config.dataset = ml_collections.ConfigDict({"name": "test_evals_fake"})
  config.eval = ml_collections.ConfigDict({"batch_size": 4})
  config.evals = ml_collections.ConfigDict(entries)
  return config


def _run(config, task, name, mesh_devices=2):
  mesh = partitioning.make_mesh(mesh_devices)
  evaluators = evals.build_evaluators(config, task)
  return evaluators, evaluators[name].run({}, mesh=mesh, step=0)


def test_retrieval_one_to_many_k_clips_and_padded_batch_by_hand():
  task = _Task()
  _, r = _run(_config(val={"type": "retrieval", "split": "one_to_many"}), task, "val")
  # 7 captions in batches of 4 over 2 devices: the last batch has one padded
  # row, which must not be counted.
  assert r["num_captions"] == 7 and r["num_videos"] == 3
  assert r["chance_r1"] == pytest.approx(100 / 3)
  # Caption ranks of their video (sims are text . mean of the K=2 clips):
  # 1, 2 (b beats a), 1, 1, 2 (a beats c), 1, 2 (c beats b).
  assert r["t2v_R@1"] == pytest.approx(100 * 4 / 7)
  assert r["t2v_R@5"] == 100.0
  assert r["t2v_MnR"] == pytest.approx(10 / 7) and r["t2v_MdR"] == 1.0
  assert r["t2v_mAP"] == pytest.approx(100 * (1 + .5 + 1 + 1 + .5 + 1 + .5) / 7)
  # Every video's best caption is one of its own: v2t R@1 = 100. mAP: video a
  # ranks its captions 1st and 4th, b 1st and 4th, c 1st, 3rd and 4th.
  assert r["v2t_R@1"] == 100.0
  ap = [(1 + 2 / 4) / 2, (1 + 2 / 4) / 2, (1 + 2 / 3 + 3 / 4) / 3]
  assert r["v2t_mAP"] == pytest.approx(100 * np.mean(ap))
  # Host fields (ids, captions) never reach the device.
  assert task.seen_keys == {"text", "video"}


def test_retrieval_paired_equals_metrics_library_and_subset_protocol():
  subset = {"n_subsets": 3, "subset_size": 4, "seed": 5}
  _, r = _run(_config(val={"type": "retrieval", "split": "paired",
                           "subset_protocol": subset, "median_convention": "coot"}),
              _Task(), "val")
  rows = _SPLITS["paired"]
  sim = np.stack([x["text"] for x in rows]) @ np.stack([x["video"][0] for x in rows]).T
  want = retrieval_metrics.retrieval_metrics(sim, median_convention="coot")
  for key, value in want.items():
    assert r[f"t2v_{key}"] == pytest.approx(value)
  assert r["v2t_R@1"] == pytest.approx(retrieval_metrics.retrieval_metrics(sim.T)["R@1"])
  for key, value in retrieval_metrics.subset_protocol(sim, **subset).items():
    assert r[f"subset/{key}"] == pytest.approx(value)


def test_classification_averages_k_clips():
  _, r = _run(_config(cls={"type": "classification", "split": "classes"}), _Task(), "cls")
  rows = _SPLITS["classes"]
  logits = np.stack([x["logits_in"] for x in rows]).mean(axis=1)
  labels = np.stack([x["labels"] for x in rows])
  want = classification_metrics.classification_metrics(logits, labels, _Task.label_names)
  assert r["num_videos"] == 5
  for key, value in want.items():
    assert r[key] == pytest.approx(value), key


def test_evaluators_share_one_compiled_predict_function():
  task = _Task()
  config = _config(a={"type": "retrieval", "split": "one_to_many"},
                   b={"type": "retrieval", "split": "one_to_many", "every_steps": 5})
  evaluators, first = _run(config, task, "a")
  second = evaluators["b"].run({}, mesh=partitioning.make_mesh(2), step=0)
  assert first == second
  assert task.traces["text"] == 1 and task.traces["video"] == 1


def test_cadence_and_config_errors():
  config = _config(a={"type": "retrieval", "every_epochs": 0.5},
                   b={"type": "classification", "every_steps": 7}, c={"type": "retrieval"})
  evaluators = evals.build_evaluators(config, _Task())
  assert [evaluators[n].every(steps_per_epoch=10) for n in "abc"] == [5, 7, 0]
  with pytest.raises(ValueError, match="every_steps or every_epochs"):
    evals.build_evaluators(_config(a={"type": "retrieval", "every_steps": 1,
                                      "every_epochs": 1.0}), _Task())
  with pytest.raises(ValueError, match=r"config.evals.a.type='nope'.*classification.*retrieval"):
    evals.build_evaluators(_config(a={"type": "nope"}), _Task())
  with pytest.raises(ValueError, match="config.evals.a.type=None; registered evaluators"):
    evals.build_evaluators(_config(a={"split": "test"}), _Task())
  with pytest.raises(ValueError, match="no predict function 'embed_audio'.*embed_text"):
    _run(_config(a={"type": "retrieval", "split": "paired", "video_fn": "embed_audio"}),
         _Task(), "a")


def test_dataset_overrides_reach_the_source():
  config = _config(a={"type": "retrieval", "dataset": {"name": "no_such_set", "data_dir": None}})
  config.dataset.data_dir = "/data/train_set"
  evaluator = evals.build_evaluators(config, _Task())["a"]
  assert evaluator.dataset_config.name == "no_such_set"
  assert evaluator.dataset_config.data_dir == "/data/train_set"  # None inherits
  assert config.dataset.name == "test_evals_fake"  # the run's own dataset is untouched
  with pytest.raises(ValueError, match="'no_such_set' is not a registered dataset"):
    evaluator.source  # pylint: disable=pointless-statement


def test_aot_reads_the_predict_functions_each_evaluator_declares():
  """aot compiles what the evaluators call: renamed keys, defaults and fixed functions."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  config = ml_collections.ConfigDict({"evals": {
      "test": {"type": "retrieval", "text_fn": "embed_paragraph"},
      "cap": {"type": "captioning"},
      "corpus": {"type": "moments"}}})
  assert evals.predict_fn_names(config) == sorted(
      ["embed_paragraph", "embed_video", "captions", "encode_query", "encode_context",
       "span_logits"])
  config.evals.bad = {"type": "retreival"}
  with pytest.raises(ValueError, match="config.evals.bad.type"):
    evals.predict_fn_names(config)


def test_retrieval_oracle_lines_by_brute_force_computed_once_per_source():
  """The synthetic world's oracle lines (whole split, sound-mentioning captions, the
  subset protocol's subsets) against caption_fits over every pair; a second evaluation
  of the same source reads no clip again and only its sound R@1 follows the new scores."""
  from avworld import captions  # pylint: disable=g-import-not-at-top
  from avworld import spoken_clips  # pylint: disable=g-import-not-at-top
  from avtext.evals import retrieval as retrieval_eval  # pylint: disable=g-import-not-at-top
  source = spoken_clips.SpokenClipSource("test", num_examples=60)
  attrs = [source.describe(i)["attributes"] for i in range(60)]

  def oracle(captions_idx, gallery):
    counts = [sum(captions.caption_fits(attrs[c]["mentioned"], attrs[g]) for g in gallery)
              for c in captions_idx]
    return 100 * np.mean(1 / np.array(counts))

  sound = [i for i in range(60) if "sound" in attrs[i]["mentioned"]]
  subset = dict(n_subsets=2, subset_size=25, seed=0)
  cfg = ml_collections.ConfigDict(dict(subset_protocol=subset))
  described = []
  original = source.describe
  source.describe = lambda i: described.append(i) or original(i)
  references = {}
  rng = np.random.default_rng(0)
  for evaluation in range(2):
    sim = rng.standard_normal((60, 60))
    out = retrieval_eval.retrieval_results(sim, None, None, cfg, source, references=references)
    assert out["oracle_t2v_r1"] == pytest.approx(oracle(range(60), range(60)))
    assert out["sound_num_captions"] == len(sound) > 5
    assert out["sound_oracle_t2v_r1"] == pytest.approx(oracle(sound, range(60)))
    assert out["sound_t2v_r1"] == pytest.approx(
        100 * np.mean([np.argmax(sim[i]) == i for i in sound]))
    assert out["subset/oracle_t2v_R@1"] == pytest.approx(np.mean(
        [oracle(idx, idx) for idx in retrieval_metrics.subset_indices(60, **subset)]))
    if evaluation == 0:
      assert len(described) <= 2 * 60  # each clip once for the oracle, once for the sound
      described.clear()
  assert not described
