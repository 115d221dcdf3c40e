r"""Writes the synthetic paragraph videos in COOT's feature layout (`make demo-coot`).

    python -m avtext.tools.coot_synthetic --tower_workdir=workdirs/demo/video_pretrain \
        --out=workdirs/demo/coot_data --num_train=1000 --num_val=500 [--force]

Videos are `MultiSceneSource` examples (3-8 scenes of 2-4 s, one sentence per
scene). Video features: one per time step at `--feature_fps` (default 1 per second,
at the centre of each step; 2/s doubles the tower time and the sequence lengths), the [CLS] embedding of the trained RGB tower in
`--tower_workdir` (`configs/synthetic_video_pretrain.py`) on the tower's own
input: `data.num_frames` frames `data.frame_stride` apart around that centre
(clamped to the video), normalized as in training, like the I3D / S3D / Inception
features of the real datasets. Text features: MiniLM-L6's last two layers per
token of the "bert_paper" paragraph (768-d), as COOT's BERT features.
Written (names as configs/coot_activitynet.py:demo expects): meta_all.json
(splits "train", "val"), synthetic_tower.h5, text_feat_synthetic_meta_all_transformers_minilm-l6_-2,-1.h5
and its _sentence_splits.json; a finished directory (marker file DONE with the
arguments) is reused, `--force` rebuilds.
"""
import json
import pathlib
import time

from absl import app
from absl import flags
from absl import logging

from avtext.data import feature_layout
from avtext.data.synthetic import multiscene
from avtext.features import coot_text
from avtext.features import done
from avtext.features.tower import extract_video_features
from avtext.features.tower import tower_from_run
from avtext.features.tower import window_frames  # pylint: disable=unused-import

VIDEO_FEATURES = "synthetic_tower"
# coot_text.default_name's scheme, so either command finds the other's file.
TEXT_FEATURES = "text_feat_synthetic_meta_all_transformers_minilm-l6_-2,-1"


def build_dataset(out_dir, *, tower_workdir, num_train: int, num_val: int, seed: int = 0,
                  feature_fps: float = 1.0, force: bool = False) -> pathlib.Path:
  out = pathlib.Path(out_dir)
  args = dict(tower_workdir=str(pathlib.Path(tower_workdir).absolute()), num_train=num_train,
              num_val=num_val, seed=seed, feature_fps=feature_fps,
              files=[VIDEO_FEATURES, TEXT_FEATURES])
  if done.reuse_finished(out, args, force):
    return out
  begin = time.time()
  apply_fn, frames_per_window, stride, spec = tower_from_run(tower_workdir)
  meta, videos, paragraphs = {}, {}, {}
  for split, n in (("train", num_train), ("val", num_val)):
    source = multiscene.MultiSceneSource(split, seed=seed, num_examples=n, spec=spec)
    videos.update(extract_video_features(source, range(n), apply_fn=apply_fn,
                                         frames_per_window=frames_per_window,
                                         frame_stride=stride, feature_fps=feature_fps))
    for i in range(n):
      d = source.describe(i)
      meta[d["video_id"]] = {
          "data_key": d["video_id"], "split": split, "duration_sec": d["duration_s"],
          "segments": [{"start_sec": s["start_s"], "stop_sec": s["stop_s"],
                        "text": s["sentence"]} for s in d["segments"]]}
      paragraphs[d["video_id"]] = d["paragraph"]
  text, lengths = coot_text.encode_paragraphs(paragraphs)
  feature_layout.write_video_features_h5(out, VIDEO_FEATURES, videos)
  feature_layout.write_text_features(out, TEXT_FEATURES, text, lengths)
  feature_layout.write_meta(out, meta)
  done.mark_finished(out, args)
  logging.info("wrote %d videos to %s in %.0f s", len(meta), out, time.time() - begin)
  return out


_TOWER = flags.DEFINE_string("tower_workdir", None, "run dir of the trained RGB tower")
_OUT = flags.DEFINE_string("out", None, "output dataset directory")
_TRAIN = flags.DEFINE_integer("num_train", 1000, "training videos")
_VAL = flags.DEFINE_integer("num_val", 500, "validation videos")
_SEED = flags.DEFINE_integer("seed", 0, "world seed")
_FPS = flags.DEFINE_float("feature_fps", 1.0, "feature steps per second")
_FORCE = flags.DEFINE_bool("force", False, "rebuild even if complete")


def main(argv):
  del argv
  if not _TOWER.value or not _OUT.value:
    raise app.UsageError("--tower_workdir and --out are required")
  build_dataset(_OUT.value, tower_workdir=_TOWER.value, num_train=_TRAIN.value,
                num_val=_VAL.value, seed=_SEED.value, feature_fps=_FPS.value,
                force=_FORCE.value)


if __name__ == "__main__":
  app.run(main)
