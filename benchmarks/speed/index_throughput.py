r"""`avtext.index` throughput on this machine, and how well the index finds its videos.

    make workdirs/demo/avr/results.json        # the demo's AVR run (~10 min)
    python -m benchmarks.speed.index_throughput [--run=workdirs/demo/avr] [--videos=50] \
        [--out=workdirs/bench/index_throughput]

Writes --videos clips of the demo's synthetic test world (64x64, 10 s, H.264 + AAC) as
a folder of mp4s (`common.own_videos`, MSR-VTT layout), indexes them with
`avtext.index.build` (probe + decode + K = 4 clips per video + the run's video tower)
and prints markdown: videos/s and clips/s of indexing (a second pass over the folder, so
JIT compilation is not counted; the first pass is shown too), text queries/s of
`avtext.search_videos`, and the share of the videos whose generating caption ranks them
in the top 1 / 5 (chance 1/N, 5/N). --quick: 4 videos. Rows: all of these.
"""
import shutil
import time

from absl import flags

from avtext import index as index_lib
from avtext import search_videos
from benchmarks import common

_RUN = flags.DEFINE_string("run", "workdirs/demo/avr", "an AVR run directory")
_VIDEOS = flags.DEFINE_integer("videos", 50, "videos to index")
SYSTEM = "Own videos"


def main(argv):
  del argv
  out = common.out_dir()
  n_videos = 4 if common.quick() else _VIDEOS.value
  captions = common.own_videos(out, n_videos)
  embedder = index_lib.VideoEmbedder(_RUN.value)
  times = []
  for attempt in range(2):
    shutil.rmtree(out / f"index{attempt}", ignore_errors=True)
    start = time.perf_counter()
    meta = index_lib.build(_RUN.value, out / "videos", out / f"index{attempt}",
                           embedder=embedder, progress=False)
    times.append(time.perf_counter() - start)
  k = meta["num_clips"]
  share, qps = common.caption_recall(search_videos.IndexSearcher(out / "index1"), captions)
  n = meta["num_videos"]
  table = f"{n} synthetic test-split videos of 64x64, 10 s, K = {k} clips each"
  print(f"run {_RUN.value} (step {embedder.step}), {table}\n")
  print("| pass | seconds | videos/s | clips/s |\n|---|---|---|---|")
  for name, seconds in zip(("first (JIT compile included)", "second"), times):
    print(f"| {name} | {seconds:.1f} | {n / seconds:.1f} | {n * k / seconds:.1f} |")
    common.record(SYSTEM, f"indexing, {name} pass", seconds, unit="s", table=table,
                  column="seconds", digits=3)
    common.record(SYSTEM, f"indexing, {name} pass", n / seconds, table=table,
                  column="videos/s", digits=3)
    common.record(SYSTEM, f"indexing, {name} pass", n * k / seconds, table=table,
                  column="clips/s", digits=3, headline="speed" if name == "second" else None)
  print(f"\ntext -> video search: {qps:.0f} queries/s (text tower + FAISS, batch of {n})")
  print(f"generating caption finds its video: top 1 {share[1]:.0f} % (chance {100 / n:.0f} %), "
        f"top 5 {share[5]:.0f} % (chance {500 / n:.0f} %)")
  search = "text -> video search over the same index, each video's caption as the query"
  common.record(SYSTEM, "text tower + exact FAISS", qps, unit="queries/s", table=search,
                digits=3)
  common.record(SYSTEM, "a video's generating caption ranks it first", share[1], unit="%",
                table=search, peer=100 / n, peer_name="chance", digits=3)
  common.record(SYSTEM, "a video's generating caption ranks it in the top 5", share[5],
                unit="%", table=search, peer=500 / n, peer_name="chance", digits=3,
                headline="quality")


if __name__ == "__main__":
  common.main(main)
