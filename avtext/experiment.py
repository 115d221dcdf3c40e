"""One experiment from one config: its task, its evaluators and the trainer that runs them.

    from avtext import experiment
    run = experiment.build(config, "workdirs/x")   # Trainer
    run.train()                                    # or run.evaluate(step)

`python -m avtext.main` builds every run this way; so do `avtext.aot` (on a TPU
topology's devices), the tests and the benchmarks. The pieces stay independent:
`avtext.train.Trainer` knows evaluators only as objects with `evaluate(...)`, and
`avtext.evals.build_evaluators` knows tasks only through the protocols each
evaluator declares.

`check_config` reads values and the tables of names (models, optimizers, modalities),
imported when it reaches them; the trainer, the evaluators' libraries and the
checkpointing stack are imported when a run is built. So `main` answers a bad number
before JAX is imported, and a bad name before TensorFlow is.
"""
from __future__ import annotations

import math
import pathlib
from typing import TYPE_CHECKING

import ml_collections

from avtext import errors
from avtext import modalities
from avtext.train import rundir

if TYPE_CHECKING:
  from avtext.train import trainer as trainer_lib


def build(config: ml_collections.ConfigDict, workdir: str | pathlib.Path, *, task=None,
          evaluators: dict | None = None, devices=None) -> trainer_lib.Trainer:
  """The trainer of `config` in `workdir`: `task` (default: `config.task` from the task
  registry) and `evaluators` (default: every entry of `config.evals`, writing their
  exports under `workdir`) on `devices` (default: `jax.devices()`)."""
  from avtext import evals  # pylint: disable=g-import-not-at-top
  from avtext.tasks import registry as tasks_registry  # pylint: disable=g-import-not-at-top
  from avtext.train import trainer as trainer_lib  # pylint: disable=g-import-not-at-top,redefined-outer-name
  workdir = pathlib.Path(workdir).absolute()
  if task is None:
    task = tasks_registry.build_task(config)
  if evaluators is None:
    evaluators = evals.build_evaluators(config, task, workdir)
  return trainer_lib.Trainer(config, workdir, task, evaluators, devices=devices)


# Config fields that name inputs: checked for existence before anything runs.
_INPUT_PATHS = ("dataset.path", "dataset.data_dir", "data.vocab", "model.vocab")


def _get(config, dotted: str):
  for key in dotted.split("."):
    if not isinstance(config, (ml_collections.ConfigDict, dict)) or key not in config:
      return None
    config = config[key]
  return config


def check_inputs(config: ml_collections.ConfigDict, task) -> None:
  """Raises `errors.InputNotFound` naming the config field when a file or directory the
  run needs is missing: dataset paths (`config.dataset`, each `config.evals.*.dataset`),
  vocabularies, the towers' pretrained weights (`Task.pretrained_towers`) and the
  `config.init_from` run. It only looks at paths, so it takes milliseconds, and `main`
  calls it before it creates anything or probes the data."""
  from avtext.weights import pretrained  # pylint: disable=g-import-not-at-top
  fields = list(_INPUT_PATHS) + [f"evals.{name}.dataset.path"
                                 for name in (config.get("evals") or {})]
  for field in fields:
    value = _get(config, field)
    if isinstance(value, str) and value and "://" not in value and not (
        pathlib.Path(value).expanduser().exists()):
      raise errors.InputNotFound(f"config.{field}={value!r} does not exist; "
                                 f"set --config.{field} to the right path")
  pretrained.check_available(config, task.pretrained_towers())
  init = config.get("init_from")
  if init and init.get("workdir") and "://" not in str(init.workdir):
    workdir = pathlib.Path(init.workdir).expanduser()
    if not (workdir / rundir.CONFIG_FILE).exists() and not (
        workdir / rundir.LATEST_DIR).exists():
      raise errors.InputNotFound(
          f"config.init_from.workdir={str(init.workdir)!r} is not an avtext run directory "
          f"(no {rundir.LATEST_DIR}/ there); train that run first or fix the path")


# ---- every value a user sets, checked before JAX compiles or a directory is made

