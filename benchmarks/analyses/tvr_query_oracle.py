r"""Best VR / SVMR / VCMR R@1 any model can reach on the synthetic TVR data, by query type.

    python -m benchmarks.analyses.tvr_query_oracle [--split=test --num_videos=250 --seed=0] \
        [--submission=workdirs/demo/xml/moments/test_step560.json \
         --ground_truth=workdirs/demo/tvr_data/tvr_test_public_release.jsonl] \
        [--run=workdirs/demo/xml]

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

With `--run` (a finished `configs/xml_tvr.py:demo` run whose test corpus store was kept),
VR R@1 / R@10 by query type from eq. 4's mean of the two streams' scores and from each
stream's score alone: the best checkpoint's query vectors against the stored H_0.
--quick: the oracle of a 20-video corpus. Rows: every printed number.
"""
import json
import pathlib

from absl import app
from absl import flags
import numpy as np

from avtext import runs
from avtext.data import builders
from avtext.inference import vcmr
from avworld import longvideo
from avworld import tvr_layout
from benchmarks import common

_SPLIT = flags.DEFINE_enum("split", "test", ["train", "val", "test"], "world split")
_NUM = flags.DEFINE_integer("num_videos", 250, "videos in the corpus (the split's first)")
_SEED = flags.DEFINE_integer("seed", 0, "the world's seed")
_SUBMISSION = flags.DEFINE_string("submission", None, "a TVR submission JSON to analyse")
_GROUND_TRUTH = flags.DEFINE_string("ground_truth", None,
                                    "its tvr_*_release.jsonl (desc_id -> vid_name, desc)")
_RUN = flags.DEFINE_string("run", None, "an XML run directory: VR by stream and query type")
SYSTEM = "TVR: XML"


def stream_recall(workdir: str) -> dict[str, dict[str, tuple[float, float]]]:
  """{score: {type: (VR R@1, R@10)}} for eq. 4 ("mean") and each stream alone."""
  run = runs.load_run(workdir, "best")
  source = builders.get_source(run.config.dataset, "test_public")
  stores = sorted((pathlib.Path(workdir) / "corpus").glob("test*"))
  if not stores:
    raise FileNotFoundError(f"{workdir}/corpus/test*: no kept test corpus store")
  store = vcmr.CorpusStore(stores[-1])
  length = run.config.model.max_query_len
  items = [source[i] for i in range(len(source))]
  query = np.zeros((len(items), length, run.config.dataset.query_dim), np.float32)
  mask = np.zeros((len(items), length), np.float32)
  for i, item in enumerate(items):
    tokens = item["query"][:length]
    query[i, :len(tokens)], mask[i, :len(tokens)] = tokens, 1
  q = np.asarray(run.model.apply({"params": run.params}, query, mask, method="encode_query"))
  q = vcmr.l2_normalize(q)
  scores = np.einsum("qmd,nmld->qnml", q, store.read("h0", slice(None))).max(-1)  # [Q, N, M]
  row = {v: i for i, v in enumerate(store.videos)}
  own = np.asarray([row[item["vid_name"]] for item in items])
  types = np.asarray([item["type"] for item in items])
  out = {}
  for name, s in [("mean (eq. 4)", scores.mean(-1))] + [
      (f"{m} alone", scores[..., j]) for j, m in enumerate(store.streams)]:
    rank = (s > s[np.arange(len(own)), own][:, None]).sum(1) + 1
    out[name] = {t: (100 * np.mean(rank[types == t] == 1), 100 * np.mean(rank[types == t] <= 10))
                 for t in longvideo.QUERY_TYPES if (types == t).any()}
  return out


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
  num = 20 if common.quick() else _NUM.value
  source = longvideo.LongVideoSource(_SPLIT.value, seed=_SEED.value, num_examples=num,
                                     clip_length_s=tvr_layout.CLIP_LENGTH)
  described = [source.describe(i) for i in range(num)]
  oracle = longvideo.query_oracle(described)
  table = f"oracle R@1 on the {_SPLIT.value} split's {num} videos (seed {_SEED.value})"
  print(f"{_SPLIT.value}, {num} videos, seed {_SEED.value}: oracle R@1 (%)")
  print(f"{'type':<6}{'queries':>8}{'VR':>8}{'SVMR':>8}{'VCMR':>8}{'fit/query':>11}")
  for t in [*longvideo.QUERY_TYPES, "all"]:
    if t in oracle:
      o = oracle[t]
      print(f"{t:<6}{o['num_queries']:>8d}{o['VR']:>8.2f}{o['SVMR']:>8.2f}{o['VCMR']:>8.2f}"
            f"{o['median_fitting_scenes']:>11.1f}")
      common.record(SYSTEM, f"{t} queries", o["num_queries"], table=table, column="queries")
      for column in ("VR", "SVMR", "VCMR"):
        common.record(SYSTEM, f"{t} queries", o[column], table=table, column=column, digits=4)
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
    where = "where a submission's video retrieval goes wrong, by query type"
    for t, (r1, top1, rank, above) in analyse(submission, ground_truth, videos).items():
      print(f"{t:<6}{r1:>8.2f}{top1:>12.1f}{rank:>10.0f}{above:>16.0f}")
      for column, value, unit in (("VR R@1", r1, ""), ("top-1 video true of the query", top1,
                                                       "%"),
                                  ("median rank of own video", rank, ""),
                                  ("median not-true videos above it", above, "")):
        common.record(SYSTEM, t, value, unit=unit, table=where, column=column, digits=3)
  if _RUN.value:
    print(f"\n{_RUN.value}: VR R@1 / R@10 by the score used")
    for name, by_type in stream_recall(_RUN.value).items():
      print(f"{name:<14}" + "".join(f"{t}: {r1:5.2f} / {r10:5.2f}   "
                                     for t, (r1, r10) in by_type.items()))
      for t, (r1, r10) in by_type.items():
        common.record(SYSTEM, name, f"{r1:.2f} / {r10:.2f}",
                      table="VR R@1 / R@10 by query type and by the score used",
                      column=t)


if __name__ == "__main__":
  common.main(main)
