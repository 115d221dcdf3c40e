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
imported on first lookup (the list in `_MODELS`), so `config.model.name` alone selects a
model. Adding a model: write the module, decorate a factory, add its module to
the list in `_MODELS`.
"""
from typing import Callable

import flax.linen as nn
import ml_collections

from avtext import registry as registry_lib

Factory = Callable[[ml_collections.ConfigDict], nn.Module]

_MODELS = registry_lib.Registry("model", (
    "avtext.models.mbt", "avtext.models.bert", "avtext.models.dual_encoder",
    "avtext.models.heads", "avtext.models.coot", "avtext.models.gpt2", "avtext.models.mmt",
    "avtext.models.xml", "avtext.models.resnet", "avtext.models.smit"))
register_model = _MODELS.register
registered = _MODELS.names


def build_model(cfg: ml_collections.ConfigDict, *, where: str = "config.model") -> nn.Module:
  """The module `cfg.name` names, built from `cfg`; `where` names the node in errors."""
  return _MODELS.get(cfg.get("name"), where=f"{where}.name")(cfg)
