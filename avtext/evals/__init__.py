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
the task members its protocol declares (`avtext/evals/protocols.py`: the task's
`eval_examples(source)` and named `predict_fns()`, which it jits once per mesh in
a cache all evaluators of the run share, plus e.g. `decode` for captioning).

Adding an evaluator: subclass `base.Evaluator` in `avtext/evals/<kind>.py`,
decorate it with `@register_evaluator("<kind>")` and set its `protocol`; the registry
finds it there.
"""
import ml_collections

from avtext import config_registry
from avtext import errors

_EVALUATORS = config_registry.Registry("evaluator", "avtext.evals", "register_evaluator")
register_evaluator = _EVALUATORS.register


def get_evaluator(name: str, *, where: str = "config.evals.<name>.type") -> type:
  return _EVALUATORS.get(name, where=where)


def predict_fn_names(config: ml_collections.ConfigDict) -> list[str]:
  """The task's predict functions `config.evals` calls, as each evaluator declares them
  (`base.Evaluator.predict_fn_names`): what `avtext.aot` compiles beside the train step."""
  names = set()
  for name, cfg in (config.get("evals") or {}).items():
    cls = get_evaluator(cfg.get("type"), where=f"config.evals.{name}.type")
    names.update(cls.predict_fn_names(cfg))
  return sorted(names)


def build_evaluators(config: ml_collections.ConfigDict, task, workdir=None) -> dict:
  """{name: evaluator} for every entry of `config.evals`, sharing one predict cache.

  `workdir` (the run's directory) is where evaluators that export files write them.
  """
  from avtext.evals import base  # pylint: disable=g-import-not-at-top
  cache = base.PredictCache(task)
  evaluators = {}
  for name, cfg in (config.get("evals") or {}).items():
    if "/" in name:
      raise ValueError(f"config.evals.{name}: evaluator names may not contain '/'")
    cls = get_evaluator(cfg.get("type"), where=f"config.evals.{name}.type")
    evaluators[name] = cls(name, cfg, config=config, task=task, cache=cache, workdir=workdir)
  return evaluators


def check_splits(config: ml_collections.ConfigDict, evaluators: dict) -> None:
  """Opens every evaluator's split, so its files are checked before training (each
  source's errors name the file and line or key), and refuses a selection metric
  (`config.eval.select`) whose evaluator reads a split without references (TVC's or
  TVR's released test_public: the source's `missing_references`), which would select
  nothing."""
  select = (config.get("eval") or {}).get("select")
  chosen = select[0].split("/")[0] if select else None
  for name, evaluator in evaluators.items():
    missing = getattr(evaluator.source, "missing_references", None)
    if name == chosen and missing:
      off = ["--config.eval.select=()"]
      if config.eval.get("early_stopping_patience"):
        off.append("--config.eval.early_stopping_patience=0")
      if (config.eval.get("plateau") or {}).get("factor"):
        off.append("--config.eval.plateau.factor=0")
      raise errors.BadInput(
          f"config.eval.select={select[0]!r}: evaluator {name!r} reads split "
          f"{evaluator.cfg.get('split', 'test')!r}, but {missing}: nothing there to score; "
          f"point config.evals.{name} at a split with references, or train without "
          f"selection ({' '.join(off)})")
