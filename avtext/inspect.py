"""Notebook API: open a run directory and poke at its model.

    from avtext import inspect
    run = inspect.load_run("workdirs/demo/avr")          # latest checkpoint
    run = inspect.load_run("workdirs/demo/avr", step=250)
    video_emb = run.model.apply({"params": run.params}, inputs, method=run.model.encode_video)

Nothing is trained or written; the optimizer state is not loaded.
"""
import dataclasses
import json
import pathlib
from typing import Any

import jax
import ml_collections

from avtext.tasks import registry
from avtext.train import checkpointing


@dataclasses.dataclass
class Run:
  config: ml_collections.ConfigDict
  model: Any  # the task's flax module
  params: Any  # numpy/jax arrays, as trained
  step: int
  task: Any  # the task object: its data pipeline, evaluation, tokenizer
  workdir: pathlib.Path

  @property
  def results(self) -> dict:
    """Contents of workdir/results.json ({} if no evaluation ran yet)."""
    path = self.workdir / "results.json"
    return json.loads(path.read_text()) if path.exists() else {}


def load_config(workdir: str | pathlib.Path) -> ml_collections.ConfigDict:
  path = pathlib.Path(workdir) / "config.json"
  if not path.exists():
    raise FileNotFoundError(f"{path}: not found; is {workdir} an avtext run directory?")
  return ml_collections.ConfigDict(json.loads(path.read_text()))


def load_run(workdir: str | pathlib.Path, step: int | None = None) -> Run:
  """(config, model, params) of the run in `workdir` at `step` (default: latest)."""
  workdir = pathlib.Path(workdir).absolute()
  config = load_config(workdir)
  task = registry.build_task(config)
  ckpt = checkpointing.Checkpointer(workdir / "checkpoints", async_save=False)
  try:
    state, step = ckpt.restore_raw(step)
  finally:
    ckpt.close()
  params = jax.tree.map(lambda x: x, state["params"])
  return Run(config=config, model=task.model, params=params, step=step, task=task,
             workdir=workdir)
