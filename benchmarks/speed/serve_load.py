r"""`avtext.serve` under load: concurrent clients searching a 1,000-video index.

    make workdirs/demo/avr/results.json        # the demo's AVR run (~10 min)
    python -m benchmarks.speed.serve_load [--run=workdirs/demo/avr] [--videos=1000] \
        [--clients=8] [--searches=25] [--out=workdirs/bench/serve_load]

Writes --videos clips of the demo's synthetic test world as mp4s (`common.own_videos`)
and indexes them with the run (`avtext.index.build`, kept in --out for the next run),
starts `python -m avtext.serve --index=...` as its own process, lets it answer a few
searches (compiling), then --clients threads each send --searches searches one after
another (GET /api/search?q=<a video's generating caption>&top=5, what the page's search
box sends: the text tower, FAISS, and each hit's probe for the page), all at once.
Prints markdown: failed requests, p50 / p95 / max latency per search and searches per
second. --quick: 20 videos, 2 clients x 3 searches. Rows: all of these.
"""
import concurrent.futures
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from absl import flags

from avtext import index as index_lib
from benchmarks import common

_RUN = flags.DEFINE_string("run", "workdirs/demo/avr", "an AVR run directory")
_VIDEOS = flags.DEFINE_integer("videos", 1000, "videos in the index")
_CLIENTS = flags.DEFINE_integer("clients", 8, "concurrent clients")
_SEARCHES = flags.DEFINE_integer("searches", 25, "searches each client sends, one at a time")
SYSTEM = "Own videos"


def start_server(index: pathlib.Path, cache: pathlib.Path) -> tuple[subprocess.Popen, str]:
  """`python -m avtext.serve --index=INDEX --port=0`, with its compilation cache in
  `cache` (the benchmark's own, not the user's), and the address it prints."""
  proc = subprocess.Popen([sys.executable, "-m", "avtext.serve", f"--index={index}",
                           "--port=0"], cwd=common.REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True,
                          env=dict(os.environ, AVTEXT_COMPILATION_CACHE=str(cache)))
  for line in proc.stdout:
    if line.startswith("avtext.serve: open "):
      return proc, line.split()[2].rstrip("/")
  raise RuntimeError(f"avtext.serve ended with status {proc.wait()} before serving")


def search(address: str, query: str) -> tuple[float, int]:
  """(seconds, HTTP status) of one search; a failed connection is status 0."""
  url = f"{address}/api/search?{urllib.parse.urlencode({'q': query, 'top': 5})}"
  start = time.perf_counter()
  try:
    with urllib.request.urlopen(url, timeout=120) as r:
      body = json.loads(r.read())
      status = r.status if body.get("hits") else 599
  except urllib.error.HTTPError as e:
    status = e.code
  except OSError:
    status = 0
  return time.perf_counter() - start, status


def main(argv):
  del argv
  out = common.out_dir().absolute()
  n_videos = 20 if common.quick() else _VIDEOS.value
  clients = 2 if common.quick() else _CLIENTS.value
  per_client = 3 if common.quick() else _SEARCHES.value
  captions = common.own_videos(out, n_videos)
  index = out / "index"
  meta = index_lib.build(_RUN.value, out / "videos", index, progress=True)
  queries = list(captions.values())
  proc, address = start_server(index, out / "jax_cache")
  try:
    for q in queries[:3]:  # compiles the text tower at this batch size
      _, status = search(address, q)
      if status != 200:
        raise RuntimeError(f"avtext.serve answered a first search with status {status}")
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
      done = list(pool.map(lambda i: search(address, queries[i % len(queries)]),
                           range(clients * per_client)))
    wall = time.perf_counter() - start
  finally:
    proc.terminate()
    proc.wait(30)
  seconds = sorted(s for s, _ in done)
  failed = sum(status != 200 for _, status in done)
  p50 = statistics.median(seconds)
  p95 = seconds[min(len(seconds) - 1, int(round(0.95 * (len(seconds) - 1))))]
  table = (f"{clients} clients x {per_client} searches at once, an index of "
           f"{meta['num_videos']} synthetic test-split videos (top 5)")
  print(f"run {_RUN.value}, {table}\n")
  print("| failed | p50 | p95 | max | searches/s |\n|---|---|---|---|---|")
  print(f"| {failed} / {len(done)} | {p50 * 1000:.0f} ms | {p95 * 1000:.0f} ms | "
        f"{seconds[-1] * 1000:.0f} ms | {len(done) / wall:.1f} |")
  metric = "`GET /api/search` (the page's search box)"
  common.record(SYSTEM, metric, failed, table=table, column="failed requests")
  common.record(SYSTEM, metric, p50 * 1000, unit="ms", table=table, column="p50", digits=3)
  common.record(SYSTEM, metric, p95 * 1000, unit="ms", table=table, column="p95", digits=3)
  common.record(SYSTEM, metric, len(done) / wall, table=table, column="searches/s", digits=3)


if __name__ == "__main__":
  common.main(main)
