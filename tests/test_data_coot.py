"""COOT data: the official frame sampler and segment rule, the feature layout, text features.

References: hand-worked examples of the official formulas (coot-videotext
nntrainer/maths.py, coot/dataset_retrieval.py, nntrainer/data_text.py,
precompute_text.py), a few-line numpy restatement of `compute_indices` drawing
from np.random.RandomState exactly as the official code draws from numpy's
global state, and transformers' FlaxBertModel hidden states for the text
features. Also the multi-scene world and the demo's feature windows.
"""
import contextlib
import io
import json
import pickle

import h5py
import ml_collections
import numpy as np
import pytest

from avtext import cli
from avtext.data import builders
from avtext.data import coot_files
from avtext.data import video as video_lib
from avtext.features import coot_text
from avworld import captions
from avworld import multiscene
from avworld import world

# ---------------------------------------------------------------- frame sampler


@pytest.mark.parametrize("n,m,expected", [
    (10, 4, [1, 3, 6, 8]),  # linspace 0, 2.5, 5, 7.5 + 1.25 -> floor 1.25, 3.75, 6.25, 8.75
    (5, 5, [0, 1, 2, 3, 4]),  # + 0.5
    (7, 1, [3]),  # 0 + 3.5
    (9, 2, [2, 6]),  # 0, 4.5 + 2.25 -> 2.25, 6.75
    (3, 6, [0, 0, 1, 1, 2, 2]),  # 0, .5, ..., 2.5 + .25: frames repeat when m > n
])
def test_eval_sampler_takes_bin_centres(n, m, expected):
  np.testing.assert_array_equal(video_lib.coot_frame_indices(n, m, None), expected)


class _ScriptedRng:
  """shuffle applies a fixed permutation, random returns fixed values."""

  def __init__(self, permutation, uniforms):
    self.permutation, self.uniforms = permutation, np.asarray(uniforms)

  def shuffle(self, x):
    x[:] = x[np.asarray(self.permutation, int)]

  def random(self, size):
    assert size == len(self.uniforms)
    return self.uniforms


def test_train_sampler_worked_example():
  # 10 -> 4: starts linspace 0, 2.5, 5, 7.5 round half down -> 0, 2, 5, 7 (2.5 -> 2,
  # 7.5 -> 7; np.round would give 2, 8); sizes 2, 3, 2 shuffled to 3, 2, 2, then the rest
  # 10 - 7 = 3: s = 3, 2, 2, 3. Bins start at cumsum(s) - s_0 = 0, 2, 4, 7 and are
  # s_1, s_2, s_3, s_0 = 2, 2, 3, 3 long; uniforms 0, .5, .99, .4 -> 0, 3, 6.97, 8.2.
  rng = _ScriptedRng([1, 0, 2], [0.0, 0.5, 0.99, 0.4])
  np.testing.assert_array_equal(video_lib.coot_frame_indices(10, 4, rng), [0, 3, 6, 8])
  # 4 -> 4: every bin is one frame: identity whatever the draws.
  rng = _ScriptedRng([2, 0, 1], [0.999, 0.0, 0.5, 0.7])
  np.testing.assert_array_equal(video_lib.coot_frame_indices(4, 4, rng), [0, 1, 2, 3])
  # 1 target: one bin of all n frames.
  np.testing.assert_array_equal(
      video_lib.coot_frame_indices(9, 1, _ScriptedRng([], [0.5])), [4])


class _Recording:
  """A Generator that records the shuffled sizes."""

  def __init__(self, seed):
    self.rng, self.sizes = np.random.default_rng(seed), None

  def shuffle(self, x):
    self.rng.shuffle(x)
    self.sizes = x.copy()

  def random(self, size):
    return self.rng.random(size)


