"""BERT text encoder (Devlin et al. 2019), the text tower of VideoCC §4.1.

VideoCC: "For the final text encoding, we use the [CLS] token output of the
final layer" -- `cls` below, taken before the optional pooler.

Parameters (names mapped from HF checkpoints by `avtext.weights.bert`):
  word_embeddings, position_embeddings, token_type_embeddings  {embedding}
  embeddings_norm                   LayerNorm
  encoderblock_<i>                  layers.EncoderBlock, post-LN
  pooler                            Dense (only with add_pooler=True)
"""
import json
import pathlib
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from avtext.models import layers
from avtext.models import model_registry

Array = jax.Array
INIT_STDDEV = 0.02  # BERT's initializer_range: N(0, 0.02) kernels and embeddings

# A pretrained text tower's architecture is its HF config.json (`bert_from_config`);
# its weights are read by `avtext.weights.bert`.
CONFIG_FILE = "config.json"

_HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}


def weights_dir(spec: str | None) -> pathlib.Path | None:
  """`config.model.text.weights`: None (random init), 'minilm-l6', or a local HF BERT dir."""
  if not spec:
    return None
  if spec == "minilm-l6":
    from avtext import assets  # pylint: disable=g-import-not-at-top
    return assets.minilm_l6_dir()
  path = pathlib.Path(spec)
  if not (path / CONFIG_FILE).exists():
    raise FileNotFoundError(f"config.model.text.weights={spec!r}: no {CONFIG_FILE} there; "
                            "expected a local HF BERT directory (config.json + "
                            "model.safetensors + vocab.txt) or 'minilm-l6'")
  return path


def bert_kwargs_from_hf_config(config: dict[str, Any],
                               source: str = CONFIG_FILE) -> dict[str, Any]:
  """Maps an HF BertConfig dict onto `Bert`'s attributes."""
  def need(key):
    if key not in config:
      raise KeyError(f"{source}: missing {key!r}")
    return config[key]

  act = config.get("hidden_act", "gelu")
  if act not in _HF_ACTIVATIONS:
    raise ValueError(f"{source}: hidden_act={act!r} is not supported; "
                     f"expected one of {sorted(_HF_ACTIVATIONS)}")
  position_type = config.get("position_embedding_type", "absolute")
  if position_type != "absolute":
    raise ValueError(f"{source}: position_embedding_type={position_type!r}; "
                     f"only 'absolute' (learned) positions are implemented")
  return dict(
      vocab_size=need("vocab_size"),
      hidden_size=need("hidden_size"),
      num_layers=need("num_hidden_layers"),
      num_heads=need("num_attention_heads"),
      mlp_dim=need("intermediate_size"),
      max_position_embeddings=need("max_position_embeddings"),
      type_vocab_size=config.get("type_vocab_size", 2),
      layer_norm_eps=config.get("layer_norm_eps", 1e-12),
      activation=_HF_ACTIVATIONS[act],
      dropout=layers.Dropout(config.get("hidden_dropout_prob", 0.1),
                             config.get("attention_probs_dropout_prob", 0.1)),
  )


