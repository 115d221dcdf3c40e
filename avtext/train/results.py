"""A run's results.json, as the trainer keeps it (`Trainer.run_results`, a `RunResults`).

    {"<step>": {"<evaluator>/<metric>": value, ...}, "latest": {"step": N, ...},
     "best": {"metric", "step", "value"}, "train_data": {...}}

Process 0 writes it, atomically (`rundir.write_json`); a lost or unreadable one is
rebuilt from what the best checkpoints store. It also tells a resumed run which of the
evaluations due at its step finished (`recorded`): checkpoints are saved before them.
"""
import pathlib
from typing import Any

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np

from avtext.train import checkpointing
from avtext.train import rundir


class RunResults:
  """results.json in `results_dir` (None: nowhere) of the run in `workdir`.

  `select`: (metric key, "max"|"min") of config.eval.select, or None;
  `best_checkpointer`: the run's best_checkpoints/ Checkpointer (None: not open);
  `evaluators`: the names of the run's evaluators.
  """

  def __init__(self, *, workdir: pathlib.Path, results_dir: pathlib.Path | None,
               select: tuple[str, str] | None, best_checkpointer, evaluators: list[str]):
    self.workdir = workdir
    self.results_dir = results_dir
    self.select = select
    self.best_checkpointer = best_checkpointer
    self.evaluators = list(evaluators)

  @property
  def path(self) -> pathlib.Path | None:
    """results.json's path (None: nowhere)."""
    return None if self.results_dir is None else self.results_dir / rundir.RESULTS_FILE

  def reconcile_best(self) -> None:
    """Makes results.json's `best` name a checkpoint in best_checkpoints/: a run killed
    after a best save and before its record (or, before this order, the other way
    round) leaves them apart. The best one on disk wins; with none, `best` goes."""
    if (self.best_checkpointer is None or jax.process_index() != 0
        or not (self.workdir / rundir.RESULTS_FILE).exists()):
      return
    on_disk = self.best_checkpointer.all_steps()

    def reconcile(results):
      recorded = (results.get("best") or {}).get("step")
      if recorded in on_disk or (recorded is None and not on_disk):
        return
      step = self.best_checkpointer.best_step()
      if step is None:
        results.pop("best", None)
      else:
        results["best"] = {"metric": self.select[0], "step": step,
                           "value": self.best_checkpointer.metric(step)}
      logging.warning("results.json named best step %s, %s holds %s; best is now %s",
                      recorded, self.best_checkpointer.directory, sorted(on_disk), step)
    self.update(reconcile)

  def recorded(self, step: int) -> dict[str, dict[str, Any]]:
    """{evaluator: its metrics} of the evaluators whose results at `step` results.json
    holds. Process 0 reads the file; the others learn the names and the selected
    metric from it (all of them must run, and update the control with, the same)."""
    names = list(self.evaluators)
    found: dict[str, dict[str, Any]] = {}
    path = self.workdir / rundir.RESULTS_FILE
    if jax.process_index() == 0 and path.exists():
      try:
        at_step = rundir.read_json(path, fix="rebuilt from the checkpoints").get(str(step), {})
      except rundir.RunFileError:
        at_step = {}
      for key, value in at_step.items():
        name, _, metric = key.partition("/")
        if name in self.evaluators:
          found.setdefault(name, {})[metric] = value
    if jax.process_count() == 1:
      return found
    key = self.select[0] if self.select else None
    selected = found.get(key.split("/")[0], {}).get(key.partition("/")[2]) if key else None
    shared = multihost_utils.broadcast_one_to_all(np.asarray(
        [float(n in found) for n in names] + [np.nan if selected is None else selected],
        np.float64))
    found = {n: {} for n, flag in zip(names, shared[:-1]) if flag}
    if key and not np.isnan(shared[-1]):
      found[key.split("/")[0]][key.partition("/")[2]] = float(shared[-1])
    return found

  def update(self, change) -> None:
    """Applies `change` to results.json; a lost or unreadable one is rebuilt first."""
    path = self.path
    if not path.exists():
      all_results = self._rebuilt_results()
    else:
      try:
        all_results = rundir.read_json(path, fix="rebuilt from the checkpoints")
      except rundir.RunFileError as e:
        logging.warning("%s", e)
        all_results = self._rebuilt_results()
    change(all_results)
    rundir.write_json(path, all_results)

  def _rebuilt_results(self) -> dict:
    """What the checkpoints record of results.json: the selected metric of each kept
    best checkpoint (orbax stores it with the checkpoint) and `best`. The other numbers
    of past evaluations stay in the TensorBoard events; later ones are added as usual."""
    directory = self.workdir / checkpointing.BEST_DIR
    if not self.select or self.results_dir != self.workdir or not directory.is_dir():
      return {}
    ckpt = self.best_checkpointer or checkpointing.Checkpointer(
        directory, async_save=False, best_mode=self.select[1])
    try:
      values = ckpt.stored_metrics()
    finally:
      if ckpt is not self.best_checkpointer:
        ckpt.close()
    if not values:
      return {}
    key, mode = self.select
    sign = -1 if mode == "max" else 1
    best = min(values, key=lambda s: (sign * values[s], s))  # the first of equal values
    logging.info("%s rebuilt from %s: %s at steps %s, best %g at step %d",
                 self.path, directory, key, sorted(values),
                 values[best], best)
    return {**{str(s): {key: v} for s, v in values.items()},
            "best": {"metric": key, "step": best, "value": values[best]}}
