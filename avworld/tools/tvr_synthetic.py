r"""Writes the synthetic long videos in the official TVR / TVC layout (`make demo-tvc`).

    python -m avworld.tools.tvr_synthetic --workdir=workdirs/demo/video_pretrain \
        --out=workdirs/demo/tvr_data --num_train=1000 --num_val=200 --num_test=300 [--force]

The layout and its names: `avworld.tvr_layout`. Video features: one
row per 1.5 s clip, the trained RGB tower's embedding of its own input window
centred on the clip (`avtext.features.tower`); query and subtitle token features:
MiniLM-L6, 384-d (`avtext.features.tvr_text`). A finished directory (marker file
DONE holding the arguments) is reused; `--force` rebuilds.
"""
import functools
import pathlib
import time

from absl import flags
from absl import logging

from avtext import cli
from avtext import errors
from avtext.data.builders import tvc
from avtext.features import done
from avtext.features import tvr_text
from avworld import tower
from avworld import tvr_layout
from avworld import world


def build_dataset(out_dir, *, tower_workdir, num_train: int, num_val: int, num_test: int,
                  seed: int = 0, force: bool = False) -> pathlib.Path:
  out = pathlib.Path(out_dir)
  args = dict(tower_workdir=str(pathlib.Path(tower_workdir).absolute()), num_train=num_train,
              num_val=num_val, num_test=num_test, seed=seed,
              files=[tvr_layout.VIDEO_FEATURES, "tvr_queries_v2", "tvr_text_features",
                     "world.json"])
  if done.reuse_finished(out, args, force):
    return out
  begin = time.time()
  video_features, frames = tower.tower_encoder(tower_workdir)
  spec = world.WorldSpec(**frames)  # the frames the tower was trained on
  text_features = functools.partial(tvr_text.write, video_features=tvr_layout.VIDEO_FEATURES,
                                    clip_length=tvc.CLIP_LENGTH, force=True)
  n = tvr_layout.write(out, num_train=num_train, num_val=num_val, num_test=num_test,
                       spec=spec, seed=seed, video_features=video_features,
                       text_features=text_features)
  done.mark_finished(out, args)
  logging.info("wrote %d videos to %s in %.0f s", n, out, time.time() - begin)
  return out


FLAGS = flags.FlagValues()
_WORKDIR = cli.DEFINE_path("workdir", None, "the run directory of the trained RGB tower "
                           "(stage 1: configs/synthetic_video_pretrain.py)", flag_values=FLAGS)
_OUT = cli.DEFINE_path("out", None, "the dataset directory to write", flag_values=FLAGS)
_NUM_TRAIN = flags.DEFINE_integer("num_train", 1000, "training videos", flag_values=FLAGS)
_NUM_VAL = flags.DEFINE_integer("num_val", 200, "validation videos", flag_values=FLAGS)
_NUM_TEST = flags.DEFINE_integer("num_test", 300, "test_public videos", flag_values=FLAGS)
_SEED = flags.DEFINE_integer("seed", 0, "the world's seed", flag_values=FLAGS)
_FORCE = flags.DEFINE_bool("force", False, "rebuild even when complete", flag_values=FLAGS)
flags.mark_flags_as_required(["workdir", "out"], flag_values=FLAGS)


def main(argv):
  if len(argv) > 1:
    raise errors.BadInput(f"unexpected arguments {list(argv[1:])}; see --help")
  out = build_dataset(_OUT.value, tower_workdir=_WORKDIR.value, num_train=_NUM_TRAIN.value,
                num_val=_NUM_VAL.value, num_test=_NUM_TEST.value, seed=_SEED.value,
                force=_FORCE.value)
  print(f"the synthetic dataset is in {out}: train on it with --config.dataset.path={out}")


if __name__ == "__main__":
  cli.run(main, FLAGS)
