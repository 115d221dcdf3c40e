"""Device mesh, shardings, and host-local <-> global arrays.

One `jax.sharding.Mesh` with a `data` axis (and an optional `model` axis):
batches are sharded on `data`; parameters are replicated unless a rule in
`config.partitioning.rules` partitions them over `model`, or
`config.partitioning.fsdp` shards them (and so their optimizer state) over
`data` (FSDP / ZeRO-3: each device keeps 1/N of every large tensor and XLA
all-gathers it for the forward and backward passes). The mesh follows the
physical topology (`jax.experimental.mesh_utils`); on a multi-slice TPU job the
slices are the outer part of `data` (data parallel across the DCN). The same
code runs on 1 CPU device, 8 fake CPU devices, a GPU, or every chip of a TPU pod
(each host feeds its process-local slice of the global batch).
"""
from collections.abc import Sequence
import re
from typing import Any

import jax
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np

from avtext.train import config_rules

DATA_AXIS = "data"
MODEL_AXIS = "model"
# FSDP leaves tensors below this many elements replicated: gathering them costs a
# collective each for almost no memory (biases, LayerNorm scales).
FSDP_MIN_SIZE = 2 ** 16


def make_mesh(num_devices: int | None = None, model_parallel: int = 1,
              devices: Sequence[Any] | None = None) -> Mesh:
  """A mesh over the first `num_devices` of `devices` (default `jax.devices()`; all
  when num_devices is None).

  Axes are ('data',), or ('data', 'model') when model_parallel > 1. Devices are laid
  out by `mesh_utils` for their physical topology (TPU ICI rings first); devices of
  several slices get a hybrid mesh whose `data` axis crosses slices outermost.
  """
  devices = list(jax.devices() if devices is None else devices)
  n = len(devices) if num_devices in (None, 0, -1) else num_devices
  if n > len(devices):
    raise ValueError(
        f"config.num_devices={n} but only {len(devices)} devices are visible; "
        "on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N")
  if n % model_parallel:
    raise ValueError(f"{n} devices do not split into model_parallel={model_parallel}")
  devices = devices[:n]
  shape = (n // model_parallel, model_parallel)
  slices = sorted({getattr(d, "slice_index", 0) for d in devices})
  if len(slices) > 1:
    if shape[0] % len(slices):
      raise ValueError(f"{n // model_parallel} data shards do not split over "
                       f"{len(slices)} slices")
    grid = mesh_utils.create_hybrid_device_mesh(
        (shape[0] // len(slices), model_parallel), (len(slices), 1), devices)
  elif devices[0].platform == "tpu" and n == len(devices):
    grid = mesh_utils.create_device_mesh(shape, devices)
  else:  # CPU / GPU, or a subset of a TPU slice: the devices in order
    grid = np.asarray(devices).reshape(shape)
  if model_parallel == 1:
    return Mesh(grid.reshape(-1), (DATA_AXIS,))
  return Mesh(grid, (DATA_AXIS, MODEL_AXIS))


def mesh_context(mesh: Mesh, config) -> Any:
  """`jax.set_mesh(mesh)` when the model runs kernels that need the mesh at trace time
  (attention "flash_tpu" / "splash_tpu", or "auto" on a TPU mesh: a Pallas kernel under
  shard_map),
  else a no-op context."""
  import contextlib  # pylint: disable=g-import-not-at-top
  model = config.get("model") or {}
  kinds = {model.get("attention"), *(
      v.get("attention") for v in model.values() if hasattr(v, "get"))}
  on_tpu = mesh.devices.flat[0].platform == "tpu"
  if kinds & {"flash_tpu", "splash_tpu"} or ("auto" in kinds and on_tpu):
    return jax.set_mesh(mesh)
  return contextlib.nullcontext()


def data_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dimension split over `data`."""
  return NamedSharding(mesh, P(DATA_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def num_data_shards(mesh: Mesh) -> int:
  return mesh.shape[DATA_AXIS]


def per_process_batch_size(global_batch_size: int, mesh: Mesh,
                           field: str = "train.batch_size") -> int:
  """The slice of the global batch each host's input pipeline produces; `field`: the
  config path of the batch size, for the error when it does not split."""
  config_rules.check_batch_split(field, global_batch_size, num_data_shards(mesh))
  return global_batch_size // jax.process_count()


def host_to_global(batch: Any, mesh: Mesh) -> Any:
  """Host-local numpy batch (this process's slice) -> globally sharded arrays."""
  sharding = data_sharding(mesh)
  return jax.tree.map(
      lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)),
      batch)


def global_to_host(tree: Any) -> Any:
  """Fully gathered numpy copy of (possibly sharded) arrays, on every host."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    tree = multihost_utils.process_allgather(tree, tiled=True)
  return jax.tree.map(np.asarray, tree)


def param_shardings(params: Any, mesh: Mesh,
                    rules: Sequence[tuple[str, Sequence[str | None]]] = (), *,
                    fsdp: bool = False, fsdp_min_size: int = FSDP_MIN_SIZE) -> Any:
  """Sharding of each parameter (or abstract array).

  `rules`: `(regex over "a/b/kernel", partition spec tuple)`, e.g.
  `("mlp/Dense_0/kernel", (None, "model"))`; the first match wins; they apply on a
  mesh with a `model` axis. `fsdp`: then every tensor of at least `fsdp_min_size`
  elements is also split over `data` along its largest dimension that the data
  shards divide and no rule already splits. Everything else is replicated.
  """
  compiled = [(re.compile(pattern), tuple(spec)) for pattern, spec in rules]
  shards = mesh.shape[DATA_AXIS]

  def one(path, x):
    spec: list = [None] * len(x.shape)
    if MODEL_AXIS in mesh.axis_names:
      name = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
      for regex, rule in compiled:
        if regex.search(name):
          spec = list(rule) + [None] * (len(x.shape) - len(rule))
          break
    if fsdp and shards > 1 and int(np.prod(x.shape)) >= fsdp_min_size:
      free = [i for i, d in enumerate(x.shape) if spec[i] is None and d % shards == 0]
      if free:
        spec[max(free, key=lambda i: x.shape[i])] = DATA_AXIS
    return NamedSharding(mesh, P(*spec))

  return jax.tree_util.tree_map_with_path(one, params)


def follow_params(tree: Any, params: Any, param_sharding: Any, mesh: Mesh) -> Any:
  """Shardings for optimizer state: a leaf whose path ends with a parameter's path and
  has that parameter's shape (Adam's mu, nu; momentum) gets the parameter's sharding;
  other leaves (step counts, scalars) are replicated."""
  by_path = {}
  for (path, p), s in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                          jax.tree.leaves(param_sharding)):
    by_path[_keys(path)] = (tuple(p.shape), s)

  def one(path, x):
    keys = _keys(path)
    for start in range(len(keys)):
      hit = by_path.get(keys[start:])
      if hit is not None and hit[0] == tuple(x.shape):
        return hit[1]
    return replicated(mesh)

  return jax.tree_util.tree_map_with_path(one, tree)


def _keys(path) -> tuple:
  return tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))
               for k in path)
