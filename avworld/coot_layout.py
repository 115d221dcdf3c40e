r"""The synthetic paragraph videos written in COOT's feature layout (`make demo-coot`).

Videos are `multiscene.MultiSceneSource` examples (3-8 scenes of 2-4 s, one
sentence per scene). `write` lays them out as `avtext.data.coot_files`
describes, under the names configs/coot_activitynet.py:demo expects:
meta_all.json (splits "train", "val"), synthetic_tower.h5 and
text_feat_synthetic_meta_all_transformers_minilm-l6_-2,-1.h5 with its
_sentence_splits.json. The features come from the caller's encoders:

  video_features(source, indices, *, feature_fps)   {video_id: float32 [T, D]}, one
                                                    step per 1 / feature_fps seconds
                                                    (`avtext.features.tower`)
  text_features(paragraphs)                         ({key: float32 [tokens, Dt]},
                                                    {key: tokens per sentence}) of
                                                    {key: sentences}
                                                    (`coot_text.encode_paragraphs`)

`python -m avworld.tools.coot_synthetic` writes it with a trained RGB tower and
MiniLM-L6.
"""
import pathlib
from typing import Callable

from avtext.data import coot_files
from avworld import multiscene
from avworld import world

VIDEO_FEATURES = "synthetic_tower"
# coot_text.default_name's scheme, so either command finds the other's file.
TEXT_FEATURES = "text_feat_synthetic_meta_all_transformers_minilm-l6_-2,-1"


def write(out_dir, *, num_train: int, num_val: int, spec: world.WorldSpec,
          video_features: Callable, text_features: Callable, seed: int = 0,
          feature_fps: float = 1.0) -> int:
  """Writes the dataset under `out_dir` (module docstring); returns its number of videos."""
  out = pathlib.Path(out_dir)
  meta, videos, paragraphs = {}, {}, {}
  for split, n in (("train", num_train), ("val", num_val)):
    source = multiscene.MultiSceneSource(split, seed=seed, num_examples=n, spec=spec)
    videos.update(video_features(source, range(n), feature_fps=feature_fps))
    for i in range(n):
      d = source.describe(i)
      meta[d["video_id"]] = {
          "data_key": d["video_id"], "split": split, "duration_sec": d["duration_s"],
          "segments": [{"start_sec": s["start_s"], "stop_sec": s["stop_s"],
                        "text": s["sentence"]} for s in d["segments"]]}
      paragraphs[d["video_id"]] = d["paragraph"]
  text, lengths = text_features(paragraphs)
  coot_files.write_video_features_h5(out, VIDEO_FEATURES, videos)
  coot_files.write_text_features(out, TEXT_FEATURES, text, lengths)
  coot_files.write_meta(out, meta)
  return len(meta)
