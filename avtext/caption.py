r"""Caption your own video files with a trained captioning run (VideoCC's GPT-2 captioner).

    python -m avtext.caption --workdir=workdirs/demo/caption [--step=best] [--beam=4] \
        video1.mp4 video2.mkv ...

Each file is read as `avtext.index` reads one (`index.media_source`: a
`builders.media_clips.MediaClips` with the run's `config.data`, frames at its fps decoded at
the model's image size, 16 kHz audio, zeros when the file has none) and captioned as the
captioning evaluator captions a test clip: `task.eval_examples` (the centre clip), the
run's `captions` predict function, batched on the run's mesh. Greedy decoding by default
(`config.generation.beam_size` = 1, VideoCC §4.2), beam search with --beam=N. Prints
`file<TAB>caption` per file in the order given; a bad file is reported on stderr with
its reason (`builders.media_clips.SKIP_REASONS`) and skipped.
"""
from __future__ import annotations

import copy
import os
import sys
from typing import Sequence

from absl import flags
import numpy as np

from avtext import cli
from avtext import errors
from avtext import index as index_lib


class Captioner:
  """A captioning run loaded once (variables on its mesh): `__call__(paths, beam=...)`
  captions files as the module docstring says; a program that captions many times (the
  web page of `avtext.serve`) keeps one."""

  def __init__(self, workdir, step=None):
    import jax  # pylint: disable=g-import-not-at-top
    from avtext import runs as runs_lib  # pylint: disable=g-import-not-at-top
    from avtext.train import partitioning  # pylint: disable=g-import-not-at-top
    self.run = runs_lib.load_run(workdir, step)
    if self.run.config.get("task") != "captioning" or "generation" not in self.run.config:
      raise errors.BadInput(f"{workdir}: a {self.run.config.get('task')!r} run; avtext.caption "
                            "needs a captioning run (configs/videocc_caption.py)")
    self.workdir = workdir
    self.mesh = index_lib.run_mesh(self.run.config, str(workdir))
    self.variables = jax.device_put(self.run.variables, partitioning.replicated(self.mesh))
    self._tasks = {}  # beam size -> (task, jitted captions)

  @property
  def default_beam(self) -> int:
    return int(self.run.config.generation.beam_size)

  def _task(self, beam: int):
    import jax  # pylint: disable=g-import-not-at-top
    from avtext.tasks import task_registry  # pylint: disable=g-import-not-at-top
    if beam not in self._tasks:
      config = copy.deepcopy(self.run.config)
      config.generation.beam_size = int(beam)
      task = task_registry.build_task(config)
      self._tasks[beam] = task, jax.jit(task.predict_fns()["captions"])
    return self._tasks[beam]

  def __call__(self, paths: Sequence[str], *, beam: int | None = None,
               progress: bool = False) -> list[tuple[str, str | None, str]]:
    """[(path, caption or None, why it was skipped or '')] in the order given."""
    if beam is not None and beam < 1:
      raise errors.BadInput(f"--beam={beam}: a beam holds at least 1 hypothesis (1 = greedy)")
    task, fn = self._task(self.default_beam if beam is None else int(beam))
    config = self.run.config
    source = index_lib.media_source(config.data, [str(p) for p in paths],
                                    "the files to caption", progress=progress)
    skipped = {s.path: f"{s.reason}: {s.detail}" for s in source.skipped}
    captions = {}
    if len(source):
      out, failed = index_lib.map_files(
          lambda b: fn(self.variables, b)["tokens"], task.eval_examples(source), len(source),
          mesh=self.mesh, global_batch_size=index_lib.global_batch(config, self.mesh,
                                                                   len(source)),
          collate=getattr(task, "collate", None), progress="captioning" if progress else None)
      texts = task.decode(np.asarray(out)) if out is not None else []
      for i, e in enumerate(source.entries):
        if i in failed:
          skipped[e.path] = f"{failed[i].reason}: {failed[i].detail}"
        else:
          captions[e.path] = texts[i]
    return [(str(p), captions.get(str(p)), skipped.get(str(p), "")) for p in paths]


def caption_files(workdir, paths: Sequence[str], *, step=None, beam: int | None = None,
                  progress: bool = False) -> list[tuple[str, str | None, str]]:
  """[(path, caption or None, why it was skipped or '')] in the order given."""
  return Captioner(workdir, step)(paths, beam=beam, progress=progress)


FLAGS = flags.FlagValues()
_WORKDIR = cli.DEFINE_path("workdir", None, "a captioning run directory (e.g. "
                           "workdirs/demo/caption)", flag_values=FLAGS)
_STEP = cli.DEFINE_checkpoint_step(FLAGS)
_BEAM = flags.DEFINE_integer("beam", None, "beam size (default: the run's "
                             "config.generation.beam_size; 1 = greedy)", lower_bound=1,
                             flag_values=FLAGS)
flags.mark_flag_as_required("workdir", flag_values=FLAGS)


def main(argv: Sequence[str]) -> None:
  paths = [cli.expand(p) for p in argv[1:]]
  if not paths:
    raise errors.BadInput("give the video files to caption: python -m avtext.caption "
                          "--workdir=RUN FILE [FILE ...]")
  for path in paths:  # before the run is read: a folder is a mistake, not a skip
    if os.path.isdir(path):
      raise errors.BadInput(f"{path}: a directory, not a video file; give the files in it "
                            "(python -m avtext.index reads a whole folder)")
  if not any(os.path.exists(path) for path in paths):
    others = " (nor any of the others)" if len(paths) > 1 else ""
    raise errors.InputNotFound(f"{paths[0]}: no such file{others}; give the video files to "
                               "caption")
  done = caption_files(_WORKDIR.value, paths, step=cli.parse_step(_STEP.value),
                       beam=_BEAM.value, progress=True)
  for path, caption, reason in done:
    if caption is None:
      print(f"{path}\t[skipped: {reason}]", file=sys.stderr)
    else:
      print(f"{path}\t{caption}")
  captioned = sum(caption is not None for _, caption, _ in done)
  if not captioned:
    raise errors.NothingProduced(f"none of the {len(done)} file(s) could be captioned (each "
                                 "skipped above, with its reason); give video files that "
                                 "decode (any format PyAV / ffmpeg reads)")
  print(f"captioned {captioned} of {len(done)} file(s) (above, on stdout)", file=sys.stderr)


if __name__ == "__main__":
  cli.run(main, FLAGS)
