"""Evaluators declared in `config.evals` (big_vision style).

    config.evals.test = ml_collections.ConfigDict(dict(
        type="retrieval",                   # registry key, see `register_evaluator`
        every_steps=0,                      # or every_epochs=1.0; 0/None: only at the end
        dataset=dict(name="msrvtt"),        # overrides of config.dataset (default: none)
        split="test",
        video_fn="embed_video", text_fn="embed_text",   # the task's predict functions
    ))

Every evaluator also runs once at the end of training. Several may run in one
run (zero-shot MSR-VTT and AudioCaps from one VideoCC run); each logs
`<name>/<metric>` to TensorBoard and `results.json`. An evaluator calls only
the task's `eval_examples(source)` and named `predict_fns()`, which it jits
once per mesh in a cache all evaluators of the run share.

Adding an evaluator: subclass `base.Evaluator` in `avtext/evals/<kind>.py`,
decorate it with `@register_evaluator("<kind>")`, add the module to `_MODULES`.
"""
import importlib
from typing import Callable

import ml_collections

_EVALUATORS: dict[str, type] = {}
_MODULES = ("avtext.evals.retrieval", "avtext.evals.classification")


def register_evaluator(name: str) -> Callable[[type], type]:
  def deco(cls):
    if name in _EVALUATORS and _EVALUATORS[name] is not cls:
      raise ValueError(f"evaluator {name!r} registered twice")
    _EVALUATORS[name] = cls
    return cls
  return deco


def get_evaluator(name: str) -> type:
  for module in _MODULES:
    importlib.import_module(module)
  if name not in _EVALUATORS:
    raise ValueError(f"evaluator type {name!r}; registered: {sorted(_EVALUATORS)}")
  return _EVALUATORS[name]


def build_evaluators(config: ml_collections.ConfigDict, task) -> dict:
  """{name: evaluator} for every entry of `config.evals`, sharing one predict cache."""
  from avtext.evals import base  # pylint: disable=g-import-not-at-top
  cache = base.PredictCache(task)
  evaluators = {}
  for name, cfg in (config.get("evals") or {}).items():
    if "/" in name:
      raise ValueError(f"config.evals.{name}: evaluator names may not contain '/'")
    if not cfg.get("type"):
      raise ValueError(f"config.evals.{name}.type is not set; registered: "
                       f"{sorted(_EVALUATORS) or 'see avtext/evals'}")
    evaluators[name] = get_evaluator(cfg.type)(name, cfg, config=config, task=task,
                                               cache=cache)
  return evaluators
