"""Run state on disk: orbax CheckpointManager with the data iterator alongside.

Each checkpoint step holds two items: `state` (params, optimizer state, step,
RNG; restored with the shardings of a template) and `data` (the input
iterator's state as JSON). Orbax writes into a temporary directory and renames
it when complete, so a process killed mid-save leaves the previous checkpoint as
the latest one; `keep` bounds how many are kept.

Once a save is on disk (checked at the next `save` or `wait`), `checksums.json`
in its step directory records the size and CRC-32 of every file (process 0
reads the files once more for it). Restoring without a step takes the newest
intact checkpoint, or in a best-N directory the best intact one (`problem`: an
empty step directory, a missing item, an iterator state that does not parse, a
file truncated or changed since it was written), logging one line for each one
it passes over; a resumed run (`restore`) deletes those, so their steps can be
saved again. A checkpoint without checksums (killed between its commit and
theirs) is checked for structure only.

A run directory holds the latest-N checkpoints in `checkpoints/` and, when
`config.eval.select` names a metric, the best-N in `best_checkpoints/` (each
saved with its metric value; orbax keeps the N best). `step="best"` anywhere a
step is asked for (`--mode=eval --step=best`, `init_from.step="best"`,
`runs.load_run(..., step="best")`) means the best one.

A save that fails (a full disk, a lost mount) raises CheckpointSaveError, one line
naming the directory and the cause, from `save` or `wait`, wherever orbax's
background threads report it.
"""
import functools
import json
import logging as std_logging
import os
import pathlib
import re
import shutil
import time
from typing import Any
import zlib

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np
import orbax.checkpoint as ocp

from avtext import atomic
from avtext import errors
from avtext.train import rundir


LATEST_DIR = rundir.LATEST_DIR
BEST_DIR = rundir.BEST_DIR
CHECKSUMS = rundir.CHECKSUMS
_DATA_FILE = "data/metadata"  # where ocp.JsonCheckpointHandler puts the iterator state
# orbax splits the write of a replicated array across its replicas, one device slice
# per replica and array. Below this many bytes per replica a slice costs more in
# dispatch than it saves in writing: a tiny model's save on 8 CPU devices took 5,500
# slices and 10 s; with this floor only arrays of 8 MiB and up (on 8 replicas) split.
MIN_REPLICA_SLICE_BYTES = 1 << 20
_PARTIAL = ".orbax-checkpoint-tmp"  # a step directory orbax has not renamed yet
_REMOVE_ROUNDS = 10  # of 0.1 s: a failed save's partial directory, removed and checked
_PRUNED_RETRIES = 3  # re-reads of the newest checkpoint when a running trainer pruned it


def _use_array_handler_floor():
  """jax.Array's handler with MIN_REPLICA_SLICE_BYTES, without the warning orbax logs
  for an override (once per Checkpointer: every program, the notebook): it is this one."""
  absl_logger = std_logging.getLogger("absl")
  absl_logger.addFilter(_our_override)
  try:
    ocp.type_handlers.register_type_handler(
        jax.Array, ocp.type_handlers.ArrayHandler(
            min_slice_bytes_for_replica_parallel=MIN_REPLICA_SLICE_BYTES), override=True)
  finally:
    absl_logger.removeFilter(_our_override)


def _our_override(record) -> bool:
  return not (str(record.msg).startswith("Type handler registry type") and record.args
              and record.args[-1] == "jax.Array")


