r"""Writes COOT's meta file (`meta_all.json`) from the official caption annotations.

    python -m avtext.tools.coot_meta --dataset=activitynet \
        --annotations=<coot-videotext>/annotations/activitynet --out=data/activitynet
    python -m avtext.tools.coot_meta --dataset=youcook2 \
        --annotations=<coot-videotext>/annotations/youcook2 --out=data/youcook2

What COOT's data_read_activitynet_meta.py and data_read_youcook2_meta.py write, in the
layout `avtext.data.coot_files` documents and the `coot` dataset reads, without COOT's
code or its dependencies:

  activitynet   --annotations holds train.json, val_1.json, val_2.json (ActivityNet
                Captions: {"v_<youtube id>": {"duration", "timestamps": [[start, stop],
                ...], "sentences": [...]}}); one entry per video and split, key
                "<youtube id>_<split>", data_key the 11-letter id, runs of white space
                in a sentence made one space. The durations are the files' own
                ("duration"), as COOT's; captioning_video_feat_duration.csv beside them
                belongs to MART's captioning features and is not read.
  youcook2      --annotations holds youcookii_annotations_trainval.json ({"database":
                {id: {"duration", "subset": "training" | "validation", "annotations":
                [{"segment": [start, stop], "sentence"}, ...]}}}); key and data_key the
                video id, splits train / val.

Segments, as COOT's scripts and its loader (coot/dataset_retrieval.py) treat them:
a reversed segment (stop before start) has its ends swapped; one that ends past the
video ends at the video's end (the loader clamps its stop frame to the last one, so
the frames are the same) and one that starts before 0 starts at 0; a zero-length one is
kept: the loader gives it ceil - floor + add_stop_frame frames (COOT's YouCook2 script
asserts there are none, and ActivityNet's train.json has two). The command prints the
videos and segments of each split and how many segments each rule changed; a segment
that starts at or after its video's end (none in the official files) has no frames and
is reported, for the `coot` dataset refuses it.
"""
import json
import pathlib
import re

from absl import flags
import tqdm

from avtext import cli
from avtext import errors
from avtext.data import coot_files

DATASETS = ("activitynet", "youcook2")
ACTIVITYNET_SPLITS = ("train", "val_1", "val_2")
YOUCOOK2_FILE = "youcookii_annotations_trainval.json"
YOUCOOK2_SPLITS = {"training": "train", "validation": "val"}
_SPACES = re.compile(r"\s+")
# What each segment rule counts, in the order the summary prints them.
RULES = ("reversed", "past_end", "before_start", "zero_length", "no_frames")
_RULE_TEXT = {"reversed": "reversed (ends swapped)", "past_end": "ending past the video "
              "(clamped to its end)", "before_start": "starting before 0 (clamped to 0)",
              "zero_length": "of zero length (kept: add_stop_frame frames when read)",
              "no_frames": "starting at or after the video's end (no frames: the coot "
              "dataset refuses them; fix them or drop the video)"}


def _number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def segment(start, stop, duration: float, counts: dict, where: str) -> tuple[float, float]:
  """(start_sec, stop_sec) of an annotated segment under the rules above; `counts`
  gains the rules it met."""
  if not (_number(start) and _number(stop)):
    raise errors.BadInput(f"{where}: expected [start, stop] in seconds, got "
                          f"{[start, stop]!r}")
  if stop < start:
    start, stop = stop, start
    counts["reversed"] += 1
  if stop > duration:
    stop = duration
    counts["past_end"] += 1
  if start < 0:
    start = 0
    counts["before_start"] += 1
  if start >= duration:
    counts["no_frames"] += 1
  elif stop == start:
    counts["zero_length"] += 1
  return start, stop


def _duration(value, where: str) -> float:
  if not _number(value) or not value > 0:
    raise errors.BadInput(f"{where}: duration={value!r}; expected a number of seconds > 0")
  return value


def _read(file: pathlib.Path, what: str):
  if not file.is_file():
    raise errors.InputNotFound(f"--annotations={file.parent}: no {file.name} there; expected "
                               f"{what}")
  try:
    return json.loads(file.read_text(encoding="utf-8"))
  except (ValueError, UnicodeDecodeError) as e:
    raise errors.BadInput(f"{file}: not JSON ({e}); expected {what}") from None


def activitynet(annotations: pathlib.Path) -> tuple[dict, dict]:
  """(meta, {split: counts}) of ActivityNet Captions' train / val_1 / val_2 files."""
  meta, stats = {}, {}
  for split in ACTIVITYNET_SPLITS:
    file = annotations / f"{split}.json"
    raw = _read(file, f"ActivityNet Captions' {split}.json")
    if not isinstance(raw, dict):
      raise errors.BadInput(f"{file}: expected {{\"v_<id>\": {{\"duration\", \"timestamps\", "
                            f"\"sentences\"}}}}, got a {type(raw).__name__}")
    counts = stats[split] = dict.fromkeys(("videos", "segments") + RULES, 0)
    for key, video in tqdm.tqdm(raw.items(), desc=split, unit="video", leave=False):
      where = f"{file}, {key!r}"
      if not key.startswith("v_") or not isinstance(video, dict):
        raise errors.BadInput(f"{where}: expected keys v_<youtube id> holding {{\"duration\", "
                              "\"timestamps\", \"sentences\"}")
      stamps, sentences = video.get("timestamps"), video.get("sentences")
      if not (isinstance(stamps, list) and isinstance(sentences, list)
              and len(stamps) == len(sentences) and stamps):
        raise errors.BadInput(f"{where}: 'timestamps' and 'sentences' must be lists of the "
                              "same, non-zero length")
      duration = _duration(video.get("duration"), where)
      segments = []
      for i, (stamp, sentence) in enumerate(zip(stamps, sentences)):
        if not isinstance(stamp, list) or len(stamp) != 2 or not isinstance(sentence, str):
          raise errors.BadInput(f"{where}, segment {i}: expected [start, stop] and a sentence")
        start, stop = segment(*stamp, duration, counts, f"{where}, segment {i}")
        segments.append({"text": _SPACES.sub(" ", sentence), "start_sec": start,
                         "stop_sec": stop})
      data_key = key[2:]
      meta[f"{data_key}_{split}"] = {"data_key": data_key, "split": split,
                                     "duration_sec": duration, "segments": segments}
      counts["videos"] += 1
      counts["segments"] += len(segments)
  return meta, stats


