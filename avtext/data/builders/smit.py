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

`python -m avtext.tools.smit_features` writes it from any clips dataset and a config's
frozen backbones and text encoder; real S-MiT users who extracted ResNet-152 / TSM
features themselves write the same datasets (either embedding may be absent when
the model has no such backbone). A split is read into memory when it opens (S-MiT's
500k clips are ~10 GB of words at D_w = 768 in float16; use a smaller D_w or fewer
clips on a small machine). When `origin` names a synthetic dataset, the source also
answers `describe` and `oracle_recall_at_1` from it, for the evaluator's oracle line.

`smit` (the real Spoken Moments clips, for phase 2 from frames): needs video decoding,
which avtext gets with the real-video issue (avtext/data/video_io.py); until then it
raises, saying what to prepare.
"""
import json
import os
from typing import Any

import ml_collections
import numpy as np

from avtext.data import builders
from avtext.data import features

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
                              "one with `python -m avtext.tools.smit_features`)")
    self.arrays: dict[str, np.ndarray] = {}
    with h5py.File(self.path, "r") as f:
      if "ids" not in f:
        raise features.FeatureError(f"{self.path}: no dataset 'ids' (str [N])")
      self.ids = [x.decode() if isinstance(x, bytes) else str(x) for x in f["ids"][()]]
      n = len(self.ids)
      for key in _PER_ITEM + _RAGGED + ("transcript", "caption"):
        if key not in f:
          continue
        value = f[key][()]
        if key in _PER_ITEM and (value.ndim != 2 or len(value) != n):
          raise features.FeatureError(f"{self.path}, {key!r}: expected [N={n}, D], got "
                                      f"{value.shape}")
        self.arrays[key] = value
      for key in _RAGGED:
        if key not in self.arrays:
          continue
        off = f"{key}_offsets"
        if off not in f:
          raise features.FeatureError(f"{self.path}: {key!r} without {off!r} (int64 [N+1])")
        offsets = np.asarray(f[off][()], np.int64)
        if (offsets.shape != (n + 1,) or offsets[0] != 0 or np.any(np.diff(offsets) < 0)
            or offsets[-1] != len(self.arrays[key])):
          raise features.FeatureError(
              f"{self.path}, {off!r}: expected N+1={n + 1} non-decreasing offsets from 0 to "
              f"{len(self.arrays[key])} (the rows of {key!r}), got shape {offsets.shape}")
        self.arrays[off] = offsets
    if not any(k in self.arrays for k in _PER_ITEM):
      raise features.FeatureError(f"{self.path}: holds neither 'image_embedding' nor "
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

  # The synthetic world's references, when the features came from it.
  def describe(self, index: int) -> dict:
    if self._origin is None:
      raise AttributeError("describe")
    return self._origin.describe(index)

  def __getattr__(self, name):
    if name == "oracle_recall_at_1" and self.__dict__.get("_origin") is not None:
      return self._origin.oracle_recall_at_1
    raise AttributeError(name)


@builders.register_dataset("smit_features")
def smit_features(dataset: ml_collections.ConfigDict, split: str) -> SMiTFeatures:
  path = dataset.get("path")
  if not path:
    raise ValueError(
        "config.dataset.path is unset: point it at an smit_features directory "
        "(meta.json + <split>.h5, layout in avtext/data/builders/smit.py). Write one with "
        "`python -m avtext.tools.smit_features --config=<your smit config> --out=DIR`, or, "
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
  if meta.get("origin") and str(meta["origin"].get("name", "")).startswith("synthetic"):
    origin = builders.get_source(ml_collections.ConfigDict(meta["origin"]), split)
  return SMiTFeatures(os.fspath(path), split, origin)


@builders.register_dataset("smit")
def smit_clips(dataset: ml_collections.ConfigDict, split: str):
  del split
  raise FileNotFoundError(
      f"config.dataset: 'smit' (the real Spoken Moments clips, data_dir="
      f"{dataset.get('data_dir')!r}) needs video decoding, which avtext does not have yet "
      "(the real-video issue adds avtext/data/video_io.py). To prepare S-MiT: download it "
      "from the authors (moments.csail.mit.edu/spoken.html); for phase 1, extract your "
      "ResNet-152 (3 frames, 1 fps) and TSM-R50 (8 frames, ~3 fps) features, the frozen "
      "language model's word features of each ASR transcript and each spoken caption's "
      "40-bin log-mel into the smit_features layout (avtext/data/builders/smit.py) and set "
      "--config.dataset.name=smit_features --config.dataset.path=<dir>. To run the whole "
      "experiment on the synthetic S-MiT instead: `make demo-smit` or the ':demo' variant.")
