"""Dataset `tvr`: TV show Retrieval (Lei et al. 2020) queries and their video corpus.

Files under `config.dataset.path`, the official names (jayleicn/TVRetrieval,
data/ and the tvr_feature_release archive):

  tvr_<split>_release.jsonl     one query per line, split = train | val | test_public:
      {"desc_id": 90200, "desc": "Phoebe puts one of her ponytails ...",
       "type": "v" | "t" | "vt", "vid_name": "friends_s01e03_seg02_clip_19",
       "duration": 61.46, "ts": [16.48, 33.87]}                      (seconds)
      (the released test_public lines carry only desc_id and desc: they can be
      answered, not scored)
  tvr_video2dur_idx.json        {split: {vid_name: [duration, global video idx]}}: the
      corpus searched for the split's queries (every video of the split, in this order)
      and the ids of the submission's video2idx. Optional when every query of the split
      names its video: the corpus is then the split's videos, sorted, numbered from 0.
  video_feature/<name>.h5       for each name in `video_features`: key vid_name ->
      float32 [n_clips, D], one row per `clip_length` (1.5 s) clip. The official
      tvr_resnet152_rgb_max_i3d_rgb600_avg_cat_cl-1.5.h5 (3072-d) is ResNet-152
      (max over the clip) and I3D (mean), each already L2-normalized; with several
      names (e.g. the separate resnet152 / i3d files) each file's rows are
      L2-normalized (`normalize_video`) and concatenated, as the official loader.
  <sub_features>                default bert_feature/sub_query/
      tvr_sub_pretrained_w_sub_query_max_cl-1.5.h5: key vid_name -> float32
      [n_clips, 768], the max over the tokens of the subtitle lines touching each
      clip (zeros where no line does), with the same n_clips as the video; the
      "<vid_name>-mask" keys (1 where a clip has a line) are not read (the official
      XML treats subtitle-less clips as real clips with a zero vector, and so do we).
  <query_features>              default bert_feature/sub_query/
      tvr_query_pretrained_w_sub_query.h5: key str(desc_id) -> float32 [L, 768],
      the query's token features without [CLS]/[SEP].

Query and subtitle features are L2-normalized per row on reading (x / (||x|| +
1e-5), `normalize_text`, the official default). `make demo-xml` writes the demo world's long
videos in this layout (MiniLM-L6 text features).

config.dataset fields: path, video_features (a name or a tuple of names),
normalize_video, video_dim, sub_features (None: no subtitle stream), sub_dim,
query_features, query_dim, normalize_text, clip_length, max_queries (-1: all).
A dim left None is read from the files; a given dim is checked.

Example i of a split is query i (file order): {"id": str(desc_id), "desc_id",
"desc", "type", "vid_name" (None on test_public), "ts" [2] (None), "duration",
"query": float32 [L, Dq]}; `context(vid_name)` -> {"video": [n, Dv], "sub":
[n, Ds]} and `corpus` (the split's (vid_name, video idx), in order) serve the
moment task and evaluator. Opening a split checks every line, every corpus
video's features and every query's; errors name the file, line and field.
"""
import json
import pathlib
from typing import Any

from absl import logging
import numpy as np

from avtext import errors
from avtext.data import builders
from avtext.data.builders import tvc

DEFAULT_VIDEO_FEATURES = (tvc.DEFAULT_VIDEO_FEATURES,)
DEFAULT_SUB_FEATURES = ("bert_feature/sub_query/tvr_sub_pretrained_w_sub_query_max_"
                        f"cl-{tvc.CLIP_LENGTH}.h5")
DEFAULT_QUERY_FEATURES = "bert_feature/sub_query/tvr_query_pretrained_w_sub_query.h5"
# A query's token features are "[CLS] desc [SEP]" cut to this many tokens (the official
# tokenizer max_length, with <s> </s>), [CLS] and [SEP] removed.
MAX_QUERY_TOKENS = 30
VIDEO2IDX = "tvr_video2dur_idx.json"
SPLITS = ("train", "val", "test_public")
QUERY_TYPES = ("v", "t", "vt")
_PREPARE = ("Download the TVR annotations (github.com/jayleicn/TVRetrieval, data/) and the "
            "released features (tvr_feature_release: video_feature/, bert_feature/) into this "
            "layout (avtext/data/builders/tvr.py), or write the demo world's dataset in it "
            "(make demo-xml, docs/tvr.md).")


def annotation_path(path, split: str) -> pathlib.Path:
  return pathlib.Path(path) / f"tvr_{split}_release.jsonl"


def l2_normalize(x: np.ndarray, eps: float = 1e-5) -> np.ndarray:
  return (x / (np.linalg.norm(x, axis=-1, keepdims=True) + eps)).astype(np.float32)


