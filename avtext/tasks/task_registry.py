"""`config.task` -> task class. A task is model + loss + predict functions.

The trainer knows tasks only through this interface (see `Task`) and the
evaluators (`avtext.evals`, declared in `config.evals`) only through the
task's `eval_examples` and `predict_fns`; a new model brings a task module that
registers itself here, never its own loop or evaluation.
"""
from typing import Any, Callable

import jax
import ml_collections
import numpy as np

from avtext import config_registry
from avtext import ops
from avtext.data import builders
from avtext.data import pipelines
from avtext.models import model_registry
from avtext.weights import pretrained

# Every `@register("<name>")` in avtext/tasks/; a module is imported when its name is looked up.
_TASKS = config_registry.Registry("task", "avtext.tasks", "register")
register = _TASKS.register


def get_task(name: str) -> type:
  return _TASKS.get(name, where="config.task")


def build_task(config: ml_collections.ConfigDict) -> Any:
  return get_task(config.task)(config)


def record_backend(config: ml_collections.ConfigDict) -> None:
  """`config.model.backend` (the platform the model is traced for: `avtext.ops`' CPU-only
  rewrites, what "auto" attention stands for), when unset, set to JAX's default backend:
  the model is built for it and the config the run writes (config.json) says which.
  `avtext.aot` sets its target's instead."""
  if config.model.get("backend") is None:
    with config.unlocked():
      config.model.backend = ops.platform()


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
    record_backend(config)
    self.model = model_registry.build_model(config.model)
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

  def train_skip_counts(self) -> dict[str, int]:
    """{reason: count} of the train split's entries put aside so far (files missing or
    not decoding, `avtext.data.builders.media_clips`); {} before the split is opened (this
    does not open it) and for sources that skip nothing."""
    counts = getattr(self._train_source, "skip_counts", None)
    return counts() if counts is not None else {}

  def num_train_examples(self) -> int:
    raise NotImplementedError

  def train_data(self, *, batch_size: int, seed: int, process_index: int,
                 process_count: int):
    """A grain MapDataset of host-local training batches, infinite, deterministic."""
    raise NotImplementedError

  def init_variables(self, rng, batch) -> dict:
    """Initial flax variables, {"params": ...[, "batch_stats": ...]} (jitted: no I/O)."""
    raise NotImplementedError

  def pretrained_towers(self) -> tuple[pretrained.Tower, ...]:
    """The sub-models that may start from public weights their config names."""
    return ()

  def load_pretrained(self, params) -> Any:
    """Freshly initialized params with `pretrained_towers` loaded (`weights.pretrained`)."""
    return pretrained.load(params, self.config, self.pretrained_towers())

  # True: the trainer calls loss_fn(..., step=<traced int32 step>) (a loss schedule).
  loss_needs_step = False

  def loss_fn(self, variables, batch, rng) -> tuple[Any, dict, dict]:
    """(scalar loss, dict of scalar metrics, updated non-param collections).

    Traced inside the jitted step and differentiated with respect to
    `variables["params"]`; the third output replaces the other collections
    (return {} when the model has none).
    """
    raise NotImplementedError

  # A loss over in-batch negatives couples the batch's examples, so it cannot be summed
  # over micro-batches. Such tasks split loss_fn into `encode(variables, batch, rng) ->
  # (features, updated collections)`, per example, and `combine(features, batch) ->
  # (loss, metrics)` over the whole batch; `config.train.microbatches` = k then runs the
  # model on k micro-batches and the loss on the whole batch, with the exact gradient
  # (GradCache, Gao et al. 2021; see avtext/train/trainer.py). None: loss_fn only.
  encode = None
  combine = None

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

  # ------------------------------------------------------------ abstract shapes
  # What ahead-of-time compilation lowers the train step and the predict functions
  # with: `jax.jit(fn).lower(abstract_variables, task.batch_spec(B, ...))`, with no
  # dataset opened and no weights read.

  def example_spec(self, *, train: bool) -> dict[str, Any]:
    """Shapes/dtypes of ONE example's array fields (no batch axis), from the config alone
    (no dataset opened, no weights read): train=True what `train_data` batches hold
    (what loss_fn reads), train=False what `eval_examples` gives the predict functions
    (array fields only; host-only fields like ids and strings are left out).

    Values are `jax.ShapeDtypeStruct`s. A length that depends on the data is the
    config's maximum, the length the pipeline pads or cuts to (each task's
    `example_spec` says which). When the predict functions do not all read
    `eval_examples`' examples (XML: `encode_context` reads `corpus_examples`,
    `span_logits` the encoded outputs), the train=False spec is keyed by predict-fn
    name instead, {fn name: {field: ShapeDtypeStruct}}; `predict_example_spec(name)`
    reads either form.
    """
    raise NotImplementedError

  def predict_example_spec(self, name: str) -> dict[str, jax.ShapeDtypeStruct]:
    """The example spec predict function `name` reads (`example_spec(train=False)`,
    or its entry `name` when that spec is keyed by predict-fn name)."""
    spec = self.example_spec(train=False)
    if not is_keyed_spec(spec):
      return spec
    if name not in spec:
      raise ValueError(f"task {type(self).__name__}: no example spec for predict function "
                       f"{name!r}; it has {sorted(spec)}")
    return spec[name]

  def batch_spec(self, batch_size: int, *, train: bool, predict_fn: str | None = None,
                 process_count: int = 1) -> dict[str, jax.ShapeDtypeStruct]:
    """The abstract global batch of `batch_size` examples that `loss_fn` (train=True) or
    predict function `predict_fn` (train=False) receives: the example spec with a
    leading batch axis, as `stack_examples` / `pipelines.train_batches` build it from
    `process_count` processes' shares. Tasks whose batches are not stacked examples
    (COOT's `collate` packs clips) override it. `predict_fn` may be left None when the
    eval spec is not keyed by predict-fn name.
    """
    if batch_size % process_count:
      raise ValueError(f"batch_size={batch_size} is not a multiple of "
                       f"process_count={process_count}")
    if train:
      spec = self.example_spec(train=True)
    elif predict_fn is None:
      spec = self.example_spec(train=False)
      if is_keyed_spec(spec):
        raise ValueError(f"task {type(self).__name__}: its predict functions read different "
                         f"batches; name one of {sorted(spec)} (predict_fn=)")
    else:
      spec = self.predict_example_spec(predict_fn)
    return {k: jax.ShapeDtypeStruct((batch_size,) + v.shape, v.dtype) for k, v in spec.items()}


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

  def clip_spec(self, *, train: bool) -> dict[str, jax.ShapeDtypeStruct]:
    """`pipelines.ClipExamples`' frames and audio of `self.modalities` (see `clip_spec`)."""
    return clip_spec(self.config.data, self.modalities, train=train)

  def num_train_examples(self) -> int:
    return len(self.train_source)

  def train_data(self, *, batch_size, seed, process_index, process_count):
    source = self.train_source
    return pipelines.train_batches(
        len(source), self.examples(source, train=True),
        batch_size=batch_size, seed=seed, process_index=process_index,
        process_count=process_count)


