"""The feature-file layout of COOT (simon-ging/coot-videotext): names, readers, writers.

h5 files of float32 arrays keyed by id, JSON side files written atomically,
and ActivityNet's per-video .npz files. `builders.coot` reads this layout; TVR's
files (`builders.tvr`) are written with the same h5 / JSON writers. The
feature tools (`avtext.features`) and the demo world's writers write both.

A COOT dataset directory `<path>` (COOT: `data/activitynet`, `data/youcook2`) holds:

  meta_<metadata_name>.json                  (default meta_all.json; COOT's
                                             data_read_{activitynet,youcook2}_meta.py)
      {key: {"data_key":     str    id of the video in the video features
                                    (ActivityNet: the 11-letter YouTube id; key is
                                    "<data_key>_<split>", one video may sit in several
                                    splits)
             "split":        str    "train" | "val_1" | "val_2" (ActivityNet),
                                    "train" | "val" (YouCook2)
             "duration_sec": float  > 0, the video's duration
             "segments":     [{"start_sec": float, "stop_sec": float, "text": str}, ...]
                                    one per sentence, in paragraph order}}
      Other fields are ignored.

  video features, video_source "h5":
      <video_features>.h5                    one dataset per data_key, float [T, D]
                                             (YouCook2: video_feat_100m.h5, D = 512;
                                             video_feat_2d3d.h5, D = 4096)
  video features, video_source "npz_activitynet":
      features/<video_features>/v_<data_key>.npz
                                             array "frame_scores", float [T, 1, D, 1, 1]
                                             (ICEP_V3_global_pool_skip_8_direct_resize,
                                             D = 2048)
  <video_features>_num_frames.json           {data_key: T}, optional: a cache written the
                                             first time a split is opened (COOT's loader
                                             does the same) and trusted afterwards

  text features (`python -m avtext.features coot_text`, COOT's
  precompute_text.py):
      <text_features>.h5                     one dataset per key, float32 [num_tokens, Dt]:
                                             the listed hidden layers of BERT concatenated
                                             per token (bert-base-uncased, layers -2,-1:
                                             Dt = 1536; MiniLM-L6: 768). Keys of old COOT
                                             releases, "v_<key[:11]>", are read too.
      <text_features>_sentence_splits.json   {key: [tokens of sentence 1, 2, ...]}: int,
                                             summing to num_tokens, one entry per segment

The tokens are those of COOT's "bert_paper" paragraph (`avtext.features.coot_text`).
"""
import json
import pathlib
import zipfile
from typing import Mapping, Sequence

import numpy as np

from avtext import atomic
from avtext import errors

VIDEO_SOURCES = ("h5", "npz_activitynet")
NPZ_ARRAY = "frame_scores"
_META_FIELDS = ("data_key", "split", "duration_sec", "segments")
_SEGMENT_FIELDS = ("start_sec", "stop_sec", "text")


# ---------------------------------------------------------------- file names
def meta_path(dataset_dir, metadata_name: str = "all") -> pathlib.Path:
  return pathlib.Path(dataset_dir) / f"meta_{metadata_name}.json"


def video_h5_path(dataset_dir, name: str) -> pathlib.Path:
  return pathlib.Path(dataset_dir) / f"{name}.h5"


def video_npz_path(dataset_dir, name: str, data_key: str) -> pathlib.Path:
  return pathlib.Path(dataset_dir) / "features" / name / f"v_{data_key}.npz"


def num_frames_path(dataset_dir, name: str) -> pathlib.Path:
  return pathlib.Path(dataset_dir) / f"{name}_num_frames.json"


def text_h5_path(dataset_dir, name: str) -> pathlib.Path:
  return pathlib.Path(dataset_dir) / f"{name}.h5"


def sentence_splits_path(dataset_dir, name: str) -> pathlib.Path:
  return pathlib.Path(dataset_dir) / f"{name}_sentence_splits.json"


