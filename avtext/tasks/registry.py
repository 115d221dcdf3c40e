"""`config.task` -> task class. A task is model + loss + predict functions.

The trainer knows tasks only through this interface (see `Task`) and the
evaluators (`avtext.evals`, declared in `config.evals`) only through the
task's `eval_examples` and `predict_fns`; a new model brings a task module that
registers itself here, never its own loop or evaluation.
"""
from typing import Any, Callable

import jax
import ml_collections

from avtext import registry as registry_lib
from avtext.data import builders
from avtext.data import pipelines
from avtext.models import registry as models_registry

# Modules imported on first lookup so `config.task` alone selects a task.
_TASKS = registry_lib.Registry(
    "task", ("avtext.tasks.retrieval", "avtext.tasks.classification", "avtext.tasks.coot",
             "avtext.tasks.captioning", "avtext.tasks.moments", "avtext.tasks.smit"))
register = _TASKS.register


def get_task(name: str) -> type:
  return _TASKS.get(name, where="config.task")


def build_task(config: ml_collections.ConfigDict) -> Any:
  return get_task(config.task)(config)


class Task:
  """What the trainer and the evaluators call.

  The model comes from `config.model` through the model registry, so building
  a task opens no dataset: the train split is opened by `train_data` /
  `num_train_examples`, and evaluation splits by the evaluators
  (`avtext.evals`). Batches are dicts of host-local numpy arrays, leading
  dimension = batch. `variables` are flax variables: {"params": ...} plus any
  non-parameter collections the model keeps (BatchNorm's "batch_stats").
  """

  def __init__(self, config: ml_collections.ConfigDict):
    self.config = config
    self.model = models_registry.build_model(config.model)
    self._train_source = None

  @property
  def train_source(self):
    """`config.dataset`'s train split, opened (and checked by `check_source`) on first use."""
    if self._train_source is None:
      self._train_source = self.check_source(builders.get_source(self.config.dataset, "train"))
    return self._train_source

  def check_source(self, source):
    """`source` if this task can read it; raises naming what it needs otherwise."""
    return source

  def num_train_examples(self) -> int:
    raise NotImplementedError

  def train_data(self, *, batch_size: int, seed: int, process_index: int,
                 process_count: int):
    """A grain MapDataset of host-local training batches, infinite, deterministic."""
    raise NotImplementedError

  def init_variables(self, rng, batch) -> dict:
    """Initial flax variables, {"params": ...[, "batch_stats": ...]} (jitted: no I/O)."""
    raise NotImplementedError

  def load_pretrained(self, params) -> Any:
    """Replaces parts of freshly initialized params with pretrained weights."""
    return params

  # True: the trainer calls loss_fn(..., step=<traced int32 step>) (a loss schedule).
  loss_needs_step = False

  def loss_fn(self, variables, batch, rng) -> tuple[Any, dict, dict]:
    """(scalar loss, dict of scalar metrics, updated non-param collections).

    Traced inside the jitted step and differentiated with respect to
    `variables["params"]`; the third output replaces the other collections
    (return {} when the model has none).
    """
    raise NotImplementedError

  def eval_examples(self, source) -> Callable[[int], dict]:
    """`index -> example` of an evaluation `source` (no augmentation).

    Arrays go to the devices; other values (ids, reference strings) stay on
    the host next to their batch (see `avtext.evals.base.map_examples`).
    """
    raise NotImplementedError

  def predict_fns(self) -> dict[str, Callable[[Any, dict], Any]]:
    """Named, un-jitted `(variables, batch) -> outputs` that evaluators call.

    Evaluators jit them once per mesh (`config.evals.<name>` names them).
    """
    raise NotImplementedError


class ClipTask(Task):
  """A task trained on the clips of `config.dataset`'s train split.

  Subclasses say how a clip becomes an example (`examples`); the train split
  (opened on first use), its size and the training batches are here.
  """

  def check_source(self, source):
    if source.kind != builders.CLIPS:
      raise ValueError(f"task {self.config.task!r} reads clips (frames, audio, captions) but "
                       f"the dataset gives {source.kind!r}; pick a clips dataset "
                       "(see avtext/data/builders)")
    return source

  def examples(self, source, *, train: bool) -> Callable[..., dict]:
    """`(index[, rng]) -> example` over `source` (a `pipelines.ClipExamples`)."""
    raise NotImplementedError

  def eval_examples(self, source) -> Callable[[int], dict]:
    return self.examples(self.check_source(source), train=False)

  def num_train_examples(self) -> int:
    return len(self.train_source)

  def train_data(self, *, batch_size, seed, process_index, process_count):
    source = self.train_source
    return pipelines.train_batches(
        len(source), self.examples(source, train=True),
        batch_size=batch_size, seed=seed, process_index=process_index,
        process_count=process_count)


def video_inputs(batch: dict) -> dict:
  """The video encoder's inputs present in a batch ('rgb' and/or 'audio')."""
  return {k: batch[k] for k in ("rgb", "audio") if k in batch}


def fold_clips(fn: Callable[[dict], Any], inputs: dict) -> Any:
  """`fn` over inputs with a clip axis [B, K, ...]: applied to [B*K, ...], returns [B, K, ...]."""
  b, k = next(iter(inputs.values())).shape[:2]
  flat = jax.tree.map(lambda x: x.reshape((b * k,) + x.shape[2:]), inputs)
  return jax.tree.map(lambda y: y.reshape((b, k) + y.shape[1:]), fn(flat))
