r"""Writes the synthetic paragraph videos in COOT's feature layout (`make demo-coot`).

    python -m avworld.tools.coot_synthetic --workdir=workdirs/demo/video_pretrain \
        --out=workdirs/demo/coot_data --num_train=1000 --num_val=500 [--force]

The layout and its names: `avworld.coot_layout`. Video features:
one per time step at `--feature_fps` (default 1 per second, at the centre of each
step; 2/s doubles the tower time and the sequence lengths), the [CLS] embedding of
the trained RGB tower in `--workdir` (`configs/synthetic_video_pretrain.py`)
on the tower's own input: `data.num_frames` frames `data.frame_stride` apart around
that centre (clamped to the video), normalized as in training, like the I3D / S3D /
Inception features of the real datasets (`avtext.features.tower`). Text features:
MiniLM-L6's last two layers per token of the "bert_paper" paragraph (768-d), as
COOT's BERT features (`avtext.features.coot_text`). A finished directory (marker
file DONE with the arguments) is reused, `--force` rebuilds.
"""
import pathlib
import time

from absl import flags
from absl import logging

from avtext import cli
from avtext import errors
from avtext.features import coot_text
from avtext.features import done
from avworld import coot_layout
from avworld import tower
from avworld import world


def build_dataset(out_dir, *, tower_workdir, num_train: int, num_val: int, seed: int = 0,
                  feature_fps: float = 1.0, force: bool = False) -> pathlib.Path:
  out = pathlib.Path(out_dir)
  args = dict(tower_workdir=str(pathlib.Path(tower_workdir).absolute()), num_train=num_train,
              num_val=num_val, seed=seed, feature_fps=feature_fps,
              files=[coot_layout.VIDEO_FEATURES, coot_layout.TEXT_FEATURES])
  if done.reuse_finished(out, args, force):
    return out
  begin = time.time()
  video_features, frames = tower.tower_encoder(tower_workdir)
  spec = world.WorldSpec(**frames)  # the frames the tower was trained on
  n = coot_layout.write(out, num_train=num_train, num_val=num_val, spec=spec, seed=seed,
                        feature_fps=feature_fps, video_features=video_features,
                        text_features=coot_text.encode_paragraphs)
  done.mark_finished(out, args)
  logging.info("wrote %d videos to %s in %.0f s", n, out, time.time() - begin)
  return out


FLAGS = flags.FlagValues()
_WORKDIR = cli.DEFINE_path("workdir", None, "the run directory of the trained RGB tower "
                           "(stage 1: configs/synthetic_video_pretrain.py)", flag_values=FLAGS)
_OUT = cli.DEFINE_path("out", None, "the dataset directory to write", flag_values=FLAGS)
_NUM_TRAIN = flags.DEFINE_integer("num_train", 1000, "training videos", flag_values=FLAGS)
_NUM_VAL = flags.DEFINE_integer("num_val", 500, "validation videos", flag_values=FLAGS)
_FEATURE_FPS = flags.DEFINE_float("feature_fps", 1.0, "feature steps per second",
                                  flag_values=FLAGS)
_SEED = flags.DEFINE_integer("seed", 0, "the world's seed", flag_values=FLAGS)
_FORCE = flags.DEFINE_bool("force", False, "rebuild even when complete", flag_values=FLAGS)
flags.mark_flags_as_required(["workdir", "out"], flag_values=FLAGS)


def main(argv):
  if len(argv) > 1:
    raise errors.BadInput(f"unexpected arguments {list(argv[1:])}; see --help")
  out = build_dataset(_OUT.value, tower_workdir=_WORKDIR.value, num_train=_NUM_TRAIN.value,
                num_val=_NUM_VAL.value, seed=_SEED.value, feature_fps=_FEATURE_FPS.value,
                force=_FORCE.value)
  print(f"the synthetic dataset is in {out}: train on it with --config.dataset.path={out}")


if __name__ == "__main__":
  cli.run(main, FLAGS)