def youcook2(annotations: pathlib.Path) -> tuple[dict, dict]:
  """(meta, {split: counts}) of YouCook2's youcookii_annotations_trainval.json."""
  file = annotations / YOUCOOK2_FILE
  raw = _read(file, "YouCook2's annotations")
  database = raw.get("database") if isinstance(raw, dict) else None
  if not isinstance(database, dict):
    raise errors.BadInput(f"{file}: no 'database' object; expected YouCook2's "
                          f"{YOUCOOK2_FILE}")
  meta, stats = {}, {}
  for key, video in tqdm.tqdm(database.items(), desc="youcook2", unit="video", leave=False):
    where = f"{file}, {key!r}"
    if not isinstance(video, dict) or video.get("subset") not in YOUCOOK2_SPLITS:
      subset = video.get("subset") if isinstance(video, dict) else video
      raise errors.BadInput(f"{where}: subset {subset!r}; expected one of "
                            f"{sorted(YOUCOOK2_SPLITS)} (the train / val annotations)")
    split = YOUCOOK2_SPLITS[video["subset"]]
    counts = stats.setdefault(split, dict.fromkeys(("videos", "segments") + RULES, 0))
    duration = _duration(video.get("duration"), where)
    segments = []
    for i, seg in enumerate(video.get("annotations") or ()):
      bounds = seg.get("segment") if isinstance(seg, dict) else None
      if not (isinstance(bounds, list) and len(bounds) == 2
              and isinstance(seg.get("sentence"), str)):
        raise errors.BadInput(f"{where}, annotation {i}: expected {{\"segment\": [start, "
                              "stop], \"sentence\"}")
      start, stop = segment(*bounds, duration, counts, f"{where}, annotation {i}")
      segments.append({"text": seg["sentence"], "start_sec": float(start),
                       "stop_sec": float(stop)})
    if not segments:
      raise errors.BadInput(f"{where}: no annotations; every video needs at least one "
                            "segment")
    meta[key] = {"data_key": key, "split": split, "duration_sec": duration,
                 "segments": segments}
    counts["videos"] += 1
    counts["segments"] += len(segments)
  return meta, dict(sorted(stats.items(), key=lambda kv: kv[0] != "train"))


def summary(stats: dict) -> list[str]:
  """One line per split: its videos and segments, then what each rule changed."""
  lines = []
  for split, counts in stats.items():
    rules = [f"{counts[r]} {_RULE_TEXT[r]}" for r in RULES if counts[r]]
    lines.append(f"{split}: {counts['videos']} videos, {counts['segments']} segments"
                 + (f"; segments {', '.join(rules)}" if rules else ""))
  return lines


FLAGS = flags.FlagValues()
_DATASET = flags.DEFINE_enum("dataset", None, list(DATASETS), "which annotations",
                             flag_values=FLAGS)
_ANNOTATIONS = cli.DEFINE_path("annotations", None, "the folder of the official annotation "
                               "files (COOT's annotations/activitynet or annotations/youcook2)",
                               flag_values=FLAGS)
_OUT = cli.DEFINE_path("out", None, "the COOT dataset directory to write meta_<name>.json "
                       "into (created when missing)", flag_values=FLAGS)
_NAME = flags.DEFINE_string("metadata_name", "all", "writes meta_<name>.json "
                            "(config.dataset.metadata_name)", flag_values=FLAGS)
flags.mark_flags_as_required(["dataset", "annotations", "out"], flag_values=FLAGS)


def main(argv):
  if len(argv) > 1:
    raise errors.BadInput(f"unexpected arguments {list(argv[1:])}; see --help")
  cli.check_input_dir("annotations", _ANNOTATIONS.value, "folder of annotation files")
  cli.check_output_dir("out", _OUT.value)
  read = activitynet if _DATASET.value == "activitynet" else youcook2
  meta, stats = read(pathlib.Path(_ANNOTATIONS.value))
  out = pathlib.Path(_OUT.value)
  out.mkdir(parents=True, exist_ok=True)
  path = coot_files.write_meta(out, meta, _NAME.value)
  print("\n".join(summary(stats)))
  print(f"wrote {path} ({len(meta)} entries); next: the text features (python -m "
        f"avtext.features coot_text --dataset_dir={out}) and the video features, then "
        f"--config.dataset.path={out}")


if __name__ == "__main__":
  cli.run(main, FLAGS)
