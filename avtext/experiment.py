"""One experiment from one config: its task, its evaluators and the trainer that runs them.

    from avtext import experiment
    run = experiment.build(config, "workdirs/x")   # Trainer
    run.train()                                    # or run.evaluate(step)

`python -m avtext.main` builds every run this way; so do `avtext.aot` (on a TPU
topology's devices), the tests and the benchmarks. The pieces stay independent:
`avtext.train.Trainer` knows evaluators only as objects with `evaluate(...)`, and
`avtext.evals.build_evaluators` knows tasks only through the protocols each
evaluator declares.
"""
import pathlib

import ml_collections

from avtext import evals
from avtext.tasks import registry as tasks_registry
from avtext.train import trainer as trainer_lib


def build(config: ml_collections.ConfigDict, workdir: str | pathlib.Path, *, task=None,
          evaluators: dict | None = None, devices=None) -> trainer_lib.Trainer:
  """The trainer of `config` in `workdir`: `task` (default: `config.task` from the task
  registry) and `evaluators` (default: every entry of `config.evals`, writing their
  exports under `workdir`) on `devices` (default: `jax.devices()`)."""
  workdir = pathlib.Path(workdir).absolute()
  if task is None:
    task = tasks_registry.build_task(config)
  if evaluators is None:
    evaluators = evals.build_evaluators(config, task, workdir)
  return trainer_lib.Trainer(config, workdir, task, evaluators, devices=devices)
