r"""Best VR / SVMR / VCMR R@1 any model can reach on the synthetic TVR data, by query type.

    .venv/bin/python benchmarks/tvr_query_oracle.py [--split=test --num_videos=250 --seed=0] \
        [--submission=workdirs/demo/xml/moments/test_step560.json \
         --ground_truth=workdirs/demo/tvr_data/tvr_test_public_release.jsonl]

The defaults are `make demo-xml`'s test_public split (the Makefile's TVC_TEST videos,
one query per moment). Each query is checked against every scene of the corpus with
the ground truth (`longvideo.fitting_scenes`: its visual statements fit the scene, and
what it says was said is that scene's topic line); `longvideo.query_oracle` turns the
counts into R@1 bounds. Prints one row per query type (v, t, vt) and all.

With a submission (TVR format, written on the same split) and its ground-truth file, it
also says where each type's video retrieval goes wrong: the share of queries whose top-1
video holds a scene the query is true of, the median rank of the query's own video, and
the median number of videos ranked above it that the query is not true of (model
errors, as opposed to ties the query cannot break).
"""
import json

from absl import app
from absl import flags
import numpy as np

from avtext.data.synthetic import longvideo
from avtext.data.synthetic import tvr_layout

_SPLIT = flags.DEFINE_enum("split", "test", ["train", "val", "test"], "world split")
_NUM = flags.DEFINE_integer("num_videos", 250, "videos in the corpus (the split's first)")
_SEED = flags.DEFINE_integer("seed", 0, "the world's seed")
_SUBMISSION = flags.DEFINE_string("submission", None, "a TVR submission JSON to analyse")
_GROUND_TRUTH = flags.DEFINE_string("ground_truth", None,
                                    "its tvr_*_release.jsonl (desc_id -> vid_name, desc)")


def analyse(submission: dict, ground_truth: list[dict], videos: dict[str, dict]) -> dict:
  """{type: (R@1, top-1 video true of the query %, median own rank, median
  not-true videos above own)} of the submission's VR predictions."""
  first = {}  # (video, text) -> the moment's first description
  for vid, d in videos.items():
    for m in d["moments"]:
      first[(vid, m["descs"][0]["desc"])] = m["descs"][0]
  gt = {r["desc_id"]: r for r in ground_truth}
  idx2vid = {i: v for v, i in submission["video2idx"].items()}
  rows: dict[str, list] = {}
  for q in submission["VR"]:
    row = gt[q["desc_id"]]
    desc = first[(row["vid_name"], row["desc"])]
    ranked = [idx2vid[p[0]] for p in q["predictions"]]
    true_of = [bool(longvideo.fitting_scenes(desc, videos[v])) for v in ranked]
    rank = ranked.index(row["vid_name"]) + 1 if row["vid_name"] in ranked else None
    above = None if rank is None else (rank - 1) - sum(true_of[:rank - 1])
    rows.setdefault(desc["type"], []).append((rank == 1, true_of[0], rank or np.inf, above))
  out = {}
  for t, r in rows.items():
    above = [a for *_, a in r if a is not None]
    out[t] = (100 * np.mean([x[0] for x in r]), 100 * np.mean([x[1] for x in r]),
              float(np.median([x[2] for x in r])), float(np.median(above)))
  return out


def main(argv):
  del argv
  source = longvideo.LongVideoSource(_SPLIT.value, seed=_SEED.value,
                                     num_examples=_NUM.value,
                                     clip_length_s=tvr_layout.CLIP_LENGTH)
  described = [source.describe(i) for i in range(_NUM.value)]
  oracle = longvideo.query_oracle(described)
  print(f"{_SPLIT.value}, {_NUM.value} videos, seed {_SEED.value}: oracle R@1 (%)")
  print(f"{'type':<6}{'queries':>8}{'VR':>8}{'SVMR':>8}{'VCMR':>8}{'fit/query':>11}")
  for t in [*longvideo.QUERY_TYPES, "all"]:
    if t in oracle:
      o = oracle[t]
      print(f"{t:<6}{o['num_queries']:>8d}{o['VR']:>8.2f}{o['SVMR']:>8.2f}{o['VCMR']:>8.2f}"
            f"{o['median_fitting_scenes']:>11.1f}")
  print("fit/query: median number of corpus scenes a query is true of")
  if _SUBMISSION.value:
    if not _GROUND_TRUTH.value:
      raise app.UsageError("--submission needs --ground_truth")
    with open(_SUBMISSION.value) as f:
      submission = json.load(f)
    with open(_GROUND_TRUTH.value) as f:
      ground_truth = [json.loads(line) for line in f if line.strip()]
    videos = {d["video_id"]: d for d in described}
    print(f"\n{_SUBMISSION.value}: VR")
    print(f"{'type':<6}{'R@1':>8}{'top-1 true':>12}{'own rank':>10}{'not-true above':>16}")
    for t, (r1, top1, rank, above) in analyse(submission, ground_truth, videos).items():
      print(f"{t:<6}{r1:>8.2f}{top1:>12.1f}{rank:>10.0f}{above:>16.0f}")


if __name__ == "__main__":
  app.run(main)
