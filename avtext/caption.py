r"""Caption your own video files with a trained captioning run (VideoCC's GPT-2 captioner).

    python -m avtext.caption --run=workdirs/demo/caption [--step=best] [--beam=4] \
        video1.mp4 video2.mkv ...

Each file is read as `avtext.index` reads one (`index.media_source`: a
`builders.files.MediaClips` with the run's `config.data`, frames at its fps decoded at
the model's image size, 16 kHz audio, zeros when the file has none) and captioned as the
captioning evaluator captions a test clip: `task.eval_examples` (the centre clip), the
run's `captions` predict function, batched on the run's mesh. Greedy decoding by default
(`config.generation.beam_size` = 1, VideoCC §4.2), beam search with --beam=N. Prints
`file<TAB>caption` per file in the order given; a bad file is reported on stderr with
its reason (`builders.files.SKIP_REASONS`) and skipped.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

import numpy as np

from avtext import index as index_lib


def caption_files(workdir, paths: Sequence[str], *, step=None, beam: int | None = None,
                  progress: bool = False) -> list[tuple[str, str | None, str]]:
  """[(path, caption or None, why it was skipped or '')] in the order given."""
  import jax  # pylint: disable=g-import-not-at-top
  from avtext import runs as runs_lib  # pylint: disable=g-import-not-at-top
  from avtext.train import partitioning  # pylint: disable=g-import-not-at-top
  run = runs_lib.load_run(workdir, step)
  if run.config.get("task") != "captioning" or "generation" not in run.config:
    raise ValueError(f"{workdir}: a {run.config.get('task')!r} run; avtext.caption needs a "
                     "captioning run (configs/videocc_caption.py)")
  if beam is not None:
    if beam < 1:
      raise ValueError(f"--beam={beam}: a beam holds at least 1 hypothesis (1 = greedy)")
    run.config.generation.beam_size = int(beam)
  task = run.task()
  source = index_lib.media_source(run.config.data, [str(p) for p in paths],
                                  "the files to caption", progress=progress)
  skipped = {s.path: f"{s.reason}: {s.detail}" for s in source.skipped}
  captions = {}
  if len(source):
    mesh = index_lib.run_mesh(run.config, str(workdir))
    variables = jax.device_put(run.variables, partitioning.replicated(mesh))
    fn = jax.jit(task.predict_fns()["captions"])
    out, failed = index_lib.map_files(
        lambda b: fn(variables, b)["tokens"], task.eval_examples(source), len(source),
        mesh=mesh, global_batch_size=index_lib.global_batch(run.config, mesh, len(source)),
        collate=getattr(task, "collate", None), progress="captioning" if progress else None)
    texts = task.decode(np.asarray(out)) if out is not None else []
    for i, e in enumerate(source.entries):
      if i in failed:
        skipped[e.path] = f"{failed[i].reason}: {failed[i].detail}"
      else:
        captions[e.path] = texts[i]
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
  for path, caption, reason in caption_files(args.run, args.files,
                                             step=index_lib.parse_step(args.step),
                                             beam=args.beam, progress=True):
    if caption is None:
      print(f"{path}\t[skipped: {reason}]", file=sys.stderr)
    else:
      print(f"{path}\t{caption}")


if __name__ == "__main__":
  main()
