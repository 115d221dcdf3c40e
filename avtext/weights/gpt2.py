"""Import Hugging Face GPT-2 checkpoints into `avtext.models.gpt2.GPT2`.

Reads a local directory with HF's `config.json` and `model.safetensors`; no
torch, no hub. Two naming schemes are accepted, each with or without the
`transformer.` prefix of GPT2LMHeadModel checkpoints:

  PyTorch (the hub's files)      h.0.attn.c_attn.weight [D, 3D] (Conv1D: [in, out]),
                                 h.0.ln_1.weight, wte.weight, ...
  Flax (FlaxGPT2*.save_pretrained(safe_serialization=True))
                                 h.0.attn.c_attn.kernel [3D, D] ([out, in]),
                                 h.0.ln_1.scale, wte.embedding, ...

GPT-2 ties its output projection to `wte`, so `lm_head.weight` (when saved)
is ignored. c_attn's output is [query | key | value], each split into heads
as [D, H, D/H]; c_proj becomes [H, D/H, D]:

  h.<i>.ln_1 -> h_<i>/attention_norm      h.<i>.attn.c_attn -> h_<i>/attention/{query,key,value}
  h.<i>.ln_2 -> h_<i>/mlp_norm            h.<i>.attn.c_proj -> h_<i>/attention/out
  h.<i>.mlp.c_fc -> h_<i>/mlp/dense_in    h.<i>.mlp.c_proj  -> h_<i>/mlp/dense_out
  wte, wpe, ln_f -> wte, wpe, ln_f

No GPT-2 weights ship offline with avtext: without `model.decoder.weights`
the decoder starts from random init (N(0, 0.02)).
"""
import json
import pathlib
from typing import Any

import numpy as np
from safetensors.numpy import load_file

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
_IGNORED = ("lm_head.weight", "lm_head.kernel")


def weights_dir(spec: str | None) -> pathlib.Path | None:
  """`config.model.decoder.weights`: None (random init) or a local HF GPT-2 directory."""
  if not spec:
    return None
  path = pathlib.Path(spec)
  for name in (CONFIG_FILE, WEIGHTS_FILE):
    if not (path / name).is_file():
      raise FileNotFoundError(f"config.model.decoder.weights={spec!r}: no {name} there; "
                              "expected a local HF GPT-2 directory (config.json + "
                              "model.safetensors)")
  return path


def gpt2_kwargs_from_hf_config(config: dict[str, Any], source: str = CONFIG_FILE) -> dict:
  """Maps an HF GPT2Config dict onto `GPT2`'s attributes."""
  def need(key):
    if key not in config:
      raise KeyError(f"{source}: missing {key!r}")
    return config[key]

  act = config.get("activation_function", "gelu_new")
  if act not in ("gelu_new", "gelu_pytorch_tanh"):
    raise ValueError(f"{source}: activation_function={act!r}; GPT2 uses the tanh GELU "
                     "(gelu_new)")
  for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
    if config.get(flag):
      raise ValueError(f"{source}: {flag}=True is not implemented")
  if not config.get("scale_attn_weights", True):
    raise ValueError(f"{source}: scale_attn_weights=False is not implemented")
  d = need("n_embd")
  return dict(vocab_size=need("vocab_size"), max_positions=need("n_positions"),
              hidden_size=d, num_layers=need("n_layer"), num_heads=need("n_head"),
              mlp_dim=config.get("n_inner") or 4 * d,
              layer_norm_eps=config.get("layer_norm_epsilon", 1e-5),
              dropout_rate=config.get("resid_pdrop", 0.1),
              attention_dropout_rate=config.get("attn_pdrop", 0.1))


def _linear(tensors: dict, name: str, where: str) -> tuple[np.ndarray, np.ndarray]:
  """(kernel [in, out], bias) of a Conv1D / FlaxConv1D."""
  if f"{name}.weight" in tensors:  # PyTorch Conv1D: [in, out]
    kernel = tensors[f"{name}.weight"]
  elif f"{name}.kernel" in tensors:  # Flax: [out, in]
    kernel = tensors[f"{name}.kernel"].T
  else:
    raise KeyError(f"{where}: missing {name}.weight (or .kernel)")
  return kernel, tensors[f"{name}.bias"]


def _norm(tensors: dict, name: str, where: str) -> dict:
  scale = tensors.get(f"{name}.weight", tensors.get(f"{name}.scale"))
  if scale is None:
    raise KeyError(f"{where}: missing {name}.weight (or .scale)")
  return {"scale": scale, "bias": tensors[f"{name}.bias"]}


