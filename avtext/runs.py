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
import pathlib
from typing import Any

import ml_collections

from avtext.models import registry as models_registry
from avtext.train import checkpointing
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
    from avtext.tasks import registry  # pylint: disable=g-import-not-at-top
    return registry.build_task(self.config)


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
  return ml_collections.ConfigDict(rundir.read_json(
      path, fix="re-running the run's training command rewrites it"))


def load_run(workdir: str | pathlib.Path, step: int | str | None = None) -> Run:
  """(config, model, params) of the run in `workdir` at `step` (None: latest, "best", N)."""
  workdir = resolve_workdir(workdir)
  config = load_config(workdir)
  state, step = checkpointing.restore_raw(workdir, step)
  return Run(config=config, model=models_registry.build_model(config.model),
             params=state["params"], model_state=dict(state.get("model_state") or {}),
             step=step, workdir=workdir)