class Bert(nn.Module):
  """BERT encoder; defaults are BERT-Base uncased (VideoCC §5.2).

  Attributes:
    vocab_size: WordPiece vocabulary size.
    hidden_size: D.
    num_layers: encoder layers.
    num_heads: attention heads.
    mlp_dim: intermediate (feed-forward) width.
    max_position_embeddings: longest sequence the position table covers.
    type_vocab_size: number of segment (token type) ids.
    layer_norm_eps: LayerNorm epsilon (BERT: 1e-12).
    activation: `layers.ACTIVATIONS` key; BERT's `gelu` is the exact erf form.
    dropout: `layers.Dropout`: rate, BERT's hidden dropout (embeddings and both
      branches); attention, on attention probabilities.
    add_pooler: also return `pooled` = tanh(Dense(cls)), BERT's NSP pooler.
    compute: dtype, remat, attention, scan_layers, backend: see `layers.Compute`
      (scan_layers runs the layers as one `layers.scan_layers`; same parameters).

  Kernels and embeddings start as N(0, 0.02) (BERT's initializer_range; imported
  checkpoints replace them).
  """
  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  mlp_dim: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  activation: str = "gelu"
  dropout: layers.Dropout = layers.Dropout(0.1, 0.1)
  add_pooler: bool = False
  compute: layers.Compute = layers.Compute()

  @property
  def dropout_rate(self) -> float:
    """BERT's hidden dropout rate (HF hidden_dropout_prob)."""
    return self.dropout.rate

  @nn.compact
  def __call__(self, input_ids: Array, attention_mask: Array,
               token_type_ids: Array | None = None, *,
               train: bool = False, cls_only: bool = False,
               hidden_states: bool = False) -> dict[str, Array]:
    """Encodes token ids.

    Args:
      input_ids: int [B, L].
      attention_mask: [B, L], 1 for real tokens and 0 for padding.
      token_type_ids: int [B, L] segment ids; zeros when None.
      train: enables dropout (needs the 'dropout' rng).
      cls_only: return `cls` only: the last layer computes the [CLS] position alone
        (`layers.EncoderBlock.query_positions`; the same value as the full pass).
      hidden_states: also return every layer's output (COOT's text features are
        BERT's last two layers).

    Returns:
      sequence: [B, L, D] final-layer outputs (HF `last_hidden_state`).
      cls: [B, D] final-layer output at position 0, the [CLS] token.
      pooled: [B, D], only with add_pooler.
      hidden_states: only with hidden_states=True: the embeddings' output
        and every layer's, num_layers + 1 arrays [B, L, D] (HF's
        `hidden_states`: [-1] is `sequence`, [-2] the layer below).
    """
    length = input_ids.shape[1]
    if length > self.max_position_embeddings:
      raise ValueError(
          f"sequence length {length} exceeds max_position_embeddings="
          f"{self.max_position_embeddings}; truncate the tokens")
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    init = nn.initializers.normal(INIT_STDDEV)
    dtype, dropout = self.compute.dtype, self.dropout

    def embed(num, name):
      return nn.Embed(num, self.hidden_size, embedding_init=init,
                      dtype=dtype, name=name)

    x = (embed(self.vocab_size, "word_embeddings")(input_ids) +
         embed(self.type_vocab_size, "token_type_embeddings")(token_type_ids) +
         embed(self.max_position_embeddings, "position_embeddings")(
             jnp.arange(length)[None]))
    x = nn.LayerNorm(epsilon=self.layer_norm_eps, dtype=dtype,
                     name="embeddings_norm")(x)
    x = hidden_0 = nn.Dropout(dropout.rate)(x, deterministic=not train)
    block = dict(
        num_heads=self.num_heads,
        mlp_dim=self.mlp_dim,
        pre_norm=False,
        activation=self.activation,
        layer_norm_eps=self.layer_norm_eps,
        dropout=dropout,
        kernel_init=init,
        compute=self.compute)
    names = [f"encoderblock_{i}" for i in range(self.num_layers)]
    # Dropout masks are drawn by shape, so a dropping layer computes all positions (the
    # same random draws with and without cls_only); so does the scanned stack.
    drops = train and (dropout.rate or dropout.attention)
    scan = self.compute.scan_layers
    last = {}
    if (cls_only and not (drops or scan or hidden_states or
                          self.add_pooler or self.is_initializing())):
      last = dict(query_positions=1)
    if scan and not self.is_initializing():
      layer = layers.EncoderBlock(**block, parent=None)

      def step(h, params, rng):
        return layer.apply({"params": params}, h, attention_mask, deterministic=not train,
                           rngs=None if rng is None else {"dropout": rng})

      x, stacked = layers.scan_layers(
          self.variables["params"], names, step, x, collect=True,
          rng=layers.dropout_rng(self, not train, dropout.rate, dropout.attention))
      hidden = [hidden_0] + [stacked[i] for i in range(self.num_layers)]
    else:
      hidden = [x]
      for i, name in enumerate(names):
        x = layers.EncoderBlock(**block, **(last if i == len(names) - 1 else {}), name=name)(
            x, attention_mask, deterministic=not train)
        hidden.append(x)
    if last:
      return {"cls": x[:, 0]}
    outputs = {"sequence": x, "cls": x[:, 0]}
    if hidden_states:
      outputs["hidden_states"] = tuple(hidden)
    if self.add_pooler:
      outputs["pooled"] = jnp.tanh(
          nn.Dense(self.hidden_size, kernel_init=init, dtype=dtype,
                   name="pooler")(x[:, 0]))
    return outputs


@model_registry.register_model("bert")
def bert_from_config(cfg) -> Bert:
  """`config.model.text` (name="bert") -> Bert.

  With `cfg.weights` (a local HF BERT directory or 'minilm-l6') the
  architecture is that checkpoint's `config.json` (its weights are loaded by
  the task's `load_pretrained`); without, the sizes in `cfg`. `dropout_rate`
  always comes from `cfg`.
  """
  weights = weights_dir(cfg.get("weights"))
  if weights is not None:
    config_path = weights / CONFIG_FILE
    kwargs = bert_kwargs_from_hf_config(
        json.loads(config_path.read_text()), str(config_path))
  else:
    kwargs = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                  num_layers=cfg.num_layers, num_heads=cfg.num_heads,
                  mlp_dim=cfg.intermediate_size,
                  max_position_embeddings=cfg.max_position_embeddings)
  kwargs["dropout"] = layers.Dropout(cfg.dropout_rate, cfg.dropout_rate)
  return Bert(**kwargs, compute=model_registry.compute_from_config(cfg))
