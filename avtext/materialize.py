r"""Store a registered clips dataset as array_record files (decode once, read many times).

    python -m avtext.materialize --config=configs/videocc_avr.py \
        --config.evals.msrvtt.dataset.path=/data/msrvtt --dataset_of=evals.msrvtt \
        --splits=train,test --name=msrvtt_clips --data_dir=/data/clips [--short_side=256] \
        [--format=frames_jpeg|frames_png|frames_raw|tfds] [--quality=95] [--workers=4]

reads each split of the dataset `config.dataset` names (or `config.<dataset_of>.dataset`,
with the evaluator's overrides) through the registry -- for the real datasets the
user's media files, lazily, via `builders.media_clips`, --workers clips at a time -- and stores
every clip (frames at the dataset's fps, resized on decode to --short_side; 16 kHz audio;
has_audio, caption, clip_id, video_id) under --data_dir/<name>, with a progress bar per
split, in the source's order. --format:

  frames_jpeg  (default) one record per frame, JPEG at --quality; a training read decodes
               only the 32 frames it samples (`avtext.data.framestore`). Read it with
               --config.dataset.name=frames:<name> --config.dataset.data_dir=<data_dir>
  frames_png,  the same, lossless (PNG; raw uint8 pixels: no decoding, ~10x the bytes)
  frames_raw
  tfds         a TFDS dataset, one record per clip (all its frames in one zlib'd tensor, so
               a read inflates the whole clip); read it with --config.dataset.name=tfds:<name>

Entries that fail to decode while being written are counted by reason like those the
source skipped when it opened: both go to <data_dir>/<name>/skipped.json and are printed.
An audio-only dataset (Clotho) stores no frames.
"""
import contextlib
import pathlib
import sys

from absl import flags
from ml_collections import config_flags

from avtext import cli
from avtext import errors
from avtext.data import clip_export
from avtext.train import rundir

FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "the experiment config whose dataset is stored "
    "(configs/<x>.py[:variant]; --config.<field>=<value> overrides)", flag_values=FLAGS)
_DATASET_OF = flags.DEFINE_string(
    "dataset_of", None, "read config.<this>.dataset (e.g. evals.msrvtt, merged over "
    "config.dataset as the evaluator merges it) instead of config.dataset", flag_values=FLAGS)
_SPLITS = flags.DEFINE_list("splits", ["train"], "the splits to store", flag_values=FLAGS)
_NAME = flags.DEFINE_string("name", None, "the dataset name to write (snake_case)",
                            flag_values=FLAGS)
_DATA_DIR = cli.DEFINE_path("data_dir", None, "the directory to write <name>/ under",
                            flag_values=FLAGS)
_SHORT_SIDE = flags.DEFINE_integer("short_side", None, "resize frames on decode to this "
                                   "shorter side (default: the dataset's)", flag_values=FLAGS)
_FORMAT = flags.DEFINE_enum("format", clip_export.DEFAULT_FORMAT, clip_export.FORMATS,
                            "how to store the frames (see the module docstring)",
                            flag_values=FLAGS)
_QUALITY = flags.DEFINE_integer("quality", 95, "JPEG quality of --format=frames_jpeg (1-100)",
                                flag_values=FLAGS)
_WORKERS = flags.DEFINE_integer("workers", 4, "clips decoded (and frames encoded) at a time",
                                flag_values=FLAGS)
flags.mark_flags_as_required(["config", "name", "data_dir"], flag_values=FLAGS)


def main(argv):
  if len(argv) > 1:
    raise errors.BadInput(f"unexpected arguments {list(argv[1:])}; see --help")
  config = cli.config_value(_CONFIG)
  dataset = clip_export.dataset_config(config, _DATASET_OF.value)
  if _SHORT_SIDE.value:
    dataset.short_side = _SHORT_SIDE.value
  cli.check_output_dir("data_dir", _DATA_DIR.value)
  # One process writes a dataset at a time, as one writes a run directory.
  # TFDS prints "Downloading and preparing" and its progress on stdout: progress goes to
  # stderr, stdout keeps the results.
  with rundir.output_lock(pathlib.Path(_DATA_DIR.value) / _NAME.value, "data_dir"), \
      contextlib.redirect_stdout(sys.stderr):
    summary = clip_export.materialize(dataset, _SPLITS.value, name=_NAME.value,
                                      data_dir=_DATA_DIR.value, fmt=_FORMAT.value,
                                      quality=_QUALITY.value, workers=_WORKERS.value)
  for split, s in summary.items():
    skipped = ", ".join(f"{k} {v}" for k, v in s["skipped"].items()) or "none"
    print(f"{split}: {s['records']} records; skipped: {skipped}")
  read_name = clip_export.READ_NAME[_FORMAT.value].format(name=_NAME.value)
  print(f"stored in {pathlib.Path(_DATA_DIR.value) / _NAME.value}: read it with "
        f"--config.dataset.name={read_name} --config.dataset.data_dir={_DATA_DIR.value}")


if __name__ == "__main__":
  cli.run(main, FLAGS)