def _check_query(file, n: int, row, split: str) -> None:
  where = f"{file}, line {n}"
  if not isinstance(row, dict):
    raise errors.BadInput(f"{where}: expected a JSON object per line")
  if not isinstance(row.get("desc_id"), int) or not isinstance(row.get("desc"), str):
    raise errors.BadInput(f"{where}: fields 'desc_id' (int) and 'desc' (str) are required, got "
                          f"{row.get('desc_id')!r}, {row.get('desc')!r}")
  if "vid_name" not in row and split == "test_public":
    return
  for key, kind in (("vid_name", str), ("duration", (int, float)), ("ts", list)):
    if not isinstance(row.get(key), kind):
      raise errors.BadInput(f"{where}: field {key!r} missing or not a {kind}: {row.get(key)!r}")
  ts = row["ts"]
  if (len(ts) != 2 or not all(isinstance(t, (int, float)) for t in ts) or ts[0] > ts[1]
      or ts[0] < 0):
    raise errors.BadInput(f"{where}: ts must be [start, end] seconds, 0 <= start <= end, got "
                          f"{ts!r}")
  if row.get("type", "v") not in QUERY_TYPES:
    raise errors.BadInput(f"{where}: type must be one of {QUERY_TYPES}, got {row.get('type')!r}")


def _dim(cfg, key: str, h5: tvc.H5File, sample: str) -> int:
  width = h5.read(sample).shape[1]
  if cfg.get(key) and int(cfg[key]) != width:
    raise errors.BadInput(builders.width_mismatch(key, cfg[key], h5.file, width,
                                                  model_reads_it=False))
  return int(width)