def test_train_sampler_draws_one_frame_inside_each_bin():
  for seed in range(30):
    rec = _Recording(seed)
    idx = video_lib.coot_frame_indices(10, 4, rec)
    assert sorted(rec.sizes) == [2, 2, 3]  # the round-half-down sizes, in some order
    sizes = np.concatenate([rec.sizes, [10 - rec.sizes.sum()]])
    lo = np.concatenate([[0], np.cumsum(sizes[1:])])  # bin k starts at s_1 + .. + s_k
    hi = lo + np.roll(sizes, -1)
    assert hi[-1] == 10 and np.all(lo <= idx) and np.all(idx < hi), (seed, idx, lo, hi)
  a = video_lib.coot_frame_indices(123, 80, np.random.default_rng(5))
  np.testing.assert_array_equal(a, video_lib.coot_frame_indices(
      123, 80, np.random.default_rng(5)))
  assert not np.array_equal(a, video_lib.coot_frame_indices(
      123, 80, np.random.default_rng(6)))


def _official_compute_indices(n, m, random):
  """compute_indices(n, m, is_train=True) with `random` in place of the np.random module."""
  starts = np.ceil(np.linspace(0, n, m, endpoint=False) - 0.5).astype(int)
  offsets = starts[1:] - starts[:-1]
  random.shuffle(offsets)
  offsets = np.concatenate([offsets, np.array([n - np.sum(offsets)])])
  new_starts = np.cumsum(offsets) - offsets[0]
  offsets = np.roll(offsets, -1)
  rand = random.rand(m) if hasattr(random, "rand") else random.random(m)
  return np.floor(new_starts + offsets * rand).astype(int)


@pytest.mark.parametrize("n,m", [(10, 4), (80, 80), (123, 80), (11, 3), (500, 80), (2, 1)])
def test_train_sampler_matches_the_official_draws(n, m):
  # RandomState(s) replays what np.random.seed(s) gives the official code.
  for seed in range(3):
    np.testing.assert_array_equal(
        video_lib.coot_frame_indices(n, m, np.random.RandomState(seed)),
        _official_compute_indices(n, m, np.random.RandomState(seed)))
    np.testing.assert_array_equal(
        video_lib.coot_frame_indices(n, m, np.random.default_rng(seed)),
        _official_compute_indices(n, m, np.random.default_rng(seed)))


@pytest.mark.parametrize("args,expected", [
    ((20, 10, 0, 3), (0, 10, True)),      # at the start: grows right only
    ((20, 10, 18, 20), (10, 20, True)),   # at the end: grows left only
    ((20, 10, 8, 10), (4, 14, True)),     # middle: left, right, left, ... (4 each side)
    ((20, 5, 10, 12), (8, 13, True)),     # odd growth: left 9, right 13, left 8
    ((5, 10, 1, 2), (0, 5, True)),        # video shorter than the minimum: the whole video
    ((20, 10, 2, 15), (2, 15, False)),    # long enough already
    ((20, 0, 3, 4), (3, 4, False)),       # YouCook2: expand_segments 0
    ((20, 10, 23, 20), (10, 20, True)),   # starts past the end: -3 frames, grows left to 10
])
def test_expand_segment_worked_examples(args, expected):
  assert video_lib.expand_segment(*args) == expected


# ---------------------------------------------------------------- the coot dataset

# ActivityNet-like: 50 frames over 100 s (fps 0.5), add_stop_frame 1, expand_segments 10.
ANET_SEGMENTS = [
    # start floor(0) = 0, stop ceil(4.5) + 1 = 6: 6 frames, grown right to 0..10
    {"start_sec": 0.0, "stop_sec": 9.0, "text": "A man walks in."},
    # floor(15.15) = 15, ceil(20.5) + 1 = 22: 7 frames; left 14, right 23, left 13 -> 13..23
    {"start_sec": 30.3, "stop_sec": 41.0, "text": "He sits  down."},
    # reversed: swapped to 80..99 s: 40, min(ceil(49.5) + 1, 50) = 50: 10 frames
    {"start_sec": 99.0, "stop_sec": 80.0, "text": "He waves."},
    # 48, min(50 + 1, 50) = 50: 2 frames, grown left only to 40..50
    {"start_sec": 96.0, "stop_sec": 100.0, "text": "He leaves."},
]
ANET_FRAMES = [[0, 10], [13, 10], [40, 10], [40, 10]]