class CorruptCheckpointError(ValueError):
  """A checkpoint asked for, or every checkpoint of a directory, is incomplete or corrupt."""


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
      partial = self._remove_partial()
      named = (f"; the partial checkpoint {', '.join(partial)} is removed" if partial
               else "")
      raise CheckpointSaveError(
          f"{self.directory}: writing a checkpoint failed: {_cause(e)}{named}; the "
          "checkpoints already there are intact and re-running resumes from the "
          "latest") from e
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
    _use_array_handler_floor()
    self._unsealed: list[int] = []  # saves started whose checksums are not written yet
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
    stored = {step: self.metric(step) for step in self.all_steps()}
    return {step: value for step, value in stored.items() if value is not None}

  @_save_errors
  def save(self, step: int, state: Any, data_state: dict | None,
           metric: float | None = None) -> bool:
    """Starts writing checkpoint `step` (the caller decides the cadence).

    `metric`: the selected metric's value, for a best-N checkpointer.
    """
    self._seal()
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
      self._unsealed.append(step)
    return saved

  def last_on_disk(self) -> int | None:
    """The latest step whose directory is committed (a save still in flight is not:
    orbax renames its temporary directory at the end); read from the directory, so any
    thread may ask."""
    try:
      return max((int(p.name) for p in self.directory.iterdir() if p.name.isdigit()),
                 default=None)
    except OSError:
      return None

  def _remove_partial(self) -> list[str]:
    """Removes the directories of saves that did not finish (orbax writes a step into
    `<step>.orbax-checkpoint-tmp*` and renames it when whole); their names. Process 0's
    to do, as it commits them."""
    if jax.process_index() != 0:
      return []
    try:  # the save's other items may still be writing in orbax's background threads
      self._manager.wait_until_finished()
    except Exception:  # pylint: disable=broad-except
      pass  # the same failure, already being reported
    removed: set[str] = set()
    for _ in range(_REMOVE_ROUNDS):  # until no writer recreates one
      partial = [p for p in self.directory.glob(f"*{_PARTIAL}*") if p.is_dir()]
      if not partial:
        break
      for path in partial:
        shutil.rmtree(path, ignore_errors=True)
        removed.add(str(path))
      time.sleep(0.1)
    return sorted(removed)

  def step_dir(self, step: int) -> pathlib.Path:
    return self.directory / str(step)

  def metric(self, step: int) -> float | None:
    """The metric checkpoint `step` was saved with (best-N checkpointers), else None."""
    metrics = self._manager.metrics(step)
    return None if not metrics or "value" not in metrics else float(metrics["value"])

  def problem(self, step: int) -> str | None:
    """What makes checkpoint `step` unusable, or None when it is intact."""
    path = self.step_dir(step)
    if not path.is_dir() or not any(path.iterdir()):
      return "the step directory is empty"
    for item in ("state", "data"):
      if not (path / item).is_dir():
        return f"{item}/ is missing"
    for name, what in (("state/_METADATA", "the state's tree metadata"),
                       (_DATA_FILE, "the input iterator's state")):
      try:
        json.loads((path / name).read_text())
      except (OSError, ValueError) as e:
        return f"{name} ({what}) does not read as JSON: {e}"
    sums = path / CHECKSUMS
    if not sums.exists():
      return None
    try:
      files = json.loads(sums.read_text())["files"]
    except (OSError, ValueError, KeyError) as e:
      return f"{CHECKSUMS} does not read: {e!r}"
    for name, (size, crc) in sorted(files.items()):
      f = path / name
      if not f.is_file():
        return f"{name} is missing"
      if f.stat().st_size != size:
        return f"{name} has {f.stat().st_size} bytes, {size} when written"
      if _crc32(f) != crc:
        return f"{name} fails its CRC-32 ({CHECKSUMS}): its bytes changed since written"
    return None

  def restore(self, template: Any, step: int | None = None) -> tuple[Any, dict, int]:
    """Restores into the structure, dtypes and shardings of `template`.

    Returns (state, data_state, step). Without `step`: the newest intact
    checkpoint; newer corrupt ones are deleted (the run resumes before them and
    saves their steps again). Raises FileNotFoundError when there is no
    checkpoint (or not the requested step), CorruptCheckpointError when none
    (or not the requested one) is intact.
    """
    step, skipped = self._resolve(step)
    if not self.best_mode:  # the latest-N: what a resumed run reads
      self._log_skipped(skipped, step, "resuming from")
      for corrupt, _ in skipped:
        self._manager.delete(corrupt)
      if not (self.step_dir(step) / CHECKSUMS).exists():
        self._unsealed.append(step)  # committed, but killed before its checksums
        self._seal()
    else:
      self._log_skipped(skipped, step, "restoring")
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
    try:
      restored = self._manager.restore(
          step,
          args=ocp.args.Composite(
              state=ocp.args.StandardRestore(abstract),
              data=ocp.args.JsonRestore()))
    except Exception as e:  # pylint: disable=broad-except
      try:
        differs = _first_difference(abstract, self._manager.item_metadata(step)["state"])
      except Exception:  # pylint: disable=broad-except
        differs = None  # no metadata to compare with: the restore's own error stands
      if differs:
        raise errors.BadInput(
            f"{self.step_dir(step)}: the checkpoint was not written by a model of this "
            f"config: {differs}; resume with the config (and --config overrides) it was "
            "trained with, or pick another --workdir") from e
      raise
    return restored.state, dict(restored.data or {}), step

  def restore_raw(self, step: int | None = None) -> tuple[Any, int]:
    """The saved state as nested dicts of numpy arrays, without a template.

    For notebooks and evaluation jobs that need only the parameters. Without
    `step`: the newest (best) intact checkpoint; nothing is written.
    """
    # A trainer still running in the workdir prunes its oldest checkpoints: the newest
    # resolved here can be deleted while it is read. Then the newest is resolved again;
    # an explicit step that vanishes is an error that says so.
    for attempt in range(_PRUNED_RETRIES + 1):
      chosen, skipped = self._resolve(step)
      self._log_skipped(skipped, chosen, "reading")
      try:
        return self._read_raw(chosen), chosen
      except Exception:  # pylint: disable=broad-except
        if self.step_dir(chosen).exists():
          raise
        self._manager.reload()
        if step is not None:
          raise FileNotFoundError(
              f"{self.step_dir(chosen)}: deleted while it was read (a trainer running in "
              "this workdir keeps only its newest checkpoints); read another step or the "
              "newest") from None
        if attempt == _PRUNED_RETRIES:
          raise
        logging.warning("%s: deleted while it was read (a trainer running in this "
                        "workdir prunes old checkpoints); reading the newest again",
                        self.step_dir(chosen))
    raise AssertionError("unreachable")

  def _read_raw(self, step: int) -> Any:
    # Onto this process's first device, whatever mesh wrote it: without a target
    # orbax would place arrays on the saving run's devices, which a run with
    # another topology (a 2-process checkpoint opened in a notebook) lacks.
    here = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=here),
                            self._manager.item_metadata(step)["state"])
    restored = self._manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
    return jax.device_get(restored.state)

  def _resolve(self, step: int | None) -> tuple[int, list[tuple[int, str]]]:
    """(step, [(newer or better step, its problem)]): `step` checked to be intact, or
    (None) the first intact checkpoint, the newest or for a best-N checkpointer the best,
    with the corrupt ones passed over."""
    steps = self.all_steps()
    if not steps:
      raise FileNotFoundError(f"{self.directory}: no checkpoint found")
    if step is not None:
      if step not in steps:
        raise FileNotFoundError(
            f"{self.directory}: no checkpoint for step {step}; available: {sorted(steps)}")
      if problem := self.problem(step):
        raise CorruptCheckpointError(f"{self.step_dir(step)}: {problem}")
      return step, []
    if self.best_mode:
      # Orbax's order: ascending metric (descending for "min"), stable over steps.
      sign = -1.0 if self.best_mode == "min" else 1.0
      values = {s: self.metric(s) for s in steps}
      order = sorted((s for s in steps if values[s] is not None),
                     key=lambda s: sign * values[s])[::-1]
    else:
      order = sorted(steps, reverse=True)
    chosen, skipped = -1, []
    if jax.process_index() == 0:  # one reader decides, so every process restores the same
      for s in order:
        problem = self.problem(s)
        if problem is None:
          chosen = s
          break
        skipped.append((s, problem))
    if jax.process_count() > 1:
      chosen = int(multihost_utils.broadcast_one_to_all(np.int32(chosen)))
      if jax.process_index() > 0 and chosen >= 0:
        skipped = [(s, "found by process 0") for s in order[:order.index(chosen)]]
    if chosen < 0:
      found = "; ".join(f"{s}: {problem}" for s, problem in skipped) or "see process 0"
      raise CorruptCheckpointError(
          f"{self.directory}: no intact checkpoint ({found}); move the directory away to "
          "start over")
    return chosen, skipped

  def _log_skipped(self, skipped: list[tuple[int, str]], chosen: int, action: str) -> None:
    for step, problem in skipped:
      logging.warning("checkpoint %s is incomplete or corrupt (%s); %s step %d instead%s",
                      self.step_dir(step), problem, action, chosen,
                      ", and it is deleted" if action == "resuming from" else "")

  def _seal(self) -> None:
    """Writes `checksums.json` into each finished save's step directory."""
    if not self._unsealed:
      return
    self._manager.wait_until_finished()
    if jax.process_index() == 0:
      for step in self._unsealed:
        path = self.step_dir(step)
        if path.is_dir():  # else already pruned
          files = {str(f.relative_to(path)): [f.stat().st_size, _crc32(f)]
                   for f in sorted(path.rglob("*")) if f.is_file() and f.name != CHECKSUMS}
          atomic.write_json(path / CHECKSUMS, {"files": files})
    self._unsealed = []

  @_save_errors
  def wait(self) -> None:
    """Blocks until asynchronous saves are on disk (and their checksums written)."""
    self._manager.wait_until_finished()
    self._seal()

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


