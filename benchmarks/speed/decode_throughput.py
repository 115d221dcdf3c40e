r"""Decode throughput of real video files: clips/s into model inputs at the demo and paper shapes.

    python benchmarks/decode_throughput.py [--out=workdirs/bench/decode] [--videos=8]

Writes two synthetic MSR-VTT layouts with `avtext.data.synthetic.layouts` (H.264 + AAC
mp4s): 64x64 10 s videos (the demo's world) and 320x240 15 s videos (MSR-VTT's usual
size and mean length), then reads them through the `msrvtt` builder
(`builders.files.MediaClips`, PyAV) and the AVR task's example pipeline
(`pipelines.ClipExamples`) with the config's frame / audio sampling:

  demo   configs/videocc_avr.py:demo   4 frames at stride 8, 64 px, 2 x 48 log-mel frames
  paper  configs/videocc_avr.py        32 frames at stride 14 at 224 px (VideoCC §5.2),
                                       8 x 100 log-mel frames over 24 s (app. C)

For each: train clips/s (one random segment) and eval clips/s (K = 4 segments, §4.1),
rgb+audio, and the decode alone (frames + audio windows, no preprocessing), in one
process and with 2 threads (the trainer's grain ReadOptions default). Prints markdown.
"""
import argparse
import concurrent.futures
import pathlib
import sys
import time

import ml_collections
import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from avtext.data import builders  # pylint: disable=wrong-import-position
from avtext.data import pipelines  # pylint: disable=wrong-import-position
from avtext.data.synthetic import layouts  # pylint: disable=wrong-import-position
from avtext.data.synthetic import world  # pylint: disable=wrong-import-position
from configs import videocc_avr  # pylint: disable=wrong-import-position

SHAPES = {'demo': (world.WorldSpec(height=64, width=64, duration_s=10.0), 'demo'),
          'paper': (world.WorldSpec(height=240, width=320, duration_s=15.0), None)}


def _rate(fn, n: int, threads: int) -> float:
  fn(0)  # warm: imports, first open
  t = time.perf_counter()
  if threads == 1:
    for i in range(n):
      fn(i)
  else:
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
      list(pool.map(fn, range(n)))
  return n / (time.perf_counter() - t)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--out', default='workdirs/bench/decode')
  parser.add_argument('--videos', type=int, default=8)
  parser.add_argument('--repeats', type=int, default=3, help='passes over the videos')
  args = parser.parse_args()
  print('| shape | video | reading | threads | train clips/s | eval clips/s (K=4) |')
  print('|---|---|---|---|---|---|')
  for name, (spec, variant) in SHAPES.items():
    root = pathlib.Path(args.out) / name
    layouts.write('msrvtt', root, sizes={'train': 1, 'val': 1, 'test': args.videos},
                  spec=spec, progress=True)
    config = videocc_avr.get_config(variant)
    source = builders.get_source(ml_collections.ConfigDict(
        {'name': 'msrvtt', 'path': str(root), 'progress': False}), 'test')
    reader = pipelines.ClipReader(source)
    n = args.videos * args.repeats
    for threads in (1, 2):
      rates = {}
      for train in (True, False):
        examples = pipelines.ClipExamples(reader, config.data, train=train)
        rng = lambda i: np.random.default_rng(i)
        rates[('full', train)] = _rate(
            lambda i, e=examples: e(i % args.videos, rng(i)), n, threads)
        # Decode only: the same frames and audio windows, no resize / log-mel.
        fi = examples._frame_indices  # pylint: disable=protected-access
        aw = examples._audio_windows  # pylint: disable=protected-access
        rates[('decode', train)] = _rate(
            lambda i, fi=fi, aw=aw: reader.read(i % args.videos, fi(rng(i)), aw),
            n, threads)
      video = f'{spec.width}x{spec.height}, {spec.duration_s:g} s'
      d = config.data
      for what in ('decode', 'full'):
        label = ('decode only' if what == 'decode' else
                 f'+ preprocess ({d.num_frames} x {d.image_size} px, '
                 f'{d.spec_segments} x {d.spec_segment_frames} mel)')
        print(f'| {name} | {video} | {label} | {threads} | {rates[(what, True)]:.1f} | '
              f'{rates[(what, False)]:.1f} |', flush=True)


if __name__ == '__main__':
  main()
