"""What each evaluator needs from a task, declared.

Evaluators reach a task only through these members. Each evaluator class names its
protocol (`base.Evaluator.protocol`); building it checks the task has every member
(`check`), so a config that pairs an evaluator with a task that cannot serve it fails
at once, naming what is missing. `avtext.tasks.task_registry.Task` subclasses provide
`Predicting`'s members; the others' come with the tasks that serve those evaluators.
"""
from typing import Any, Callable, Protocol, Sequence

import ml_collections
import numpy as np


class Predicting(Protocol):
  """Every evaluator's: an evaluation split's examples and named predict functions.

  Optional: `collate(examples) -> batch`, for tasks whose batches are not stacked
  examples (COOT packs clips); without it `base.stack_examples` builds them.
  """

  def eval_examples(self, source) -> Callable[[int], dict]:
    """`index -> example` of an evaluation `source`."""

  def predict_fns(self) -> dict[str, Callable[[Any, dict], Any]]:
    """Named, un-jitted `(variables, batch) -> outputs`."""


class Retrieval(Predicting, Protocol):
  """`retrieval` (AVR, S-MiT) and `hierarchical` (COOT): embedding predict functions,
  named in the evaluator's config (`text_fn` / `video_fn`, `embed_fn`)."""


class Classification(Predicting, Protocol):
  """`classification`: a `logits` predict function and the class names."""

  label_names: Sequence[str]


class Captioning(Predicting, Protocol):
  """`captioning`: a `captions` predict function giving token ids, and their text."""

  train_source: Any  # the train split (the nearest-neighbour baseline embeds it)

  def decode(self, tokens: np.ndarray) -> list[str]:
    """Token ids [B, T] -> B captions."""

  def train_captions(self, n: int) -> list[str]:
    """The first n training captions (the most-frequent baseline)."""


class Corpus(Predicting, Protocol):
  """`moments` (VCMR / SVMR / VR): queries from `eval_examples`, the split's videos from
  `corpus_examples`, predict functions encode_query, encode_context and span_logits."""

  config: ml_collections.ConfigDict  # model.span_head / masked_convse: what the store keeps
  streams: Sequence[str]  # the context streams encode_context reads ('video', 'sub')

  def corpus_examples(self, source) -> Callable[[int], dict]:
    """`index -> example` over `source.corpus` (the split's videos, in order)."""


def members(protocol: type) -> list[str]:
  """The public members `protocol` declares, its bases' first."""
  names: list[str] = []
  for cls in reversed(protocol.__mro__):
    if not cls.__dict__.get("_is_protocol") or cls is Protocol:
      continue
    for name in [*cls.__dict__.get("__annotations__", {}), *vars(cls)]:
      if not name.startswith("_") and name not in names:
        names.append(name)
  return names


def check(task, protocol: type, where: str) -> None:
  """Raises naming `where`, `protocol` and the members `task` lacks, if any.

  Members are looked up on the task's class and instance dict, so properties (which may
  open a dataset) are not evaluated.
  """
  have = set(dir(type(task))) | set(getattr(task, "__dict__", {}))
  missing = [name for name in members(protocol) if name not in have]
  if missing:
    raise TypeError(f"{where} needs a task with the members of {protocol.__name__} "
                    f"(avtext/evals/protocols.py); task {type(task).__name__} lacks {missing}")
