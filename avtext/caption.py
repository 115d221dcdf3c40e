r"""Caption your own video files with a trained captioning run (VideoCC's GPT-2 captioner).

    python -m avtext.caption --run=workdirs/demo/caption [--step=best] [--beam=4] \
        video1.mp4 video2.mkv ...

Each file is read through `builders.files.MediaClips` with the run's `config.data`
(frames at its fps, decoded at the model's image size; audio at 16 kHz, zeros when the
file has none) and captioned as the captioning evaluator captions a test clip
(`task.eval_examples`, the run's `captions` predict function): greedy decoding by default
(`config.generation.beam_size` = 1), beam search with --beam=N. Prints `file<TAB>caption`
per file; a file that cannot be read is reported (reason) and skipped.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

import numpy as np

from avtext.data import video_io
from avtext.data.builders import files


def caption_files(workdir, paths: Sequence[str], *, step=None, beam: int | None = None
                  ) -> list[tuple[str, str | None, str]]:
  """[(path, caption or None, reason it was skipped or '')] in the order given."""
  import jax  # pylint: disable=g-import-not-at-top
  from avtext import inspect as inspect_lib  # pylint: disable=g-import-not-at-top
  run = inspect_lib.load_run(workdir, step)
  if "generation" not in run.config or run.config.task != "captioning":
    raise ValueError(f"{workdir}: a {run.config.get('task')!r} run; avtext.caption needs a "
                     "captioning run (configs/videocc_caption.py)")
  if beam is not None:
    run.config.generation.beam_size = int(beam)
  task = run.task()
  data = run.config.data
  source = files.MediaClips([files.Entry(str(p), "", str(p), str(p)) for p in paths],
                            where="the files to caption", fps=data.fps,
                            sample_rate=data.sample_rate, short_side=data.image_size,
                            min_seconds=0.5, progress=False, allow_empty=True)
  skipped = {s.path: f"{s.reason} {s.detail}".strip() for s in source.skipped}
  captions = {}
  if len(source):
    fn = jax.jit(lambda b: task.predict_fns()["captions"](run.variables, b))
    examples = task.eval_examples(source)
    for i, e in enumerate(source.entries):
      try:
        ex = examples(i)
      except video_io.VideoReadError as err:
        skipped[e.path] = f"{err.reason} {err.detail}".strip()
        continue
      batch = {k: np.asarray(v)[None] for k, v in ex.items()
               if isinstance(v, np.ndarray) and v.dtype.kind in "biuf"}
      captions[e.path] = task.decode(np.asarray(fn(batch)["tokens"]))[0]
  return [(str(p), captions.get(str(p)), skipped.get(str(p), "")) for p in paths]


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m avtext.caption",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--run", required=True, help="a captioning run directory")
  parser.add_argument("--step", default=None, help="checkpoint: N, 'best' or latest (default)")
  parser.add_argument("--beam", type=int, default=None,
                      help="beam size (default: the run's config.generation, greedy = 1)")
  parser.add_argument("files", nargs="+", help="video files")
  args = parser.parse_args(argv)
  step = int(args.step) if args.step and args.step.isdigit() else args.step
  for path, caption, reason in caption_files(args.run, args.files, step=step, beam=args.beam):
    if caption is None:
      print(f"{path}\t[skipped: {reason}]", file=sys.stderr)
    else:
      print(f"{path}\t{caption}")


if __name__ == "__main__":
  main()
