"""`config.model.name` -> a flax module built from the config alone.

    @register_model("mbt")
    def _mbt(cfg: ml_collections.ConfigDict) -> nn.Module: ...

    model = build_model(config.model)

A factory reads only its own config node (and, for pretrained towers, the
architecture in a local checkpoint's `config.json`): no dataset, no task. So
`avtext.runs.load_run` and `--mode=eval` rebuild a model from a run's
`config.json` alone. Composite models name their parts by sub-nodes that carry
their own `name` (`config.model.video.name = "mbt"`).

Factories live next to their modules and register on import; the modules are
imported on first lookup (the list in `_MODELS`), so `config.model.name` alone selects a
model. Adding a model: write the module, decorate a factory, add its module to
the list in `_MODELS`.

Precision, memory and the backend traced for (`config.model.dtype`, `.remat`, `.attention`,
`.scan_layers`, `.backend`, `.patch_embed`; see `avtext.models.layers.Compute`) are read by
`compute_from_config`. A sub-node
inherits the fields it does not set from the node that builds it
(`build_model(cfg.video, parent=cfg)`), so one `config.model.dtype` sets every tower.
"""
from typing import Callable

import flax.linen as nn
import ml_collections

from avtext import config_registry
from avtext import ops
from avtext.models import layers

Factory = Callable[[ml_collections.ConfigDict], nn.Module]

_MODELS = config_registry.Registry("model", "avtext.models", "register_model")
register_model = _MODELS.register
registered = _MODELS.names


COMPUTE_FIELDS = ("dtype", "remat", "attention", "scan_layers", "backend", "patch_embed")


def build_model(cfg: ml_collections.ConfigDict, *, where: str = "config.model",
                parent: ml_collections.ConfigDict | None = None) -> nn.Module:
  """The module `cfg.name` names, built from `cfg`; `where` names the node in errors.

  `parent`: the node of the model that contains this one; its `COMPUTE_FIELDS`
  apply where `cfg` does not set its own.
  """
  if parent is not None:
    inherited = {k: parent.get(k) for k in COMPUTE_FIELDS
                 if parent.get(k) is not None and cfg.get(k) is None}
    if inherited:
      cfg = ml_collections.ConfigDict(cfg.to_dict())
      cfg.update(inherited)
  return _MODELS.get(cfg.get("name"), where=f"{where}.name")(cfg)


def compute_from_config(cfg: ml_collections.ConfigDict) -> layers.Compute:
  """`layers.Compute` from a model node's dtype / remat / attention / scan_layers / backend /
  patch_embed;
  a field the node leaves unset keeps `layers.Compute`'s default (the one home of the
  defaults), but the backend, which is JAX's default backend's platform (`ops.platform`)."""
  given = {k: cfg.get(k) for k in COMPUTE_FIELDS if cfg.get(k) not in (None, "")}
  if "dtype" in given:
    if given["dtype"] not in layers.DTYPES:
      raise ValueError(f"config.model.dtype={given['dtype']!r}: expected one of "
                       f"{sorted(layers.DTYPES)}")
    given["dtype"] = layers.DTYPES[given["dtype"]]
  if "scan_layers" in given:
    given["scan_layers"] = bool(given["scan_layers"])
  # The model is built for a named platform: unset, JAX's default backend, named here.
  given["backend"] = ops.platform(given.get("backend"))
  return layers.Compute(**given)
