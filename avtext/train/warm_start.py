"""Warm start: initialize parts of a new run from another run's checkpoint.

    config.init_from = ml_collections.ConfigDict(dict(
        workdir="workdirs/video_pretrain",  # an avtext run directory
        step=None,                          # latest; "best" or N
        params=(("video/", "video/rgb/"),)  # (source prefix, target prefix), ...
    ))

Every parameter of the new model whose path starts with a target prefix is
replaced by the source parameter at the same path below the source prefix.
Both sides must match exactly: a target parameter with no source, a source
parameter with no target, or a shape/dtype mismatch is an error naming the
paths. Parameters outside the target prefixes keep their initialization.

The model's other variable collections (BatchNorm's `batch_stats`) follow the same
pairs (`apply_variables`): a ResNet carried to a new run keeps its running statistics,
which its frozen or eval-mode use needs. Under a target prefix that holds such
variables the source must hold them too (an error otherwise: fresh statistics under
trained weights would silently give wrong features); a prefix without them is left as is.

This is how a pretraining stage hands its encoder to a downstream task (VideoCC
initializes its towers from pretrained ViT/BERT; a model trained on one dataset
is fine-tuned on another). It runs only when a run starts from scratch; a
resumed run restores its own checkpoint instead.
"""
import pathlib
from typing import Any

from absl import logging
import jax
import ml_collections
import numpy as np

from avtext.train import checkpointing
from avtext.train import optimizers


def _flatten(tree: Any) -> dict[str, Any]:
  return {optimizers.path_name(path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _normalize(prefix: str) -> str:
  prefix = prefix.strip("/")
  return prefix + "/" if prefix else ""


def configured(config: ml_collections.ConfigDict) -> bool:
  spec = config.get("init_from")
  return bool(spec and spec.get("workdir"))


def load_source_params(workdir: str | pathlib.Path, step: int | str | None
                       ) -> tuple[Any, int]:
  """(params as nested dicts of numpy arrays, step) of the run in `workdir`.

  `step`: None (latest), "best" (its best checkpoint, see config.eval.select) or N.
  """
  params, _, step = load_source_state(workdir, step)
  return params, step


def load_source_state(workdir: str | pathlib.Path, step: int | str | None
                      ) -> tuple[Any, dict[str, Any], int]:
  """(params, model_state: {collection: tree}, step) of the run in `workdir`."""
  try:
    state, step = checkpointing.restore_raw(workdir, step)
  except FileNotFoundError as e:
    raise FileNotFoundError(f"config.init_from.workdir={str(workdir)!r}: {e}; expected the "
                            "run directory of a finished avtext run") from e
  if "params" not in state:
    raise ValueError(f"{workdir}: checkpoint at step {step} holds no 'params'")
  return state["params"], dict(state.get("model_state") or {}), step


def transplant(params: Any, source: Any, pairs, *, where: str = "source") -> Any:
  """`params` with the leaves under each target prefix taken from `source`.

  Args:
    params: the new model's parameter tree (any leaves with .shape/.dtype).
    source: the source parameter tree.
    pairs: ((source_prefix, target_prefix), ...); '' means the whole tree.
    where: names the source in error messages.

  Returns:
    A tree with the structure of `params`; replaced leaves are the source's
    numpy arrays (shapes and dtypes must already agree).
  """
  pairs = [tuple(p) for p in pairs]
  if not pairs or any(len(p) != 2 for p in pairs):
    raise ValueError(f"config.init_from.params must be ((source_prefix, target_prefix), ...), "
                     f"got {pairs!r}")
  target = _flatten(params)
  src = _flatten(source)
  replaced: dict[str, Any] = {}
  for src_prefix, dst_prefix in pairs:
    src_prefix, dst_prefix = _normalize(src_prefix), _normalize(dst_prefix)
    dst_names = [n for n in target if n.startswith(dst_prefix)]
    src_names = [n for n in src if n.startswith(src_prefix)]
    if not dst_names:
      raise ValueError(f"config.init_from.params: target prefix {dst_prefix!r} matches no "
                       f"parameter of the model; its top-level parameters are "
                       f"{sorted({n.split('/')[0] for n in target})}")
    wanted = {src_prefix + n[len(dst_prefix):]: n for n in dst_names}
    missing = sorted(set(wanted) - set(src_names))
    extra = sorted(set(src_names) - set(wanted))
    if missing or extra:
      raise ValueError(
          f"config.init_from.params ({src_prefix!r} -> {dst_prefix!r}): the {where} "
          f"does not match the model; missing in the {where}: {missing[:5]}"
          f"{' ...' if len(missing) > 5 else ''}; in the {where} but not in the model: "
          f"{extra[:5]}{' ...' if len(extra) > 5 else ''}")
    for src_name, dst_name in wanted.items():
      have, want = src[src_name], target[dst_name]
      if tuple(np.shape(have)) != tuple(want.shape) or np.dtype(have.dtype) != np.dtype(want.dtype):
        raise ValueError(
            f"config.init_from.params: {where} {src_name!r} is {np.dtype(have.dtype)}"
            f"{tuple(np.shape(have))}, the model's {dst_name!r} is "
            f"{np.dtype(want.dtype)}{tuple(want.shape)}")
      if dst_name in replaced:
        raise ValueError(f"config.init_from.params: {dst_name!r} is under two target prefixes")
      replaced[dst_name] = np.asarray(have)
  leaves, treedef = jax.tree_util.tree_flatten(params)
  names = list(target)
  return jax.tree_util.tree_unflatten(
      treedef, [replaced.get(n, leaf) for n, leaf in zip(names, leaves)])


def apply(params: Any, config: ml_collections.ConfigDict) -> Any:
  """`params` warm-started as `config.init_from` says (unchanged when it is unset).
  Params only: a model with `batch_stats` needs `apply_variables`."""
  return apply_variables(params, {}, config)[0]


def apply_variables(params: Any, model_state: dict[str, Any], config: ml_collections.ConfigDict
                    ) -> tuple[Any, dict[str, Any]]:
  """(params, model_state) warm-started as `config.init_from` says: the parameters and,
  under the same prefix pairs, each collection of `model_state` (module docstring)."""
  if not configured(config):
    return params, model_state
  spec = config.init_from
  source, source_state, step = load_source_state(spec.workdir, spec.get("step"))
  pairs = [tuple(p) for p in (spec.get("params") or (("", ""),))]
  where = f"checkpoint {spec.workdir} (step {step})"
  params = transplant(params, source, pairs, where=where)
  model_state = dict(model_state)
  carried = []
  for name, tree in model_state.items():
    names = list(_flatten(tree))
    active = [(s, d) for s, d in pairs if any(n.startswith(_normalize(d)) for n in names)]
    if not active:
      continue
    if name not in source_state:
      raise ValueError(f"config.init_from: the model has {name!r} under "
                       f"{[d or '<all>' for _, d in active]} but {where} holds no {name!r} "
                       "(its running statistics would start fresh under trained weights)")
    model_state[name] = transplant(tree, source_state[name], active,
                                   where=f"{where} {name!r}")
    carried.append(name)
  logging.info("warm start from %s step %d: %s%s", spec.workdir, step,
               ", ".join(f"{s or '<all>'} -> {d or '<all>'}" for s, d in pairs),
               f" (with {', '.join(carried)})" if carried else "")
  return params, model_state
