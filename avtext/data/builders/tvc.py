"""Dataset `tvc`: TV show Captions (TVR app. D) in the official TVCaption layout.

Files under `config.dataset.path` (the official names; TVCaption README "Data"):

  tvc_<split>_release.jsonl        one moment per line, split = train | val | test_public:
      {"vid_name": "friends_s01e03_seg02_clip_19", "duration": 61.46,
       "ts": [16.48, 33.87], "clip_id": 86603,
       "descs": [{"desc": "...", "type": "v" | "t" | "vt", "desc_id": 109026}, ...]}
      (2 descriptions per training moment, 4 in val / test; the released
      test_public file has no "descs": it can be captioned, not scored)
  tvqa_preprocessed_subtitles.jsonl  one video per line:
      {"vid_name": ..., "sub": [{"text": "( Chase : ) That's all?", "start": 0.862,
                                 "end": 1.862}, ...]}                    (seconds)
  video_feature/<video_features>.h5  key vid_name -> float32 [n_clips, D], one row per
      1.5 s clip (`clip_length`); the official default
      tvr_resnet152_rgb_max_i3d_rgb600_avg_cat_cl-1.5.h5 is ResNet-152 (max
      over the clip) and I3D (mean), each L2-normalized, concatenated (D 3072)

config.dataset fields:
  path             the directory above
  video_features   h5 name without .h5 (default the official resnet_i3d file)
  video_dim        D, checked against the file
  subtitles        subtitle file name (default tvqa_preprocessed_subtitles.jsonl)
  clip_length      seconds per feature row (`CLIP_LENGTH`, 1.5)
  max_moments      -1: every moment of the split, else the first N

Example i of a split is moment i (file order): {"id": clip_id, "vid_name",
"duration", "ts" [2], "video": float32 [n_clips, D] (the whole video's rows),
"subtitles": [(start, end, text), ...] (the whole video's lines),
"descs": [str], "types": [str], "attributes": JSON string or None}; the
MMT task picks the moment's clips and subtitle lines from them
(`avtext.tasks.mmt`). `describe(i)` is the same without reading
features. Extra keys of a line (a world that writes this layout stores the moment's
ground-truth "attributes") are ignored by the official code and kept here; the
source's `ground_truth` is that world's (`avtext.data.ground_truth`: the world.json
it writes beside the annotations), None for the real TVC.

Opening a split checks every line's fields and that every video has
features and subtitles; errors name the file, the line and the field.
"""
import collections
import json
import os
import pathlib

from absl import logging
import numpy as np

from avtext import errors
from avtext.data import builders
from avtext.data import ground_truth

# TVR's clip: every TVR / TVC feature row, moment label and subtitle span is on this grid
# of seconds (the released features' "cl-1.5"; TVR s3.1). The one home of the figure.
CLIP_LENGTH = 1.5
DEFAULT_VIDEO_FEATURES = f"tvr_resnet152_rgb_max_i3d_rgb600_avg_cat_cl-{CLIP_LENGTH}"
DEFAULT_SUBTITLES = "tvqa_preprocessed_subtitles.jsonl"
SPLITS = ("train", "val", "test_public")
_PREPARE = ("Download the TVC annotations (github.com/jayleicn/TVCaption, data/), the TVQA "
            "subtitles and the TVR video features (tvc_feature_release) into this layout "
            "(avtext/data/builders/tvc.py), or write the demo world's dataset in it (make "
            "demo-tvc, docs/tvr.md).")


def annotation_path(path, split: str) -> pathlib.Path:
  return pathlib.Path(path) / f"tvc_{split}_release.jsonl"


def video_features_path(path, name: str) -> pathlib.Path:
  return pathlib.Path(path) / "video_feature" / f"{name}.h5"