def _leaves(tree) -> dict[str, tuple | None]:
  """{"params/text/embed/kernel": shape} of a state or of its checkpoint's metadata."""
  def name(key):
    return str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key))))
  return {"/".join(map(name, path)): tuple(getattr(leaf, "shape", ()) or ())
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _first_difference(template, saved) -> str | None:
  """The first parameter (in the template's order) whose shape differs between the state
  a config builds and a checkpoint's, or that only one of them has; None when they agree."""
  ours, theirs = _leaves(template), _leaves(saved)
  show = lambda shape: f"[{', '.join(map(str, shape))}]"  # pylint: disable=unnecessary-lambda-assignment
  for path, shape in ours.items():
    if path not in theirs:
      return f"{path} {show(shape)} is not in the checkpoint"
    if theirs[path] != shape:
      return f"{path} has shape {show(theirs[path])} there, {show(shape)} in this config"
  extra = next((p for p in theirs if p not in ours), None)
  return None if extra is None else f"{extra} {show(theirs[extra])} is not in this config"


def _crc32(path: pathlib.Path) -> int:
  crc = 0
  with path.open("rb") as f:
    while chunk := f.read(1 << 20):
      crc = zlib.crc32(chunk, crc)
  return crc


def _stored_best_mode(workdir: pathlib.Path) -> str:
  config = workdir / rundir.CONFIG_FILE
  if not config.exists():
    return "max"
  select = rundir.read_json(config, fix=rundir.CONFIG_FIX
                            ).get("eval", {}).get("select")
  return select[1] if select else "max"
