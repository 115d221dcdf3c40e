"""avtext.data.ground_truth: the world's ground truth behind its protocols, and the sources
without any (real datasets) answering None."""
import json

import ml_collections
import numpy as np
import pytest

from avtext.data import ground_truth
from avtext.evals import captioning
from avworld import captions
from avworld import clips
from avworld import mining
from avworld import mining_corpus
from avworld import truth
from avworld import world

SPEC = world.WorldSpec(height=32, width=32)


def test_the_world_clip_truth_is_its_labels_and_caption_scores():
  assert isinstance(truth.WORLD, ground_truth.ClipTruth)
  src = clips.ClipCaptionSource("val", num_examples=20, spec=SPEC)
  assert ground_truth.of_source(src) is truth.WORLD
  attrs = [src.describe(i)["attributes"] for i in range(20)]
  assert truth.WORLD.label_names == world.LABEL_NAMES
  for a in attrs[:5]:
    np.testing.assert_array_equal(truth.WORLD.labels(a), world.attribute_labels(a))
  texts = [src.describe((i + 1) % 20)["caption"] for i in range(20)]  # mostly wrong clips
  assert truth.WORLD.caption_scores(texts, attrs) == captions.statement_precision_recall(
      texts, attrs)


def test_datasets_declare_their_truth_without_opening():
  for name in ("synthetic_clips", "synthetic_smit"):
    assert ground_truth.of_dataset(ml_collections.ConfigDict({"name": name})) is truth.WORLD
  assert ground_truth.of_dataset(ml_collections.ConfigDict({"name": "msrvtt"})) is None
  with pytest.raises(ValueError, match="not a registered dataset"):
    ground_truth.of_dataset(ml_collections.ConfigDict({"name": "nope"}))


def test_sources_without_truth_answer_none():
  class Files:  # a real dataset's source: media and captions only
    def describe(self, i):
      return {"caption": "x", "attributes": None}

  assert ground_truth.of_source(Files()) is None
  assert ground_truth.retrieval_oracle(Files()) is None
  src = clips.ClipCaptionSource("test", num_examples=4, spec=SPEC)
  assert ground_truth.retrieval_oracle(src) is src


def test_world_files_name_their_world(tmp_path):
  assert ground_truth.world_meta(tmp_path) is None
  assert ground_truth.world_meta("gs://bucket/videos") is None
  truth.write_world_file(tmp_path)
  meta = ground_truth.world_meta(tmp_path)
  assert meta == {"format": truth.FORMAT}
  assert ground_truth.open_world(meta, where="w", kind=ground_truth.ClipTruth) is truth.WORLD
  with pytest.raises(TypeError, match="knows no CorpusTruth"):
    ground_truth.open_world(meta, where="w", kind=ground_truth.CorpusTruth)
  with pytest.raises(ValueError, match=r"w: format='avtext.other/1' names no known world; "
                                       r"known formats: .*avtext.mining_world/"):
    ground_truth.open_world({"format": "avtext.other/1"}, where="w",
                            kind=ground_truth.ClipTruth)


def test_corpus_truth_is_the_mining_world_by_id():
  w = mining.MiningWorld(num_seeds=12, num_videos=3, seed_scene_rate=0.5, num_scenes=(3, 4),
                         scene_seconds=(4.0, 6.0),
                         spec=world.WorldSpec(height=32, width=32, duration_s=10.0))
  meta = json.loads(json.dumps(mining_corpus.world_meta(w, ())))  # as read from the file
  corpus = ground_truth.open_world(meta, where="w", kind=ground_truth.CorpusTruth)
  assert (corpus.fps, corpus.sample_rate) == (w.spec.fps, w.spec.sample_rate)
  times = np.array([0.0, 1.3, 7.9])
  np.testing.assert_array_equal(corpus.render_frames(w.video_id(1), times),
                                w.render_frames(1, times))
  np.testing.assert_array_equal(corpus.render_audio(w.video_id(2), 100, 500),
                                w.render_audio(2, 100, 500))
  for v in range(3):
    for s in range(w.num_seeds):
      for start in (0.0, 3.0, 9.0):
        assert corpus.clip_fits(w.video_id(v), w.seed_id(s), start, start + 2.0) == \
            w.clip_fits(v, start, start + 2.0, s)


def test_captioning_scores_attributes_only_with_the_sources_truth():
  src = clips.ClipCaptionSource("test", num_examples=3, spec=SPEC)
  host = {"attributes": [json.dumps(src.describe(i)["attributes"]) for i in range(3)]}
  evaluator = object.__new__(captioning.CaptioningEvaluator)  # just its source
  evaluator._source = src  # pylint: disable=protected-access
  got_truth, attrs = evaluator._truth(host)  # pylint: disable=protected-access
  assert got_truth is truth.WORLD and attrs == [src.describe(i)["attributes"] for i in range(3)]

  class Files:  # the same attributes from a source that does not know what they mean
    pass

  evaluator._source = Files()  # pylint: disable=protected-access
  assert evaluator._truth(host) == (None, None)  # pylint: disable=protected-access
