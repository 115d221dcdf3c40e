"""S-MiT datasets: `smit_features` (phase-1 features) and `smit` (the real clips).

`smit_features` (kind 'features'): config.dataset.path = a directory holding

  meta.json      {"format": "avtext.smit_features/1", "splits": {split: N, ...},
                  "origin": the clips dataset config it was computed from, or null,
                  ...}  (other keys are provenance: model config, command)
  <split>.h5     one HDF5 file per split ('validation' is read as 'val'), datasets:
                   ids                 str [N]              clip ids
                   image_embedding     float32 [N, D_i]     frozen image backbone, pooled
                   temporal_embedding  float32 [N, D_t]     frozen temporal backbone, pooled
                   words               float16 [sum_i W_i, D_w]  frozen text encoder, one
                                       row per word of each ASR transcript (optional:
                                       language-caption models)
                   word_offsets        int64 [N + 1]        item i's words are rows
                                                            word_offsets[i]:[i+1]
                   log_mel             float16 [sum_i T_i, 40]   whole spoken caption,
                                       40-bin log-mel, 100 frames/s (optional: spoken)
                   log_mel_offsets     int64 [N + 1]
                   transcript, caption str [N]              (optional, for reading)

`python -m avtext.features smit` writes it from any clips dataset and a config's
frozen backbones and text encoder; real S-MiT users who extracted ResNet-152 / TSM
features themselves write the same datasets (either embedding may be absent when
the model has no such backbone). A split is read into memory when it opens (S-MiT's
500k clips are ~10 GB of words at D_w = 768 in float16; use a smaller D_w or fewer
clips on a small machine). When `origin` names a dataset that declares its ground truth
(`avtext.data.ground_truth.of_dataset`: a world's, which reopens without files), the
source also answers `describe`, `oracle_recall_at_1` and `query_groups` from it, for the
evaluator's oracle lines.

`smit` (kind 'clips'): the real Spoken Moments clips, read from the files (phase 2 from
frames, and the input of `avtext.features.smit` for phase 1).
config.dataset.path = DIR holding, per split, DIR/<split>.csv ('validation' is read as
'val'; DIR/validation.csv is accepted for val) with a header row and the columns

  video_id         the clip's id (unique in the split)
  video            the clip's video file (S-MiT: a 3 s Moments in Time mp4), a path
                   relative to DIR or absolute
  spoken_caption   the spoken caption's audio file (wav / flac / mp3 / m4a; any sample
                   rate: read as 16 kHz mono), relative to DIR or absolute
  transcript       its ASR transcript, the text the language-caption model reads

Every file is probed when a split opens (`builders.media_clips.MediaClips`): a bad video is
put aside and counted by reason (missing / empty / unreadable / no_video / truncated /
short); with dataset.spoken (default True; the language configs set False, so no
caption audio is opened) a bad spoken caption puts its row aside too, counted under the
same reasons (no_audio: a caption file without sound). A row whose transcript is empty
is an error naming the file and line. Other fields are `media_clips.options`' (fps 25,
short_side, min_seconds 1 s, on_bad, verify, probe_cache).
"""
import json
import os
import pathlib
from typing import Any

import ml_collections
import numpy as np

from avtext import errors
from avtext.data import builders
from avtext.data import ground_truth
from avtext.data import array_store
from avtext.data.builders import media_clips

FORMAT = "avtext.smit_features/1"
_PER_ITEM = ("image_embedding", "temporal_embedding")
_RAGGED = ("words", "log_mel")