def spec(shape, dtype) -> jax.ShapeDtypeStruct:
  """`jax.ShapeDtypeStruct` of `shape` (ints) and numpy `dtype`."""
  return jax.ShapeDtypeStruct(tuple(int(n) for n in shape), np.dtype(dtype))


def is_keyed_spec(spec: dict) -> bool:
  """True for an eval spec keyed by predict-fn name ({fn: {field: ShapeDtypeStruct}})."""
  return bool(spec) and all(isinstance(v, dict) for v in spec.values())


def clip_spec(data: ml_collections.ConfigDict, modalities, *, train: bool
              ) -> dict[str, jax.ShapeDtypeStruct]:
  """'rgb' / 'audio' / 'has_audio' of `pipelines.ClipExamples` over `config.data`.

  rgb float32 [T, S, S, 3] (T = num_frames, S = image_size); audio float32
  [spec_segments * spec_segment_frames, num_mel_bins] and has_audio bool []; at eval
  every field has a leading K = eval_num_clips axis. Only `modalities`' fields.
  """
  k = () if train else (int(data.eval_num_clips),)
  out = {}
  if "rgb" in modalities:
    out["rgb"] = spec(k + (data.num_frames, data.image_size, data.image_size, 3), np.float32)
  if "audio" in modalities:
    out["audio"] = spec(k + (data.spec_segments * data.spec_segment_frames, data.num_mel_bins),
                        np.float32)
    out["has_audio"] = spec(k, np.bool_)
  return out


def video_inputs(batch: dict) -> dict:
  """The video encoder's inputs present in a batch ('rgb' and/or 'audio')."""
  return {k: batch[k] for k in ("rgb", "audio") if k in batch}


def fold_clips(fn: Callable[[dict], Any], inputs: dict) -> Any:
  """`fn` over inputs with a clip axis [B, K, ...]: applied to [B*K, ...], returns [B, K, ...]."""
  b, k = next(iter(inputs.values())).shape[:2]
  flat = jax.tree.map(lambda x: x.reshape((b * k,) + x.shape[2:]), inputs)
  return jax.tree.map(lambda y: y.reshape((b, k) + y.shape[1:]), fn(flat))