def read_jsonl(file: pathlib.Path, what: str) -> list[dict]:
  if not file.is_file():
    raise FileNotFoundError(f"{what} {file} not found. {_PREPARE}")
  rows = []
  with open(file, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        rows.append(json.loads(line))
      except ValueError as e:
        raise errors.BadInput(f"{file}, line {n}: not JSON ({e})") from e
  return rows


class H5File:
  """One h5py handle per process (grain workers fork), opened on first use."""

  def __init__(self, file: pathlib.Path, what: str, prepare: str = _PREPARE):
    if not file.is_file():
      raise FileNotFoundError(f"{what} {file} not found. {prepare}")
    self.file, self.what = file, what
    self._h5, self._pid = None, None

  def __getstate__(self):
    return {**self.__dict__, "_h5": None, "_pid": None}

  def get(self):
    import h5py  # pylint: disable=g-import-not-at-top
    if self._h5 is None or self._pid != os.getpid():
      try:
        self._h5, self._pid = h5py.File(self.file, "r"), os.getpid()
      except OSError as e:  # not HDF5, or cut short
        raise errors.BadInput(f"{self.file}: not a readable HDF5 file ({e}); expected the "
                              f"{self.what}") from e
    return self._h5

  def _check_shape(self, key: str, shape, dim: int | None) -> None:
    if len(shape) != 2 or shape[0] == 0 or (dim is not None and shape[1] != dim):
      raise errors.BadInput(f"{self.file}, key {key!r}: expected float [n >= 1, "
                            f"{dim or 'D'}] ({self.what}), got shape {list(shape)}")

  def read(self, key: str, dim: int | None = None) -> np.ndarray:
    h5 = self.get()
    if key not in h5:
      raise errors.BadInput(f"{self.file}: no key {key!r} ({self.what})")
    x = np.asarray(h5[key], np.float32)
    self._check_shape(key, x.shape, dim)
    return x

  def check_shapes(self, keys, dim: int) -> None:
    """Every key's array is [n >= 1, dim], from the headers (no data read), so a feature
    file of the wrong shape stops a split when it opens, not a run when it is read."""
    h5 = self.get()
    for key in keys:
      self._check_shape(key, h5[key].shape, dim)

  def missing(self, keys) -> list[str]:
    h5 = self.get()
    return [k for k in keys if k not in h5]

  def close(self):
    if self._h5 is not None:
      self._h5.close()
    self._h5 = None


def _check_moment(file, n: int, row) -> None:
  where = f"{file}, line {n}"
  if not isinstance(row, dict):
    raise errors.BadInput(f"{where}: expected a JSON object per line")
  for key, kind in (("vid_name", str), ("duration", (int, float)), ("ts", list),
                    ("clip_id", (int, str))):
    if not isinstance(row.get(key), kind):
      raise errors.BadInput(f"{where}: field {key!r} missing or not a {kind}: {row.get(key)!r}")
  ts = row["ts"]
  if (len(ts) != 2 or not all(isinstance(t, (int, float)) for t in ts) or ts[0] > ts[1]
      or ts[0] < 0):
    raise errors.BadInput(f"{where}: ts must be [start, end] in seconds, 0 <= start <= end, "
                          f"got {ts!r}")
  for j, d in enumerate(row.get("descs") or ()):
    if not isinstance(d, dict) or not isinstance(d.get("desc"), str):
      raise errors.BadInput(f"{where}: descs[{j}] must be {{\"desc\": str, ...}}, got {d!r}")


class TvcSource:
  """Moments of one TVC split (grain random-access protocol)."""
  kind = builders.FEATURES

  def __init__(self, cfg, split: str):
    if split not in SPLITS:
      raise errors.BadInput(f"tvc: unknown split {split!r}; expected one of {SPLITS}")
    if not cfg.get("path"):
      raise errors.BadInput(f"config.dataset.path is not set: the TVC directory. {_PREPARE}")
    self.path = pathlib.Path(cfg.path)
    self.split = split
    self.clip_length = float(cfg.get("clip_length") or CLIP_LENGTH)
    self.video_file = video_features_path(self.path, cfg.get("video_features")
                                          or DEFAULT_VIDEO_FEATURES)
    self.video_dim = cfg.get("video_dim")
    file = annotation_path(self.path, split)
    self.moments = read_jsonl(file, f"TVC {split} annotations")
    for n, row in enumerate(self.moments, 1):
      _check_moment(file, n, row)
    limit = int(cfg.get("max_moments", -1) or -1)
    if limit >= 0:
      self.moments = self.moments[:limit]
    if not self.moments:
      raise errors.BadInput(f"{file}: no moments")
    self.has_descs = all(row.get("descs") for row in self.moments)
    # What a split without references lacks, for the checks of a selection metric.
    self.missing_references = None if self.has_descs else f"{file} has no 'descs'"
    subs_file = self.path / (cfg.get("subtitles") or DEFAULT_SUBTITLES)
    wanted = {row["vid_name"] for row in self.moments}
    self.subtitles: dict[str, list[tuple[float, float, str]]] = {}
    for n, row in enumerate(read_jsonl(subs_file, "subtitles"), 1):
      if not isinstance(row, dict) or "vid_name" not in row or "sub" not in row:
        raise errors.BadInput(f"{subs_file}, line {n}: expected {{\"vid_name\", \"sub\": [...]}}")
      if row["vid_name"] in wanted:
        try:
          self.subtitles[row["vid_name"]] = [(float(s["start"]), float(s["end"]),
                                              str(s["text"])) for s in row["sub"]]
        except (KeyError, TypeError, ValueError) as e:
          raise errors.BadInput(f"{subs_file}, line {n}: each sub needs start, end (seconds) and "
                                f"text: {e}") from e
    missing = sorted(wanted - set(self.subtitles))
    if missing:
      raise errors.BadInput(f"{subs_file}: no subtitles for {len(missing)} videos of {file}, e.g. "
                            f"{missing[:3]}")
    self.video_h5 = H5File(self.video_file, "video features")
    h5 = self.video_h5.get()
    absent = sorted(v for v in wanted if v not in h5)
    if absent:
      raise errors.BadInput(f"{self.video_file}: no features for {len(absent)} videos of {file}, "
                            f"e.g. {absent[:3]}")
    # The width most of the split's videos have (one odd file is a shape error of its own,
    # named by its key below; a set's order is not the same from run to run).
    widths = collections.Counter(h5[v].shape[-1] for v in sorted(wanted))
    width = widths.most_common(1)[0][0]
    if self.video_dim and int(self.video_dim) != width and len(widths) == 1:
      raise errors.BadInput(builders.width_mismatch("video_dim", self.video_dim, self.video_file,
                                                    width, model_reads_it=True))
    self.video_dim = int(self.video_dim or width)
    self.video_h5.check_shapes(sorted(wanted), self.video_dim)
    self.video_h5.close()
    meta = ground_truth.world_meta(self.path)
    self.ground_truth = None if meta is None else ground_truth.open_world(
        meta, where=str(self.path / ground_truth.WORLD_FILE), kind=ground_truth.ClipTruth)
    logging.info("tvc %s/%s: %d moments of %d videos", self.path, split, len(self.moments),
                 len(wanted))

  def __len__(self) -> int:
    return len(self.moments)

  def __repr__(self) -> str:
    return f"TvcSource({str(self.path)!r}, {self.split!r}, {len(self)} moments)"

  def describe(self, i: int) -> dict:
    """Moment i without its features."""
    row = self.moments[int(i)]
    descs = row.get("descs") or []
    attrs = row.get("attributes")
    return {"id": row["clip_id"], "vid_name": row["vid_name"],
            "duration": float(row["duration"]), "ts": [float(t) for t in row["ts"]],
            "subtitles": self.subtitles[row["vid_name"]],
            "descs": [d["desc"] for d in descs], "types": [d.get("type", "") for d in descs],
            "attributes": None if attrs is None else json.dumps(attrs)}

  def __getitem__(self, i: int) -> dict:
    item = self.describe(i)
    video = np.asarray(self.video_h5.get()[item["vid_name"]], np.float32)
    if video.ndim != 2 or video.shape[0] == 0:
      raise errors.BadInput(f"{self.video_file}, video {item['vid_name']!r}: expected [n_clips, "
                            f"{self.video_dim}] features, got shape {list(video.shape)}")
    return {**item, "video": video}


@builders.register_dataset("tvc")
def _open(cfg, split: str) -> TvcSource:
  return TvcSource(cfg, split)