def legacy_text_key(key: str) -> str:
  """The key older COOT text features use for `key` (features_loader.py's fallback)."""
  return f"v_{key[:11]}"


# ---------------------------------------------------------------- readers
def read_json(path: pathlib.Path, what: str):
  try:
    return json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
  except json.JSONDecodeError as e:
    raise errors.BadInput(f"{path}: not valid JSON ({e}); expected the {what}") from e


def check_meta_entry(meta_file, key: str, entry) -> None:
  """Raises ValueError naming the meta file, key and field when `entry` is malformed."""
  if not isinstance(entry, Mapping):
    raise errors.BadInput(f"{meta_file}: entry {key!r} is {type(entry).__name__}, expected an "
                          f"object with {list(_META_FIELDS)}")
  for field in _META_FIELDS:
    if field not in entry:
      raise errors.BadInput(f"{meta_file}: entry {key!r} has no field {field!r}; every entry needs "
                            f"{list(_META_FIELDS)}")
  if not isinstance(entry["duration_sec"], (int, float)) or not entry["duration_sec"] > 0:
    raise errors.BadInput(f"{meta_file}: entry {key!r}: duration_sec={entry['duration_sec']!r}, "
                          "expected a number > 0")
  if not isinstance(entry["segments"], list) or not entry["segments"]:
    raise errors.BadInput(f"{meta_file}: entry {key!r}: 'segments' must be a non-empty list of "
                          f"{{{', '.join(_SEGMENT_FIELDS)}}}")
  for i, seg in enumerate(entry["segments"]):
    missing = [f for f in _SEGMENT_FIELDS if not isinstance(seg, Mapping) or f not in seg]
    if missing:
      raise errors.BadInput(f"{meta_file}: entry {key!r}, segment {i} has no field {missing[0]!r}; "
                            f"every segment needs {list(_SEGMENT_FIELDS)}")


def npz_shape(file: pathlib.Path) -> tuple[int, ...]:
  """Shape of `frame_scores` in an .npz, from the array header only (no data read)."""
  try:
    archive = zipfile.ZipFile(file)
  except zipfile.BadZipFile as e:
    raise errors.BadInput(f"{file}: not an .npz file ({e}); expected {NPZ_ARRAY} "
                          "[T, 1, D, 1, 1] (COOT's ActivityNet features)") from e
  with archive:
    member = f"{NPZ_ARRAY}.npy"
    if member not in archive.namelist():
      raise errors.BadInput(f"{file}: no array {NPZ_ARRAY!r} (arrays there: "
                            f"{[n.removesuffix('.npy') for n in archive.namelist()]}); expected "
                            f"{NPZ_ARRAY} [T, 1, D, 1, 1] (COOT's ActivityNet features)")
    with archive.open(member) as f:
      version = np.lib.format.read_magic(f)
      read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0) else
                     np.lib.format.read_array_header_2_0)
      shape, _, _ = read_header(f)
  return tuple(shape)


def check_npz_shape(file: pathlib.Path, shape: Sequence[int]) -> None:
  if len(shape) != 5 or shape[1] != 1 or shape[3:] != (1, 1):
    raise errors.BadInput(f"{file}: {NPZ_ARRAY} has shape {list(shape)}; expected "
                          f"[T, 1, D, 1, 1] (COOT's ActivityNet features)")


def read_npz_video(file: pathlib.Path) -> np.ndarray:
  """float32 [T, D] from an ActivityNet `v_<data_key>.npz` ([T, 1, D, 1, 1] frame_scores)."""
  with np.load(file) as npz:
    if NPZ_ARRAY not in npz:
      raise errors.BadInput(f"{file}: no array {NPZ_ARRAY!r} (arrays there: {list(npz)}); expected "
                            f"{NPZ_ARRAY} [T, 1, D, 1, 1] (COOT's ActivityNet features)")
    scores = npz[NPZ_ARRAY]
  check_npz_shape(file, scores.shape)
  return np.asarray(scores[:, 0, :, 0, 0], np.float32)