# YouCook2-like: 7 frames over 14 s (fps 0.5), add_stop_frame 2, expand_segments 0.
YC2_SEGMENTS = [
    {"start_sec": 0.0, "stop_sec": 3.0, "text": "cut the onion"},  # 0, ceil(1.5) + 2 = 4
    {"start_sec": 5.0, "stop_sec": 12.2, "text": "fry it"},  # 2, min(ceil(6.1) + 2, 7) = 7
]
YC2_FRAMES = [[0, 4], [2, 5]]

VIDEO_DIM, TEXT_DIM = 6, 4


def _sentence_lengths(n):
  return [3 + i for i in range(n)]


def write_dataset(path, source):
  """Three keys: two train videos (the first also in val_1 as its own key), one val_1."""
  rng = np.random.default_rng(0)
  if source == "npz_activitynet":
    segments, frames, duration = ANET_SEGMENTS, 50, 100.0
  else:
    segments, frames, duration = YC2_SEGMENTS, 7, 14.0
  videos = {"vidA": rng.normal(size=(frames, VIDEO_DIM)),
            "vidB": rng.normal(size=(frames + 3, VIDEO_DIM))}
  meta = {
      "vidA_train": {"data_key": "vidA", "split": "train", "duration_sec": duration,
                     "segments": segments, "url": "ignored"},
      "vidB_train": {"data_key": "vidB", "split": "train", "duration_sec": duration,
                     "segments": segments[:2]},
      "vidA_val_1": {"data_key": "vidA", "split": "val_1", "duration_sec": duration,
                     "segments": segments[:1]},
  }
  lengths = {k: _sentence_lengths(len(v["segments"])) for k, v in meta.items()}
  texts = {k: rng.normal(size=(sum(n), TEXT_DIM)) for k, n in lengths.items()}
  coot_files.write_meta(path, meta)
  if source == "npz_activitynet":
    coot_files.write_video_features_npz(path, "icep", videos)
  else:
    coot_files.write_video_features_h5(path, "icep", videos)
  coot_files.write_text_features(path, "txt", texts, lengths)
  return meta, videos, texts


def dataset_config(path, source, **overrides):
  anet = source == "npz_activitynet"
  return ml_collections.ConfigDict({
      "name": "coot", "path": str(path), "metadata_name": "all", "video_features": "icep",
      "video_source": source, "video_dim": VIDEO_DIM, "text_features": "txt",
      "text_dim": TEXT_DIM, "add_stop_frame": 1 if anet else 2,
      "expand_segments": 10 if anet else 0, "max_datapoints": -1, **overrides})


@pytest.mark.parametrize("source,expected", [("npz_activitynet", ANET_FRAMES),
                                             ("h5", YC2_FRAMES)])
def test_dataset_reads_the_layout_with_official_segments(tmp_path, source, expected):
  meta, videos, texts = write_dataset(tmp_path, source)
  config = dataset_config(tmp_path, source)
  train = builders.get_source(config, "train")
  assert train.kind == builders.FEATURES and len(train) == 2
  assert train.keys == ["vidA_train", "vidB_train"]
  item = train[0]
  assert item["id"] == "vidA_train"
  np.testing.assert_array_equal(item["segments"], expected)
  assert item["segments"].dtype == np.int32 and item["video"].dtype == np.float32
  np.testing.assert_allclose(item["video"], videos["vidA"], rtol=1e-6)
  np.testing.assert_allclose(item["text"], texts["vidA_train"], rtol=1e-6)
  assert item["text"].dtype == np.float32
  np.testing.assert_array_equal(item["sentence_lengths"], _sentence_lengths(len(expected)))
  assert item["sentences"] == [s["text"] for s in meta["vidA_train"]["segments"]]
  described = train.describe(1)
  assert "video" not in described and "text" not in described
  assert described["num_frames"] == len(videos["vidB"])
  # The num-frames cache lists the videos read (COOT's <features>_num_frames.json).
  cache = json.loads((tmp_path / "icep_num_frames.json").read_text())
  assert cache == {"vidA": len(videos["vidA"]), "vidB": len(videos["vidB"])}
  # Another split of the same video, and a pickled copy (grain workers) read the same.
  val = builders.get_source(config, "val_1")
  assert val.keys == ["vidA_val_1"]
  np.testing.assert_array_equal(val[0]["segments"], expected[:1])
  np.testing.assert_array_equal(val[0]["video"], item["video"])
  copy = pickle.loads(pickle.dumps(train))
  np.testing.assert_array_equal(copy[1]["video"], train[1]["video"])
  np.testing.assert_array_equal(copy[0]["text"], item["text"])
  config.max_datapoints = 1
  assert builders.get_source(config, "train").keys == ["vidA_train"]


