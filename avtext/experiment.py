"""One experiment from one config: its task, its evaluators and the trainer that runs them.

    from avtext import experiment
    run = experiment.build(config, "workdirs/x")   # Trainer
    run.train()                                    # or run.evaluate(step)

`python -m avtext.main` builds every run this way; so do `avtext.aot` (on a TPU
topology's devices), the tests and the benchmarks. The pieces stay independent:
`avtext.train.Trainer` knows evaluators only as objects with `evaluate(...)`, and
`avtext.evals.build_evaluators` knows tasks only through the protocols each
evaluator declares.

`check_config` reads values and the tables of names (models, optimizers, modalities),
imported when it reaches them; the trainer, the evaluators' libraries and the
checkpointing stack are imported when a run is built. So `main` answers a bad number
before JAX is imported, and a bad name before TensorFlow is.
"""
from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING

import ml_collections

from avtext import errors
from avtext.train import config_rules
from avtext.train import rundir

if TYPE_CHECKING:
  from avtext.train import trainer as trainer_lib


def build(config: ml_collections.ConfigDict, workdir: str | pathlib.Path, *, task=None,
          evaluators: dict | None = None, devices=None) -> trainer_lib.Trainer:
  """The trainer of `config` in `workdir`: `task` (default: `config.task` from the task
  registry) and `evaluators` (default: every entry of `config.evals`, writing their
  exports under `workdir`) on `devices` (default: `jax.devices()`)."""
  from avtext import evals  # pylint: disable=g-import-not-at-top
  from avtext.tasks import task_registry  # pylint: disable=g-import-not-at-top
  from avtext.train import trainer as trainer_lib  # pylint: disable=g-import-not-at-top,redefined-outer-name
  workdir = pathlib.Path(workdir).absolute()
  if task is None:
    task = task_registry.build_task(config)
  if evaluators is None:
    evaluators = evals.build_evaluators(config, task, workdir)
  return trainer_lib.Trainer(config, workdir, task, evaluators, devices=devices)


# Config fields that name inputs: checked for existence before anything runs.
_INPUT_PATHS = ("dataset.path", "dataset.data_dir", "data.vocab", "model.vocab")


def check_inputs(config: ml_collections.ConfigDict, task) -> None:
  """Raises `errors.InputNotFound` naming the config field when a file or directory the
  run needs is missing: dataset paths (`config.dataset`, each `config.evals.*.dataset`),
  vocabularies, the towers' pretrained weights (`Task.pretrained_towers`) and the
  `config.init_from` run. It only looks at paths, so it takes milliseconds, and `main`
  calls it before it creates anything or probes the data."""
  from avtext.weights import pretrained  # pylint: disable=g-import-not-at-top
  fields = list(_INPUT_PATHS) + [f"evals.{name}.dataset.path"
                                 for name in (config.get("evals") or {})]
  for field in fields:
    value = config_rules.get(config, field)
    if isinstance(value, str) and value and "://" not in value and not (
        pathlib.Path(value).expanduser().exists()):
      raise errors.InputNotFound(f"config.{field}={value!r} does not exist; "
                                 f"set --config.{field} to the right path")
  pretrained.check_available(config, task.pretrained_towers())
  init = config.get("init_from")
  if init and init.get("workdir") and "://" not in str(init.workdir):
    workdir = pathlib.Path(init.workdir).expanduser()
    if not (workdir / rundir.CONFIG_FILE).exists() and not (
        workdir / rundir.LATEST_DIR).exists():
      raise errors.InputNotFound(
          f"config.init_from.workdir={str(init.workdir)!r} is not an avtext run directory "
          f"(no {rundir.LATEST_DIR}/ there); train that run first or fix the path")


# ---- every value a user sets, checked before JAX compiles or a directory is made


def check_config(config: ml_collections.ConfigDict, num_devices: int | None) -> None:
  """Raises `errors.BadInput`, one line `--config.<field>=<value>: what is wrong; what to
  do`, for the first value no run could use (`avtext.train.config_rules`, where each rule
  lives once, by path). Values only: it reads no file and compiles nothing, so `main`
  calls it before anything is built, and first before JAX is imported (the numbers are
  checked before the tables of names are imported); `num_devices` None: the batch is not
  checked against the devices yet."""
  config_rules.check_config(config, num_devices)