class SMiTFeatures:
  """One split of an `smit_features` directory, in memory (module docstring)."""
  kind = builders.FEATURES

  def __init__(self, path: str, split: str, origin_source=None):
    import h5py  # pylint: disable=g-import-not-at-top
    self.path = os.path.join(path, f"{split}.h5")
    if not os.path.isfile(self.path):
      raise FileNotFoundError(f"{self.path}: no such file; an smit_features directory holds "
                              "<split>.h5 for each split (avtext/data/builders/smit.py; write "
                              "one with `python -m avtext.features smit`)")
    self.arrays: dict[str, np.ndarray] = {}
    with h5py.File(self.path, "r") as f:
      if "ids" not in f:
        raise array_store.FeatureError(f"{self.path}: no dataset 'ids' (str [N])")
      self.ids = [x.decode() if isinstance(x, bytes) else str(x) for x in f["ids"][()]]
      n = len(self.ids)
      for key in _PER_ITEM + _RAGGED + ("transcript", "caption"):
        if key not in f:
          continue
        value = f[key][()]
        if key in _PER_ITEM and (value.ndim != 2 or len(value) != n):
          raise array_store.FeatureError(f"{self.path}, {key!r}: expected [N={n}, D], got "
                                      f"{value.shape}")
        self.arrays[key] = value
      for key in _RAGGED:
        if key not in self.arrays:
          continue
        off = f"{key}_offsets"
        if off not in f:
          raise array_store.FeatureError(f"{self.path}: {key!r} without {off!r} (int64 [N+1])")
        offsets = np.asarray(f[off][()], np.int64)
        if (offsets.shape != (n + 1,) or offsets[0] != 0 or np.any(np.diff(offsets) < 0)
            or offsets[-1] != len(self.arrays[key])):
          raise array_store.FeatureError(
              f"{self.path}, {off!r}: expected N+1={n + 1} non-decreasing offsets from 0 to "
              f"{len(self.arrays[key])} (the rows of {key!r}), got shape {offsets.shape}")
        self.arrays[off] = offsets
    if not any(k in self.arrays for k in _PER_ITEM):
      raise array_store.FeatureError(f"{self.path}: holds neither 'image_embedding' nor "
                                  "'temporal_embedding'")
    self.schema = {k: None for k in self.arrays if not k.endswith("_offsets")}
    self._origin = origin_source
    if origin_source is not None and len(origin_source) != len(self.ids):
      raise ValueError(f"{self.path}: {len(self.ids)} items but its origin dataset has "
                       f"{len(origin_source)}; rebuild the features")

  def __len__(self) -> int:
    return len(self.ids)

  def __repr__(self) -> str:
    return f"SMiTFeatures({self.path!r}, {len(self)} items, keys {sorted(self.schema)})"

  def __getitem__(self, index: int) -> dict[str, Any]:
    i = int(index)
    out: dict[str, Any] = {"id": self.ids[i]}
    for key in _PER_ITEM:
      if key in self.arrays:
        out[key] = self.arrays[key][i]
    for key in _RAGGED:
      if key in self.arrays:
        lo, hi = self.arrays[f"{key}_offsets"][i:i + 2]
        out[key] = self.arrays[key][lo:hi]
    for key in ("transcript", "caption"):
      if key in self.arrays:
        v = self.arrays[key][i]
        out[key] = v.decode() if isinstance(v, bytes) else str(v)
    return out

  # The origin's ground truth, when the features came from a world.
  def describe(self, index: int) -> dict:
    if self._origin is None:
      raise AttributeError("describe")
    return self._origin.describe(index)

  def __getattr__(self, name):
    if (name in ("oracle_recall_at_1", "query_groups")
        and self.__dict__.get("_origin") is not None):
      return getattr(self._origin, name)
    raise AttributeError(name)


@builders.register_dataset("smit_features")
def smit_features(dataset: ml_collections.ConfigDict, split: str) -> SMiTFeatures:
  path = dataset.get("path")
  if not path:
    raise errors.BadInput(
        "config.dataset.path is unset: point it at an smit_features directory "
        "(meta.json + <split>.h5, layout in avtext/data/builders/smit.py). Write one with "
        "`python -m avtext.features smit --config=<your smit config> --out=DIR`, or, "
        "for real S-MiT, from your own ResNet-152 / TSM-R50 features in that layout")
  meta_file = os.path.join(os.fspath(path), "meta.json")
  if not os.path.isfile(meta_file):
    raise FileNotFoundError(f"{meta_file}: no such file; an smit_features directory holds "
                            "meta.json and <split>.h5 (avtext/data/builders/smit.py)")
  meta = json.loads(open(meta_file, encoding="utf-8").read())
  if meta.get("format") != FORMAT:
    raise ValueError(f"{meta_file}: format {meta.get('format')!r}, expected {FORMAT!r}")
  split = "val" if split == "validation" else split
  origin = None
  if meta.get("origin") and meta["origin"].get("name") in builders.registered_names():
    origin_config = ml_collections.ConfigDict(meta["origin"])
    if ground_truth.of_dataset(origin_config) is not None:
      origin = builders.get_source(origin_config, split)
  return SMiTFeatures(os.fspath(path), split, origin)


SPLIT_FILES = {"train": ("train.csv",), "val": ("val.csv", "validation.csv"),
               "test": ("test.csv",)}
