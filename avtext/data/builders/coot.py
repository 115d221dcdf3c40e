"""Dataset `coot`: COOT's feature layout (avtext/data/coot_files.py) from local files.

config.dataset fields (the official `dataset_train` names and values of
config/retrieval/paper2020/{anet_coot,yc2_100m_coot}.yaml in brackets):
  path             the dataset directory, e.g. .../activitynet [<data_path>/<name>]
  metadata_name    "all": reads meta_all.json [metadata_name: "all"]
  video_features   feature name [vid_feat_name: "ICEP_V3_global_pool_skip_8_direct_resize" |
                   "video_feat_100m"]
  video_source     "h5" | "npz_activitynet" [vid_feat_source: "npz_activitynet" | "h5"]
  video_dim        D, checked [vid_feat_dim: 2048 | 512]
  text_features    text feature name [text_feat_name:
                   "text_feat_<activitynet|youcook2>_meta_all_transformers_bert-base-uncased_-2,-1"]
  text_dim         Dt, checked [text_feat_dim: 1536]
  add_stop_frame   frames added after a segment's ceil'd stop frame, default 1
                   [add_stop_frame: 1 | 2]
  expand_segments  segments shorter than this many frames are grown to it, default 0
                   [expand_segments: 10 | 0]
  max_datapoints   -1 = every key of the split, else its first N [max_datapoints: -1]

Example i of a split: {"id": key (str), "video": float32 [T, D] (every frame),
"segments": int32 [N, 2] (start frame, number of frames), "text": float32
[tokens, Dt] (the paragraph), "sentence_lengths": int32 [N], "sentences": N
raw segment texts (a host field)}. Keys keep the meta file's order.

Segment frames are the official `RetrievalDataset`'s (coot/dataset_retrieval.py):
fps = T / duration_sec; a segment with stop_sec < start_sec has them swapped;
start = floor(fps * start_sec); stop = min(T, ceil(fps * stop_sec) +
add_stop_frame) (exclusive); then `video.expand_segment` to
expand_segments frames. A segment left with no frames (it starts at or after
the video's end and is not expanded) is an error here; officially it yields an
empty clip.

Opening a split checks the meta entries, that every video and text key is
stored, the feature widths, and that the sentence splits match the segments
and token counts, so bad data fails before training. The number of frames per
video comes from `<video_features>_num_frames.json` when it lists the video
(trusted, as COOT's loader does; a stale count is an error when the video is
read), otherwise from the stored array's shape (no data read), and the file is
updated.
"""
import math
import os
import pathlib

from absl import logging
import numpy as np

from avtext import errors
from avtext.data import builders
from avtext.data import coot_files
from avtext.data import video as video_lib

_PREPARE = (
    "COOT's setup (github.com/simon-ging/coot-videotext, README 'Prepare datasets') writes "
    "meta_all.json with data_read_activitynet_meta.py / data_read_youcook2_meta.py (here: "
    "`python -m avtext.tools.coot_meta`, docs/coot.md) and downloads the video features into "
    "the dataset directory; "
    "`python -m avtext.features coot_text --dataset_dir=<path>` builds the text "
    "features; `make demo-coot` writes the demo world's dataset. Layout: "
    "avtext/data/coot_files.py")


def segment_frames(num_frames: int, duration_sec: float, segments, *, add_stop_frame: int,
                   expand_segments: int, where: str = "") -> np.ndarray:
  """int32 [N, 2] (start frame, number of frames) of `segments` (the official rule above)."""
  fps = num_frames / duration_sec
  out = []
  for i, seg in enumerate(segments):
    start_s, stop_s = seg["start_sec"], seg["stop_sec"]
    if stop_s < start_s:
      start_s, stop_s = stop_s, start_s
    start = int(math.floor(fps * start_s))
    stop = min(int(math.ceil(fps * stop_s)) + add_stop_frame, num_frames)
    start, stop, _ = video_lib.expand_segment(num_frames, expand_segments, start, stop)
    if stop <= start:
      raise errors.BadInput(f"{where}segment {i} ({start_s} s to {stop_s} s) has no frames in a "
                            f"video of {num_frames} frames over {duration_sec} s; raise "
                            "config.dataset.expand_segments or fix the segment")
    out.append((start, stop - start))
  return np.asarray(out, np.int32).reshape(-1, 2)


def _required(cfg, field: str, hint: str):
  value = cfg.get(field)
  if value in (None, "", 0):
    raise errors.BadInput(f"config.dataset.{field} is not set: {hint}. {_PREPARE}")
  return value