# Fields that count something (anywhere in the config): a whole number >= 1 when set.
_COUNTS = ("batch_size", "num_steps", "log_every_steps", "checkpoint_every_steps",
           "keep_checkpoints", "keep_best", "microbatches", "num_train", "num_val", "num_eval",
           "hidden_size", "num_layers", "num_heads", "mlp_dim", "intermediate_size",
           "embed_dim", "vocab_size", "max_positions", "num_frames", "image_size",
           "max_new_tokens", "beam_size", "max_text_len", "max_caption_len")
# Fields that are 0 or more when set: periods (0: off), warmups, decays.
_NON_NEGATIVE = ("every_steps", "every_epochs", "warmup_steps", "warmup_epochs",
                 "weight_decay", "grad_clip_norm")
# Fields above 0 when set: softmax temperatures.
_POSITIVE = ("temperature",)
# Probabilities in [0, 1).
_RATES = ("dropout_rate", "attention_dropout_rate", "label_smoothing", "stochastic_depth")


def _choices() -> dict:
  """Fields with a fixed set of names -> the table in the code that reads them (imported
  when asked: the value checks before them answer without loading JAX or Flax)."""
  from avtext.models import attention  # pylint: disable=g-import-not-at-top
  from avtext.models import coot  # pylint: disable=g-import-not-at-top
  from avtext.models import gpt2  # pylint: disable=g-import-not-at-top
  from avtext.models import mbt  # pylint: disable=g-import-not-at-top
  return {"attention": attention.ATTENTION_IMPLEMENTATIONS,
          "context_pool": gpt2.CONTEXT_POOLS, "rgb_pool": mbt.RGB_POOLS,
          "local_pooler": coot.POOLERS}


