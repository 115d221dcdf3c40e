r"""Writes the synthetic paragraph videos in COOT's feature layout (`make demo-coot`).

    python -m avtext.tools.coot_synthetic --tower_workdir=workdirs/demo/video_pretrain \
        --out=workdirs/demo/coot_data --num_train=1000 --num_val=500 [--force]

The layout and its names: `avtext.data.synthetic.coot_layout`. Video features:
one per time step at `--feature_fps` (default 1 per second, at the centre of each
step; 2/s doubles the tower time and the sequence lengths), the [CLS] embedding of
the trained RGB tower in `--tower_workdir` (`configs/synthetic_video_pretrain.py`)
on the tower's own input: `data.num_frames` frames `data.frame_stride` apart around
that centre (clamped to the video), normalized as in training, like the I3D / S3D /
Inception features of the real datasets (`avtext.features.tower`). Text features:
MiniLM-L6's last two layers per token of the "bert_paper" paragraph (768-d), as
COOT's BERT features (`avtext.features.coot_text`). A finished directory (marker
file DONE with the arguments) is reused, `--force` rebuilds.
"""
import pathlib
import time

from absl import app
from absl import flags
from absl import logging

from avtext.data.synthetic import coot_layout
from avtext.features import coot_text
from avtext.features import done
from avtext.features import tower


def build_dataset(out_dir, *, tower_workdir, num_train: int, num_val: int, seed: int = 0,
                  feature_fps: float = 1.0, force: bool = False) -> pathlib.Path:
  out = pathlib.Path(out_dir)
  args = dict(tower_workdir=str(pathlib.Path(tower_workdir).absolute()), num_train=num_train,
              num_val=num_val, seed=seed, feature_fps=feature_fps,
              files=[coot_layout.VIDEO_FEATURES, coot_layout.TEXT_FEATURES])
  if done.reuse_finished(out, args, force):
    return out
  begin = time.time()
  video_features, spec = tower.tower_encoder(tower_workdir)
  n = coot_layout.write(out, num_train=num_train, num_val=num_val, spec=spec, seed=seed,
                        feature_fps=feature_fps, video_features=video_features,
                        text_features=coot_text.encode_paragraphs)
  done.mark_finished(out, args)
  logging.info("wrote %d videos to %s in %.0f s", n, out, time.time() - begin)
  return out


def main(argv):
  del argv
  f = flags.FLAGS
  if not f.tower_workdir or not f.out:
    raise app.UsageError("--tower_workdir and --out are required")
  build_dataset(f.out, tower_workdir=f.tower_workdir, num_train=f.num_train,
                num_val=f.num_val, seed=f.seed, feature_fps=f.feature_fps, force=f.force)


if __name__ == "__main__":
  # Defined here, not at import (as every avtext CLI module that is also a library):
  # importing this module beside avtext.tools.tvr_synthetic defines no flag twice.
  flags.DEFINE_string("tower_workdir", None, "run dir of the trained RGB tower")
  flags.DEFINE_string("out", None, "output dataset directory")
  flags.DEFINE_integer("num_train", 1000, "training videos")
  flags.DEFINE_integer("num_val", 500, "validation videos")
  flags.DEFINE_integer("seed", 0, "world seed")
  flags.DEFINE_float("feature_fps", 1.0, "feature steps per second")
  flags.DEFINE_bool("force", False, "rebuild even if complete")
  app.run(main)