def test_dataset_split_alias_and_legacy_text_keys(tmp_path):
  write_dataset(tmp_path, "h5")
  meta = json.loads((tmp_path / "meta_all.json").read_text())
  meta["vidB_train"]["split"] = "val"
  coot_files.write_meta(tmp_path, meta)
  # Old COOT releases name text features v_<key[:11]>.
  legacy = coot_files.legacy_text_key("vidB_train")
  assert legacy == "v_vidB_train"
  with h5py.File(tmp_path / "txt.h5", "a") as h5:
    h5.move("vidB_train", legacy)
  splits = json.loads((tmp_path / "txt_sentence_splits.json").read_text())
  splits[legacy] = splits.pop("vidB_train")
  (tmp_path / "txt_sentence_splits.json").write_text(json.dumps(splits))
  val = builders.get_source(dataset_config(tmp_path, "h5"), "validation")
  assert val.keys == ["vidB_train"] and val[0]["text"].shape == (3 + 4, TEXT_DIM)


def test_segment_frames_rule():
  from avtext.data.builders import coot
  np.testing.assert_array_equal(
      coot.segment_frames(50, 100.0, ANET_SEGMENTS, add_stop_frame=1, expand_segments=10),
      ANET_FRAMES)
  # Without expansion, ActivityNet's segments as computed: 0..6, 15..22, 40..50, 48..50.
  np.testing.assert_array_equal(
      coot.segment_frames(50, 100.0, ANET_SEGMENTS, add_stop_frame=1, expand_segments=0),
      [[0, 6], [15, 7], [40, 10], [48, 2]])
  with pytest.raises(ValueError, match=r"k: segment 0 \(60.0 s to 70.0 s\) has no frames"):
    coot.segment_frames(50, 50.0, [{"start_sec": 60.0, "stop_sec": 70.0}], add_stop_frame=1,
                        expand_segments=0, where="k: ")


def _edit_json(path, edit):
  value = json.loads(path.read_text())
  edit(value)
  path.write_text(json.dumps(value))


def _edit_h5(path, edit):
  with h5py.File(path, "a") as h5:
    edit(h5)


def _replace(h5, key, value):
  del h5[key]
  h5[key] = value


