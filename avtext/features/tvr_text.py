r"""TVR's query and subtitle token features (the layout `builders.tvr` reads).

    python -m avtext.features tvr_text --data=/data/tvr [--bert_dir=/models/roberta-ft] \
        [--layer=-2] [--subtitles=tvqa_preprocessed_subtitles.jsonl] \
        [--video_features=tvr_resnet152_rgb_max_i3d_rgb600_avg_cat_cl-1.5] [--force]

Writes, with the official names under `<data>/bert_feature/sub_query/`:

  tvr_query_pretrained_w_sub_query.h5          str(desc_id) -> float32 [L, D]: the
      hidden state `--layer` (official: the second-to-last) of every token of
      "[CLS] desc [SEP]" cut to 30 tokens, [CLS] and [SEP] removed, for every
      query of tvr_{train,val,test_public}_release.jsonl present
  tvr_sub_pretrained_w_sub_query_max_cl-1.5.h5 vid_name -> float32 [n_clips, D]: per
      1.5 s clip, the max over the tokens of the subtitle lines touching it (a line
      [s, e] covers clips floor(s / 1.5) .. ceil(e / 1.5) - 1), zeros where none
      does; n_clips is the video feature file's; "<vid_name>-mask" -> float32
      [n_clips], 1 where a line touches the clip

Each subtitle line is encoded as its own "[CLS] line [SEP]" sequence. The
official features come from a RoBERTa fine-tuned on TVR's queries and
subtitles (768-d); the default here is the offline MiniLM-L6 as is (384-d),
so the configs set query_dim / sub_dim accordingly. Existing files are kept
unless `--force`.
"""
import math
import pathlib
import sys
from typing import Sequence

from absl import flags
from absl import logging
import numpy as np

from avtext import cli
from avtext import errors

from avtext.data import coot_files
from avtext.data.builders import tvc
from avtext.data.builders import tvr
from avtext.train import rundir
from avtext.weights import bert_encoder

MAX_LINE_TOKENS = 64


def clip_span(start: float, end: float, clip_length: float) -> tuple[int, int]:
  """Clips [a, b) a subtitle line [start, end] seconds touches (TVCaption / TVR rule)."""
  return int(math.floor(start / clip_length)), int(math.ceil(end / clip_length))


def pool_subtitles(lines: Sequence[tuple[float, float, np.ndarray]], num_clips: int,
                   clip_length: float, dim: int) -> tuple[np.ndarray, np.ndarray]:
  """(float32 [num_clips, dim] max over the tokens of the lines touching each clip, mask)."""
  out = np.full((num_clips, dim), -np.inf, np.float32)
  for start, end, tokens in lines:
    a, b = clip_span(start, end, clip_length)
    a, b = max(a, 0), min(b, num_clips)
    if a < b:
      out[a:b] = np.maximum(out[a:b], tokens.max(axis=0))
  mask = np.isfinite(out[:, 0]).astype(np.float32)
  out[mask == 0] = 0.0
  return out, mask


