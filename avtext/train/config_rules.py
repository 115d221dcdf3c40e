"""Every rule a config's values are held to, each checked here once, by its path, with one
message: `errors.BadInput`, one line `--config.<path>=<value>: what is wrong; what to do`.

`check_config` holds a whole config to them before anything runs (`avtext.experiment`,
`python -m avtext.main`); the trainer and the partitioning call the same rules where they
meet the values (the step count, the selected metric's evaluator, the batch over the data
shards, the micro-batches), so a rule and its message exist once.

A rule names the fields it reads by path: `*` is one key (`evals.*.batch_size`: any
evaluator's), `**` any run of keys (`model.**.hidden_size`: the model's and each tower's);
a field of the same name elsewhere (`dataset.hidden_size`) is not held to it.

Only values: no file is read and nothing is compiled, and this module imports no JAX (the
tables of names are imported when `check_config` reaches them), so `main` answers a bad
number before JAX is imported and a bad name before TensorFlow is.
"""
import functools
import math
import re
from typing import Any, Iterable, Iterator

import ml_collections

from avtext import errors
from avtext import modalities

_MODEL_SIZES = ("hidden_size", "num_layers", "num_heads", "mlp_dim", "intermediate_size",
                "embed_dim", "vocab_size", "max_positions")
_SPLIT_SIZES = ("num_train", "num_val", "num_eval")
# Fields that count something: a whole number >= 1 when set.
COUNTS = (
    "train.batch_size", "eval.batch_size", "evals.*.batch_size", "train.num_steps",
    "train.log_every_steps", "train.checkpoint_every_steps", "train.keep_checkpoints",
    "eval.keep_best", "train.microbatches", "data.num_frames", "data.image_size",
    "data.max_text_len", "data.max_caption_len", "generation.max_new_tokens",
    "generation.beam_size", "evals.*.baselines.*.num_train",
    *(f"model.**.{k}" for k in _MODEL_SIZES),
    *(f"{node}.{k}" for node in ("dataset", "evals.*.dataset", "features_source")
      for k in _SPLIT_SIZES))
# Fields that are 0 or more when set: periods (0: off), warmups, decays.
NON_NEGATIVE = ("evals.*.every_steps", "evals.*.every_epochs", "optimizer.warmup_steps",
                "optimizer.warmup_epochs", "optimizer.weight_decay", "optimizer.grad_clip_norm")
# Fields above 0 when set: softmax temperatures.
POSITIVE = ("loss.temperature",)
# Probabilities in [0, 1).
RATES = ("model.**.dropout_rate", "model.**.attention_dropout_rate",
         "model.**.stochastic_depth", "loss.label_smoothing")
MODALITIES = ("model.**.modalities",)
HEADS = ("model.**.num_heads",)  # divide the hidden_size beside them


@functools.cache
def _regex(pattern: str) -> re.Pattern:
  parts = []
  for key in pattern.split("."):
    parts.append(r"(?:[^.]+\.)*" if key == "**" else
                 (r"[^.]+" if key == "*" else re.escape(key)) + r"\.")
  return re.compile("".join(parts)[:-2])


def matches(path: str, patterns: Iterable[str]) -> bool:
  """Whether the dotted `path` is one of `patterns` (`*` one key, `**` any keys)."""
  return any(_regex(p).fullmatch(path) for p in patterns)


def bad(path: str, value, what: str) -> errors.BadInput:
  return errors.BadInput(f"--config.{path}={value}: {what}")


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def get(config, path: str):
  """The value at dotted `path`, None where a key is missing."""
  for key in path.split("."):
    if not isinstance(config, (ml_collections.ConfigDict, dict)) or key not in config:
      return None
    config = config[key]
  return config


