r"""The synthetic long videos written in the official TVR / TVC layout (`make demo-tvc`).

Videos are `longvideo.LongVideoSource` examples (4-8 scenes of 3-7.5 s with a
subtitle stream; 3 moments per video, each one scene, with 2 descriptions in
train and 4 in val / test_public). Written, in the layout `builders.tvc` reads
(and TVRetrieval's, for the XML issue):

  tvc_{train,val,test_public}_release.jsonl   moments, TVC fields + "attributes"
                                               (the scene's ground truth)
  tvr_{train,val,test_public}_release.jsonl   XML's queries: desc_id, desc, type,
                                               vid_name, duration, ts; every
                                               description of a training moment, the
                                               first one of a val / test moment (TVR
                                               has one query per moment)
  tvr_video2dur_idx.json                      {split: {vid_name: [duration, idx]}}
  world.json                                  the world that wrote it (`truth`): the
                                               `tvc` source's ground truth
  tvqa_preprocessed_subtitles.jsonl           every video's lines
  video_feature/synthetic_tower_cl-1.5.h5     vid_name -> [ceil(duration / 1.5), D]
  bert_feature/sub_query/*.h5                 query and subtitle token features

The features come from the caller's encoders:

  video_features(source, indices, *, feature_fps, num_steps)
      {video_id: float32 [T, D]}, one row per 1.5 s clip (`avtext.features.tower`),
      L2-normalized here as the official per-part normalization (x / (||x|| + 1e-5))
  text_features(out_dir)
      writes bert_feature/sub_query/ from the files above, called last
      (`avtext.features.tvr_text.write`)

Clip ids and description ids are integers, unique over the splits.
`python -m avworld.tools.tvr_synthetic` writes it with a trained RGB tower and
MiniLM-L6.
"""
import json
import pathlib
from typing import Callable

import numpy as np

from avtext import atomic
from avtext.data import coot_files
from avtext.data.builders import tvc
from avtext.data.builders import tvr
from avworld import longvideo
from avworld import truth
from avworld import world

VIDEO_FEATURES = f"synthetic_tower_cl-{tvc.CLIP_LENGTH}"
SPLITS = (("train", "train"), ("val", "val"), ("test_public", "test"))  # file name, world split


def l2_normalize(x: np.ndarray, eps: float = 1e-5) -> np.ndarray:
  return (x / (np.linalg.norm(x, axis=-1, keepdims=True) + eps)).astype(np.float32)


def annotations(source: longvideo.LongVideoSource, indices, clip_ids, desc_ids, *,
                all_queries: bool = False):
  """(TVC lines, TVR lines, subtitle lines) of `indices`; ids drawn from the two iterators.

  TVR lines: every description of a moment with `all_queries`, else its first.
  """
  tvc_rows, tvr_rows, subs = [], [], []
  for i in indices:
    d = source.describe(i)
    vid, duration = d["video_id"], round(d["duration_s"], 3)
    subs.append({"vid_name": vid, "sub": [{"text": s["text"], "start": s["start"],
                                           "end": s["end"]} for s in d["subtitles"]]})
    for m in d["moments"]:
      ts = [round(t, 3) for t in m["ts"]]
      descs = [{"desc": x["desc"], "type": x["type"], "desc_id": next(desc_ids)}
               for x in m["descs"]]
      tvc_rows.append({"vid_name": vid, "duration": duration, "ts": ts,
                       "clip_id": next(clip_ids), "descs": descs,
                       "attributes": m["attributes"]})
      tvr_rows += [{"desc_id": x["desc_id"], "desc": x["desc"], "type": x["type"],
                    "vid_name": vid, "duration": duration, "ts": ts}
                   for x in (descs if all_queries else descs[:1])]
  return tvc_rows, tvr_rows, subs


def _write_jsonl(path: pathlib.Path, rows) -> None:
  atomic.write_text(path, "".join(json.dumps(r) + "\n" for r in rows), durable=False)

def write(out_dir, *, num_train: int, num_val: int, num_test: int, spec: world.WorldSpec,
          video_features: Callable, text_features: Callable, seed: int = 0) -> int:
  """Writes the dataset under `out_dir` (module docstring); returns its number of videos."""
  out = pathlib.Path(out_dir)
  (out / "video_feature").mkdir(parents=True, exist_ok=True)
  clip_ids, desc_ids = iter(range(10**9)), iter(range(10**9))
  videos, all_subs, video2idx = {}, [], {}
  for name, split in SPLITS:
    n = {"train": num_train, "val": num_val, "test": num_test}[split]
    source = longvideo.LongVideoSource(split, seed=seed, num_examples=n, spec=spec,
                                       clip_length_s=tvc.CLIP_LENGTH)
    feats = video_features(source, range(n), feature_fps=1.0 / tvc.CLIP_LENGTH,
                           num_steps=source.num_clips)
    videos.update({k: l2_normalize(v) for k, v in feats.items()})
    tvc_rows, tvr_rows, subs = annotations(source, range(n), clip_ids, desc_ids,
                                           all_queries=split == "train")
    video2idx[name] = {}
    for i in range(n):
      d = source.describe(i)
      video2idx[name][d["video_id"]] = [round(d["duration_s"], 3), len(videos) - n + i]
    _write_jsonl(tvc.annotation_path(out, name), tvc_rows)
    _write_jsonl(out / f"tvr_{name}_release.jsonl", tvr_rows)
    all_subs += subs
  _write_jsonl(out / tvc.DEFAULT_SUBTITLES, all_subs)
  coot_files.write_video_features_h5(out / "video_feature", VIDEO_FEATURES, videos)
  coot_files.write_json(out / tvr.VIDEO2IDX, video2idx)
  truth.write_world_file(out)
  text_features(out)
  return len(videos)
