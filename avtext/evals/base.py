"""What every evaluator shares: its config, cadence, data, and batched prediction.

An evaluator's entry in `config.evals.<name>`:
  type            registry key (`avtext.evals.register_evaluator`)
  every_steps     run every N training steps (0 / None: not periodically)
  every_epochs    or every E epochs of the train split (converted to steps)
  dataset         overrides of `config.dataset` for this evaluator (e.g. {name: "msrvtt"});
                  a field left None keeps `config.dataset`'s value
  split           the split to evaluate (default "test")
  batch_size      global eval batch (default `config.eval.batch_size`)
plus the evaluator's own fields (the predict functions it calls, metric options).
Every evaluator also runs at the end of training and in `--mode=eval`.

Prediction (`map_examples`): examples 0..n-1 of the source, each process
building its contiguous share of every global batch; arrays go to the devices
and through the jitted predict function; other values (ids, reference strings)
stay on the host next to their rows. The last batch is padded to the full size
and the padded rows are dropped from both, so they are never counted.
"""
import pickle
from typing import Any, Callable

import jax
import ml_collections
import numpy as np

from avtext.data import builders
from avtext.evals import protocols
from avtext.evals import submission
from avtext.train import partitioning


class PredictCache:
  """One jitted function per (key, mesh), shared by all evaluators of a run."""

  def __init__(self, task):
    self.task = task
    self._fns = None
    self._jitted: dict[Any, Callable] = {}

  def predict_fn(self, name: str) -> Callable:
    """The task's un-jitted predict function `name`."""
    if self._fns is None:
      self._fns = dict(self.task.predict_fns())
    if name not in self._fns:
      raise ValueError(f"task {type(self.task).__name__} has no predict function {name!r}; "
                       f"it has {sorted(self._fns)}")
    return self._fns[name]

  def jitted(self, key: Any, mesh, build: Callable[[], Callable]) -> Callable:
    """jit(build()) compiled once for `key` on `mesh` (`build` is called once)."""
    if (key, mesh) not in self._jitted:
      self._jitted[(key, mesh)] = jax.jit(build())
    return self._jitted[(key, mesh)]


class Evaluator:
  """Base class: subclasses implement `evaluate` (and usually `report`) and name the
  task members they call (`protocol`, checked here)."""

  protocol = protocols.Predicting
  # The task predict functions the evaluator calls: {config key: default name} for the
  # ones a config may rename, and the fixed ones. `predict_fn_names` reads both (aot
  # compiles exactly these for a config).
  predict_fn_keys: dict[str, str] = {}
  fixed_predict_fns: tuple[str, ...] = ()

  @classmethod
  def predict_fn_names(cls, cfg) -> list[str]:
    """The task's predict functions an evaluator of this config calls."""
    return sorted({cfg.get(k, default) for k, default in cls.predict_fn_keys.items()}
                  | set(cls.fixed_predict_fns))

  def predict_fn_name(self, key: str) -> str:
    """The predict function configured under `key` (`predict_fn_keys`' default)."""
    return self.cfg.get(key, self.predict_fn_keys[key])

  def __init__(self, name: str, cfg: ml_collections.ConfigDict, *,
               config: ml_collections.ConfigDict, task, cache: PredictCache,
               workdir: Any = None):
    self.name = name
    # Where exports go: the run's directory, --mode=eval's --eval_dir, or None (nowhere).
    self.workdir = workdir
    self.cfg = cfg
    self.config = config
    self.task = task
    self.cache = cache
    self._source = None
    if cfg.get("every_steps") and cfg.get("every_epochs"):
      raise ValueError(f"config.evals.{name}: set every_steps or every_epochs, not both")
    protocols.check(task, self.protocol,
                    f"config.evals.{name} (type {cfg.get('type')!r}, {type(self).__name__})")

  def every(self, steps_per_epoch: int) -> int:
    """Period in training steps (0: only at the end of training)."""
    if self.cfg.get("every_epochs"):
      return max(1, int(round(self.cfg.every_epochs * steps_per_epoch)))
    return int(self.cfg.get("every_steps") or 0)

  @property
  def dataset_config(self) -> ml_collections.ConfigDict:
    """`config.dataset` with this evaluator's `dataset` overrides (None: inherited)."""
    merged = ml_collections.ConfigDict(self.config.dataset.to_dict())
    overrides = self.cfg.get("dataset")
    if overrides:
      overrides = overrides.to_dict() if hasattr(overrides, "to_dict") else dict(overrides)
      merged.update({k: v for k, v in overrides.items() if v is not None})
    return merged

  @property
  def source(self):
    """The evaluated split, opened on first use and kept."""
    if self._source is None:
      self._source = builders.get_source(self.dataset_config, self.cfg.get("split", "test"))
    return self._source

  def skip_counts(self) -> dict[str, int] | None:
    """{reason: count} of the split's entries put aside so far (files missing or not
    decoding, `avtext.data.builders.media_clips`); None before the split is opened (this
    does not open it) and for sources that never skip."""
    counts = getattr(self._source, "skip_counts", None)
    return counts() if counts is not None else None

  @property
  def batch_size(self) -> int:
    return int(self.cfg.get("batch_size") or self.config.eval.batch_size)

  def predict(self, key: Any, build: Callable[[], Callable], variables, *,
              mesh) -> tuple[Any, dict[str, list]]:
    """(device outputs [n, ...] per leaf, host fields {name: [n values]}) over the source."""
    fn = self.cache.jitted(key, mesh, build)
    source = self.source
    return map_examples(lambda batch: fn(variables, batch), self.task.eval_examples(source),
                        len(source), mesh=mesh, global_batch_size=self.batch_size,
                        collate=getattr(self.task, "collate", None),
                        batch_field=(f"evals.{self.name}.batch_size" if self.cfg.get("batch_size")
                                     else "eval.batch_size"))

  def run(self, variables, *, mesh, step: int) -> dict[str, Any]:
    """Evaluates, prints the evaluator's table on process 0, returns its metrics."""
    results = self.evaluate(variables, mesh=mesh, step=step)
    if jax.process_index() == 0:
      self.report(results, step)
    return results

  def evaluate(self, variables, *, mesh, step: int) -> dict[str, Any]:
    raise NotImplementedError

  def package_submission(self, step: int, export) -> str:
    """After this evaluator wrote `export`, its file of `step`: the zip to upload to the
    official server once this process wrote the run's val and test_public exports of that
    step (`avtext.evals.submission`), else ""."""
    if (export is None or jax.process_index() != 0
        or self.cfg.get("type") not in submission.KINDS):
      return ""
    return str(submission.package(self.config, self.workdir, step, self.cfg.type,
                                  written=export) or "")

  def report(self, results: dict, step: int) -> None:
    del step
    print(f"== {self.name} ==\n" + "\n".join(f"{k}: {v}" for k, v in sorted(results.items())),
          flush=True)