def leaves(node, prefix: str = "") -> Iterator[tuple[str, Any]]:
  """(dotted path, value) of every field under `node`."""
  for key, value in node.items():
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      yield from leaves(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


def check_count(path: str, value) -> None:
  if not _is_number(value) or value < 1 or value != int(value):
    raise bad(path, value, "must be a whole number of at least 1; set it to one")


def check_value(config, path: str, value) -> None:
  """The rules of the tables above that hold the field at `path`."""
  if matches(path, COUNTS):
    check_count(path, value)
  if matches(path, NON_NEGATIVE) and (not _is_number(value) or value < 0):
    raise bad(path, value, "must be 0 or more; set it to 0 or more")
  if matches(path, POSITIVE) and (not _is_number(value) or not 0 < value < math.inf):
    raise bad(path, value, "must be a number above 0; set it to one (e.g. 0.05)")
  if matches(path, RATES) and (not _is_number(value) or not 0 <= value < 1):
    raise bad(path, value, "must be in [0, 1); set it to a rate in that range")
  if matches(path, MODALITIES):
    try:
      modalities.parse_modalities(value)
    except ValueError:
      raise bad(path, value, f"unknown modalities; set it to {', '.join(modalities.MODALITIES)}"
                f" or {'+'.join(modalities.MODALITIES)}") from None
  if matches(path, HEADS):
    node = path.rpartition(".")[0]
    hidden = get(config, f"{node}.hidden_size")
    if _is_number(hidden) and _is_number(value) and hidden % value:
      raise bad(path, value, f"must divide the hidden_size {hidden} of {node}; pick a "
                "divisor of it")


def check_steps(config) -> None:
  """train.num_steps or train.num_epochs is set; epochs above 0 (steps: `COUNTS`)."""
  train = config.get("train") or {}
  if train.get("num_steps") is None and train.get("num_epochs") is None:
    raise bad("train.num_steps", None, "set train.num_steps or train.num_epochs")
  epochs = train.get("num_epochs")
  if epochs is not None and (not _is_number(epochs) or epochs <= 0):
    raise bad("train.num_epochs", epochs, "must be more than 0; set it, or set "
              "train.num_steps instead")
  if train.get("num_steps") is not None:
    check_count("train.num_steps", train.get("num_steps"))


def selection(config) -> tuple[str, str] | None:
  """(metric key, "max"|"min") of `config.eval.select`, or None."""
  select = (config.get("eval") or {}).get("select")
  if not select:
    return None
  if len(select) != 2 or select[1] not in ("max", "min") or "/" not in select[0]:
    raise bad("eval.select", tuple(select), "expected ('<evaluator>/<metric>', 'max' | 'min')")
  return str(select[0]), str(select[1])


def check_selected_evaluator(config, evaluators: Iterable[str]) -> None:
  """The evaluator `config.eval.select` names is one of `evaluators`."""
  select, names = selection(config), sorted(evaluators)
  if select and select[0].split("/")[0] not in names:
    raise bad("eval.select", select, f"names evaluator {select[0].split('/')[0]!r}; "
              f"config.evals has {', '.join(names) or 'none'}")


def check_batch_split(path: str, batch, shards: int) -> None:
  """A global batch splits evenly over the `shards` devices of the data axis."""
  if _is_number(batch) and batch % shards:
    fit = max(shards, batch // shards * shards)
    raise bad(path, batch, f"does not split over the {shards} devices of the data axis; "
              f"set it to a multiple of {shards} (e.g. {fit})")


def check_microbatches(config, shards: int) -> int:
  """`train.microbatches` (k): the global batch splits into k parts that each divide over
  the `shards` data shards. Returns k."""
  k = get(config, "train.microbatches")
  k = 1 if k is None else k
  check_count("train.microbatches", k)
  batch = get(config, "train.batch_size")
  if k > 1 and _is_number(batch) and batch % (k * shards):
    raise bad("train.microbatches", k, f"the batch of {batch} must split into {k} "
              f"micro-batches that each divide over the {shards} data shards; pick another")
  return k


def _choices() -> dict:
  """Fields with a fixed set of names -> the table in the code that reads them (imported
  when asked: the value checks before them answer without loading JAX or Flax)."""
  from avtext.models import attention  # pylint: disable=g-import-not-at-top
  from avtext.models import coot  # pylint: disable=g-import-not-at-top
  from avtext.models import gpt2  # pylint: disable=g-import-not-at-top
  from avtext.models import mbt  # pylint: disable=g-import-not-at-top
  from avtext import ops  # pylint: disable=g-import-not-at-top
  from avtext.train import optimizers  # pylint: disable=g-import-not-at-top
  return {"model.**.attention": attention.ATTENTION_IMPLEMENTATIONS,
          "model.**.backend": ops.PLATFORMS,
          "model.**.context_pool": gpt2.CONTEXT_POOLS, "model.**.rgb_pool": mbt.RGB_POOLS,
          "model.**.local_pooler": coot.POOLERS, "optimizer.name": optimizers.OPTIMIZERS,
          "optimizer.schedule": optimizers.SCHEDULES}


def _check_widths(config) -> None:
  """A feature width the model reads (config.model.<x>_dim) is the dataset's, when both are
  set (COOT, MMT: the dataset's is checked against the files when they are opened)."""
  model, dataset = config.get("model") or {}, config.get("dataset") or {}
  for key in ("video_dim", "text_dim", "sub_dim", "query_dim"):
    have, want = dataset.get(key), model.get(key)
    if _is_number(have) and _is_number(want) and have and want and have != want:
      raise bad(f"model.{key}", want, f"the model reads config.dataset.{key}={have} "
                f"features; set --config.model.{key} and --config.dataset.{key} both to the "
                "features' width")


def _check_batch(config, num_devices: int) -> None:
  """The global batches (train, eval) split evenly over the devices of the data axis."""
  wanted = config.get("num_devices")
  if wanted not in (None, 0, -1):
    if not _is_number(wanted) or wanted < 1 or wanted > num_devices:
      raise bad("num_devices", wanted, f"JAX sees {num_devices} devices here; set it to "
                f"at most {num_devices} (or leave it unset: all of them)")
    num_devices = int(wanted)
  shards = num_devices // int(config.get("model_parallel") or 1)
  for path, batch in leaves(config):
    if matches(path, ("train.batch_size", "eval.batch_size", "evals.*.batch_size")):
      check_batch_split(path, batch, shards)
  check_microbatches(config, shards)


def check_config(config: ml_collections.ConfigDict, num_devices: int | None) -> None:
  """Raises `errors.BadInput` for the first value no run could use: counts and sizes
  (`COUNTS`), periods, rates, temperatures, modalities and heads by path, the step count,
  the learning rate, the model's feature widths against the dataset's, the names with a
  fixed set of choices (each against the table of the code that reads it), the global
  batch against the `num_devices` it is split over (None: not yet known, not checked),
  the selected metric and its evaluator. The numbers are checked before the tables of
  names are imported; the task then checks what only it knows, its loss names."""
  for path, value in leaves(config):
    if value is not None:
      check_value(config, path, value)
  _check_widths(config)
  check_steps(config)
  lr = get(config, "optimizer.learning_rate")
  if lr is not None and (not _is_number(lr) or not math.isfinite(lr) or lr <= 0):
    raise bad("optimizer.learning_rate", lr, "must be a finite number above 0 (e.g. 1e-4)")
  choices = _choices()
  for path, value in leaves(config):
    for pattern, names in choices.items():
      if value is not None and matches(path, (pattern,)) and value not in names:
        raise bad(path, value, f"unknown; set it to one of {', '.join(names)}")
  if num_devices is not None:
    _check_batch(config, num_devices)
  check_selected_evaluator(config, config.get("evals") or {})