def write(data_dir, *, bert_dir=None, layer: int = -2, subtitles: str = tvc.DEFAULT_SUBTITLES,
          video_features: str = tvr.DEFAULT_VIDEO_FEATURES[0],
          clip_length: float = tvc.CLIP_LENGTH,
          batch_size: int = 64, force: bool = False) -> tuple[pathlib.Path, pathlib.Path]:
  """Writes both files (module docstring); returns (query h5, subtitle h5)."""
  import h5py  # pylint: disable=g-import-not-at-top

  data = pathlib.Path(data_dir)
  query_out, sub_out = data / tvr.DEFAULT_QUERY_FEATURES, data / tvr.DEFAULT_SUB_FEATURES
  if query_out.is_file() and sub_out.is_file() and not force:
    logging.info("%s and %s exist; nothing to do (--force overwrites)", query_out, sub_out)
    return query_out, sub_out
  encoder = bert_encoder.TextEncoder(bert_dir, (layer,))

  queries = {}
  for split in tvr.SPLITS:
    file = tvr.annotation_path(data, split)
    if file.is_file():
      for n, row in enumerate(tvc.read_jsonl(file, "TVR annotations"), 1):
        if not isinstance(row, dict) or "desc_id" not in row or "desc" not in row:
          raise ValueError(f"{file}, line {n}: expected desc_id and desc")
        queries[str(row["desc_id"])] = str(row["desc"])
  if not queries:
    raise FileNotFoundError(f"no tvr_<split>_release.jsonl under {data}")
  feats = encoder.token_features(queries, tvr.MAX_QUERY_TOKENS, batch_size=batch_size,
                                 desc="query features")
  coot_files.write_h5(query_out, feats)

  video_file = tvc.video_features_path(data, video_features)
  if not video_file.is_file():
    raise FileNotFoundError(f"{video_file} not found: the subtitle features take their clip "
                            "count from it (--video_features)")
  with h5py.File(video_file, "r") as h5:
    num_clips = {k: int(h5[k].shape[0]) for k in h5.keys()}
  subs_file = data / subtitles
  lines, texts = {}, {}
  for n, row in enumerate(tvc.read_jsonl(subs_file, "subtitles"), 1):
    if not isinstance(row, dict) or "vid_name" not in row or "sub" not in row:
      raise ValueError(f"{subs_file}, line {n}: expected {{\"vid_name\", \"sub\": [...]}}")
    if row["vid_name"] not in num_clips:
      continue
    lines[row["vid_name"]] = []
    for j, s in enumerate(row["sub"]):
      try:
        start, end, text = float(s["start"]), float(s["end"]), str(s["text"])
      except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{subs_file}, line {n}, sub {j}: needs start, end, text ({e})") from e
      key = f"{row['vid_name']}/{j}"
      texts[key] = text
      lines[row["vid_name"]].append((start, end, key))
  missing = sorted(set(num_clips) - set(lines))
  if missing:
    logging.warning("%d videos of %s have no subtitle line in %s: all-zero subtitle features, "
                    "e.g. %s", len(missing), video_file, subs_file, missing[:3])
  line_feats = encoder.token_features(texts, MAX_LINE_TOKENS, batch_size=batch_size,
                                      desc="subtitle features")
  arrays = {}
  for vid, n in num_clips.items():
    pooled, mask = pool_subtitles(
        [(s, e, line_feats[k]) for s, e, k in lines.get(vid, [])], n, clip_length, encoder.dim)
    arrays[vid], arrays[f"{vid}-mask"] = pooled, mask
  coot_files.write_h5(sub_out, arrays)
  logging.info("wrote %d query and %d video subtitle features (%d-d) to %s", len(feats),
               len(num_clips), encoder.dim, query_out.parent)
  return query_out, sub_out


FLAGS = flags.FlagValues()
_DATA = cli.DEFINE_path("data", None, "the TVR directory (avtext/data/builders/tvr.py "
                        "layout)", flag_values=FLAGS)
_BERT_DIR = cli.DEFINE_path("bert_dir", None, "a local HF BERT directory (default: the "
                            "offline MiniLM-L6)", flag_values=FLAGS)
_LAYER = flags.DEFINE_integer("layer", -2, "the hidden state to store (HF numbering)",
                              flag_values=FLAGS)
_SUBTITLES = flags.DEFINE_string("subtitles", tvc.DEFAULT_SUBTITLES, "the subtitle file's "
                                 "name under --data", flag_values=FLAGS)
_VIDEO_FEATURES = flags.DEFINE_string(
    "video_features", tvr.DEFAULT_VIDEO_FEATURES[0], "the video feature h5 under --data "
    "that gives each video's clip count", flag_values=FLAGS)
_CLIP_LENGTH = flags.DEFINE_float("clip_length", tvc.CLIP_LENGTH, "seconds per clip (TVR: 1.5)",
                                  flag_values=FLAGS)
_FORCE = flags.DEFINE_bool("force", False, "overwrite existing features", flag_values=FLAGS)
flags.mark_flag_as_required("data", flag_values=FLAGS)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise errors.BadInput(f"unexpected arguments {list(argv[1:])}; see --help")
  cli.log_progress()
  cli.check_input_dir("data", _DATA.value, "TVR directory")
  with rundir.output_lock(_DATA.value, "data"):
    queries, subtitles = write(_DATA.value, bert_dir=_BERT_DIR.value, layer=_LAYER.value,
                subtitles=_SUBTITLES.value, video_features=_VIDEO_FEATURES.value,
                clip_length=_CLIP_LENGTH.value, force=_FORCE.value)
  print(f"features written to {queries} and {subtitles}")


if __name__ == "__main__":  # python -m avtext.features.tvr_text: as python -m avtext.features tvr_text
  cli.run(main, FLAGS, [f"python -m avtext.features tvr_text"] + sys.argv[1:], doc=__doc__)