class TvrSource:
  """Queries of one TVR split plus the split's video corpus (grain random-access)."""
  kind = builders.FEATURES

  def __init__(self, cfg, split: str):
    if split not in SPLITS:
      raise errors.BadInput(f"tvr: unknown split {split!r}; expected one of {SPLITS}")
    if not cfg.get("path"):
      raise errors.BadInput(f"config.dataset.path is not set: the TVR directory. {_PREPARE}")
    self.path = pathlib.Path(cfg.path)
    self.split = split
    self.clip_length = float(cfg.get("clip_length") or tvc.CLIP_LENGTH)
    self.normalize_text = bool(cfg.get("normalize_text", True))
    file = annotation_path(self.path, split)
    self.queries = tvc.read_jsonl(file, f"TVR {split} annotations")
    for n, row in enumerate(self.queries, 1):
      _check_query(file, n, row, split)
    limit = int(cfg.get("max_queries", -1) or -1)
    if limit >= 0:
      self.queries = self.queries[:limit]
    if not self.queries:
      raise errors.BadInput(f"{file}: no queries")
    ids = [q["desc_id"] for q in self.queries]
    if len(set(ids)) != len(ids):
      raise errors.BadInput(f"{file}: desc_id values repeat")
    self.has_ground_truth = all("vid_name" in q for q in self.queries)
    # What a split without references lacks, for the checks of a selection metric.
    self.missing_references = (None if self.has_ground_truth else
                               f"{file} has no 'vid_name' / 'ts' (the moments)")
    self.corpus = self._corpus(file)
    self.video2idx = dict(self.corpus)
    absent = sorted({q["vid_name"] for q in self.queries if "vid_name" in q}
                    - set(self.video2idx))
    if absent:
      raise errors.BadInput(f"{self.path / VIDEO2IDX}: {len(absent)} videos of {file} are not in "
                            f"the {split} corpus, e.g. {absent[:3]}")

    names = cfg.get("video_features") or DEFAULT_VIDEO_FEATURES
    names = (names,) if isinstance(names, str) else tuple(names)
    self.video_h5 = [tvc.H5File(tvc.video_features_path(self.path, n), "video features",
                                _PREPARE) for n in names]
    self.normalize_video = bool(cfg.get("normalize_video", len(names) > 1))
    sub = cfg.get("sub_features", DEFAULT_SUB_FEATURES)
    self.sub_h5 = tvc.H5File(self.path / sub, "subtitle features", _PREPARE) if sub else None
    self.query_h5 = tvc.H5File(
        self.path / (cfg.get("query_features") or DEFAULT_QUERY_FEATURES), "query features",
        _PREPARE)
    videos = [v for v, _ in self.corpus]
    for h5 in self.video_h5 + ([self.sub_h5] if self.sub_h5 else []):
      missing = h5.missing(videos)
      if missing:
        raise errors.BadInput(f"{h5.file}: no {h5.what} for {len(missing)} videos of the {split} "
                              f"corpus, e.g. {missing[:3]}")
    missing = self.query_h5.missing([str(i) for i in ids])
    if missing:
      raise errors.BadInput(f"{self.query_h5.file}: no features for {len(missing)} desc_ids of "
                            f"{file}, e.g. {missing[:3]}")
    self.video_dim = sum(_dim({}, "video_dim", h5, videos[0]) for h5 in self.video_h5)
    if cfg.get("video_dim") and int(cfg.video_dim) != self.video_dim:
      raise errors.BadInput(builders.width_mismatch(
          "video_dim", cfg.video_dim, ", ".join(str(h.file) for h in self.video_h5),
          self.video_dim, model_reads_it=False))
    self.sub_dim = _dim(cfg, "sub_dim", self.sub_h5, videos[0]) if self.sub_h5 else None
    self.query_dim = _dim(cfg, "query_dim", self.query_h5, str(ids[0]))
    for h5 in self.video_h5 + ([self.sub_h5] if self.sub_h5 else []):
      h5.check_shapes(videos, h5.read(videos[0]).shape[1])
    for h5 in self.video_h5 + [self.sub_h5, self.query_h5]:
      if h5 is not None:
        h5.close()
    logging.info("tvr %s/%s: %d queries, corpus of %d videos", self.path, split,
                 len(self.queries), len(self.corpus))

  def _corpus(self, file) -> list[tuple[str, int]]:
    index_file = self.path / VIDEO2IDX
    if index_file.is_file():
      try:
        table = json.loads(index_file.read_text())
      except ValueError as e:
        raise errors.BadInput(f"{index_file}: not JSON ({e})") from e
      if not isinstance(table, dict) or not isinstance(table.get(self.split), dict):
        raise errors.BadInput(f"{index_file}: expected {{split: {{vid_name: [duration, idx]}}}} "
                              f"with a {self.split!r} entry")
      corpus = []
      for vid, value in table[self.split].items():
        if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], int)):
          raise errors.BadInput(f"{index_file}, {self.split}/{vid}: expected [duration, idx], "
                                f"got {value!r}")
        corpus.append((vid, value[1]))
      if not corpus:
        raise errors.BadInput(f"{index_file}: the {self.split} corpus is empty")
      return corpus
    if not self.has_ground_truth:
      raise FileNotFoundError(f"{index_file} not found: {file} does not name its videos, so "
                              f"the corpus must come from it. {_PREPARE}")
    logging.warning("%s not found: the %s corpus is the %s videos of %s, numbered from 0",
                    index_file, self.split, "sorted", file.name)
    return [(v, i) for i, v in enumerate(sorted({q["vid_name"] for q in self.queries}))]

  def __len__(self) -> int:
    return len(self.queries)

  def __repr__(self) -> str:
    return f"TvrSource({str(self.path)!r}, {self.split!r}, {len(self)} queries)"

  def describe(self, i: int) -> dict[str, Any]:
    """Query i without features."""
    q = self.queries[int(i)]
    return {"id": str(q["desc_id"]), "desc_id": q["desc_id"], "desc": q["desc"],
            "type": q.get("type", ""), "vid_name": q.get("vid_name"),
            "ts": [float(t) for t in q["ts"]] if "ts" in q else None,
            "duration": float(q["duration"]) if "duration" in q else None}

  def __getitem__(self, i: int) -> dict[str, Any]:
    item = self.describe(i)
    query = self.query_h5.read(item["id"], self.query_dim)
    return {**item, "query": l2_normalize(query) if self.normalize_text else query}

  def context(self, vid_name: str) -> dict[str, np.ndarray]:
    """{"video": float32 [n, Dv], "sub": [n, Ds] (with sub_features)} of a corpus video."""
    parts = [h5.read(vid_name) for h5 in self.video_h5]
    if len({p.shape[0] for p in parts}) > 1:
      raise errors.BadInput(f"video {vid_name!r}: the video feature files disagree on the clip "
                            f"count ({[p.shape[0] for p in parts]} in "
                            f"{[str(h.file) for h in self.video_h5]})")
    if self.normalize_video:
      parts = [l2_normalize(p) for p in parts]
    out = {"video": np.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0]}
    if self.sub_h5 is not None:
      sub = self.sub_h5.read(vid_name, self.sub_dim)
      if sub.shape[0] != out["video"].shape[0]:
        raise errors.BadInput(f"{self.sub_h5.file}, key {vid_name!r}: {sub.shape[0]} clips but the "
                              f"video features have {out['video'].shape[0]}; both must be on one "
                              f"{self.clip_length} s clip grid")
      out["sub"] = l2_normalize(sub) if self.normalize_text else sub
    return out


@builders.register_dataset("tvr")
def _open(cfg, split: str) -> TvrSource:
  return TvrSource(cfg, split)
