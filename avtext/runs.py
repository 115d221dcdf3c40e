"""Notebook API: open a run directory and poke at its model.

    from avtext import runs
    run = runs.load_run("workdirs/demo/avr")          # latest checkpoint
    run = runs.load_run("workdirs/demo/avr", step=250)
    run = runs.load_run("workdirs/demo/avr", step="best")   # with config.eval.select
    (a relative path not found under the current directory is taken from the repository
    root: `resolve_workdir`)
    video_emb = run.model.apply(run.variables, inputs, method=run.model.encode_video)

The model is rebuilt from the run's `config.json` alone (`config.model` through
the model registry): no dataset is opened, so a run trained on data you do not
have can still be inspected. Nothing is trained or written, no lock is taken
(a run being trained can be opened) and no write access is needed; the optimizer
state is not loaded.
"""
import dataclasses
import hashlib
import os
import pathlib
from typing import Any

import ml_collections
import numpy as np

from avtext import cli
from avtext.models import model_registry
from avtext.train import rundir


@dataclasses.dataclass
class Run:
  config: ml_collections.ConfigDict
  model: Any  # the flax module of config.model
  params: Any  # numpy arrays, as trained
  model_state: dict  # non-param collections (e.g. batch_stats); {} if none
  step: int
  workdir: pathlib.Path

  @property
  def variables(self) -> dict:
    """{"params": ..., **model_state}: what `model.apply` takes."""
    return {"params": self.params, **self.model_state}

  @property
  def results(self) -> dict:
    """Contents of workdir/results.json ({} if no evaluation ran yet)."""
    path = self.workdir / rundir.RESULTS_FILE
    if not path.exists():
      return {}
    return rundir.read_json(path, fix="re-running the run's training command rebuilds it "
                            "from the checkpoints")

  def task(self):
    """The run's task (tokenizer, example pipeline, predict functions); opens no data."""
    from avtext.tasks import task_registry  # pylint: disable=g-import-not-at-top
    return task_registry.build_task(self.config)


def repo_root() -> pathlib.Path | None:
  """The checkout avtext runs from (the directory holding avtext/ and setup.py), or None
  for an installed copy."""
  root = pathlib.Path(__file__).resolve().parent.parent
  return root if (root / "setup.py").exists() else None


def resolve_workdir(path: str | pathlib.Path) -> pathlib.Path:
  """A run directory as given (~ expanded); a relative one that is not under the current
  directory is taken from the repository root, so `workdirs/demo/avr` opens the same run
  from a notebook in notebooks/ as from the root."""
  path = pathlib.Path(path).expanduser()
  if path.is_absolute() or path.exists():
    return path.absolute()
  root = repo_root()
  return (root / path) if root is not None and (root / path).exists() else path.absolute()