COLUMNS = ("video_id", "video", "spoken_caption", "transcript")
PREPARE = (
    "Download Spoken Moments (moments.csail.mit.edu/spoken.html) and write, per split, "
    "DIR/{train,val,test}.csv with the header video_id,video,spoken_caption,transcript "
    "(paths relative to DIR; layout in avtext/data/builders/smit.py), then set "
    "--config.dataset.path=DIR (phase 2) or --config.features_source.path=DIR "
    "(`python -m avtext.features smit`, phase 1). No download at hand: the demo world "
    "writes this layout (docs/smit.md); the whole experiment on the demo world's S-MiT: "
    "`make demo-smit` or the ':demo' variant")


class SpokenMomentsClips(media_clips.MediaClips):
  """S-MiT clips from the user's files (module docstring): `MediaClips` over the videos
  (caption = the ASR transcript), plus `describe(i)['transcript']` and `render_speech(i)`,
  the spoken caption as float32 16 kHz mono. The caption audio is a second `MediaClips`
  (need='audio') over the spoken-caption files, so they are probed, counted and raised on
  as every media file is; a row is kept when both of its files are."""

  def __init__(self, rows: list[dict[str, str]], *, where: str, spoken: bool = True,
               **options):
    self.has_speech = spoken
    self._speech, self._speech_index = None, {}
    if spoken:
      self._speech = media_clips.MediaClips(
          [media_clips.Entry(r["spoken_caption"], r["transcript"], r["video_id"], r["video_id"])
           for r in rows], where=f"{where} spoken captions",
          **{**options, "need": "audio", "min_seconds": 0.0, "substitute": False,
             "allow_empty": True})
      self._speech_index = {e.clip_id: j for j, e in enumerate(self._speech.entries)}
      rows = [r for r in rows if r["video_id"] in self._speech_index]
    super().__init__([media_clips.Entry(r["video"], r["transcript"], r["video_id"], r["video_id"])
                      for r in rows], where=where, **options)
    if spoken:
      self.skipped = self._speech.skipped + self.skipped

  def describe(self, index: int) -> dict[str, Any]:
    out = super().describe(index)
    out["transcript"] = out["caption"]
    return out

  def render_speech(self, index: int) -> np.ndarray:
    """float32 16 kHz mono samples of clip `index`'s whole spoken caption."""
    e, _ = self._get(index)
    if self._speech is None:
      raise ValueError(f"{self.where}: opened with config.dataset.spoken=False (no spoken "
                       "captions); set it True for a spoken-caption model")
    return self._speech.render_audio(self._speech_index[e.clip_id])

  def __getitem__(self, index: int) -> dict[str, Any]:
    out = super().__getitem__(index)
    out["transcript"] = out["caption"]
    if self._speech is not None:
      out["spoken_caption"] = self.render_speech(index)
    return out


def read_rows(root: pathlib.Path, split: str) -> list[dict[str, str]]:
  """The split's CSV rows (module docstring), paths made absolute; errors name the file
  and line."""
  split = "val" if split == "validation" else split
  if split not in SPLIT_FILES:
    raise ValueError(f"smit: no split {split!r}; splits: {', '.join(SPLIT_FILES)}")
  names = SPLIT_FILES[split]
  path = next((root / n for n in names if (root / n).is_file()), root / names[0])
  path = media_clips.require_file(path, f"the S-MiT {split} list", PREPARE)
  rows, seen = [], {}
  for line, row in enumerate(media_clips.read_csv_rows(path, COLUMNS), start=2):
    for key in ("video_id", "video", "spoken_caption", "transcript"):
      if not row[key].strip():
        raise ValueError(f"{path}, line {line}: empty {key!r} (expected {', '.join(COLUMNS)})")
    if row["video_id"] in seen:
      raise ValueError(f"{path}, line {line}: video_id {row['video_id']!r} again (first on "
                       f"line {seen[row['video_id']]}); ids must be unique in a split")
    seen[row["video_id"]] = line
    rows.append({**row, "video": str(root / row["video"]),
                 "spoken_caption": str(root / row["spoken_caption"])})
  return rows


@builders.register_dataset("smit")
def smit_clips(dataset: ml_collections.ConfigDict, split: str) -> SpokenMomentsClips:
  root = media_clips.require_path(dataset, "S-MiT", PREPARE)
  rows = read_rows(root, split)
  keep = dataset.get("num_train") if split == "train" else dataset.get("num_eval")
  rows = rows[:keep] if keep else rows
  return SpokenMomentsClips(rows, spoken=dataset.get("spoken", True), **media_clips.options(
      dataset, split, f"smit {split!r} under {root}"))
