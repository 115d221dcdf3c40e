"""`config.task` -> task class. A task is model + loss + evaluator.

The trainer knows tasks only through this interface (see `Task`); a new model
brings a task module that registers itself here, never its own loop.
"""
import importlib
from typing import Any, Callable

import jax
import ml_collections
import numpy as np

from avtext.data import builders
from avtext.data import pipelines
from avtext.train import partitioning

_TASKS: dict[str, type] = {}
# Modules imported on first lookup so `config.task` alone selects a task.
_MODULES = ("avtext.tasks.retrieval", "avtext.tasks.classification")


def register(name: str) -> Callable[[type], type]:
  def deco(cls):
    if name in _TASKS and _TASKS[name] is not cls:
      raise ValueError(f"task {name!r} registered twice")
    _TASKS[name] = cls
    return cls
  return deco


def get_task(name: str) -> type:
  for module in _MODULES:
    importlib.import_module(module)
  if name not in _TASKS:
    raise ValueError(f"config.task={name!r}; registered tasks: {sorted(_TASKS)}")
  return _TASKS[name]


def build_task(config: ml_collections.ConfigDict) -> Any:
  return get_task(config.task)(config)


class Task:
  """What the trainer calls. Subclasses implement every method.

  Batches are dicts of host-local numpy arrays, leading dimension = batch.
  """

  def __init__(self, config: ml_collections.ConfigDict):
    self.config = config

  @property
  def model(self):
    """The flax module(s) of the task, for `avtext.inspect`."""
    raise NotImplementedError

  def num_train_examples(self) -> int:
    raise NotImplementedError

  def train_data(self, *, batch_size: int, seed: int, process_index: int,
                 process_count: int):
    """A grain MapDataset of host-local training batches, infinite, deterministic."""
    raise NotImplementedError

  def init_params(self, rng, batch) -> Any:
    """Random initial parameters (jitted, so no I/O here)."""
    raise NotImplementedError

  def load_pretrained(self, params) -> Any:
    """Replaces parts of freshly initialized params with pretrained weights."""
    return params

  def loss_fn(self, params, batch, rng) -> tuple[Any, dict]:
    """(scalar loss, dict of scalar metrics); traced inside the jitted step."""
    raise NotImplementedError

  def evaluate(self, params, *, mesh, workdir, step: int) -> dict[str, float]:
    """Runs the task's evaluation; returns scalar metrics to log."""
    raise NotImplementedError


class ClipTask(Task):
  """A task trained on the clips of `config.dataset`'s train split.

  Subclasses set the model and say how a clip becomes an example
  (`examples`); the train split, its size and the training batches are here.
  """

  def __init__(self, config: ml_collections.ConfigDict, model: Any):
    super().__init__(config)
    self._model = model
    self._train_source = builders.clip_source(config.dataset, "train")

  @property
  def model(self):
    return self._model

  def examples(self, source, *, train: bool) -> Callable[..., dict]:
    """`(index[, rng]) -> example` over `source` (a `pipelines.ClipExamples`)."""
    raise NotImplementedError

  def num_train_examples(self) -> int:
    return len(self._train_source)

  def train_data(self, *, batch_size, seed, process_index, process_count):
    return pipelines.train_batches(
        len(self._train_source), self.examples(self._train_source, train=True),
        batch_size=batch_size, seed=seed, process_index=process_index,
        process_count=process_count)


def map_examples(fn: Callable[[dict], Any], examples: Callable[[int], dict], n: int, *,
                 mesh, global_batch_size: int) -> Any:
  """`fn` (jitted, on global batches) over examples 0..n-1, outputs gathered on host.

  Each process builds its share of every global batch; the last batch is
  padded and the padding dropped again. Returns `fn`'s output tree with the
  leading axes of all batches concatenated ([n, ...] per leaf).
  """
  local_bs = partitioning.per_process_batch_size(global_batch_size, mesh)
  first = jax.process_index() * local_bs
  outputs = []
  for start in range(0, n, global_batch_size):
    rows = range(start + first, min(start + first + local_bs, n))
    local = [examples(i) for i in rows] or [examples(n - 1)]
    batch = {k: np.stack([ex[k] for ex in local]) for k in local[0]}
    batch, _ = pipelines.pad_batch(batch, local_bs)
    out = partitioning.global_to_host(fn(partitioning.host_to_global(batch, mesh)))
    valid = min(global_batch_size, n - start)
    outputs.append(jax.tree.map(lambda x, v=valid: x[:v], out))
  return jax.tree.map(lambda *xs: np.concatenate(xs), *outputs)