# ---------------------------------------------------------------- writers
def _replace_with(path, write) -> pathlib.Path:
  """A dataset file, whole or not at all (regenerable: no disk flush per file)."""
  return atomic.replace_with(path, write, durable=False)


def write_json(path: pathlib.Path, value) -> pathlib.Path:
  return _replace_with(pathlib.Path(path),
                       lambda p: p.write_text(json.dumps(value, sort_keys=True), encoding="utf-8"))


def write_h5(path: pathlib.Path, arrays: Mapping[str, np.ndarray]) -> pathlib.Path:
  import h5py  # pylint: disable=g-import-not-at-top

  def write(tmp):
    with h5py.File(tmp, "w") as h5:
      for key, value in arrays.items():
        h5[key] = np.asarray(value, np.float32)
  return _replace_with(path, write)


def _as_videos(features: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  out = {}
  for key, value in features.items():
    value = np.asarray(value, np.float32)
    if value.ndim != 2 or not len(value):
      raise errors.BadInput(f"video features of {key!r}: shape {value.shape}, expected [T >= 1, D]")
    out[key] = value
  return out


def write_meta(dataset_dir, meta: Mapping, metadata_name: str = "all") -> pathlib.Path:
  """`meta_<metadata_name>.json`; every entry is checked (`check_meta_entry`) first."""
  path = meta_path(dataset_dir, metadata_name)
  for key, entry in meta.items():
    check_meta_entry(path, key, entry)
  return write_json(path, dict(meta))


def write_video_features_h5(dataset_dir, name: str,
                            features: Mapping[str, np.ndarray]) -> pathlib.Path:
  """`<name>.h5` (one float32 [T, D] dataset per data_key) and `<name>_num_frames.json`."""
  videos = _as_videos(features)
  write_json(num_frames_path(dataset_dir, name), {k: len(v) for k, v in videos.items()})
  return write_h5(video_h5_path(dataset_dir, name), videos)


def write_video_features_npz(dataset_dir, name: str,
                             features: Mapping[str, np.ndarray]) -> pathlib.Path:
  """ActivityNet's layout: `features/<name>/v_<data_key>.npz`, float32 [T, 1, D, 1, 1].

  No num-frames cache is written (COOT's download has none either). Returns
  the directory.
  """
  def writer(video):
    def write(tmp):
      with open(tmp, "wb") as f:
        np.savez(f, **{NPZ_ARRAY: video[:, None, :, None, None]})
    return write

  for key, value in _as_videos(features).items():
    _replace_with(video_npz_path(dataset_dir, name, key), writer(value))
  return pathlib.Path(dataset_dir) / "features" / name


def write_text_features(dataset_dir, name: str, features: Mapping[str, np.ndarray],
                        sentence_lengths: Mapping[str, Sequence[int]]) -> pathlib.Path:
  """`<name>.h5` (float32 [tokens, Dt] per key) and `<name>_sentence_splits.json`."""
  if set(features) != set(sentence_lengths):
    odd = sorted(set(features) ^ set(sentence_lengths))
    raise errors.BadInput(f"text features {name!r}: features and sentence lengths cover different "
                          f"keys, e.g. {odd[:3]}")
  for key, value in features.items():
    if np.ndim(value) != 2 or sum(sentence_lengths[key]) != len(value):
      raise errors.BadInput(f"text features of {key!r}: shape {np.shape(value)} but the sentence "
                            f"lengths {list(sentence_lengths[key])} sum to "
                            f"{sum(sentence_lengths[key])}; expected [that many tokens, Dt]")
  write_json(sentence_splits_path(dataset_dir, name),
             {k: [int(n) for n in v] for k, v in sentence_lengths.items()})
  return write_h5(text_h5_path(dataset_dir, name), features)