# (video source, edit of the directory or config, exception, message).
BAD = {
    "no path": ("h5", lambda p, c: c.update(path=None), ValueError,
                r"config.dataset.path is not set"),
    "no meta": ("h5", lambda p, c: (p / "meta_all.json").unlink(), FileNotFoundError,
                r"meta_all.json not found.*data_read_activitynet_meta.py.*"
                r"avtext.features.coot_text"),
    "empty split": ("h5", lambda p, c: c.update(split="test"), ValueError,
                    r"meta_all.json: no videos in split 'test'; its splits are "
                    r"\['train', 'val_1'\]"),
    "meta field": ("h5", lambda p, c: _edit_json(
        p / "meta_all.json", lambda m: m["vidB_train"].pop("duration_sec")), ValueError,
                   r"meta_all.json: entry 'vidB_train' has no field 'duration_sec'"),
    "segment field": ("h5", lambda p, c: _edit_json(
        p / "meta_all.json", lambda m: m["vidB_train"]["segments"][1].pop("stop_sec")),
                      ValueError, r"'vidB_train', segment 1 has no field 'stop_sec'"),
    "video source": ("h5", lambda p, c: c.update(video_source="lmdb"), ValueError,
                     r"video_source='lmdb'; expected one of \('h5', 'npz_activitynet'\)"),
    "h5 data_key": ("h5", lambda p, c: _edit_h5(p / "icep.h5", lambda h5: h5.pop("vidB")),
                    ValueError, r"icep.h5: no video 'vidB' \(the data_key of 'vidB_train'"),
    "npz data_key": ("npz_activitynet",
                     lambda p, c: (p / "features/icep/v_vidB.npz").unlink(), FileNotFoundError,
                     r"video features of 'vidB_train' \(data_key 'vidB'\): \S*v_vidB.npz not "
                     r"found"),
    "npz shape": ("npz_activitynet", lambda p, c: np.savez(
        p / "features/icep/v_vidB.npz", frame_scores=np.zeros((4, VIDEO_DIM))), ValueError,
                  r"v_vidB.npz: frame_scores has shape \[4, 6\]; expected \[T, 1, D, 1, 1\]"),
    "h5 video dim": ("h5", lambda p, c: c.update(video_dim=7), ValueError,
                     r"^config.dataset.video_dim=7: the features in \S*icep.h5, video "
                     r"'vid[AB]' are 6-d; set --config.dataset.video_dim=6 "
                     r"--config.model.video_dim=6"),
    "npz video dim": ("npz_activitynet", lambda p, c: c.update(video_dim=7), ValueError,
                      r"config.dataset.video_dim=7: the features in \S*v_vid[AB].npz are "
                      r"6-d"),
    "no text file": ("h5", lambda p, c: (p / "txt.h5").unlink(), FileNotFoundError,
                     r"text features \S*txt.h5 not found.*coot_text"),
    "no splits file": ("h5", lambda p, c: (p / "txt_sentence_splits.json").unlink(),
                       FileNotFoundError, r"sentence splits \S*txt_sentence_splits.json not "
                       r"found"),
    "text key": ("h5", lambda p, c: _edit_h5(p / "txt.h5", lambda h5: h5.pop("vidB_train")),
                 ValueError, r"txt.h5: no text features for 'vidB_train' \(nor 'v_vidB_train'\)"),
    "text dim": ("h5", lambda p, c: c.update(text_dim=5), ValueError,
                 r"config.dataset.text_dim=5: the features in \S*txt.h5 \('vidA_train'\) "
                 r"are 4-d; set --config.dataset.text_dim=4 --config.model.text_dim=4"),
    "splits sum": ("h5", lambda p, c: _edit_json(
        p / "txt_sentence_splits.json", lambda s: s.update(vidB_train=[3, 3])), ValueError,
                   r"txt_sentence_splits.json: the sentence splits of 'vidB_train', \[3, 3\], "
                   r"sum to 6 but \S*txt.h5 holds 7 tokens"),
    "splits count": ("h5", lambda p, c: (
        _edit_json(p / "txt_sentence_splits.json", lambda s: s.update(vidB_train=[3, 2, 2]))),
                     ValueError, r"'vidB_train': 2 segments in \S*meta_all.json but 3 "
                     r"sentences in \S*txt_sentence_splits.json"),
    "no frames": ("h5", lambda p, c: _edit_json(
        p / "meta_all.json", lambda m: m["vidB_train"]["segments"][1].update(start_sec=40.0,
                                                                            stop_sec=41.0)),
                  ValueError, r"meta_all.json, 'vidB_train': segment 1 \(40.0 s to 41.0 s\) "
                  r"has no frames in a video of 10 frames"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_dataset_errors_name_the_file_and_field(tmp_path, case):
  source, edit, error, message = BAD[case]
  write_dataset(tmp_path, source)
  config = dataset_config(tmp_path, source)
  split = {"split": "train"}
  edit(tmp_path, _Config(config, split))
  with pytest.raises(error, match=message) as raised:
    builders.get_source(config, split["split"])
  assert isinstance(raised.value, cli.USER_ERRORS)  # one `error:` line, exit 2


class _Config:
  """Lets a case edit the config or the split with one `update`."""

  def __init__(self, config, split):
    self.config, self.split = config, split

  def update(self, **kw):
    for k, v in kw.items():
      (self.split if k == "split" else self.config)[k] = v


def test_stale_frame_count_is_an_error_when_read(tmp_path):
  write_dataset(tmp_path, "h5")
  _edit_json(tmp_path / "icep_num_frames.json", lambda c: c.update(vidB=9))
  source = builders.get_source(dataset_config(tmp_path, "h5"), "train")
  assert source.describe(1)["num_frames"] == 9  # trusted, as COOT's loader does
  with pytest.raises(ValueError, match=r"icep.h5, video 'vidB': 10 frames but \S*"
                     r"icep_num_frames.json says 9; delete that stale cache"):
    source[1]


# ---------------------------------------------------------------- text features

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "man", "walk", "##s", "he", "sit",
         "the", "dog", "run", "fast", "."]
ID = {w: i for i, w in enumerate(VOCAB)}


def test_bert_paper_preprocessing():
  # nntrainer/data_text.py "bert_paper": whitespace collapsed, trailing dot dropped ("..."
  # kept), inner ". " -> [SEP], [CLS] first, [SEP] after each sentence, case kept.
  sentences = ["A man  walks.", " He sits. The dog runs fast", "Wait..."]
  assert coot_text.bert_paper_sentences(sentences) == [
      "[CLS] A man walks [SEP]", "He sits [SEP] The dog runs fast [SEP]", "Wait... [SEP]"]
  assert coot_text.bert_paper_paragraph(sentences[:2]) == (
      "[CLS] A man walks [SEP] He sits [SEP] The dog runs fast [SEP]")
  with pytest.raises(ValueError, match="sentence 1 of the paragraph is empty"):
    coot_text.bert_paper_sentences(["a", "  "])


def test_cut_follows_precompute_text():
  # [6, 10] tokens, max 12: the last sentence loses 16 - 12 = 4 -> first 5 + its last.
  pieces = [list(range(6)), list(range(10, 20))]
  assert coot_text.cut_to_length(pieces, 12, "k") == [
      list(range(6)), [10, 11, 12, 13, 14, 19]]
  # [10, 3], max 10: the last gets max(5, 3 - 3) = 5 (the official code then keeps its 3
  # tokens + its last again), the first max(5, 10 - 5) = 5: first 4 + last.
  assert coot_text.cut_to_length([list(range(10)), [20, 21, 22]], 10, "k") == [
      [0, 1, 2, 3, 9], [20, 21, 22, 22]]
  with pytest.raises(ValueError, match=r"paragraph 'k': its 3 sentences do not fit "
                     r"max_len=8 tokens even when cut to 5 tokens each"):
    coot_text.cut_to_length([list(range(6)), [1, 2], [3, 4, 5]], 8, "k")


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
  """(directory, FlaxBertModel): a random 2-layer BERT over VOCAB in HF's PyTorch naming."""
  import transformers  # pylint: disable=g-import-not-at-top
  from test_models_bert import _export_pytorch_named  # pylint: disable=g-import-not-at-top
  config = transformers.BertConfig(
      vocab_size=len(VOCAB), hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
      intermediate_size=16, max_position_embeddings=32)
  model = transformers.FlaxBertModel(config, seed=0)
  directory = tmp_path_factory.mktemp("data") / "tiny-bert"
  directory.mkdir()
  _export_pytorch_named(model, directory, "")
  (directory / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
  return directory, model


def _hf_states(model, sequences):
  """FlaxBertModel's hidden states 0, 1, 2 of each id list, concatenated: one padded call."""
  import jax  # pylint: disable=g-import-not-at-top
  width = max(map(len, sequences))
  ids = np.zeros((len(sequences), width), np.int32)
  mask = np.zeros_like(ids)
  for row, seq in enumerate(sequences):
    ids[row, :len(seq)], mask[row, :len(seq)] = seq, 1
  with jax.default_matmul_precision("highest"):
    states = model(ids, attention_mask=mask, output_hidden_states=True).hidden_states
  out = np.concatenate([np.asarray(state) for state in states], -1)  # [B, L, 3 x 8]
  return [out[row, :len(seq)] for row, seq in enumerate(sequences)]


PARAGRAPHS = {
    "p1": ["A man  walks.", "He sits. The dog runs fast"],
    "p2": ["The dog."],
    "p3": ["Zebra runs"],
}
TOKENS = {  # by hand: greedy WordPiece over VOCAB, lower-cased, [UNK] for "zebra"
    "p1": [["[CLS]", "a", "man", "walk", "##s", "[SEP]"],
           ["he", "sit", "##s", "[SEP]", "the", "dog", "run", "##s", "fast", "[SEP]"]],
    "p2": [["[CLS]", "the", "dog", "[SEP]"]],
    "p3": [["[CLS]", "[UNK]", "run", "##s", "[SEP]"]],
}


def test_encode_paragraphs_are_bert_hidden_states(tiny_bert):
  directory, model = tiny_bert
  features, lengths = coot_text.encode_paragraphs(PARAGRAPHS, bert_dir=str(directory),
                                                  batch_size=2)
  assert list(features) == list(PARAGRAPHS)
  ids = {k: [ID[t] for s in sentences for t in s] for k, sentences in TOKENS.items()}
  # Below, the official cut at max_len=12: p1's second sentence keeps 5 tokens and [SEP].
  ids["p1 cut"] = [ID[t] for t in TOKENS["p1"][0] + TOKENS["p1"][1][:5] + ["[SEP]"]]
  want = dict(zip(ids, _hf_states(model, list(ids.values()))))
  for key, sentences in TOKENS.items():
    assert lengths[key] == [len(s) for s in sentences]
    assert features[key].dtype == np.float32 and features[key].shape == (len(ids[key]), 16)
    np.testing.assert_allclose(features[key], want[key][..., 8:], atol=2e-5)  # layers -2, -1
  features, lengths = coot_text.encode_paragraphs({"p1": PARAGRAPHS["p1"]},
                                                  bert_dir=str(directory), layers=(0, 1),
                                                  max_len=12)
  assert lengths == {"p1": [6, 6]}
  np.testing.assert_allclose(features["p1"], want["p1 cut"][..., :16], atol=2e-5)  # 0: embeddings
  with pytest.raises(ValueError, match=r"layers=\(3,\): .* has 3 hidden states"):
    coot_text.encode_paragraphs(PARAGRAPHS, bert_dir=str(directory), layers=(3,))


def test_cased_tokenizer_config_keeps_case(tiny_bert, tmp_path):
  directory, _ = tiny_bert
  cased = tmp_path / "cased"
  cased.mkdir()
  for f in directory.iterdir():
    (cased / f.name).symlink_to(f)
  (cased / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
  _, lengths = coot_text.encode_paragraphs({"k": ["The dog"]}, bert_dir=str(cased))
  assert lengths == {"k": [4]}  # [CLS] [UNK] dog [SEP]: "The" is not in the uncased vocab


def test_precompute_command_writes_what_the_dataset_reads(tiny_bert, tmp_path):
  from avtext.features import coot_text as tool
  directory, model = tiny_bert
  data = tmp_path / "mydata"
  write_dataset(data, "h5")
  meta = json.loads((data / "meta_all.json").read_text())
  meta["vidB_train"]["segments"] = [{"start_sec": 0.0, "stop_sec": 2.0, "text": "He sits."},
                                    {"start_sec": 4.0, "stop_sec": 9.0, "text": "The dog"}]
  coot_files.write_meta(data, meta)
  name = "text_feat_mydata_meta_all_transformers_tiny-bert_-2,-1"
  assert tool.default_name(data, "all", str(directory), (-2, -1)) == name
  assert tool.parse_layers("-2,-1") == (-2, -1)
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):  # the program, as `python -m avtext.features`
    cli.run(tool.main, tool.FLAGS, ["python -m avtext.features coot_text",
                                    f"--dataset_dir={data}", f"--bert_dir={directory}",
                                    "--layers=-2,-1", "--batch_size=2"])
  assert printed.getvalue().strip() == str(data / f"{name}.h5")
  splits = json.loads((data / f"{name}_sentence_splits.json").read_text())
  assert splits["vidB_train"] == [5, 3]  # [CLS] he sit ##s [SEP] | the dog [SEP]
  source = builders.get_source(
      dataset_config(data, "h5", text_features=name, text_dim=16), "train")
  item = source[1]
  ids = [ID[t] for t in ["[CLS]", "he", "sit", "##s", "[SEP]", "the", "dog", "[SEP]"]]
  np.testing.assert_allclose(item["text"], _hf_states(model, [ids])[0][:, 8:], atol=2e-5)
  # Existing features are kept unless forced.
  before = (data / f"{name}.h5").stat().st_mtime_ns
  tool.precompute(data, bert_dir=str(directory))
  assert (data / f"{name}.h5").stat().st_mtime_ns == before
  with pytest.raises(FileNotFoundError, match=r"meta_other.json not found"):
    tool.precompute(data, metadata_name="other", bert_dir=str(directory))


# ---------------------------------------------------------------- synthetic world


def test_multiscene_video_renders_by_owning_scene():
  spec = world.WorldSpec(height=32, width=32)
  source = multiscene.MultiSceneSource("val", num_examples=5, spec=spec)
  d = source.describe(2)
  video = source.video(2)
  bounds = video.boundaries
  assert 3 <= len(d["segments"]) <= 8 and bounds[0] == 0 and np.all(np.diff(bounds) >= 2.0 - 1e-9)
  for a, b in zip(video.scenes, video.scenes[1:]):
    assert a.attributes() != b.attributes()
  for seg in d["segments"]:
    assert captions.caption_fits(seg["mentioned"], seg["attributes"])
  k = 1
  first = int(round(bounds[k] * spec.fps))  # the first frame of scene k
  np.testing.assert_array_equal(source.render_frames(2, [first, first - 1]), np.concatenate([
      world.render_frames(video.scenes[k], [0.0], spec),
      world.render_frames(video.scenes[k - 1], [(first - 1) / spec.fps - bounds[k - 1]], spec)]))
  full = source.render_audio(2)
  np.testing.assert_array_equal(source.render_audio(2, 12345, 40000), full[12345:52345])
  # Random access: example 2 alone equals example 2 after others; splits differ.
  other = multiscene.MultiSceneSource("val", num_examples=5, spec=spec)
  assert other.describe(2) == d
  assert multiscene.MultiSceneSource("test", num_examples=5, spec=spec).describe(2) != d


def test_feature_windows_are_centred_and_clamped():
  from avtext.features import tower
  w = tower.window_frames(num_frames=100, fps=25, feature_fps=2, frames_per_window=4,
                          stride=8)
  # 4 s -> 8 steps centred at 0.25 s + 0.5 s k = frame 6.25 -> 6, 19 (round half even), ...
  assert w.shape == (8, 4)
  np.testing.assert_array_equal(w[0], [0, 2, 10, 18])  # 6 - 12 clamped to 0
  np.testing.assert_array_equal(w[1], [7, 15, 23, 31])  # centre round(18.75) = 19
  assert w.max() == 99


def test_synthetic_text_features_follow_the_precompute_naming(tmp_path):
  from avworld import coot_layout  # pylint: disable=g-import-not-at-top
  assert coot_layout.TEXT_FEATURES == coot_text.default_name(
      tmp_path / "synthetic", "all", None, (-2, -1))
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location("coot_cfg", "configs/coot_activitynet.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config("demo")
  assert config.dataset.text_features == coot_layout.TEXT_FEATURES
  assert config.dataset.video_features == coot_layout.VIDEO_FEATURES
