r"""Decode throughput of real video files: clips/s into model inputs at the demo and paper shapes.

    python -m benchmarks.speed.decode_throughput [--out=workdirs/bench/decode_throughput] \
        [--videos=8] [--repeats=3]

Writes two synthetic MSR-VTT layouts with `avworld.layouts` (H.264 + AAC
mp4s): 64x64 10 s videos (the demo's world) and 320x240 15 s videos (MSR-VTT's usual
size and mean length), then reads them through the `msrvtt` builder
(`builders.media_clips.MediaClips`, PyAV) and the AVR task's example pipeline
(`pipelines.ClipExamples`) with the config's frame / audio sampling:

  demo   configs/videocc_avr.py:demo   4 frames at stride 8, 64 px, 2 x 48 log-mel frames
  paper  configs/videocc_avr.py        32 frames at stride 14 at 224 px (VideoCC §5.2),
                                       8 x 100 log-mel frames over 24 s (app. C)

For each: train clips/s (one random segment) and eval clips/s (K = 4 segments, §4.1),
rgb+audio, and the decode alone (frames + audio windows, no preprocessing), in one
process and with 2 threads (the trainer's grain ReadOptions default). Prints markdown and
records each cell. --quick: the demo shape, 2 videos, one pass.
"""
import ml_collections
import numpy as np
from absl import flags

from avtext.data import builders
from avtext.data import pipelines
from avworld import layouts
from avworld import world
from benchmarks import common

_VIDEOS = flags.DEFINE_integer("videos", 8, "videos per shape")
_REPEATS = flags.DEFINE_integer("repeats", 3, "passes over the videos")
SHAPES = {"demo": (world.WorldSpec(height=64, width=64, duration_s=10.0), ":demo"),
          "paper": (world.WorldSpec(height=240, width=320, duration_s=15.0), "")}


def main(argv):
  del argv
  videos, repeats = (2, 1) if common.quick() else (_VIDEOS.value, _REPEATS.value)
  shapes = {"demo": SHAPES["demo"]} if common.quick() else SHAPES
  print("| shape | video | reading | threads | train clips/s | eval clips/s (K=4) |")
  print("|---|---|---|---|---|---|")
  for name, (spec, variant) in shapes.items():
    root = common.out_dir() / name
    layouts.write("msrvtt", root, sizes={"train": 1, "val": 1, "test": videos},
                  spec=spec, progress=True)
    config = common.load_config(f"configs/videocc_avr.py{variant}")
    source = builders.get_source(ml_collections.ConfigDict(
        {"name": "msrvtt", "path": str(root), "progress": False}), "test")
    reader = pipelines.ClipReader(source)
    n = videos * repeats
    for threads in (1, 2):
      rates = {}
      for train in (True, False):
        examples = pipelines.ClipExamples(reader, config.data, train=train)
        rng = np.random.default_rng
        rates[("full", train)] = common.rate(
            lambda i, e=examples: e(i % videos, rng(i)), n, threads)
        # Decode only: the same frames and audio windows, no resize / log-mel.
        fi = examples._frame_indices  # pylint: disable=protected-access
        aw = examples._audio_windows  # pylint: disable=protected-access
        rates[("decode", train)] = common.rate(
            lambda i, fi=fi, aw=aw: reader.read(i % videos, fi(rng(i)), aw), n, threads)
      video = f"{spec.width}x{spec.height}, {spec.duration_s:g} s"
      d = config.data
      for what in ("decode", "full"):
        label = ("decode only" if what == "decode" else
                 f"+ preprocess ({d.num_frames} x {d.image_size} px, "
                 f"{d.spec_segments} x {d.spec_segment_frames} mel)")
        print(f"| {name} | {video} | {label} | {threads} | {rates[(what, True)]:.1f} | "
              f"{rates[(what, False)]:.1f} |", flush=True)
        metric = f"{name}, {video}, {label}, {threads} thread{'s' if threads > 1 else ''}"
        table = f"{videos} mp4s a shape, {repeats} passes, the msrvtt builder + AVR examples"
        common.record("Input pipeline", metric, rates[(what, True)], table=table,
                      column="train clips/s", digits=3)
        common.record("Input pipeline", metric, rates[(what, False)], table=table,
                      column="eval clips/s (K = 4)", digits=3)


if __name__ == "__main__":
  common.main(main)