def config_file(spec: str) -> ml_collections.ConfigDict:
  """The config of "configs/<x>.py[:variant]", as `--config=` reads it (get_config(variant))."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  path, _, variant = str(spec).partition(":")
  if not pathlib.Path(path).is_file():
    raise FileNotFoundError(f"config {spec!r}: no file {path}")
  module_spec = importlib.util.spec_from_file_location("avtext_config_file", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(variant) if variant else module.get_config()


def load_config(workdir: str | pathlib.Path) -> ml_collections.ConfigDict:
  path = pathlib.Path(workdir) / rundir.CONFIG_FILE
  if not path.exists():
    raise FileNotFoundError(f"{path}: not found; is {workdir} an avtext run directory?")
  return rundir.read_config(path)


RUN_CACHE_ENV = "AVTEXT_RUN_CACHE"  # a directory, or "off"; default ~/.cache/avtext/runs
_SNAPSHOT_MAX_BYTES = 4 << 30


def _snapshot(workdir: pathlib.Path, step) -> tuple[pathlib.Path | None, int | None]:
  """(the snapshot file of the variables at `step` of the run, the step) when the
  checkpoint can be named without reading it: a given step, or the latest sealed one
  (None). Its key holds the run's real path, the step and the checkpoint's checksum
  file (or orbax's commit metadata; size and mtime), so a checkpoint written again gets
  a new snapshot."""
  root = cli.cache_dir(RUN_CACHE_ENV, "runs")
  if root is None or step == "best":
    return None, None
  folder = workdir / rundir.LATEST_DIR
  if step is None:
    steps = sorted((int(p.name) for p in folder.glob("[0-9]*") if p.name.isdigit()),
                   reverse=True) if folder.is_dir() else []
    if not steps:
      return None, None
    step = steps[0]
  step_dir = folder / str(int(step))
  # Written when the checkpoint was committed (orbax) and sealed (our checksums).
  stamps = [step_dir / name for name in (rundir.CHECKSUMS, "_CHECKPOINT_METADATA")]
  sums = next((p for p in stamps if p.exists()), None)
  if sums is None:  # not committed: read it the long way
    return None, None
  st = sums.stat()
  key = hashlib.sha1(f"{os.path.realpath(workdir)}|{int(step)}|{st.st_size}|"
                     f"{st.st_mtime_ns}".encode()).hexdigest()
  return pathlib.Path(root) / f"{key}.npz", int(step)


def _flatten(tree, prefix: str = "") -> dict:
  """{"a/b/c": array}; dtypes numpy cannot store (bfloat16, ...) as raw unsigned
  integers of their width under "a/b/c::<dtype>"."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flatten(value, f"{prefix}{key}/"))
      continue
    value = np.asarray(value)
    if value.dtype.type.__module__.startswith("ml_dtypes"):
      out[f"{prefix}{key}::{value.dtype.name}"] = value.view(f"u{value.dtype.itemsize}")
    else:
      out[f"{prefix}{key}"] = value
  return out


def _unflatten(flat) -> dict:
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  tree: dict = {}
  for name in flat.files:
    path, _, dtype = name.partition("::")
    *parents, leaf = path.split("/")
    node = tree
    for part in parents:
      node = node.setdefault(part, {})
    value = flat[name]
    node[leaf] = value.view(getattr(ml_dtypes, dtype)) if dtype else value
  return tree


def read_variables(workdir: pathlib.Path, step: int | str | None = None) -> tuple[dict, int]:
  """({"params": ..., "model_state": ...} as nested numpy dicts, step) of a run.

  The first read of a checkpoint goes through orbax (checksums, the whole train state,
  optimizer moments included) and leaves a snapshot of the variables alone in the run
  cache (AVTEXT_RUN_CACHE, default ~/.cache/avtext/runs; "off" disables it); the next
  program that opens the same checkpoint reads that one file instead."""
  path, known = _snapshot(workdir, step)
  if path is not None and path.exists():
    try:
      with np.load(path, allow_pickle=False) as flat:
        tree = _unflatten(flat)
      return {"params": tree.get("params", {}), "model_state": tree.get("model_state", {})}, known
    except (OSError, ValueError):  # a cut-off snapshot: read the checkpoint again
      path.unlink(missing_ok=True)
  from avtext.train import checkpointing  # pylint: disable=g-import-not-at-top  (orbax)
  state, step = checkpointing.restore_raw(workdir, step)
  variables = {"params": state["params"], "model_state": dict(state.get("model_state") or {})}
  if path is not None and known == step:  # (a corrupt newest checkpoint: an older step)
    flat = _flatten(variables)
    if sum(v.nbytes for v in flat.values()) <= _SNAPSHOT_MAX_BYTES:
      try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(tmp, **flat)
        tmp.replace(path)
      except OSError:  # a read-only or full cache only costs the next reader time
        pass
  return variables, step


def load_run(workdir: str | pathlib.Path, step: int | str | None = None) -> Run:
  """(config, model, params) of the run in `workdir` at `step` (None: latest, "best", N)."""
  cli.quiet_tpu_probe()  # a notebook's first JAX work: no libtpu lines on a CPU
  workdir = resolve_workdir(workdir)
  config = load_config(workdir)
  variables, step = read_variables(workdir, step)
  return Run(config=config, model=model_registry.build_model(config.model),
             params=variables["params"], model_state=variables["model_state"],
             step=step, workdir=workdir)


def scalar_curves(workdir: str | pathlib.Path) -> dict[str, list[tuple[int, float]]]:
  """{tag: [(step, value)] in step order}: the scalars of the run's TensorBoard event
  files (workdir/events.out.tfevents.*: training metrics and evaluators' results); tags
  whose values are not single numbers (hparams, text) are left out."""
  from tensorboard.backend.event_processing import event_file_loader  # pylint: disable=g-import-not-at-top
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
  curves: dict[str, list[tuple[int, float]]] = {}
  for path in sorted(resolve_workdir(workdir).glob("events.out.tfevents.*")):
    for event in event_file_loader.EventFileLoader(str(path)).Load():
      for value in event.summary.value:
        if value.HasField("tensor"):
          array = tensor_util.make_ndarray(value.tensor)
          if array.size != 1 or array.dtype.kind not in "fiu":
            continue
          scalar = float(array.reshape(()))
        elif value.HasField("simple_value"):
          scalar = float(value.simple_value)
        else:
          continue
        curves.setdefault(value.tag, []).append((int(event.step), scalar))
  return {tag: sorted(points) for tag, points in sorted(curves.items())}