class CootSource:
  """Random access over one split of a COOT-layout dataset directory (picklable)."""
  kind = builders.FEATURES

  def __init__(self, cfg, split: str):
    self.path = pathlib.Path(_required(cfg, "path", "the COOT dataset directory"))
    self.split = split
    self.video_name = _required(cfg, "video_features", "the video feature name (ActivityNet "
                                "ICEP_V3_global_pool_skip_8_direct_resize, YouCook2 "
                                "video_feat_100m)")
    self.text_name = _required(cfg, "text_features", "the text feature name (<name>.h5 + "
                               "<name>_sentence_splits.json)")
    self.video_dim = int(_required(cfg, "video_dim", "the video feature width D"))
    self.text_dim = int(_required(cfg, "text_dim", "the text feature width Dt"))
    self.source = cfg.get("video_source", "h5")
    if self.source not in coot_files.VIDEO_SOURCES:
      raise errors.BadInput(f"config.dataset.video_source={self.source!r}; expected one of "
                            f"{coot_files.VIDEO_SOURCES}")
    self.add_stop_frame = int(cfg.get("add_stop_frame", 1))
    self.expand_segments = int(cfg.get("expand_segments", 0))
    self._h5, self._pid = {}, os.getpid()

    self.meta_file = coot_files.meta_path(self.path, cfg.get("metadata_name", "all"))
    if not self.meta_file.is_file():
      raise FileNotFoundError(f"{self.meta_file} not found. {_PREPARE}")
    meta = coot_files.read_json(self.meta_file, "COOT meta file")
    self.keys = [k for k, v in meta.items() if isinstance(v, dict) and v.get("split") == split]
    if not self.keys:
      splits = sorted({str(v.get("split")) for v in meta.values() if isinstance(v, dict)})
      raise errors.BadInput(f"{self.meta_file}: no videos in split {split!r}; its splits are "
                            f"{splits}")
    limit = cfg.get("max_datapoints", -1)
    if limit is not None and limit > -1:
      self.keys = self.keys[:limit]
    for key in self.keys:
      coot_files.check_meta_entry(self.meta_file, key, meta[key])
    self.meta = {k: meta[k] for k in self.keys}

    self.num_frames_file = coot_files.num_frames_path(self.path, self.video_name)
    self._num_frames = self._count_frames()
    self._text_keys, self._splits = self._check_text()
    self._segments = {
        k: segment_frames(self._num_frames[v["data_key"]], v["duration_sec"], v["segments"],
                          add_stop_frame=self.add_stop_frame,
                          expand_segments=self.expand_segments,
                          where=f"{self.meta_file}, {k!r}: ")
        for k, v in self.meta.items()}
    self._close()  # readers (grain workers) open their own handles
    logging.info("coot %s/%s: %d videos, %d segments", self.path, split, len(self.keys),
                 sum(len(s) for s in self._segments.values()))

  # ---------------------------------------------------------------- files
  def __getstate__(self):
    return {**self.__dict__, "_h5": {}}

  def _open(self, file: pathlib.Path):
    """This process's read handle of an HDF5 file (handles are not shared across forks)."""
    import h5py  # pylint: disable=g-import-not-at-top
    if self._pid != os.getpid():
      self._h5, self._pid = {}, os.getpid()
    if file not in self._h5:
      try:
        self._h5[file] = h5py.File(file, "r")
      except OSError as e:  # not HDF5, or cut short
        raise errors.BadInput(f"{file}: not a readable HDF5 file ({e}); expected COOT's "
                              "features (avtext/data/coot_files.py)") from e
    return self._h5[file]

  def _close(self) -> None:
    for h5 in self._h5.values():
      h5.close()
    self._h5 = {}

  def _existing(self, file: pathlib.Path, what: str) -> pathlib.Path:
    if not file.is_file():
      raise FileNotFoundError(f"{what} {file} not found. {_PREPARE}")
    return file

  @property
  def _video_h5(self) -> pathlib.Path:
    return coot_files.video_h5_path(self.path, self.video_name)

  def _npz(self, data_key: str) -> pathlib.Path:
    return coot_files.video_npz_path(self.path, self.video_name, data_key)

  def _video_where(self, data_key: str) -> str:
    return (f"{self._video_h5}, video {data_key!r}" if self.source == "h5" else
            str(self._npz(data_key)))

  def _check_width(self, data_key: str, shape) -> None:
    if len(shape) == 2 and shape[1] != self.video_dim:
      raise errors.BadInput(builders.width_mismatch("video_dim", self.video_dim,
                                                    self._video_where(data_key), shape[1],
                                                    model_reads_it=True))
    if len(shape) != 2:
      raise errors.BadInput(f"{self._video_where(data_key)}: features of shape {list(shape)}; "
                            f"expected [T, {self.video_dim}] (config.dataset.video_dim)")

  def _count_frames(self) -> dict[str, int]:
    """{data_key: T}; checks that every video is stored, with width video_dim."""
    counts = {}
    if self.num_frames_file.is_file():
      counts = coot_files.read_json(self.num_frames_file, "{data_key: number of frames} cache")
    data_keys = sorted({v["data_key"] for v in self.meta.values()})
    missing = [d for d in data_keys if d not in counts]
    if self.source == "h5":
      h5 = self._open(self._existing(self._video_h5, "video features"))
      for d in data_keys:
        if d not in h5:
          raise errors.BadInput(f"{self._video_h5}: no video {d!r} (the data_key of "
                                f"{self._key_of(d)!r} in {self.meta_file}). {_PREPARE}")
        self._check_width(d, h5[d].shape)
        if d in missing:
          counts[d] = int(h5[d].shape[0])
    else:
      for d in data_keys:
        file = self._existing(self._npz(d), f"video features of {self._key_of(d)!r} "
                              f"(data_key {d!r}):")
        if d in missing:
          shape = coot_files.npz_shape(file)
          coot_files.check_npz_shape(file, shape)
          self._check_width(d, (shape[0], shape[2]))
          counts[d] = int(shape[0])
    if missing:
      try:
        coot_files.write_json(self.num_frames_file, counts)
      except OSError as e:  # a read-only dataset directory: count again next time
        logging.warning("could not update %s: %s", self.num_frames_file, e)
    return counts

  def _key_of(self, data_key: str) -> str:
    return next(k for k, v in self.meta.items() if v["data_key"] == data_key)

  def _check_text(self) -> tuple[dict[str, str], dict[str, list[int]]]:
    """({key: key in the text h5}, {key: sentence lengths}), every one checked."""
    text_file = self._existing(coot_files.text_h5_path(self.path, self.text_name),
                               "text features")
    splits_file = self._existing(
        coot_files.sentence_splits_path(self.path, self.text_name), "sentence splits")
    all_splits = coot_files.read_json(splits_file, "{key: tokens per sentence} sentence splits")
    h5 = self._open(text_file)
    stored, splits = {}, {}
    for key in self.keys:
      legacy = coot_files.legacy_text_key(key)
      name = key if key in h5 else legacy if legacy in h5 else None
      if name is None:
        raise errors.BadInput(f"{text_file}: no text features for {key!r} (nor {legacy!r}); "
                              f"rebuild them for {self.meta_file} with `python -m "
                              "avtext.features.coot_text`")
      shape = h5[name].shape
      if len(shape) == 2 and shape[1] != self.text_dim:
        raise errors.BadInput(builders.width_mismatch("text_dim", self.text_dim,
                                                      f"{text_file} ({name!r})", shape[1],
                                                      model_reads_it=True))
      if len(shape) != 2:
        raise errors.BadInput(f"{text_file}: {name!r} has shape {list(shape)}; expected [tokens, "
                              f"{self.text_dim}] (config.dataset.text_dim)")
      lengths = all_splits.get(key, all_splits.get(legacy))
      if lengths is None:
        raise errors.BadInput(f"{splits_file}: no sentence splits for {key!r} (nor {legacy!r})")
      if sum(lengths) != shape[0]:
        raise errors.BadInput(f"{splits_file}: the sentence splits of {key!r}, {lengths}, sum to "
                              f"{sum(lengths)} but {text_file} holds {shape[0]} tokens for it")
      segments = len(self.meta[key]["segments"])
      if len(lengths) != segments:
        raise errors.BadInput(f"{key!r}: {segments} segments in {self.meta_file} but "
                              f"{len(lengths)} sentences in {splits_file}; the text features "
                              "were built from another meta file")
      stored[key], splits[key] = name, [int(n) for n in lengths]
    return stored, splits

  # ---------------------------------------------------------------- access
  def __len__(self) -> int:
    return len(self.keys)

  def video(self, data_key: str) -> np.ndarray:
    """float32 [T, D], every frame of a video."""
    if self.source == "h5":
      video = np.asarray(self._open(self._video_h5)[data_key], np.float32)
    else:
      video = coot_files.read_npz_video(self._npz(data_key))
    self._check_width(data_key, video.shape)
    if len(video) != self._num_frames[data_key]:
      raise errors.BadInput(f"{self._video_where(data_key)}: {len(video)} frames but "
                            f"{self.num_frames_file} says {self._num_frames[data_key]}; delete "
                            "that stale cache")
    return video

  def describe(self, index: int) -> dict:
    """Example `index` without its features."""
    key = self.keys[int(index)]
    meta = self.meta[key]
    return {"id": key, "data_key": meta["data_key"], "duration_sec": meta["duration_sec"],
            "num_frames": self._num_frames[meta["data_key"]],
            "segments": self._segments[key].copy(),
            "sentence_lengths": np.asarray(self._splits[key], np.int32),
            "sentences": [str(s["text"]) for s in meta["segments"]]}

  def __getitem__(self, index: int) -> dict:
    out = self.describe(index)
    key = out["id"]
    out["video"] = self.video(out.pop("data_key"))
    out["text"] = np.asarray(
        self._open(coot_files.text_h5_path(self.path, self.text_name))[self._text_keys[key]],
        np.float32)
    del out["duration_sec"], out["num_frames"]
    return out


@builders.register_dataset("coot")
def coot(dataset_config, split: str) -> CootSource:
  return CootSource(dataset_config, split)
