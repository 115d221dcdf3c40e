"""Run state on disk: orbax CheckpointManager with the data iterator alongside.

Each checkpoint step holds two items: `state` (params, optimizer state, step,
RNG; restored with the shardings of a template) and `data` (the input
iterator's state as JSON). Orbax writes into a temporary directory and renames
it when complete, so a process killed mid-save leaves the previous checkpoint as
the latest one; `keep` bounds how many are kept.

A run directory holds the latest-N checkpoints in `checkpoints/` and, when
`config.eval.select` names a metric, the best-N in `best_checkpoints/` (each
saved with its metric value; orbax keeps the N best). `step="best"` anywhere a
step is asked for (`--mode=eval --step=best`, `init_from.step="best"`,
`inspect.load_run(..., step="best")`) means the best one.

A save that fails (a full disk, a lost mount) raises CheckpointSaveError, one line
naming the directory and the cause, from `save` or `wait`, wherever orbax's
background threads report it.
"""
import functools
import os
import pathlib
import re
from typing import Any

from absl import logging
import jax
import orbax.checkpoint as ocp

from avtext.train import rundir


LATEST_DIR = "checkpoints"
BEST_DIR = "best_checkpoints"


class CheckpointSaveError(OSError):
  """Writing a checkpoint failed; the ones already on disk are intact."""


def _save_errors(method):
  """Turns a failed save, raised by `method` however orbax wraps it, into one line."""

  @functools.wraps(method)
  def wrapper(self, *args, **kwargs):
    try:
      return method(self, *args, **kwargs)
    except CheckpointSaveError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointSaveError(
          f"{self.directory}: writing a checkpoint failed: {_cause(e)}; the checkpoints "
          "already there are intact and re-running resumes from the latest") from e
  return wrapper


def _cause(e: BaseException) -> str:
  """The innermost error of `e`'s chain, in a few words."""
  while e.__cause__ is not None or e.__context__ is not None:
    e = e.__cause__ or e.__context__
  if isinstance(e, OSError) and e.errno:
    return f"{e.strerror} ({e.filename})" if e.filename else e.strerror
  text = str(e)
  if code := re.search(r"os_error_code='?(\d+)", text):  # tensorstore's I/O errors
    return os.strerror(int(code.group(1)))
  return text.splitlines()[0] if text else type(e).__name__


class Checkpointer:
  """Saves and restores (train state, data-iterator state) under `directory`."""

  def __init__(self, directory: str | pathlib.Path, *, keep: int = 3,
               async_save: bool = True, best_mode: str | None = None):
    """best_mode "max"/"min": keep the `keep` checkpoints of best metric (see `save`)."""
    self.directory = pathlib.Path(directory).absolute()
    self.best_mode = best_mode
    best = {}
    if best_mode is not None:
      best = dict(best_fn=lambda metrics: metrics["value"], best_mode=best_mode,
                  keep_checkpoints_without_metrics=False)
    self._manager = ocp.CheckpointManager(
        self.directory,
        # Explicit handlers: item metadata (shapes, dtypes) is then readable before
        # any restore, which `restore_raw` needs.
        item_handlers={"state": ocp.StandardCheckpointHandler(),
                       "data": ocp.JsonCheckpointHandler()},
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=True,
            enable_async_checkpointing=async_save,
            **best,
        ),
    )

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def best_step(self) -> int | None:
    return self._manager.best_step() if self.best_mode else None

  def stored_metrics(self) -> dict[int, float]:
    """{step: metric} as saved with each checkpoint (a best-N checkpointer's)."""
    stored = {step: self._manager.metrics(step) for step in self.all_steps()}
    return {step: float(m["value"]) for step, m in stored.items() if m and "value" in m}

  @_save_errors
  def save(self, step: int, state: Any, data_state: dict | None,
           metric: float | None = None) -> bool:
    """Starts writing checkpoint `step` (the caller decides the cadence).

    `metric`: the selected metric's value, for a best-N checkpointer.
    """
    if step in self.all_steps():
      return False
    saved = self._manager.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(data_state or {})),
        metrics=None if metric is None else {"value": float(metric)},
        force=True)
    if saved:
      logging.info("checkpoint for step %d being written to %s", step, self.directory)
    return saved

  def restore(self, template: Any, step: int | None = None) -> tuple[Any, dict, int]:
    """Restores into the structure, dtypes and shardings of `template`.

    Returns (state, data_state, step). Raises FileNotFoundError when there is
    no checkpoint (or not the requested step).
    """
    step = self._resolve(step)
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
    restored = self._manager.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract),
            data=ocp.args.JsonRestore()))
    return restored.state, dict(restored.data or {}), step

  def restore_raw(self, step: int | None = None) -> tuple[Any, int]:
    """The saved state as nested dicts of numpy arrays, without a template.

    For notebooks and evaluation jobs that need only the parameters.
    """
    step = self._resolve(step)
    # Onto this process's first device, whatever mesh wrote it: without a target
    # orbax would place arrays on the saving run's devices, which a run with
    # another topology (a 2-process checkpoint opened in a notebook) lacks.
    here = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=here),
                            self._manager.item_metadata(step)["state"])
    restored = self._manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
    return jax.device_get(restored.state), step

  def _resolve(self, step: int | None) -> int:
    steps = self.all_steps()
    if not steps:
      raise FileNotFoundError(f"{self.directory}: no checkpoint found")
    if step is None:
      return self.best_step() if self.best_mode else max(steps)
    if step not in steps:
      raise FileNotFoundError(
          f"{self.directory}: no checkpoint for step {step}; available: {sorted(steps)}")
    return step

  @_save_errors
  def wait(self) -> None:
    """Blocks until asynchronous saves are on disk."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()


def run_checkpointer(workdir: str | pathlib.Path, step: int | str | None = None
                     ) -> tuple[Checkpointer, int | None]:
  """(Checkpointer, step) for reading `step` (None: latest, "best", or N) of a run."""
  workdir = pathlib.Path(workdir)
  if isinstance(step, str) and step != "best":
    step = int(step)
  if step == "best":
    directory = workdir / BEST_DIR
    if not directory.is_dir():
      raise FileNotFoundError(f"{workdir}: no {BEST_DIR}/ (the run had no config.eval.select)")
    # The mode only matters for saving and pruning; reading takes the metrics as stored.
    ckpt = Checkpointer(directory, async_save=False, best_mode=_stored_best_mode(workdir))
    return ckpt, None
  directory = workdir / LATEST_DIR
  if not directory.is_dir():
    raise FileNotFoundError(f"{workdir}: no {LATEST_DIR}/ directory; expected an avtext run "
                            "directory with at least one checkpoint")
  return Checkpointer(directory, async_save=False), step


def restore_raw(workdir: str | pathlib.Path, step: int | str | None = None
                ) -> tuple[dict, int]:
  """(saved train state as nested numpy dicts, step) of a run; no template needed."""
  ckpt, step = run_checkpointer(workdir, step)
  try:
    return ckpt.restore_raw(step)
  finally:
    ckpt.close()


def _stored_best_mode(workdir: pathlib.Path) -> str:
  config = workdir / rundir.CONFIG_FILE
  if not config.exists():
    return "max"
  select = rundir.read_json(config, fix="re-running the training command rewrites it"
                            ).get("eval", {}).get("select")
  return select[1] if select else "max"