def _embedding(tensors: dict, name: str, where: str) -> np.ndarray:
  table = tensors.get(f"{name}.weight", tensors.get(f"{name}.embedding"))
  if table is None:
    raise KeyError(f"{where}: missing {name}.weight (or .embedding)")
  return table


def convert(tensors: dict[str, np.ndarray], *, num_layers: int, num_heads: int,
            where: str = WEIGHTS_FILE) -> dict:
  """HF GPT-2 tensors -> `GPT2` params (see the module docstring)."""
  tensors = {k.removeprefix("transformer."): np.asarray(v, np.float32)
             for k, v in tensors.items() if k not in _IGNORED}
  tensors = {k: v for k, v in tensors.items() if not k.endswith(".attn.bias")
             and not k.endswith(".attn.masked_bias")}  # old causal-mask buffers
  params: dict[str, Any] = {
      "wte": {"embedding": _embedding(tensors, "wte", where)},
      "wpe": {"embedding": _embedding(tensors, "wpe", where)},
      "ln_f": _norm(tensors, "ln_f", where),
  }
  d = params["wte"]["embedding"].shape[1]
  if d % num_heads:
    raise ValueError(f"{where}: width {d} is not divisible by n_head={num_heads}")
  hd = d // num_heads
  used = {"wte", "wpe", "ln_f"}
  for i in range(num_layers):
    p = f"h.{i}"
    kernel, bias = _linear(tensors, f"{p}.attn.c_attn", where)
    if kernel.shape != (d, 3 * d):
      raise ValueError(f"{where}: {p}.attn.c_attn is {kernel.shape}, expected ({d}, {3 * d})")
    attention = {}
    for j, name in enumerate(("query", "key", "value")):
      attention[name] = {"kernel": kernel[:, j * d:(j + 1) * d].reshape(d, num_heads, hd),
                         "bias": bias[j * d:(j + 1) * d].reshape(num_heads, hd)}
    kernel, bias = _linear(tensors, f"{p}.attn.c_proj", where)
    attention["out"] = {"kernel": kernel.reshape(num_heads, hd, d), "bias": bias}
    fc_in, b_in = _linear(tensors, f"{p}.mlp.c_fc", where)
    fc_out, b_out = _linear(tensors, f"{p}.mlp.c_proj", where)
    params[f"h_{i}"] = {
        "attention": attention,
        "attention_norm": _norm(tensors, f"{p}.ln_1", where),
        "mlp_norm": _norm(tensors, f"{p}.ln_2", where),
        "mlp": {"dense_in": {"kernel": fc_in, "bias": b_in},
                "dense_out": {"kernel": fc_out, "bias": b_out}},
    }
    used.add(p)
  extra = sorted({k for k in tensors if k.split(".")[0] not in used and
                  ".".join(k.split(".")[:2]) not in used})
  if extra:
    raise ValueError(f"{where}: tensors the model does not use: {extra[:5]}"
                     f"{' ...' if len(extra) > 5 else ''} (n_layer={num_layers}?)")
  return params


def load_hf_gpt2(path: str | pathlib.Path,
                 vocab_subset: np.ndarray | None = None) -> tuple[dict, dict]:
  """(GPT2 kwargs, params) from a local HF GPT-2 directory.

  `vocab_subset` (GPT-2 ids, `CaptionTokenizer.gpt2_ids`) keeps those rows of
  the tied embedding, in that order, and sets vocab_size to their number.
  """
  path = pathlib.Path(path)
  config = json.loads((path / CONFIG_FILE).read_text())
  kwargs = gpt2_kwargs_from_hf_config(config, str(path / CONFIG_FILE))
  params = convert(load_file(str(path / WEIGHTS_FILE)), num_layers=kwargs["num_layers"],
                   num_heads=kwargs["num_heads"], where=str(path / WEIGHTS_FILE))
  if vocab_subset is not None:
    table = params["wte"]["embedding"]
    if np.max(vocab_subset) >= table.shape[0]:
      raise ValueError(f"{path}: vocab subset has ids >= the checkpoint's vocab_size "
                       f"{table.shape[0]}")
    params["wte"]["embedding"] = table[np.asarray(vocab_subset)]
    kwargs["vocab_size"] = len(vocab_subset)
  return kwargs, params
