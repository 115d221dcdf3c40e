r"""Best VR / SVMR / VCMR R@1 any model can reach on the synthetic TVR data, by query type.

    .venv/bin/python benchmarks/tvr_query_oracle.py [--split=test --num_videos=250 --seed=0]

The defaults are `make demo-xml`'s test_public split (the Makefile's TVC_TEST videos,
one query per moment). Each query is checked against every scene of the corpus with
the ground truth (`longvideo.fitting_scenes`: its visual statements fit the scene, and
what it says was said is that scene's topic line); `longvideo.query_oracle` turns the
counts into R@1 bounds. Prints one row per query type (v, t, vt) and all.
"""
from absl import app
from absl import flags

from avtext.data.synthetic import longvideo
from avtext.data.synthetic import tvr_layout

_SPLIT = flags.DEFINE_enum("split", "test", ["train", "val", "test"], "world split")
_NUM = flags.DEFINE_integer("num_videos", 250, "videos in the corpus (the split's first)")
_SEED = flags.DEFINE_integer("seed", 0, "the world's seed")


def main(argv):
  del argv
  source = longvideo.LongVideoSource(_SPLIT.value, seed=_SEED.value,
                                     num_examples=_NUM.value,
                                     clip_length_s=tvr_layout.CLIP_LENGTH)
  oracle = longvideo.query_oracle([source.describe(i) for i in range(_NUM.value)])
  print(f"{_SPLIT.value}, {_NUM.value} videos, seed {_SEED.value}: oracle R@1 (%)")
  print(f"{'type':<6}{'queries':>8}{'VR':>8}{'SVMR':>8}{'VCMR':>8}{'fit/query':>11}")
  for t in [*longvideo.QUERY_TYPES, "all"]:
    if t in oracle:
      o = oracle[t]
      print(f"{t:<6}{o['num_queries']:>8d}{o['VR']:>8.2f}{o['SVMR']:>8.2f}{o['VCMR']:>8.2f}"
            f"{o['median_fitting_scenes']:>11.1f}")
  print("fit/query: median number of corpus scenes a query is true of")


if __name__ == "__main__":
  app.run(main)
