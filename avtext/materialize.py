r"""Store a registered clips dataset as TFDS array_record files (decode once, read many times).

    python -m avtext.materialize --config=configs/videocc_avr.py \
        --config.evals.msrvtt.dataset.path=/data/msrvtt --dataset_of=evals.msrvtt \
        --splits=train,test --name=msrvtt_clips --data_dir=/data/tfds [--short_side=256]

reads each split of the dataset `config.dataset` names (or `config.<dataset_of>.dataset`,
with the evaluator's overrides) through the registry -- for the real datasets the
user's media files, lazily, via `builders.files` -- and writes every clip (frames at the
dataset's fps, resized on decode to --short_side; 16 kHz audio; has_audio, caption,
clip_id, video_id) as one record of the TFDS dataset `<name>` under --data_dir, with a
progress bar per split. Records are in the source's order. Entries that fail to decode
while being written are counted by reason like those the source skipped when it opened:
both go to <data_dir>/<name>/skipped.json and are printed. Afterwards train or evaluate
on it with

    --config.dataset.name=tfds:<name> --config.dataset.data_dir=<data_dir>

(`builders.tfds_clips`). An audio-only dataset (Clotho) stores no frames.
"""
from absl import flags
from ml_collections import config_flags

from avtext import cli
from avtext import errors
from avtext.data import materialize as materialize_lib

FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "the experiment config whose dataset is stored "
    "(configs/<x>.py[:variant]; --config.<field>=<value> overrides)", flag_values=FLAGS)
_DATASET_OF = flags.DEFINE_string(
    "dataset_of", None, "read config.<this>.dataset (e.g. evals.msrvtt, merged over "
    "config.dataset as the evaluator merges it) instead of config.dataset", flag_values=FLAGS)
_SPLITS = flags.DEFINE_list("splits", ["train"], "the splits to store", flag_values=FLAGS)
_NAME = flags.DEFINE_string("name", None, "the TFDS dataset name to write (snake_case)",
                            flag_values=FLAGS)
_DATA_DIR = cli.DEFINE_path("data_dir", None, "the TFDS data directory to write under",
                            flag_values=FLAGS)
_SHORT_SIDE = flags.DEFINE_integer("short_side", None, "resize frames on decode to this "
                                   "shorter side (default: the dataset's)", flag_values=FLAGS)
flags.mark_flags_as_required(["config", "name", "data_dir"], flag_values=FLAGS)


def main(argv):
  if len(argv) > 1:
    raise errors.BadInput(f"unexpected arguments {list(argv[1:])}; see --help")
  config = cli.config_value(_CONFIG)
  dataset = materialize_lib.dataset_config(config, _DATASET_OF.value)
  if _SHORT_SIDE.value:
    dataset.short_side = _SHORT_SIDE.value
  summary = materialize_lib.materialize(dataset, _SPLITS.value, name=_NAME.value,
                                        data_dir=_DATA_DIR.value)
  for split, s in summary.items():
    skipped = ", ".join(f"{k} {v}" for k, v in s["skipped"].items()) or "none"
    print(f"{split}: {s['records']} records; skipped: {skipped}")
  print(f"read it with --config.dataset.name=tfds:{_NAME.value} "
        f"--config.dataset.data_dir={_DATA_DIR.value}")


if __name__ == "__main__":
  cli.run(main, FLAGS)
