"""`config.model.name` -> a flax module built from the config alone.

    @register_model("mbt")
    def _mbt(cfg: ml_collections.ConfigDict) -> nn.Module: ...

    model = build_model(config.model)

A factory reads only its own config node (and, for pretrained towers, the
architecture in a local checkpoint's `config.json`): no dataset, no task. So
`avtext.inspect.load_run` and `--mode=eval` rebuild a model from a run's
`config.json` alone. Composite models name their parts by sub-nodes that carry
their own `name` (`config.model.video.name = "mbt"`).

Factories live next to their modules and register on import; the modules are
imported on first lookup (`_MODULES`), so `config.model.name` alone selects a
model. Adding a model: write the module, decorate a factory, add its module to
`_MODULES`.
"""
import importlib
from typing import Callable

import flax.linen as nn
import ml_collections

Factory = Callable[[ml_collections.ConfigDict], nn.Module]

_MODELS: dict[str, Factory] = {}
_MODULES = ("avtext.models.mbt", "avtext.models.bert", "avtext.models.dual_encoder",
            "avtext.models.heads")


def register_model(name: str) -> Callable[[Factory], Factory]:
  def deco(factory):
    if name in _MODELS and _MODELS[name] is not factory:
      raise ValueError(f"model {name!r} registered twice")
    _MODELS[name] = factory
    return factory
  return deco


def registered() -> list[str]:
  for module in _MODULES:
    importlib.import_module(module)
  return sorted(_MODELS)


def build_model(cfg: ml_collections.ConfigDict, *, where: str = "config.model") -> nn.Module:
  """The module `cfg.name` names, built from `cfg`; `where` names the node in errors."""
  name = cfg.get("name")
  names = registered()
  if not name:
    raise ValueError(f"{where}.name is not set; registered models: {names}")
  if name not in _MODELS:
    raise ValueError(f"{where}.name={name!r}; registered models: {names}")
  return _MODELS[name](cfg)
