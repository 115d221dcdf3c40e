r"""`avtext.index` throughput on this machine, and how well the index finds its videos.

    make workdirs/demo/avr/results.json        # the demo's AVR run (~10 min)
    python benchmarks/index_throughput.py [--run=workdirs/demo/avr] [--videos=50] \
        [--out=workdirs/bench/index]

Writes --videos clips of the demo's synthetic test world (64x64, 10 s, H.264 + AAC) as
a folder of mp4s (`avtext.data.synthetic.layouts`, MSR-VTT layout), indexes them with
`avtext.index.build` (probe + decode + K = 4 clips per video + the run's video tower)
and prints markdown: videos/s and clips/s of indexing (a second pass over a copy of
the folder, so JIT compilation is not counted; the first pass is shown too), text
queries/s of `avtext.search_videos`, and the share of the videos whose generating caption
ranks them in the top 1 / 5 (chance 1/N, 5/N).
"""
import argparse
import pathlib
import shutil
import sys
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from avtext import index as index_lib  # pylint: disable=wrong-import-position
from avtext import search_videos  # pylint: disable=wrong-import-position
from avtext.data.synthetic import layouts  # pylint: disable=wrong-import-position
from avtext.data.synthetic import world  # pylint: disable=wrong-import-position


def own_videos(out: pathlib.Path, n: int, spec: world.WorldSpec) -> dict[str, str]:
  """A folder of n mp4s of the world's test split; {file name: its caption}."""
  written = layouts.write('msrvtt', out / 'layout', sizes={'test': n}, spec=spec)
  folder = out / 'videos'
  folder.mkdir(parents=True, exist_ok=True)
  captions = {}
  for _, stem, caps in written.items['test']:
    if not (folder / f'{stem}.mp4').exists():
      shutil.copy(out / 'layout' / 'videos' / 'all' / f'{stem}.mp4', folder / f'{stem}.mp4')
    captions[f'{stem}.mp4'] = caps[0]
  return captions


def recall(searcher: search_videos.IndexSearcher, captions: dict[str, str], ks=(1, 5)
           ) -> tuple[dict[int, float], float]:
  """({k: % of videos their caption ranks in the top k}, queries/s)."""
  names = list(captions)
  t = time.perf_counter()
  found = searcher.texts([captions[v] for v in names], top=max(ks))
  qps = len(names) / (time.perf_counter() - t)
  out = {}
  for k in ks:
    out[k] = 100.0 * np.mean([v in [x for x, _ in f[:k]] for v, f in zip(names, found)])
  return out, qps


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--run', default='workdirs/demo/avr')
  parser.add_argument('--videos', type=int, default=50)
  parser.add_argument('--out', default='workdirs/bench/index')
  args = parser.parse_args()
  out = pathlib.Path(args.out)
  spec = world.WorldSpec()  # the demo's: 64x64, 25 fps, 10 s
  captions = own_videos(out, args.videos, spec)
  embedder = index_lib.VideoEmbedder(args.run)
  times = []
  for attempt in range(2):
    shutil.rmtree(out / f'index{attempt}', ignore_errors=True)
    t = time.perf_counter()
    meta = index_lib.build(args.run, out / 'videos', out / f'index{attempt}',
                           embedder=embedder, progress=False)
    times.append(time.perf_counter() - t)
  k = meta['num_clips']
  searcher = search_videos.IndexSearcher(out / 'index1')
  rec, qps = recall(searcher, captions)
  n = meta['num_videos']
  print(f'run {args.run} (step {embedder.step}), {n} videos of {spec.width}x{spec.height}, '
        f'{spec.duration_s:g} s, K = {k} clips each\n')
  print('| pass | seconds | videos/s | clips/s |')
  print('|---|---|---|---|')
  for name, s in zip(('first (JIT compile included)', 'second'), times):
    print(f'| {name} | {s:.1f} | {n / s:.1f} | {n * k / s:.1f} |')
  print(f'\ntext -> video search: {qps:.0f} queries/s (text tower + FAISS, batch of {n})')
  print(f'generating caption finds its video: top 1 {rec[1]:.0f} % (chance {100 / n:.0f} %), '
        f'top 5 {rec[5]:.0f} % (chance {500 / n:.0f} %)')


if __name__ == '__main__':
  main()
