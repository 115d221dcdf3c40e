"""Import Hugging Face BERT checkpoints into `avtext.models.bert.Bert`.

Reads a local directory with HF's `config.json` and `model.safetensors` in
PyTorch naming (`[bert.]encoder.layer.0.attention.self.query.weight`, Linear
weights stored [out, in]); no torch or hub access is needed. MiniLM-L6
(`avtext.assets.minilm_l6_dir()`) ships keys without the `bert.`
prefix; checkpoints saved from BertFor* heads carry it; both are accepted.
"""
import dataclasses
import json
import pathlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.flax import load_file

from avtext.models.bert import Bert
from avtext.models.bert import CONFIG_FILE
from avtext.models.bert import bert_kwargs_from_hf_config

WEIGHTS_FILE = "model.safetensors"
# Tensors a BERT encoder checkpoint may hold that the encoder does not use:
# the position-id buffer and the pre-training heads.
_UNUSED = ("embeddings.position_ids",)
_UNUSED_PREFIXES = ("cls.",)


def _linear(w: np.ndarray) -> np.ndarray:
  return w.T  # torch Linear stores [out, in]; flax Dense kernels are [in, out].


def _tensor_map(num_layers: int, add_pooler: bool
                ) -> list[tuple[str, tuple[str, ...], Callable]]:
  """(HF name, our param path, HF tensor -> ours before reshaping) triples."""
  ident = lambda w: w
  entries = [
      (f"embeddings.{n}.weight", (n, "embedding"), ident)
      for n in ("word_embeddings", "position_embeddings",
                "token_type_embeddings")
  ]

  def norm(hf, ours):
    return [(f"{hf}.LayerNorm.weight", (*ours, "scale"), ident),
            (f"{hf}.LayerNorm.bias", (*ours, "bias"), ident)]

  def dense(hf, ours):
    return [(f"{hf}.weight", (*ours, "kernel"), _linear),
            (f"{hf}.bias", (*ours, "bias"), ident)]

  entries += norm("embeddings", ("embeddings_norm",))
  for i in range(num_layers):
    hf, ours = f"encoder.layer.{i}", f"encoderblock_{i}"
    for proj in ("query", "key", "value"):
      entries += dense(f"{hf}.attention.self.{proj}", (ours, "attention", proj))
    entries += dense(f"{hf}.attention.output.dense", (ours, "attention", "out"))
    entries += norm(f"{hf}.attention.output", (ours, "attention_norm"))
    entries += dense(f"{hf}.intermediate.dense", (ours, "mlp", "dense_in"))
    entries += dense(f"{hf}.output.dense", (ours, "mlp", "dense_out"))
    entries += norm(f"{hf}.output", (ours, "mlp_norm"))
  if add_pooler:
    entries += dense("pooler.dense", ("pooler",))
  return entries


def _unsplit_heads(shape: tuple[int, ...],
                   ours: tuple[str, ...]) -> tuple[int, ...]:
  """Our param shape as HF stores it: attention keeps heads in their own axis.

  query/key/value kernels are [D, H, D/H] (biases [H, D/H]) and the output
  kernel [H, D/H, D]; HF Linear layers hold them as [D, D] and [D].
  """
  if "attention" not in ours:
    return shape
  if ours[-2] == "out":
    return shape if ours[-1] == "bias" else (shape[0] * shape[1], shape[2])
  return shape[:-2] + (shape[-2] * shape[-1],)


def _lookup(tensors: dict[str, Any], name: str, source: pathlib.Path) -> Any:
  # Checkpoints from old TF conversions call LayerNorm parameters gamma/beta.
  candidates = [name]
  if name.endswith("LayerNorm.weight"):
    candidates.append(name[:-len("weight")] + "gamma")
  elif name.endswith("LayerNorm.bias"):
    candidates.append(name[:-len("bias")] + "beta")
  for c in candidates:
    if c in tensors:
      return tensors.pop(c)
  example = sorted(tensors)[:3]
  raise KeyError(f"{source}: missing tensor {name!r} (tried {candidates}, "
                 f"with or without the 'bert.' prefix); some keys present: "
                 f"{example}")


def load_hf_bert(path: str | pathlib.Path, *, add_pooler: bool = False
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
  """Reads an HF BERT directory into `Bert` kwargs and its param tree.

  Args:
    path: directory with config.json and model.safetensors.
    add_pooler: also import the pooler (sets `add_pooler` in the kwargs).

  Returns:
    (bert_kwargs, params): `Bert(**bert_kwargs).apply({'params': params}, ...)`
    reproduces HF's BertModel; params are float32.
  """
  path = pathlib.Path(path)
  config_path, weights_path = path / CONFIG_FILE, path / WEIGHTS_FILE
  for f in (config_path, weights_path):
    if not f.is_file():
      raise FileNotFoundError(f"{f} not found; an HF BERT directory needs "
                              f"{CONFIG_FILE} and {WEIGHTS_FILE}")
  kwargs = bert_kwargs_from_hf_config(json.loads(config_path.read_text()),
                                      str(config_path))
  kwargs["add_pooler"] = add_pooler

  tensors = {k.removeprefix("bert."): v
             for k, v in load_file(str(weights_path)).items()}
  expected = jax.eval_shape(
      lambda: Bert(**kwargs).init(
          jax.random.PRNGKey(0), jnp.zeros((1, 1), jnp.int32),
          jnp.ones((1, 1), jnp.int32))["params"])

  params: dict[str, Any] = {}
  for name, ours, convert in _tensor_map(kwargs["num_layers"], add_pooler):
    value = convert(np.asarray(_lookup(tensors, name, weights_path),
                               np.float32))
    want = expected
    for key in ours:
      want = want[key]
    if value.shape != _unsplit_heads(want.shape, ours):
      raise ValueError(
          f"{weights_path}: {name} has shape {value.shape} (after "
          f"transposing Linear weights to [in, out]) but {'/'.join(ours)} "
          f"needs {_unsplit_heads(want.shape, ours)} (from {config_path})")
    node = params
    for key in ours[:-1]:
      node = node.setdefault(key, {})
    node[ours[-1]] = jnp.asarray(value.reshape(want.shape))

  unexpected = sorted(
      k for k in tensors
      if k not in _UNUSED and not k.startswith(_UNUSED_PREFIXES) and
      not (k.startswith("pooler.") and not add_pooler))
  if unexpected:
    raise ValueError(
        f"{weights_path}: {len(unexpected)} tensors do not map onto Bert "
        f"(num_layers={kwargs['num_layers']} from {config_path}): "
        f"{unexpected[:10]}")
  return kwargs, params


def bert_from_hf(path: str | pathlib.Path, *, add_pooler: bool = False,
                 **overrides: Any) -> tuple[Bert, dict[str, Any]]:
  """`Bert` module and params from an HF directory.

  overrides replace `Bert` fields that do not change parameter shapes, e.g.
  compute=layers.Compute(dtype=jnp.bfloat16); dropout_rate / attention_dropout_rate
  replace those of its `dropout`.
  """
  kwargs, params = load_hf_bert(path, add_pooler=add_pooler)
  dropout = kwargs["dropout"]
  kwargs["dropout"] = dataclasses.replace(
      dropout, rate=overrides.pop("dropout_rate", dropout.rate),
      attention=overrides.pop("attention_dropout_rate", dropout.attention))
  return Bert(**{**kwargs, **overrides}), params