def _walk(node, prefix=""):
  for key, value in node.items():
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      yield from _walk(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", key, value


def _bad(field: str, value, what: str) -> errors.BadInput:
  return errors.BadInput(f"--config.{field}={value}: {what}")


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_config(config: ml_collections.ConfigDict, num_devices: int | None) -> None:
  """Raises `errors.BadInput`, one line `--config.<field>=<value>: what is wrong; what to
  do`, for the first value no run could use: counts and sizes (_COUNTS), steps, the
  learning rate, rates, temperatures, the model's feature widths against the dataset's,
  the names with a fixed set of choices (modalities, optimizer,
  schedule, attention kind, pools: each against the table of the code that reads it),
  the global batch against the `num_devices` it is split over (None: not yet known, not
  checked), the selected metric's evaluator. Values only: it reads no file and compiles
  nothing, so `main` calls it before anything is built, and first before JAX is imported
  (the numbers are checked before the tables of names are imported); the task then
  checks what only it knows, its loss names."""
  for field, key, value in _walk(config):
    if value is None:
      continue
    if key in _COUNTS and (not _is_number(value) or value < 1 or value != int(value)):
      raise _bad(field, value, "must be a whole number of at least 1; set it to one")
    if key in _NON_NEGATIVE and (not _is_number(value) or value < 0):
      raise _bad(field, value, "must be 0 or more; set it to 0 or more")
    if key in _POSITIVE and (not _is_number(value) or not 0 < value < math.inf):
      raise _bad(field, value, "must be a number above 0; set it to one (e.g. 0.05)")
    if key in _RATES and (not _is_number(value) or not 0 <= value < 1):
      raise _bad(field, value, "must be in [0, 1); set it to a rate in that range")
    if key == "modalities":
      try:
        modalities.parse_modalities(value)
      except ValueError:
        raise _bad(field, value, f"unknown modalities; set it to {', '.join(modalities.MODALITIES)}"
                   f" or {'+'.join(modalities.MODALITIES)}") from None
    if key in ("hidden_size", "num_heads") and field.endswith(".num_heads"):
      parent = _get(config, field.rpartition(".")[0])
      hidden = parent.get("hidden_size")
      if _is_number(hidden) and hidden % value:
        raise _bad(field, value, f"must divide the hidden_size {hidden} of "
                   f"{field.rpartition('.')[0]}; pick a divisor of it")
  _check_widths(config)
  train = config.get("train") or {}
  if train.get("num_steps") is None and train.get("num_epochs") is None:
    raise _bad("train.num_steps", None, "set train.num_steps or train.num_epochs")
  epochs = train.get("num_epochs")
  if epochs is not None and (not _is_number(epochs) or epochs <= 0):
    raise _bad("train.num_epochs", epochs, "must be more than 0; set it, or set "
               "train.num_steps instead")
  opt = config.get("optimizer") or {}
  lr = opt.get("learning_rate")
  if lr is not None and (not _is_number(lr) or not math.isfinite(lr) or lr <= 0):
    raise _bad("optimizer.learning_rate", lr, "must be a finite number above 0 (e.g. 1e-4)")
  choices = _choices()
  for field, key, value in _walk(config):
    if key in choices and isinstance(value, str) and value not in choices[key]:
      raise _bad(field, value, f"unknown; set it to one of {', '.join(choices[key])}")
  from avtext.train import control  # pylint: disable=g-import-not-at-top
  from avtext.train import optimizers  # pylint: disable=g-import-not-at-top
  for key, names in (("name", optimizers.OPTIMIZERS), ("schedule", optimizers.SCHEDULES)):
    if opt.get(key) is not None and opt.get(key) not in names:
      raise _bad(f"optimizer.{key}", opt.get(key), f"unknown; set it to one of "
                 f"{', '.join(names)}")
  if num_devices is not None:
    _check_batch(config, num_devices)
  try:
    select = control.selection(config)
  except ValueError as e:
    raise _bad("eval.select", config.eval.select, str(e).split("; ", 1)[-1]) from None
  if select and select[0].split("/")[0] not in (config.get("evals") or {}):
    raise _bad("eval.select", select, f"names evaluator {select[0].split('/')[0]!r}; "
               f"config.evals has {', '.join(sorted(config.get('evals') or {})) or 'none'}")


def _check_widths(config: ml_collections.ConfigDict) -> None:
  """A feature width the model reads (config.model.<x>_dim) is the dataset's, when both are
  set (COOT, MMT: the dataset's is checked against the files when they are opened)."""
  model, dataset = config.get("model") or {}, config.get("dataset") or {}
  for key in ("video_dim", "text_dim", "sub_dim", "query_dim"):
    have, want = dataset.get(key), model.get(key)
    if _is_number(have) and _is_number(want) and have and want and have != want:
      raise _bad(f"model.{key}", want, f"the model reads config.dataset.{key}={have} "
                 f"features; set --config.model.{key} and --config.dataset.{key} both to the "
                 "features' width")


def _check_batch(config: ml_collections.ConfigDict, num_devices: int) -> None:
  """The global batches (train, eval) split evenly over the devices of the data axis."""
  wanted = config.get("num_devices")
  if wanted not in (None, 0, -1):
    if not _is_number(wanted) or wanted < 1 or wanted > num_devices:
      raise _bad("num_devices", wanted, f"JAX sees {num_devices} devices here; set it to "
                 f"at most {num_devices} (or leave it unset: all of them)")
    num_devices = int(wanted)
  shards = num_devices // int(config.get("model_parallel") or 1)
  fields = [("train.batch_size", _get(config, "train.batch_size")),
            ("eval.batch_size", _get(config, "eval.batch_size"))]
  fields += [(f"evals.{name}.batch_size", ev.get("batch_size"))
             for name, ev in (config.get("evals") or {}).items()]
  for field, batch in fields:
    if _is_number(batch) and batch % shards:
      fit = max(shards, batch // shards * shards)
      raise _bad(field, batch, f"does not split over the {shards} devices of the data axis; "
                 f"set it to a multiple of {shards} (e.g. {fit})")
  k = int(_get(config, "train.microbatches") or 1)
  batch = _get(config, "train.batch_size")
  if k > 1 and _is_number(batch) and batch % (k * shards):
    raise _bad("train.microbatches", k, f"the batch of {batch} must split into {k} "
               f"micro-batches that each divide over the {shards} data shards; pick another")
