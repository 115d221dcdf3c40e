r"""Writes the synthetic long videos in the official TVR / TVC layout (`make demo-tvc`).

    python -m avtext.tools.tvr_synthetic --tower_workdir=workdirs/demo/video_pretrain \
        --out=workdirs/demo/tvr_data --num_train=1000 --num_val=200 --num_test=300 [--force]

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
  tvqa_preprocessed_subtitles.jsonl           every video's lines
  video_feature/synthetic_tower_cl-1.5.h5     vid_name -> [ceil(duration / 1.5), D]
  bert_feature/sub_query/*.h5                 query and subtitle token features
                                               (`tvr_text_features`, MiniLM-L6, 384-d)

Video features: one row per 1.5 s clip, the trained RGB tower's embedding of
its own input window centred on the clip (`tower_features`), L2-normalized as
the official per-part normalization (x / (||x|| + 1e-5)). Clip ids and
description ids are integers, unique over the splits. A finished directory
(marker file DONE holding the arguments) is reused; `--force` rebuilds.
"""
import json
import pathlib
import time

from absl import app
from absl import flags
from absl import logging
import numpy as np

from avtext.data import feature_layout
from avtext.data.builders import tvc
from avtext.data.builders import tvr
from avtext.data.synthetic import longvideo
from avtext.features import done
from avtext.features import tower as tower_features
from avtext.features import tvr_text

VIDEO_FEATURES = "synthetic_tower_cl-1.5"
CLIP_LENGTH = 1.5
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
  tmp = path.with_suffix(path.suffix + ".tmp")
  tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
  tmp.replace(path)


def build_dataset(out_dir, *, tower_workdir, num_train: int, num_val: int, num_test: int,
                  seed: int = 0, force: bool = False) -> pathlib.Path:
  out = pathlib.Path(out_dir)
  args = dict(tower_workdir=str(pathlib.Path(tower_workdir).absolute()), num_train=num_train,
              num_val=num_val, num_test=num_test, seed=seed,
              files=[VIDEO_FEATURES, "tvr_queries_v2", "tvr_text_features"])
  if done.reuse_finished(out, args, force):
    return out
  (out / "video_feature").mkdir(parents=True, exist_ok=True)
  begin = time.time()
  apply_fn, frames_per_window, stride, spec = tower_features.tower_from_run(tower_workdir)
  clip_ids, desc_ids = iter(range(10**9)), iter(range(10**9))
  videos, all_subs, video2idx = {}, [], {}
  for name, split in SPLITS:
    n = {"train": num_train, "val": num_val, "test": num_test}[split]
    source = longvideo.LongVideoSource(split, seed=seed, num_examples=n, spec=spec,
                                       clip_length_s=CLIP_LENGTH)
    feats = tower_features.extract_video_features(
        source, range(n), apply_fn=apply_fn, frames_per_window=frames_per_window,
        frame_stride=stride, feature_fps=1.0 / CLIP_LENGTH, num_steps=source.num_clips)
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
  feature_layout.write_video_features_h5(out / "video_feature", VIDEO_FEATURES, videos)
  feature_layout.write_json(out / tvr.VIDEO2IDX, video2idx)
  tvr_text.write(out, video_features=VIDEO_FEATURES, clip_length=CLIP_LENGTH,
                          force=True)
  done.mark_finished(out, args)
  logging.info("wrote %d videos to %s in %.0f s", len(videos), out, time.time() - begin)
  return out


def main(argv):
  del argv
  f = flags.FLAGS
  if not f.tower_workdir or not f.out:
    raise app.UsageError("--tower_workdir and --out are required")
  build_dataset(f.out, tower_workdir=f.tower_workdir, num_train=f.num_train,
                num_val=f.num_val, num_test=f.num_test, seed=f.seed, force=f.force)


if __name__ == "__main__":
  # Defined here, not at import: the tests import this module beside coot_synthetic,
  # which defines flags of the same names.
  flags.DEFINE_string("tower_workdir", None, "run dir of the trained RGB tower")
  flags.DEFINE_string("out", None, "output dataset directory")
  flags.DEFINE_integer("num_train", 1000, "training videos")
  flags.DEFINE_integer("num_val", 200, "validation videos")
  flags.DEFINE_integer("num_test", 300, "test_public videos")
  flags.DEFINE_integer("seed", 0, "world seed")
  flags.DEFINE_bool("force", False, "rebuild even if complete")
  app.run(main)
