"""Dataset `coot`: COOT's feature layout (avtext/data/coot_layout.py) from local files.

config.dataset fields (official `dataset_train` names in brackets):
  path              the dataset directory (ActivityNet: .../activitynet)
  metadata_name     "all" -> meta_all.json [metadata_name]
  video_features    feature name [vid_feat_name]
  video_source      "h5" | "npz_activitynet" [vid_feat_source]
  video_dim         D, checked [vid_feat_dim]
  text_features     text feature name [text_feat_name]
  text_dim          Dt, checked [text_feat_dim]
  add_stop_frame    frames added after a segment's ceil'd stop frame (ActivityNet 1, YouCook2 2)
  expand_segments   minimum frames per segment (ActivityNet 10, YouCook2 0)
  max_datapoints    -1 = all, else the first N keys of the split

Example i of a split: {"id": key, "video": float32 [T, D] (every frame),
"segments": int32 [N, 2] (start frame, number of frames), "text": float32
[tokens, Dt], "sentence_lengths": int32 [N], "sentences": [N strings]}.
Segment frames follow the official `RetrievalDataset`: fps = T / duration,
start = floor(fps * start_sec), stop = min(T, ceil(fps * stop_sec) +
add_stop_frame), start/stop swapped when reversed, then expanded to
`expand_segments` frames (`preprocessing.expand_segment`).
"""
import json
import math
import pathlib

from absl import logging
import numpy as np

from avtext.data import builders
from avtext.data import coot_layout
from avtext.data import preprocessing

_PREPARE = ("COOT's features come from its setup (github.com/simon-ging/coot-videotext, "
            "README: download the features and meta files into <path>); text features can be "
            "built with `python -m avtext.tools.precompute_text_features --dataset_dir=<path>`; "
            "the synthetic demo data with `make demo-coot`")