def _on_device(value: Any) -> bool:
  """Numeric arrays and scalars go to the devices; ids and strings stay on the host."""
  if isinstance(value, (np.ndarray, np.generic, bool, int, float)):
    return np.asarray(value).dtype.kind in "biuf"
  return False


def stack_examples(examples: list[dict]) -> dict:
  """The default collate: every field stacked along a new leading batch axis."""
  return {k: np.stack([ex[k] for ex in examples]) for k in examples[0]}


def map_examples(fn: Callable[[dict], Any], examples: Callable[[int], dict], n: int, *,
                 mesh, global_batch_size: int,
                 collate: Callable[[list[dict]], dict] | None = None,
                 batch_field: str = "eval.batch_size") -> tuple[Any, dict[str, list]]:
  """`fn` (jitted, on global batches) over examples 0..n-1, gathered on every host.

  A process's batch is `collate` (default `stack_examples`) of its examples'
  array fields, padded to the per-process batch size by repeating the last
  example; `fn`'s outputs must have one row per example. `batch_field`: the config path
  of `global_batch_size`, named when it does not split over the data shards.

  Returns (fn's output tree with the batches concatenated, [n, ...] per leaf;
  {host field: list of n values} for the examples' non-array fields).
  """
  if n == 0:
    raise ValueError("nothing to evaluate: the source is empty")
  local_bs = partitioning.per_process_batch_size(global_batch_size, mesh, batch_field)
  first = jax.process_index() * local_bs
  outputs, host_rows = [], []
  for start in range(0, n, global_batch_size):
    rows = range(start + first, min(start + first + local_bs, n))
    real = [examples(i) for i in rows]
    local = real or [examples(n - 1)]  # a process past the end still joins the step
    keys = [k for k in local[0] if _on_device(local[0][k])]
    host_rows.append({k: [ex[k] for ex in real] for k in local[0] if k not in keys})
    local = local + [local[-1]] * (local_bs - len(local))
    batch = (collate or stack_examples)([{k: ex[k] for k in keys} for ex in local])
    out = partitioning.global_to_host(fn(partitioning.host_to_global(batch, mesh)))
    valid = min(global_batch_size, n - start)
    outputs.append(jax.tree.map(lambda x, v=valid: x[:v], out))
  host: dict[str, list] = {}
  # Process p holds rows [p * local_bs, (p + 1) * local_bs) of every batch.
  for per_process in zip(*allgather_objects(host_rows)):
    for part in per_process:
      for k, values in part.items():
        host.setdefault(k, []).extend(values)
  return jax.tree.map(lambda *xs: np.concatenate(xs), *outputs), host


def allgather_objects(obj: Any) -> list[Any]:
  """[obj of process 0, obj of process 1, ...] on every process (pickled bytes)."""
  if jax.process_count() == 1:
    return [obj]
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  data = np.frombuffer(pickle.dumps(obj), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int64)))
  buf = np.zeros(int(sizes.max()), np.uint8)
  buf[:data.size] = data
  gathered = np.asarray(multihost_utils.process_allgather(buf))  # [processes, max size]
  return [pickle.loads(gathered[p, :int(sizes[p].item())].tobytes())
          for p in range(gathered.shape[0])]
