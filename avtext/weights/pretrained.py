"""Public pretrained towers into a fresh model's params: the one loader of every task.

Each sub-model names its public checkpoint in its own config, the way big_vision's
two-tower `load` takes one init file per tower:

  config.model.text.weights         BERT: a local HF directory or 'minilm-l6' (weights/bert.py)
  config.model.decoder.weights      GPT-2: a local HF directory, the rows of
                                    config.model.decoder.vocab_subset (weights/gpt2.py)
  config.model.video.init_from_vit  ViT into MBT's rgb / audio towers (weights/vit.py)

A task declares its towers (`Task.pretrained_towers`: which config field, which subtree
of its params, which loader). `load` walks them; each loader reads what its config names
(nothing when unset); the result must have the fresh subtree's structure, shapes and
dtypes (else an error naming the weights and the config field) and replaces it. A run's
own checkpoints come in after this, through `config.init_from` (train/warm_start.py).
"""
import dataclasses
import pathlib
from typing import Any, Callable

from absl import logging
import jax
import ml_collections
import numpy as np

from avtext import assets
from avtext import errors
from avtext.models import bert
from avtext.text import tokenizers
from avtext.weights import bert as bert_weights
from avtext.weights import gpt2 as gpt2_weights
from avtext.weights import vit

# (fresh tower params, the tower's config, the run config) -> (where the weights came
# from, loaded tower params), or None when the tower's config names no weights.
Loader = Callable[[Any, ml_collections.ConfigDict, ml_collections.ConfigDict],
                  tuple[str, Any] | None]


@dataclasses.dataclass(frozen=True)
class Tower:
  """A sub-model that may start from public weights."""
  field: str               # its config under the run config, e.g. "model.text"
  params: tuple[str, ...]  # its subtree of the model's params, e.g. ("caption", "text")
  loader: str              # a key of `LOADERS`


def _bert(fresh, cfg, config):
  del fresh, config
  weights = bert.weights_dir(cfg.get("weights"))
  if weights is None:
    return None
  return str(weights), bert_weights.load_hf_bert(weights)[1]


def _gpt2(fresh, cfg, config):
  del fresh, config
  weights = gpt2_weights.weights_dir(cfg.get("weights"))
  if weights is None:
    return None
  subset = cfg.get("vocab_subset")  # the tokenizer's compact ids (`CaptionTokenizer.gpt2_ids`)
  ids = np.asarray(tokenizers.read_vocab_subset(subset), np.int64) if subset else None
  return str(weights), gpt2_weights.load_hf_gpt2(weights, ids)[1]


LOADERS: dict[str, Loader] = {"bert": _bert, "gpt2": _gpt2, "vit": vit.load_into_video}


def _vit_source(cfg) -> None:
  spec = cfg.get("init_from_vit")
  if spec and spec.get("path") and not pathlib.Path(spec.path).expanduser().exists():
    raise errors.InputNotFound(f"config.model.video.init_from_vit.path={spec.path!r}: "
                               f"not found. {vit.DOWNLOAD}")


def _gpt2_source(cfg) -> None:
  gpt2_weights.weights_dir(cfg.get("weights"))
  subset = cfg.get("vocab_subset")
  if subset and not pathlib.Path(subset).expanduser().exists():
    raise errors.InputNotFound(f"config.model.decoder.vocab_subset={subset!r}: not found; "
                               "write it with python -m avtext.tools.caption_vocab")


# Each loader's files, checked without reading them (`check_available`).
SOURCES: dict[str, Callable[[Any], None]] = {
    "bert": lambda cfg: bert.weights_dir(cfg.get("weights")),
    "gpt2": _gpt2_source, "vit": _vit_source}


def check_available(config: ml_collections.ConfigDict, towers) -> None:
  """Raises (errors.InputNotFound) when weights a tower's config names are missing:
  before a run probes its data or builds anything, so a missing file costs seconds."""
  for tower in towers:
    cfg = config
    for key in tower.field.split("."):
      cfg = cfg[key]
    try:
      SOURCES[tower.loader](cfg)
    except FileNotFoundError as e:
      if isinstance(e, errors.UserError):
        raise
      raise errors.InputNotFound(str(e)) from None


def _leaves(tree) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
  return {"/".join(str(getattr(k, "key", k)) for k in path): (tuple(np.shape(x)),
                                                              np.dtype(x.dtype))
          for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _difference(want: dict, got: dict) -> str:
  """The first way `got` ({leaf: (shape, dtype)}) differs from `want`."""
  missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
  if missing:
    return f"{len(missing)} parameter(s) missing, e.g. {missing[0]}"
  if extra:
    return f"{len(extra)} parameter(s) the model lacks, e.g. {extra[0]}"
  name = next(n for n in want if want[n] != got[n])
  (ws, wd), (gs, gd) = want[name], got[name]
  return f"{name} is {gd}{gs}, the model's {wd}{ws}"


def _replaced(tree, path: tuple[str, ...], value):
  if not path:
    return value
  return {**tree, path[0]: _replaced(tree[path[0]], path[1:], value)}


def load(params, config: ml_collections.ConfigDict, towers) -> Any:
  """`params` with every tower of `towers` whose config names weights loaded into it
  (module docstring); `params` itself when none does."""
  for tower in towers:
    cfg = config
    for key in tower.field.split("."):
      cfg = cfg[key]
    fresh = params
    for i, key in enumerate(tower.params):
      if key not in fresh:
        raise KeyError(f"config.{tower.field}: the model has no parameters "
                       f"{'/'.join(tower.params[:i + 1])} to load its weights into")
      fresh = fresh[key]
    out = LOADERS[tower.loader](fresh, cfg, config)
    if out is None:
      continue
    source, loaded = out
    want, got = _leaves(fresh), _leaves(loaded)
    if want != got:
      raise ValueError(f"{source}: the pretrained {tower.loader} weights do not match the "
                       f"model's {'/'.join(tower.params)} parameters ({_difference(want, got)});"
                       f" config.{tower.field} disagrees with the checkpoint's config")
    params = _replaced(params, tower.params, loaded)
    logging.info("%s initialised from %s (config.%s)", "/".join(tower.params), source,
                 tower.field)
  return params


def text_tokenizer(config: ml_collections.ConfigDict) -> tokenizers.Tokenizer:
  """The text tower's WordPiece tokenizer, `config.data.max_text_len` tokens: the vocab
  of config.data.vocab, else of config.model.text.weights, else MiniLM-L6's."""
  weights = bert.weights_dir(config.model.text.get("weights"))
  vocab = config.data.get("vocab") or (
      weights / "vocab.txt" if weights is not None else assets.minilm_l6_dir() / "vocab.txt")
  return tokenizers.Tokenizer(vocab, max_len=config.data.max_text_len)