class CootSource:
  """Random access over one split of a COOT-layout dataset directory."""
  kind = builders.FEATURES

  def __init__(self, cfg, split: str):
    if not cfg.get("path"):
      raise FileNotFoundError(f"config.dataset.path is not set: the COOT dataset directory "
                              f"is needed. {_PREPARE}")
    self.path = pathlib.Path(cfg.path)
    self.cfg = cfg
    meta_file = coot_layout.meta_path(self.path, cfg.get("metadata_name", "all"))
    if not meta_file.is_file():
      raise FileNotFoundError(f"{meta_file} not found. {_PREPARE}")
    meta = json.loads(meta_file.read_text())
    self.keys = [k for k, v in meta.items() if v.get("split") == split]
    if not self.keys:
      splits = sorted({str(v.get("split")) for v in meta.values()})
      raise ValueError(f"{meta_file}: no videos in split {split!r}; its splits are {splits}")
    limit = cfg.get("max_datapoints", -1)
    if limit is not None and limit > -1:
      self.keys = self.keys[:limit]
    self.meta = {k: meta[k] for k in self.keys}
    self.source = cfg.get("video_source", "h5")
    if self.source not in ("h5", "npz_activitynet"):
      raise ValueError(f"config.dataset.video_source={self.source!r}; expected 'h5' or "
                       "'npz_activitynet'")
    self.video_name = cfg.video_features
    self.text_file = self.path / f"{cfg.text_features}.h5"
    splits_file = self.path / f"{cfg.text_features}_sentence_splits.json"
    for f in (self.text_file, splits_file):
      if not f.is_file():
        raise FileNotFoundError(f"text features {f} not found. {_PREPARE}")
    self.sentence_splits = json.loads(splits_file.read_text())
    if self.source == "h5":
      self.video_file = self.path / f"{self.video_name}.h5"
      if not self.video_file.is_file():
        raise FileNotFoundError(f"video features {self.video_file} not found. {_PREPARE}")
    self._h5 = {}
    self._num_frames = self._load_num_frames()
    self._segments = {k: self._segment_frames(k) for k in self.keys}
    logging.info("coot %s/%s: %d videos, %d segments", self.path, split, len(self.keys),
                 sum(len(s) for s in self._segments.values()))

  def __len__(self) -> int:
    return len(self.keys)

  def __getstate__(self):
    return {**self.__dict__, "_h5": {}}

  def _open(self, file: pathlib.Path):
    import h5py  # pylint: disable=g-import-not-at-top
    if file not in self._h5:
      self._h5[file] = h5py.File(file, "r")
    return self._h5[file]

  def _npz_file(self, data_key: str) -> pathlib.Path:
    return self.path / "features" / self.video_name / f"v_{data_key}.npz"

  def _video(self, data_key: str) -> np.ndarray:
    if self.source == "h5":
      h5 = self._open(self.video_file)
      if data_key not in h5:
        raise KeyError(f"{self.video_file}: no video {data_key!r}")
      video = np.asarray(h5[data_key], np.float32)
    else:
      file = self._npz_file(data_key)
      if not file.is_file():
        raise FileNotFoundError(f"video features {file} not found. {_PREPARE}")
      with np.load(file) as npz:
        if "frame_scores" not in npz:
          raise KeyError(f"{file}: no array 'frame_scores' [T, 1, D, 1, 1]")
        video = np.asarray(npz["frame_scores"], np.float32).reshape(
            npz["frame_scores"].shape[0], -1)
    if video.ndim != 2 or video.shape[1] != self.cfg.video_dim:
      where = self.video_file if self.source == "h5" else self._npz_file(data_key)
      raise ValueError(f"{where}: video {data_key!r} has features of shape {video.shape}; "
                       f"expected [T, {self.cfg.video_dim}] (config.dataset.video_dim)")
    return video

  def _load_num_frames(self) -> dict[str, int]:
    cache = self.path / f"{self.video_name}_num_frames.json"
    counts = json.loads(cache.read_text()) if cache.is_file() else {}
    missing = [self.meta[k]["data_key"] for k in self.keys
               if self.meta[k]["data_key"] not in counts]
    for data_key in missing:
      counts[data_key] = len(self._video(data_key))
    if missing:
      try:
        cache.write_text(json.dumps(counts, sort_keys=True))
      except OSError:
        pass  # a read-only dataset dir: recount next time
    return counts

  def _segment_frames(self, key: str) -> np.ndarray:
    meta = self.meta[key]
    frames = self._num_frames[meta["data_key"]]
    fps = frames / meta["duration_sec"]
    out = []
    for seg in meta["segments"]:
      start_s, stop_s = seg["start_sec"], seg["stop_sec"]
      if stop_s < start_s:
        start_s, stop_s = stop_s, start_s
      start = int(math.floor(fps * start_s))
      stop = min(int(math.ceil(fps * stop_s)) + int(self.cfg.get("add_stop_frame", 1)), frames)
      start, stop, _ = preprocessing.expand_segment(
          frames, int(self.cfg.get("expand_segments", 0)), start, stop)
      if stop <= start:
        raise ValueError(f"video {key!r}: segment {seg} has no frames ({frames} frames, "
                         f"{meta['duration_sec']} s)")
      out.append((start, stop - start))
    return np.asarray(out, np.int32).reshape(-1, 2)

  def describe(self, index: int) -> dict:
    key = self.keys[index]
    return {"id": key, "segments": self._segments[key],
            "sentences": [s["text"] for s in self.meta[key]["segments"]]}

  def __getitem__(self, index: int) -> dict:
    key = self.keys[int(index)]
    out = self.describe(index)
    out["video"] = self._video(self.meta[key]["data_key"])
    h5 = self._open(self.text_file)
    if key not in h5:
      raise KeyError(f"{self.text_file}: no text features for {key!r}")
    text = np.asarray(h5[key], np.float32)
    if text.ndim != 2 or text.shape[1] != self.cfg.text_dim:
      raise ValueError(f"{self.text_file}: {key!r} has shape {text.shape}; expected "
                       f"[tokens, {self.cfg.text_dim}] (config.dataset.text_dim)")
    lengths = self.sentence_splits.get(key)
    if lengths is None or sum(lengths) != len(text):
      raise ValueError(f"{self.text_file}: sentence splits of {key!r} ({lengths}) do not sum "
                       f"to its {len(text)} tokens")
    if len(lengths) != len(out["segments"]):
      raise ValueError(f"{key!r}: {len(out['segments'])} segments in the meta file but "
                       f"{len(lengths)} sentences in the text features")
    out["text"] = text
    out["sentence_lengths"] = np.asarray(lengths, np.int32)
    return out


@builders.register_dataset("coot")
def _coot(cfg, split: str) -> CootSource:
  return CootSource(cfg, split)
